// Host side of the KL-divergence custom operators: op definitions, shape/dtype inference and tiling.
//
//   KlDivCustom(x, target; reduction, log_target) -> y
//       y = loss (x's shape) for reduction='none', else a 0-d tensor: sum * scale.
//   KlDivCustomGrad(x, target, dout; reduction, log_target) -> dx, dtarget
//       both gradients in one pass, each of x's (== target's) shape, already multiplied by dout and scale.
//
// x and target have one shape and one dtype: the Python layer (ms_kldiv/backends/ascend.py) broadcasts and
// promotes before launching, so MindSpore's BroadcastTo gradient sums dx / dtarget back to each operand's
// shape. scale follows PyTorch on the operator's own shapes: 1/numel for 'mean', 1/x.shape[0] for
// 'batchmean' (1 for 0-d); the Python layer passes 'sum' and scales itself in the one case where the SPEC's
// 'batchmean' (input's first dimension before broadcasting) differs from that.
#include <cstring>

#include "kl_div_custom_tiling.h"
#include "register/op_def_registry.h"
#include "tiling/platform/platform_ascendc.h"
#include "../op_kernel/kl_div_tiling_plan.h"

namespace {

// kldiv_tiling::Reduction of an attribute value; UINT32_MAX when unknown.
uint32_t ParseReduction(const char* r) {
  if (r == nullptr) return UINT32_MAX;
  if (std::strcmp(r, "none") == 0) return kldiv_tiling::kNone;
  if (std::strcmp(r, "sum") == 0) return kldiv_tiling::kSum;
  if (std::strcmp(r, "mean") == 0) return kldiv_tiling::kMean;
  if (std::strcmp(r, "batchmean") == 0) return kldiv_tiling::kBatchMean;
  return UINT32_MAX;
}

uint32_t IoBytes(ge::DataType dt) {
  switch (dt) {
    case ge::DT_FLOAT: return 4;
    case ge::DT_FLOAT16:
    case ge::DT_BF16: return 2;
    default: return 0;
  }
}

bool SameShape(const gert::Shape& a, const gert::Shape& b) {
  if (a.GetDimNum() != b.GetDimNum()) return false;
  for (size_t i = 0; i < a.GetDimNum(); ++i) {
    if (a.GetDim(i) != b.GetDim(i)) return false;
  }
  return true;
}

}  // namespace

namespace optiling {

static ge::graphStatus KlDivTilingCommon(gert::TilingContext* context, bool backward) {
  const gert::StorageShape* xs = context->GetInputShape(0);
  const gert::StorageShape* ts = context->GetInputShape(1);
  if (xs == nullptr || ts == nullptr) return ge::GRAPH_FAILED;
  const gert::Shape& xShape = xs->GetOriginShape();
  if (!SameShape(xShape, ts->GetOriginShape())) return ge::GRAPH_FAILED;  // broadcast happens in Python
  const uint64_t n = static_cast<uint64_t>(xShape.GetShapeSize());
  const uint64_t firstDim = xShape.GetDimNum() ? static_cast<uint64_t>(xShape.GetDim(0)) : 1;

  const gert::RuntimeAttrs* attrs = context->GetAttrs();
  if (attrs == nullptr) return ge::GRAPH_FAILED;
  const uint32_t reduction = ParseReduction(attrs->GetAttrPointer<char>(0));
  const bool* logTarget = attrs->GetAttrPointer<bool>(1);
  if (reduction == UINT32_MAX || logTarget == nullptr) return ge::GRAPH_FAILED;

  const uint32_t io = IoBytes(context->GetInputDesc(0)->GetDataType());
  if (io == 0 || context->GetInputDesc(1)->GetDataType() != context->GetInputDesc(0)->GetDataType()) {
    return ge::GRAPH_FAILED;
  }
  if (backward) {
    const gert::StorageShape* gs = context->GetInputShape(2);
    if (gs == nullptr) return ge::GRAPH_FAILED;
    const uint64_t gn = static_cast<uint64_t>(gs->GetOriginShape().GetShapeSize());
    if (reduction == kldiv_tiling::kNone ? gn != n : gn != 1) return ge::GRAPH_FAILED;
  }

  uint32_t mode;
  if (backward) {
    mode = reduction == kldiv_tiling::kNone ? kldiv_tiling::kBackwardNone : kldiv_tiling::kBackwardReduce;
  } else {
    mode = reduction == kldiv_tiling::kNone ? kldiv_tiling::kForwardNone : kldiv_tiling::kForwardReduce;
  }

  auto platform = platform_ascendc::PlatformAscendC(context->GetPlatformInfo());
  uint64_t ubBytes = 0;
  platform.GetCoreMemSize(platform_ascendc::CoreMemType::UB, ubBytes);
  const uint32_t coreCount = platform.GetCoreNumAiv();

  kldiv_tiling::Plan plan{};
  if (!kldiv_tiling::MakePlan(n, io, mode, coreCount, static_cast<uint32_t>(ubBytes), &plan)) {
    return ge::GRAPH_FAILED;
  }

  KlDivCustomTilingData tiling;
  tiling.set_totalLength(plan.totalLength);
  tiling.set_baseChunks(plan.baseChunks);
  tiling.set_remChunks(plan.remChunks);
  tiling.set_usedCores(plan.usedCores);
  tiling.set_tileLength(plan.tileLength);
  tiling.set_logTarget(*logTarget ? 1U : 0U);
  tiling.set_reduction(reduction);
  tiling.set_scale(kldiv_tiling::ReductionScale(reduction, n, firstDim));
  tiling.SaveToBuffer(context->GetRawTilingData()->GetData(), context->GetRawTilingData()->GetCapacity());
  context->GetRawTilingData()->SetDataSize(tiling.GetDataSize());

  context->SetBlockDim(plan.usedCores);
  context->SetTilingKey(1);
  // The reducing forward ends with SyncAll: every core of the launch must be resident at once, or the ones
  // that arrive first wait for cores another stream holds (batch mode), and the hard SyncAll wants a
  // non-zero workspace, which the per-core partials provide.
  if (mode == kldiv_tiling::kForwardReduce) context->SetScheduleMode(1);
  size_t* ws = context->GetWorkspaceSizes(1);
  ws[0] = static_cast<size_t>(platform.GetLibApiWorkSpaceSize()) + plan.workspaceBytes;
  return ge::GRAPH_SUCCESS;
}

static ge::graphStatus KlDivCustomTiling(gert::TilingContext* context) { return KlDivTilingCommon(context, false); }
static ge::graphStatus KlDivCustomGradTiling(gert::TilingContext* context) {
  return KlDivTilingCommon(context, true);
}

}  // namespace optiling

namespace ge {

static graphStatus KlDivCustomInferShape(gert::InferShapeContext* context) {
  const gert::Shape* x = context->GetInputShape(0);
  gert::Shape* y = context->GetOutputShape(0);
  const gert::RuntimeAttrs* attrs = context->GetAttrs();
  if (x == nullptr || y == nullptr || attrs == nullptr) return GRAPH_FAILED;
  const uint32_t reduction = ParseReduction(attrs->GetAttrPointer<char>(0));
  if (reduction == UINT32_MAX) return GRAPH_FAILED;
  if (reduction == kldiv_tiling::kNone) {
    *y = *x;
  } else {
    y->SetDimNum(0);  // reduced results are 0-d tensors, never shape (1,)
  }
  return GRAPH_SUCCESS;
}

static graphStatus KlDivCustomInferDataType(gert::InferDataTypeContext* context) {
  context->SetOutputDataType(0, context->GetInputDataType(0));
  return GRAPH_SUCCESS;
}

static graphStatus KlDivCustomGradInferShape(gert::InferShapeContext* context) {
  const gert::Shape* x = context->GetInputShape(0);
  const gert::Shape* t = context->GetInputShape(1);
  gert::Shape* dx = context->GetOutputShape(0);
  gert::Shape* dt = context->GetOutputShape(1);
  if (x == nullptr || t == nullptr || dx == nullptr || dt == nullptr) return GRAPH_FAILED;
  *dx = *x;
  *dt = *t;
  return GRAPH_SUCCESS;
}

static graphStatus KlDivCustomGradInferDataType(gert::InferDataTypeContext* context) {
  context->SetOutputDataType(0, context->GetInputDataType(0));
  context->SetOutputDataType(1, context->GetInputDataType(1));
  return GRAPH_SUCCESS;
}

}  // namespace ge

namespace ops {

// Vector-only kernels; float16 and bfloat16 are computed in float32 inside. float64 is not offered: the
// vector units have no float64 and the Python layer routes float64 to the composite backend.
class KlDivCustom : public OpDef {
 public:
  explicit KlDivCustom(const char* name) : OpDef(name) {
    const std::vector<ge::DataType> types = {ge::DT_FLOAT, ge::DT_FLOAT16, ge::DT_BF16};
    const std::vector<ge::Format> formats = {ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND};
    this->Input("x").ParamType(REQUIRED).DataType(types).Format(formats).UnknownShapeFormat(formats);
    this->Input("target").ParamType(REQUIRED).DataType(types).Format(formats).UnknownShapeFormat(formats);
    this->Output("y").ParamType(REQUIRED).DataType(types).Format(formats).UnknownShapeFormat(formats);
    this->Attr("reduction").AttrType(OPTIONAL).String("mean");
    this->Attr("log_target").AttrType(OPTIONAL).Bool(false);
    this->SetInferShape(ge::KlDivCustomInferShape).SetInferDataType(ge::KlDivCustomInferDataType);
    this->AICore().SetTiling(optiling::KlDivCustomTiling);
    this->AICore().AddConfig("ascend910b");
    this->AICore().AddConfig("ascend910_93");
  }
};

class KlDivCustomGrad : public OpDef {
 public:
  explicit KlDivCustomGrad(const char* name) : OpDef(name) {
    const std::vector<ge::DataType> types = {ge::DT_FLOAT, ge::DT_FLOAT16, ge::DT_BF16};
    const std::vector<ge::Format> formats = {ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND};
    this->Input("x").ParamType(REQUIRED).DataType(types).Format(formats).UnknownShapeFormat(formats);
    this->Input("target").ParamType(REQUIRED).DataType(types).Format(formats).UnknownShapeFormat(formats);
    this->Input("dout").ParamType(REQUIRED).DataType(types).Format(formats).UnknownShapeFormat(formats);
    this->Output("dx").ParamType(REQUIRED).DataType(types).Format(formats).UnknownShapeFormat(formats);
    this->Output("dtarget").ParamType(REQUIRED).DataType(types).Format(formats).UnknownShapeFormat(formats);
    this->Attr("reduction").AttrType(OPTIONAL).String("mean");
    this->Attr("log_target").AttrType(OPTIONAL).Bool(false);
    this->SetInferShape(ge::KlDivCustomGradInferShape).SetInferDataType(ge::KlDivCustomGradInferDataType);
    this->AICore().SetTiling(optiling::KlDivCustomGradTiling);
    this->AICore().AddConfig("ascend910b");
    this->AICore().AddConfig("ascend910_93");
  }
};

OP_ADD(KlDivCustom);
OP_ADD(KlDivCustomGrad);

}  // namespace ops
