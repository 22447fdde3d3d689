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
#include "op_host_common.h"
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

}  // namespace

namespace optiling {

// KlDivCustomGrad when backward, else KlDivCustom.
template <bool backward>
ge::graphStatus KlDivTilingCommon(gert::TilingContext* context) {
  const gert::Shape* xShape = kldiv_host::PairShape(context);  // broadcast happens in Python
  if (xShape == nullptr) return ge::GRAPH_FAILED;
  const uint64_t n = static_cast<uint64_t>(xShape->GetShapeSize());
  const uint64_t firstDim = xShape->GetDimNum() ? static_cast<uint64_t>(xShape->GetDim(0)) : 1;

  const gert::RuntimeAttrs* attrs = context->GetAttrs();
  if (attrs == nullptr) return ge::GRAPH_FAILED;
  const uint32_t reduction = ParseReduction(attrs->GetAttrPointer<char>(0));
  const bool* logTarget = attrs->GetAttrPointer<bool>(1);
  if (reduction == UINT32_MAX || logTarget == nullptr) return ge::GRAPH_FAILED;

  const uint32_t io = kldiv_host::PairIoBytes(context);
  if (io == 0) return ge::GRAPH_FAILED;
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
  uint32_t cores = 0, ubBytes = 0;
  kldiv_host::CoreResources(platform, &cores, &ubBytes);
  kldiv_tiling::Plan plan{};
  if (!kldiv_tiling::MakePlan(n, io, mode, cores, ubBytes, &plan)) return ge::GRAPH_FAILED;

  KlDivCustomTilingData tiling;
  tiling.set_totalLength(plan.totalLength);
  tiling.set_baseChunks(plan.baseChunks);
  tiling.set_remChunks(plan.remChunks);
  kldiv_host::SetLaunchFields(tiling, plan);
  tiling.set_logTarget(*logTarget ? 1U : 0U);
  tiling.set_reduction(reduction);
  tiling.set_scale(kldiv_tiling::ReductionScale(reduction, n, firstDim));
  // The reducing forward ends with SyncAll: every core of the launch must be resident at once, or the ones
  // that arrive first wait for cores another stream holds (batch mode), and the hard SyncAll wants a
  // non-zero workspace, which the per-core partials provide.
  if (mode == kldiv_tiling::kForwardReduce) context->SetScheduleMode(1);
  return kldiv_host::SaveTiling(context, tiling, plan.usedCores, platform, plan.workspaceBytes);
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

}  // namespace ge

namespace ops {

// All tensors of both ops are of one of IoTypes() (vector-only kernels; float64 goes to the composite backend).
template <typename Def>
void KlDivAttrs(Def* def) {
  def->Attr("reduction").AttrType(OPTIONAL).String("mean");
  def->Attr("log_target").AttrType(OPTIONAL).Bool(false);
}

class KlDivCustom : public OpDef {
 public:
  explicit KlDivCustom(const char* name) : OpDef(name) {
    NdTensors(this, {{"x", IoTypes()}, {"target", IoTypes()}}, {{"y", IoTypes()}});
    KlDivAttrs(this);
    FinishOpDef(this, ge::KlDivCustomInferShape, kldiv_host::SameDataTypes<1>, optiling::KlDivTilingCommon<false>);
  }
};

class KlDivCustomGrad : public OpDef {
 public:
  explicit KlDivCustomGrad(const char* name) : OpDef(name) {
    NdTensors(this, {{"x", IoTypes()}, {"target", IoTypes()}, {"dout", IoTypes()}},
              {{"dx", IoTypes()}, {"dtarget", IoTypes()}});
    KlDivAttrs(this);
    FinishOpDef(this, kldiv_host::SameShapes<2>, kldiv_host::SameDataTypes<2>, optiling::KlDivTilingCommon<true>);
  }
};

OP_ADD(KlDivCustom);
OP_ADD(KlDivCustomGrad);

}  // namespace ops
