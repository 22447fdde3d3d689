// Host side of the fused distillation operators: op definitions, shape/dtype inference and tiling.
//
//   DistillCustom(student, teacher; temperature, beta) -> stats
//       student, teacher: [..., V], one shape and dtype. stats: float32 [..., 8] per row: the row's loss
//       (T^2 times the divergence of beta), lse of both scaled rows, the row's KL terms (distill_custom.cpp).
//   DistillCustomGrad(student, teacher, stats, dloss; temperature, beta, teacher_grad) -> d_student, d_teacher
//       dloss: float32 [...], the gradient of each row's loss (0 for ignored rows: exact zeros come back).
//       d_teacher has the teacher's shape, or is a one-element placeholder, never written, when teacher_grad is
//       false (nothing is computed for it; MindSpore's Custom op path does not take 0-element outputs).
//
// Reductions, ignored rows and dtype promotion are the Python layer's (ms_kldiv/backends/ascend.py): they are
// O(rows) work on the stats.
#include <cmath>

#include "distill_custom_tiling.h"
#include "register/op_def_registry.h"
#include "tiling/platform/platform_ascendc.h"
#include "../op_kernel/distill_tiling_plan.h"

namespace {

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

static ge::graphStatus DistillTilingCommon(gert::TilingContext* context, bool backward) {
  const gert::StorageShape* ss = context->GetInputShape(0);
  const gert::StorageShape* ts = context->GetInputShape(1);
  if (ss == nullptr || ts == nullptr) return ge::GRAPH_FAILED;
  const gert::Shape& shape = ss->GetOriginShape();
  if (shape.GetDimNum() < 1 || !SameShape(shape, ts->GetOriginShape())) return ge::GRAPH_FAILED;
  const uint64_t vocab = static_cast<uint64_t>(shape.GetDim(shape.GetDimNum() - 1));
  const uint64_t rows = vocab ? static_cast<uint64_t>(shape.GetShapeSize()) / vocab : 0;

  const gert::RuntimeAttrs* attrs = context->GetAttrs();
  if (attrs == nullptr) return ge::GRAPH_FAILED;
  const float* temperature = attrs->GetAttrPointer<float>(0);
  const float* beta = attrs->GetAttrPointer<float>(1);
  if (temperature == nullptr || beta == nullptr || !(*temperature > 0.0f) || !std::isfinite(*temperature) ||
      !(*beta >= 0.0f && *beta <= 1.0f)) {
    return ge::GRAPH_FAILED;
  }
  bool teacherGrad = false;
  if (backward) {
    const bool* tg = attrs->GetAttrPointer<bool>(2);
    if (tg == nullptr) return ge::GRAPH_FAILED;
    teacherGrad = *tg;
  }

  const uint32_t io = IoBytes(context->GetInputDesc(0)->GetDataType());
  if (io == 0 || context->GetInputDesc(1)->GetDataType() != context->GetInputDesc(0)->GetDataType()) {
    return ge::GRAPH_FAILED;
  }
  const uint32_t kind = distill_tiling::KindOfBeta(*beta);
  const uint32_t op = !backward ? distill_tiling::kForward
                                : (teacherGrad ? distill_tiling::kBackwardBoth : distill_tiling::kBackwardStudent);

  auto platform = platform_ascendc::PlatformAscendC(context->GetPlatformInfo());
  uint64_t ubBytes = 0;
  platform.GetCoreMemSize(platform_ascendc::CoreMemType::UB, ubBytes);
  distill_tiling::Plan plan{};
  if (!distill_tiling::MakePlan(rows, vocab, io, op, kind, platform.GetCoreNumAiv(), static_cast<uint32_t>(ubBytes),
                                &plan)) {
    return ge::GRAPH_FAILED;
  }

  const double t = *temperature;
  const double b = *beta;
  DistillCustomTilingData tiling;
  tiling.set_rows(plan.rows);
  tiling.set_vocab(plan.vocab);
  tiling.set_baseRows(plan.baseRows);
  tiling.set_remRows(plan.remRows);
  tiling.set_usedCores(plan.usedCores);
  tiling.set_tileLength(plan.tileLength);
  tiling.set_kind(kind);
  tiling.set_teacherGrad(teacherGrad ? 1U : 0U);
  tiling.set_invTemperature(static_cast<float>(1.0 / t));
  tiling.set_temperature(static_cast<float>(t));
  tiling.set_tSquared(static_cast<float>(t * t));
  tiling.set_beta(static_cast<float>(b));
  tiling.set_logBeta(kind == distill_tiling::kJSD ? static_cast<float>(std::log(b)) : 0.0f);
  tiling.set_log1mBeta(kind == distill_tiling::kJSD ? static_cast<float>(std::log1p(-b)) : 0.0f);
  tiling.SaveToBuffer(context->GetRawTilingData()->GetData(), context->GetRawTilingData()->GetCapacity());
  context->GetRawTilingData()->SetDataSize(tiling.GetDataSize());

  context->SetBlockDim(plan.usedCores);
  context->SetTilingKey(1);
  size_t* ws = context->GetWorkspaceSizes(1);
  ws[0] = static_cast<size_t>(platform.GetLibApiWorkSpaceSize());
  return ge::GRAPH_SUCCESS;
}

static ge::graphStatus DistillCustomTiling(gert::TilingContext* context) { return DistillTilingCommon(context, false); }
static ge::graphStatus DistillCustomGradTiling(gert::TilingContext* context) {
  return DistillTilingCommon(context, true);
}

}  // namespace optiling

namespace ge {

static graphStatus DistillCustomInferShape(gert::InferShapeContext* context) {
  const gert::Shape* s = context->GetInputShape(0);
  gert::Shape* stats = context->GetOutputShape(0);
  if (s == nullptr || stats == nullptr || s->GetDimNum() < 1) return GRAPH_FAILED;
  *stats = *s;
  stats->SetDim(s->GetDimNum() - 1, distill_tiling::kStatsStride);
  return GRAPH_SUCCESS;
}

static graphStatus DistillCustomInferDataType(gert::InferDataTypeContext* context) {
  context->SetOutputDataType(0, DT_FLOAT);
  return GRAPH_SUCCESS;
}

static graphStatus DistillCustomGradInferShape(gert::InferShapeContext* context) {
  const gert::Shape* s = context->GetInputShape(0);
  const gert::Shape* t = context->GetInputShape(1);
  gert::Shape* ds = context->GetOutputShape(0);
  gert::Shape* dt = context->GetOutputShape(1);
  const gert::RuntimeAttrs* attrs = context->GetAttrs();
  if (s == nullptr || t == nullptr || ds == nullptr || dt == nullptr || attrs == nullptr) return GRAPH_FAILED;
  const bool* teacherGrad = attrs->GetAttrPointer<bool>(2);
  if (teacherGrad == nullptr) return GRAPH_FAILED;
  *ds = *s;
  if (*teacherGrad) {
    *dt = *t;
  } else {
    dt->SetDimNum(1);
    dt->SetDim(0, 1);
  }
  return GRAPH_SUCCESS;
}

static graphStatus DistillCustomGradInferDataType(gert::InferDataTypeContext* context) {
  context->SetOutputDataType(0, context->GetInputDataType(0));
  context->SetOutputDataType(1, context->GetInputDataType(1));
  return GRAPH_SUCCESS;
}

}  // namespace ge

namespace ops {

class DistillCustom : public OpDef {
 public:
  explicit DistillCustom(const char* name) : OpDef(name) {
    const std::vector<ge::DataType> types = {ge::DT_FLOAT, ge::DT_FLOAT16, ge::DT_BF16};
    const std::vector<ge::DataType> f32 = {ge::DT_FLOAT, ge::DT_FLOAT, ge::DT_FLOAT};
    const std::vector<ge::Format> formats = {ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND};
    this->Input("student").ParamType(REQUIRED).DataType(types).Format(formats).UnknownShapeFormat(formats);
    this->Input("teacher").ParamType(REQUIRED).DataType(types).Format(formats).UnknownShapeFormat(formats);
    this->Output("stats").ParamType(REQUIRED).DataType(f32).Format(formats).UnknownShapeFormat(formats);
    this->Attr("temperature").AttrType(OPTIONAL).Float(1.0f);
    this->Attr("beta").AttrType(OPTIONAL).Float(0.0f);
    this->SetInferShape(ge::DistillCustomInferShape).SetInferDataType(ge::DistillCustomInferDataType);
    this->AICore().SetTiling(optiling::DistillCustomTiling);
    this->AICore().AddConfig("ascend910b");
    this->AICore().AddConfig("ascend910_93");
  }
};

class DistillCustomGrad : public OpDef {
 public:
  explicit DistillCustomGrad(const char* name) : OpDef(name) {
    const std::vector<ge::DataType> types = {ge::DT_FLOAT, ge::DT_FLOAT16, ge::DT_BF16};
    const std::vector<ge::DataType> f32 = {ge::DT_FLOAT, ge::DT_FLOAT, ge::DT_FLOAT};
    const std::vector<ge::Format> formats = {ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND};
    this->Input("student").ParamType(REQUIRED).DataType(types).Format(formats).UnknownShapeFormat(formats);
    this->Input("teacher").ParamType(REQUIRED).DataType(types).Format(formats).UnknownShapeFormat(formats);
    this->Input("stats").ParamType(REQUIRED).DataType(f32).Format(formats).UnknownShapeFormat(formats);
    this->Input("dloss").ParamType(REQUIRED).DataType(f32).Format(formats).UnknownShapeFormat(formats);
    this->Output("d_student").ParamType(REQUIRED).DataType(types).Format(formats).UnknownShapeFormat(formats);
    this->Output("d_teacher").ParamType(REQUIRED).DataType(types).Format(formats).UnknownShapeFormat(formats);
    this->Attr("temperature").AttrType(OPTIONAL).Float(1.0f);
    this->Attr("beta").AttrType(OPTIONAL).Float(0.0f);
    this->Attr("teacher_grad").AttrType(OPTIONAL).Bool(true);
    this->SetInferShape(ge::DistillCustomGradInferShape).SetInferDataType(ge::DistillCustomGradInferDataType);
    this->AICore().SetTiling(optiling::DistillCustomGradTiling);
    this->AICore().AddConfig("ascend910b");
    this->AICore().AddConfig("ascend910_93");
  }
};

OP_ADD(DistillCustom);
OP_ADD(DistillCustomGrad);

}  // namespace ops
