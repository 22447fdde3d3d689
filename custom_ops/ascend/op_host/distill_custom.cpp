// Host side of the fused distillation operators: op definitions, shape/dtype inference and tiling.
//
//   DistillCustom(student, teacher; temperature, beta, divergence, alpha, softcap, logit_scale) -> stats
//       student, teacher: [..., V], one shape and dtype. stats: float32 [..., 8] per row: the row's loss
//       (T^2 times the divergence), lse of both scaled rows, the row's sums of terms (distill_custom.cpp).
//       divergence: the code of ms_kldiv/_distill_math.py DIVERGENCES (0 'kl' by beta, 1 'tvd', 2 'skew_kl',
//       3 'skew_rkl', 4 'symmetric_kl'), alpha its parameter; softcap > 0 caps both models' logits,
//       cap tanh(logit_scale z / cap), else they are multiplied by logit_scale, before the temperature.
//   DistillCustomGrad(student, teacher, stats, dloss; the same six, teacher_grad) -> d_student, d_teacher
//       dloss: float32 [...], the gradient of each row's loss (0 for ignored rows: exact zeros come back).
//       d_teacher has the teacher's shape, or is a one-element placeholder, never written, when teacher_grad is
//       false (nothing is computed for it; MindSpore's Custom op path does not take 0-element outputs).
//
// Reductions, ignored rows and dtype promotion are the Python layer's (ms_kldiv/backends/ascend.py): they are
// O(rows) work on the stats.
#include <cmath>

#include "distill_custom_tiling.h"
#include "distill_hyper.h"
#include "op_host_common.h"
#include "../op_kernel/distill_tiling_plan.h"

namespace {
// Attribute indices, in declaration order (DistillAttrs below; teacher_grad is DistillCustomGrad's last).
constexpr size_t kAttrTemperature = 0, kAttrBeta = 1, kAttrDivergence = 2, kAttrAlpha = 3, kAttrSoftcap = 4,
                 kAttrLogitScale = 5, kAttrTeacherGrad = 6;
}  // namespace

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
  const float* temperature = attrs->GetAttrPointer<float>(kAttrTemperature);
  const float* beta = attrs->GetAttrPointer<float>(kAttrBeta);
  const int64_t* divergence = attrs->GetAttrPointer<int64_t>(kAttrDivergence);
  const float* alpha = attrs->GetAttrPointer<float>(kAttrAlpha);
  const float* softcap = attrs->GetAttrPointer<float>(kAttrSoftcap);
  const float* logitScale = attrs->GetAttrPointer<float>(kAttrLogitScale);
  if (temperature == nullptr || beta == nullptr || divergence == nullptr || alpha == nullptr || softcap == nullptr ||
      logitScale == nullptr) {
    return ge::GRAPH_FAILED;
  }
  const distill_hyper::Attrs hyper{*temperature, *beta, *divergence, *alpha, *softcap, *logitScale};
  const uint32_t kind = distill_hyper::Validate(hyper);
  if (kind > distill_tiling::kSymmetric) return ge::GRAPH_FAILED;
  bool teacherGrad = false;
  if (backward) {
    const bool* tg = attrs->GetAttrPointer<bool>(kAttrTeacherGrad);
    if (tg == nullptr) return ge::GRAPH_FAILED;
    teacherGrad = *tg;
  }

  const uint32_t io = kldiv_host::PairIoBytes(context);
  if (io == 0) return ge::GRAPH_FAILED;
  const uint32_t op = !backward ? distill_tiling::kForward
                                : (teacherGrad ? distill_tiling::kBackwardBoth : distill_tiling::kBackwardStudent);

  auto platform = platform_ascendc::PlatformAscendC(context->GetPlatformInfo());
  uint32_t cores = 0, ubBytes = 0;
  kldiv_host::CoreResources(platform, &cores, &ubBytes);
  distill_tiling::Plan plan{};
  if (!distill_tiling::MakePlan(rows, vocab, io, op, kind, cores, ubBytes, &plan, hyper.softcap > 0.0)) {
    return ge::GRAPH_FAILED;
  }

  DistillCustomTilingData tiling;
  tiling.set_rows(plan.rows);
  tiling.set_vocab(plan.vocab);
  tiling.set_baseRows(plan.baseRows);
  tiling.set_remRows(plan.remRows);
  kldiv_host::SetLaunchFields(tiling, plan);
  tiling.set_teacherGrad(teacherGrad ? 1U : 0U);
  distill_hyper::Fill(hyper, kind, &tiling);
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
  const bool* teacherGrad = attrs->GetAttrPointer<bool>(kAttrTeacherGrad);
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
  def->Attr("divergence").AttrType(OPTIONAL).Int(0);
  def->Attr("alpha").AttrType(OPTIONAL).Float(0.0f);
  def->Attr("softcap").AttrType(OPTIONAL).Float(0.0f);
  def->Attr("logit_scale").AttrType(OPTIONAL).Float(1.0f);
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
