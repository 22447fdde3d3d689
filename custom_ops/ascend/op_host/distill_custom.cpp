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
#include "op_host_common.h"
#include "../op_kernel/distill_tiling_plan.h"

namespace optiling {

// DistillCustomGrad when backward, else DistillCustom.
template <bool backward>
ge::graphStatus DistillTilingCommon(gert::TilingContext* context) {
  const gert::Shape* shape = kldiv_host::PairShape(context);
  if (shape == nullptr || shape->GetDimNum() < 1) return ge::GRAPH_FAILED;
  const uint64_t vocab = static_cast<uint64_t>(shape->GetDim(shape->GetDimNum() - 1));
  const uint64_t rows = vocab ? static_cast<uint64_t>(shape->GetShapeSize()) / vocab : 0;

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

  const uint32_t io = kldiv_host::PairIoBytes(context);
  if (io == 0) return ge::GRAPH_FAILED;
  const uint32_t kind = distill_tiling::KindOfBeta(*beta);
  const uint32_t op = !backward ? distill_tiling::kForward
                                : (teacherGrad ? distill_tiling::kBackwardBoth : distill_tiling::kBackwardStudent);

  auto platform = platform_ascendc::PlatformAscendC(context->GetPlatformInfo());
  uint32_t cores = 0, ubBytes = 0;
  kldiv_host::CoreResources(platform, &cores, &ubBytes);
  distill_tiling::Plan plan{};
  if (!distill_tiling::MakePlan(rows, vocab, io, op, kind, cores, ubBytes, &plan)) return ge::GRAPH_FAILED;

  const double t = *temperature;
  const double b = *beta;
  DistillCustomTilingData tiling;
  tiling.set_rows(plan.rows);
  tiling.set_vocab(plan.vocab);
  tiling.set_baseRows(plan.baseRows);
  tiling.set_remRows(plan.remRows);
  kldiv_host::SetLaunchFields(tiling, plan);
  tiling.set_kind(kind);
  tiling.set_teacherGrad(teacherGrad ? 1U : 0U);
  tiling.set_invTemperature(static_cast<float>(1.0 / t));
  tiling.set_temperature(static_cast<float>(t));
  tiling.set_tSquared(static_cast<float>(t * t));
  tiling.set_beta(static_cast<float>(b));
  tiling.set_logBeta(kind == distill_tiling::kJSD ? static_cast<float>(std::log(b)) : 0.0f);
  tiling.set_log1mBeta(kind == distill_tiling::kJSD ? static_cast<float>(std::log1p(-b)) : 0.0f);
  return kldiv_host::SaveTiling(context, tiling, plan.usedCores, platform, 0);
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

}  // namespace ge

namespace ops {

// The logits are of one of IoTypes(); the per-row statistics and loss gradients are float32.
template <typename Def>
void DistillAttrs(Def* def) {
  def->Attr("temperature").AttrType(OPTIONAL).Float(1.0f);
  def->Attr("beta").AttrType(OPTIONAL).Float(0.0f);
}

class DistillCustom : public OpDef {
 public:
  explicit DistillCustom(const char* name) : OpDef(name) {
    NdTensors(this, {{"student", IoTypes()}, {"teacher", IoTypes()}}, {{"stats", F32Types()}});
    DistillAttrs(this);
    FinishOpDef(this, ge::DistillCustomInferShape, ge::DistillCustomInferDataType,
                optiling::DistillTilingCommon<false>);
  }
};

class DistillCustomGrad : public OpDef {
 public:
  explicit DistillCustomGrad(const char* name) : OpDef(name) {
    NdTensors(this, {{"student", IoTypes()}, {"teacher", IoTypes()}, {"stats", F32Types()}, {"dloss", F32Types()}},
              {{"d_student", IoTypes()}, {"d_teacher", IoTypes()}});
    DistillAttrs(this);
    this->Attr("teacher_grad").AttrType(OPTIONAL).Bool(true);
    FinishOpDef(this, ge::DistillCustomGradInferShape, kldiv_host::SameDataTypes<2>,
                optiling::DistillTilingCommon<true>);
  }
};

OP_ADD(DistillCustom);
OP_ADD(DistillCustomGrad);

}  // namespace ops
