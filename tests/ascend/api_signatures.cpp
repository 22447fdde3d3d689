// Compile-only check (g++ -fsyntax-only) that the CPU stand-in of AscendC declares what the real API declares:
// each stand-in function is bound to a pointer whose type is written from the declaration in asc-devkit
// (include/basic_api, file:line in API_CHECK.md). A stand-in signature that differs fails to bind.
#include "kernel_operator.h"

using namespace AscendC;

template <typename T> using LT = LocalTensor<T>;
using F = float;

void Bind() {
  // kernel_operator_sys_var_intf.h
  int64_t (*blockIdx)() = &GetBlockIdx;
  int64_t (*blockNum)() = &GetBlockNum;
  // kernel_operator_block_sync_intf.h
  void (*syncAll)() = &SyncAll<true>;
  void (*setFlag)(int32_t) = &SetFlag<HardEvent::V_S>;
  void (*waitFlag)(int32_t) = &WaitFlag<HardEvent::V_S>;
  void (*barrier)() = &PipeBarrier<PIPE_ALL>;
  // kernel_operator_vec_unary_intf.h
  void (*ln)(const LT<F>&, const LT<F>&, const int32_t&) = &Ln<F>;
  void (*exp)(const LT<F>&, const LT<F>&, const int32_t&) = &Exp<F>;
  void (*abs)(const LT<F>&, const LT<F>&, const int32_t&) = &Abs<F>;
  void (*not_)(const LT<uint16_t>&, const LT<uint16_t>&, const int32_t&) = &Not<uint16_t>;
  // kernel_operator_vec_binary_intf.h
  void (*add)(const LT<F>&, const LT<F>&, const LT<F>&, const int32_t&) = &Add<F>;
  void (*sub)(const LT<F>&, const LT<F>&, const LT<F>&, const int32_t&) = &Sub<F>;
  void (*mul)(const LT<F>&, const LT<F>&, const LT<F>&, const int32_t&) = &Mul<F>;
  void (*div)(const LT<F>&, const LT<F>&, const LT<F>&, const int32_t&) = &Div<F>;
  void (*max)(const LT<F>&, const LT<F>&, const LT<F>&, const int32_t&) = &Max<F>;
  void (*min)(const LT<F>&, const LT<F>&, const LT<F>&, const int32_t&) = &Min<F>;
  // kernel_operator_vec_binary_scalar_intf.h (the `const T&` overload)
  void (*adds)(const LT<F>&, const LT<F>&, const F&, const int32_t&) = &Adds<F, true>;
  void (*muls)(const LT<F>&, const LT<F>&, const F&, const int32_t&) = &Muls<F, true>;
  // kernel_operator_vec_duplicate_intf.h
  void (*dup)(const LT<F>&, const F&, const int32_t&) = &Duplicate<F>;
  void (*dupH)(const LT<half>&, const half&, const int32_t&) = &Duplicate<half>;
  // kernel_operator_vec_reduce_intf.h
  void (*rsum)(const LT<F>&, const LT<F>&, const LT<F>&, const int32_t) = &ReduceSum<F, true>;
  void (*rmax)(const LT<F>&, const LT<F>&, const LT<F>&, const int32_t, bool) = &ReduceMax<F>;
  // kernel_operator_vec_cmpsel_intf.h
  void (*cmps)(const LT<uint8_t>&, const LT<F>&, const F, CMPMODE, uint32_t) = &CompareScalar<F, uint8_t>;
  void (*sel)(const LT<F>&, const LT<uint8_t>&, const LT<F>&, F, SELMODE, uint32_t) = &Select<F, uint8_t>;
  // kernel_operator_vec_vconv_intf.h
  void (*castIn)(const LT<F>&, const LT<half>&, const RoundMode&, const uint32_t) = &Cast<F, half>;
  void (*castOut)(const LT<bfloat16_t>&, const LT<F>&, const RoundMode&, const uint32_t) = &Cast<bfloat16_t, F>;
  // kernel_operator_data_copy_intf.h
  void (*copyIn)(const LT<F>&, const GlobalTensor<F>&, const uint32_t) = &DataCopy<F>;
  void (*copyOut)(const GlobalTensor<F>&, const LT<F>&, const uint32_t) = &DataCopy<F>;
  void (*padIn)(const LT<F>&, const GlobalTensor<F>&, const DataCopyExtParams&, const DataCopyPadExtParams<F>&) =
      &DataCopyPad<F>;
  void (*padOut)(const GlobalTensor<F>&, const LT<F>&, const DataCopyExtParams&) = &DataCopyPad<F>;
  // kernel_tpipe.h / kernel_tensor.h (members)
  using Que = TQue<TPosition::VECIN, 2>;
  void (Que::*freeT)(LT<F>&) = &Que::FreeTensor<F>;
  bool (Que::*enq)(const LT<F>&) = &Que::EnQue<F>;
  LT<F> (Que::*deq)() = &Que::DeQue<F>;
  LT<F> (TBuf<>::*get)() = &TBuf<>::Get<F>;
  bool (TPipe::*initQue)(Que&, uint8_t, uint32_t) = &TPipe::InitBuffer<Que>;
  bool (TPipe::*initBuf)(TBuf<TPosition::VECCALC>&, uint32_t) = &TPipe::InitBuffer<TPosition::VECCALC>;
  F (LT<F>::*getValue)(const uint32_t) const = &LT<F>::GetValue;
  void (LT<F>::*setValue)(const uint32_t, const F) const = &LT<F>::SetValue<F>;
  LT<F> (LT<F>::*index)(const uint32_t) const = &LT<F>::operator[];
  static_assert(std::is_same<decltype(TBuf<>()), TBuf<TPosition::LCM>>::value, "TBuf defaults to LCM");
  static_assert(TPosition::LCM == TPosition::VECCALC, "LCM is VECCALC");
  static_assert(static_cast<int>(RoundMode::CAST_RINT) == 1 && static_cast<int>(RoundMode::CAST_ODD) == 6, "order");
  static_assert(static_cast<int>(HardEvent::V_S) == 22 && static_cast<int>(HardEvent::S_MTE3) == 25, "order");
  (void)blockIdx; (void)blockNum; (void)syncAll; (void)setFlag; (void)waitFlag; (void)barrier; (void)ln; (void)exp;
  (void)abs; (void)div;
  (void)not_; (void)add; (void)sub; (void)mul; (void)max; (void)min; (void)adds; (void)muls; (void)dup; (void)dupH;
  (void)rsum; (void)rmax; (void)cmps; (void)sel; (void)castIn; (void)castOut; (void)copyIn; (void)copyOut;
  (void)padIn; (void)padOut; (void)freeT; (void)enq; (void)deq; (void)get; (void)initQue; (void)initBuf;
  (void)getValue; (void)setValue; (void)index;
}

// Calls the real API rejects; each must fail to compile here too (the test defines one REJECT_* at a time).
void Reject(LT<F> t, TQue<TPosition::VECIN, 2>& q) {
#if defined(REJECT_DOUBLE_SCALAR)
  Muls(t, t, 2.0, 64);  // a double scalar for a float tensor: no overload deduces
#elif defined(REJECT_RVALUE_FREE)
  q.FreeTensor(q.DeQue<F>());  // FreeTensor takes a non-const lvalue reference
#elif defined(REJECT_DOUBLE_DUPLICATE)
  Duplicate(t, 0.0, 64);
#elif defined(REJECT_MIXED_COMPARE)
  LT<uint8_t> m;
  CompareScalar(m, t, 0.0, CMPMODE::LE, 64);  // src1Scalar must be the tensor's type
#endif
  (void)t;
  (void)q;
}
