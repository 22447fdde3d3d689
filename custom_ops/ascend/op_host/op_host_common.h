// What the host sides of the KL-divergence (kl_div_custom.cpp) and distillation (distill_custom.cpp) operators
// share: the IO dtypes they take, the checks of their two same-shaped inputs, writing the tiling, and the op
// definitions' common parts.
#ifndef OP_HOST_COMMON_H_
#define OP_HOST_COMMON_H_
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "register/op_def_registry.h"
#include "tiling/platform/platform_ascendc.h"

namespace kldiv_host {

// Bytes per element of a supported IO dtype; 0 for any other.
inline uint32_t IoBytes(ge::DataType dt) {
  switch (dt) {
    case ge::DT_FLOAT: return 4;
    case ge::DT_FLOAT16:
    case ge::DT_BF16: return 2;
    default: return 0;
  }
}

inline bool SameShape(const gert::Shape& a, const gert::Shape& b) {
  if (a.GetDimNum() != b.GetDimNum()) return false;
  for (size_t i = 0; i < a.GetDimNum(); ++i) {
    if (a.GetDim(i) != b.GetDim(i)) return false;
  }
  return true;
}

// The shape of inputs 0 and 1, which must be equal (broadcasting is the Python layer's); null if they are not.
inline const gert::Shape* PairShape(gert::TilingContext* context) {
  const gert::StorageShape* a = context->GetInputShape(0);
  const gert::StorageShape* b = context->GetInputShape(1);
  if (a == nullptr || b == nullptr || !SameShape(a->GetOriginShape(), b->GetOriginShape())) return nullptr;
  return &a->GetOriginShape();
}

// Bytes per element of inputs 0 and 1, which must have one supported dtype; 0 if they do not.
inline uint32_t PairIoBytes(gert::TilingContext* context) {
  const ge::DataType dt = context->GetInputDesc(0)->GetDataType();
  return context->GetInputDesc(1)->GetDataType() == dt ? IoBytes(dt) : 0;
}

// The vector cores and the bytes of unified buffer each has.
inline void CoreResources(platform_ascendc::PlatformAscendC& platform, uint32_t* cores, uint32_t* ubBytes) {
  uint64_t ub = 0;
  platform.GetCoreMemSize(platform_ascendc::CoreMemType::UB, ub);
  *cores = platform.GetCoreNumAiv();
  *ubBytes = static_cast<uint32_t>(ub);
}

// The fields every operator's tiling data takes unchanged from its plan: the cores launched and the tile length.
template <typename TilingData, typename Plan>
void SetLaunchFields(TilingData& tiling, const Plan& plan) {
  tiling.set_usedCores(plan.usedCores);
  tiling.set_tileLength(plan.tileLength);
}

// The end of a tiling function: writes the tiling data and launches `usedCores` blocks of tiling key 1, with the
// library API's workspace plus `extraWorkspace` bytes.
template <typename TilingData>
ge::graphStatus SaveTiling(gert::TilingContext* context, TilingData& tiling, uint32_t usedCores,
                platform_ascendc::PlatformAscendC& platform, uint64_t extraWorkspace) {
  tiling.SaveToBuffer(context->GetRawTilingData()->GetData(), context->GetRawTilingData()->GetCapacity());
  context->GetRawTilingData()->SetDataSize(tiling.GetDataSize());
  context->SetBlockDim(usedCores);
  context->SetTilingKey(1);
  size_t* ws = context->GetWorkspaceSizes(1);
  ws[0] = static_cast<size_t>(platform.GetLibApiWorkSpaceSize()) + static_cast<size_t>(extraWorkspace);
  return ge::GRAPH_SUCCESS;
}

// An InferShape function: output i takes input i's shape, for each i below n.
template <size_t n>
ge::graphStatus SameShapes(gert::InferShapeContext* context) {
  for (size_t i = 0; i < n; ++i) {
    const gert::Shape* in = context->GetInputShape(i);
    gert::Shape* out = context->GetOutputShape(i);
    if (in == nullptr || out == nullptr) return ge::GRAPH_FAILED;
  }
  for (size_t i = 0; i < n; ++i) *context->GetOutputShape(i) = *context->GetInputShape(i);
  return ge::GRAPH_SUCCESS;
}

// An InferDataType function: output i takes input i's dtype, for each i below n.
template <size_t n>
ge::graphStatus SameDataTypes(gert::InferDataTypeContext* context) {
  for (size_t i = 0; i < n; ++i) context->SetOutputDataType(i, context->GetInputDataType(i));
  return ge::GRAPH_SUCCESS;
}

}  // namespace kldiv_host

namespace ops {

// The dtypes of an operator's IO tensors, one per supported combination: vector-only kernels that compute float16
// and bfloat16 in float32 inside. float64 is not offered: the vector units have no float64 and the Python layer
// routes float64 to the composite backend.
inline const std::vector<ge::DataType>& IoTypes() {
  static const std::vector<ge::DataType> types = {ge::DT_FLOAT, ge::DT_FLOAT16, ge::DT_BF16};
  return types;
}
// A float32 tensor in every combination.
inline const std::vector<ge::DataType>& F32Types() {
  static const std::vector<ge::DataType> types = {ge::DT_FLOAT, ge::DT_FLOAT, ge::DT_FLOAT};
  return types;
}

// One tensor of an op definition: its name and dtypes (IoTypes() or F32Types()).
struct TensorDef {
  const char* name;
  const std::vector<ge::DataType>& types;
};

// Declares the op's inputs, then its outputs, each a required ND tensor.
template <typename Def>
void NdTensors(Def* def, std::initializer_list<TensorDef> inputs, std::initializer_list<TensorDef> outputs) {
  static const std::vector<ge::Format> formats = {ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND};
  for (const TensorDef& t : inputs) {
    def->Input(t.name).ParamType(REQUIRED).DataType(t.types).Format(formats).UnknownShapeFormat(formats);
  }
  for (const TensorDef& t : outputs) {
    def->Output(t.name).ParamType(REQUIRED).DataType(t.types).Format(formats).UnknownShapeFormat(formats);
  }
}

// The rest of an op definition once its tensors and attributes are declared: shape and dtype inference, the tiling
// function, and the SoCs its AI Core kernel is built for.
template <typename Def, typename InferShape, typename InferDataType, typename Tiling>
void FinishOpDef(Def* def, InferShape inferShape, InferDataType inferDataType, Tiling tiling) {
  def->SetInferShape(inferShape).SetInferDataType(inferDataType);
  def->AICore().SetTiling(tiling);
  def->AICore().AddConfig("ascend910b");
  def->AICore().AddConfig("ascend910_93");
}

}  // namespace ops
#endif  // OP_HOST_COMMON_H_
