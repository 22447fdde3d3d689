// Host side of the stored-teacher ("sparse") distillation operators: op definitions, shape/dtype inference and
// tiling.
//
//   SparseDistillCustom(student, ids, values; temperature, ratio, beta, tail) -> stats
//       student: [..., V] float32/float16/bfloat16; ids: int32 [..., K] (negative: padding); values: float32
//       [..., K] (log-probabilities at temperature T0, or log-counts), same leading shape. stats: float32 [..., 8]
//       per row (sparse::Stat of custom_ops/common/sparse_math.h): the row's loss, NaN for an id >= V, a repeated
//       id or no teacher distribution; what the backward reads.
//   SparseDistillCustomGrad(student, ids, values, stats, dloss; temperature, ratio, beta, tail) -> d_student
//       dloss: float32 [...], the gradient of each row's loss (0 for ignored rows: exact zeros come back).
//
// ratio = T0 / T (1 for sampled counts); tail: the teacher keeps its missing mass as a bucket. Reductions, ignored
// rows and dtype promotion are the Python layer's (ms_kldiv/sparse_distillation.py, ms_kldiv/backends/ascend.py).
#include <cmath>

#include "op_host_common.h"
#include "sparse_distill_custom_tiling.h"
#include "../op_kernel/sparse_tiling_plan.h"

namespace optiling {

// The rows, V and K of (student [..., V], ids [..., K], values [..., K]) with one leading shape; false otherwise.
static bool SparseShapes(gert::TilingContext* context, uint64_t* rows, uint64_t* vocab, uint64_t* k) {
  const gert::StorageShape* s = context->GetInputShape(0);
  const gert::StorageShape* ids = context->GetInputShape(1);
  const gert::StorageShape* vals = context->GetInputShape(2);
  if (s == nullptr || ids == nullptr || vals == nullptr) return false;
  const gert::Shape& ss = s->GetOriginShape();
  const gert::Shape& is = ids->GetOriginShape();
  if (ss.GetDimNum() < 1 || ss.GetDimNum() != is.GetDimNum() || !kldiv_host::SameShape(is, vals->GetOriginShape())) {
    return false;
  }
  for (size_t i = 0; i + 1 < ss.GetDimNum(); ++i) {
    if (ss.GetDim(i) != is.GetDim(i)) return false;
  }
  *vocab = static_cast<uint64_t>(ss.GetDim(ss.GetDimNum() - 1));
  *k = static_cast<uint64_t>(is.GetDim(is.GetDimNum() - 1));
  *rows = *vocab ? static_cast<uint64_t>(ss.GetShapeSize()) / *vocab : 0;
  return *vocab > 0;
}

// SparseDistillCustomGrad when backward, else SparseDistillCustom.
template <bool backward>
ge::graphStatus SparseTilingCommon(gert::TilingContext* context) {
  uint64_t rows = 0, vocab = 0, k = 0;
  if (!SparseShapes(context, &rows, &vocab, &k)) return ge::GRAPH_FAILED;
  if (context->GetInputDesc(1)->GetDataType() != ge::DT_INT32 ||
      context->GetInputDesc(2)->GetDataType() != ge::DT_FLOAT) {
    return ge::GRAPH_FAILED;
  }
  const uint32_t io = kldiv_host::IoBytes(context->GetInputDesc(0)->GetDataType());
  if (io == 0) return ge::GRAPH_FAILED;

  const gert::RuntimeAttrs* attrs = context->GetAttrs();
  if (attrs == nullptr) return ge::GRAPH_FAILED;
  const float* temperature = attrs->GetAttrPointer<float>(0);
  const float* ratio = attrs->GetAttrPointer<float>(1);
  const float* beta = attrs->GetAttrPointer<float>(2);
  const bool* tail = attrs->GetAttrPointer<bool>(3);
  if (temperature == nullptr || ratio == nullptr || beta == nullptr || tail == nullptr ||
      !(*temperature > 0.0f) || !std::isfinite(*temperature) || !(*ratio > 0.0f) || !std::isfinite(*ratio) ||
      !(*beta >= 0.0f && *beta <= 1.0f)) {
    return ge::GRAPH_FAILED;
  }

  const uint32_t op = backward ? sparse_tiling::kBackward : sparse_tiling::kForward;
  auto platform = platform_ascendc::PlatformAscendC(context->GetPlatformInfo());
  uint32_t cores = 0, ubBytes = 0;
  kldiv_host::CoreResources(platform, &cores, &ubBytes);
  sparse_tiling::Plan plan{};
  if (!sparse_tiling::MakePlan(rows, vocab, k, io, op, cores, ubBytes, &plan)) return ge::GRAPH_FAILED;

  const uint32_t kind = sparse_tiling::KindOfBeta(*beta);
  const double t = *temperature;
  const double b = *beta;
  SparseDistillCustomTilingData tiling;
  tiling.set_rows(plan.rows);
  tiling.set_vocab(plan.vocab);
  tiling.set_baseRows(plan.baseRows);
  tiling.set_remRows(plan.remRows);
  kldiv_host::SetLaunchFields(tiling, plan);
  tiling.set_ids(plan.ids);
  tiling.set_idLanes(plan.idLanes);
  tiling.set_kind(kind);
  tiling.set_tail(*tail ? 1U : 0U);
  tiling.set_invTemperature(static_cast<float>(1.0 / t));
  tiling.set_temperature(static_cast<float>(t));
  tiling.set_tSquared(static_cast<float>(t * t));
  tiling.set_ratio(*ratio);
  tiling.set_beta(static_cast<float>(b));
  tiling.set_logBeta(kind == sparse_tiling::kJSD ? static_cast<float>(std::log(b)) : 0.0f);
  tiling.set_log1mBeta(kind == sparse_tiling::kJSD ? static_cast<float>(std::log1p(-b)) : 0.0f);
  return kldiv_host::SaveTiling(context, tiling, plan.usedCores, platform, 0);
}

}  // namespace optiling

namespace ge {

static graphStatus SparseDistillCustomInferShape(gert::InferShapeContext* context) {
  const gert::Shape* s = context->GetInputShape(0);
  gert::Shape* stats = context->GetOutputShape(0);
  if (s == nullptr || stats == nullptr || s->GetDimNum() < 1) return GRAPH_FAILED;
  *stats = *s;
  stats->SetDim(s->GetDimNum() - 1, sparse_tiling::kStatsStride);
  return GRAPH_SUCCESS;
}

static graphStatus SparseDistillCustomInferDataType(gert::InferDataTypeContext* context) {
  context->SetOutputDataType(0, DT_FLOAT);
  return GRAPH_SUCCESS;
}

}  // namespace ge

namespace ops {

inline const std::vector<ge::DataType>& I32Types() {
  static const std::vector<ge::DataType> types = {ge::DT_INT32, ge::DT_INT32, ge::DT_INT32};
  return types;
}

template <typename Def>
void SparseAttrs(Def* def) {
  def->Attr("temperature").AttrType(OPTIONAL).Float(1.0f);
  def->Attr("ratio").AttrType(OPTIONAL).Float(1.0f);
  def->Attr("beta").AttrType(OPTIONAL).Float(0.0f);
  def->Attr("tail").AttrType(OPTIONAL).Bool(false);
}

// The logits are of one of IoTypes(); ids int32; values, stats and loss gradients float32.
class SparseDistillCustom : public OpDef {
 public:
  explicit SparseDistillCustom(const char* name) : OpDef(name) {
    NdTensors(this, {{"student", IoTypes()}, {"ids", I32Types()}, {"values", F32Types()}}, {{"stats", F32Types()}});
    SparseAttrs(this);
    FinishOpDef(this, ge::SparseDistillCustomInferShape, ge::SparseDistillCustomInferDataType,
                optiling::SparseTilingCommon<false>);
  }
};

class SparseDistillCustomGrad : public OpDef {
 public:
  explicit SparseDistillCustomGrad(const char* name) : OpDef(name) {
    NdTensors(this,
              {{"student", IoTypes()}, {"ids", I32Types()}, {"values", F32Types()}, {"stats", F32Types()},
               {"dloss", F32Types()}},
              {{"d_student", IoTypes()}});
    SparseAttrs(this);
    FinishOpDef(this, kldiv_host::SameShapes<1>, kldiv_host::SameDataTypes<1>, optiling::SparseTilingCommon<true>);
  }
};

OP_ADD(SparseDistillCustom);
OP_ADD(SparseDistillCustomGrad);

}  // namespace ops
