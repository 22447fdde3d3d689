// A CPU stand-in for the subset of the AscendC kernel API that op_kernel/*.cpp uses, written for this project
// from the documented semantics, so the kernel SOURCES can be compiled with g++ and executed on a CPU:
// each vector core is a thread with its own 192 KiB "unified buffer", SyncAll is a thread barrier.
//
// It checks, rather than trusts, the constraints the kernels must respect on real hardware:
//   * every UB allocation of a core fits its unified buffer below the API's reserved top 8 KiB, 32 B aligned;
//   * DataCopy moves whole 32 B blocks only (ragged transfers must use DataCopyPad);
//   * CompareScalar counts cover whole 256 B repeats;
//   * a TQue never hands out more buffers than it was initialised with, and DeQue follows EnQue;
//   * every WaitFlag<event>(id) has a SetFlag<event>(id) before it on the same core.
// Signatures follow the declarations of the open-source Ascend C API (asc-devkit include/basic_api, see
// API_CHECK.md): templates on the element type, `const int32_t& count` where the real API has it, scalars of the
// tensor's own type, non-const FreeTensor/Get. So a call that compiles here deduces and converts as in ccec.
// A violated constraint throws; the driver stops that core, reports the message, and the launch fails.
// Not modelled: pipelining (everything here is sequential, so a missing barrier is not detected; SetFlag/WaitFlag
// are only checked for pairing), hardware Ln/Exp accuracy (libm float functions), performance.
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <type_traits>
#include <vector>

#define __aicore__
#define __global__
#define __gm__
using GM_ADDR = uint8_t*;

struct AscendSimError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] inline void AscendSimFail(const char* what) { throw AscendSimError(what); }
#define ASIM_CHECK(cond, what) \
  do {                         \
    if (!(cond)) AscendSimFail(what); \
  } while (0)

using half = _Float16;

struct bfloat16_t {
  uint16_t bits = 0;
  bfloat16_t() = default;
  bfloat16_t(float f) {  // round to nearest even, NaN kept
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (std::isnan(f)) {
      bits = 0x7FC0;
    } else {
      bits = static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
    }
  }
  bfloat16_t(int v) : bfloat16_t(static_cast<float>(v)) {}
  operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

namespace AscendC {

template <typename A, typename B> struct IsSameType { static constexpr bool value = std::is_same<A, B>::value; };

// The real enumerators in the real order (impl/basic_api/common_types.h, utils/kernel_utils_mode.h,
// kernel_event.h), so that values, not only names, agree.
enum class TPosition : uint8_t {
  GM, A1, A2, B1, B2, C1, C2, CO1, CO2, VECIN, VECOUT, VECCALC, LCM = VECCALC, SPM, SHM = SPM, TSCM,
  C2PIPE2GM, C2PIPE2LOCAL, FIX_MTE2, FIX_S, M_S, FIX_MTE3, MTE1_FIX, FIX_MTE1, FIX_FIX, MAX,
};
using QuePosition = TPosition;
enum class RoundMode : uint8_t { CAST_NONE = 0, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD,
                                 UNKNOWN = 0xFF };
enum class CMPMODE : uint8_t { LT = 0, GT, EQ, LE, GE, NE };
enum class SELMODE : uint8_t { VSEL_CMPMASK_SPR = 0, VSEL_TENSOR_SCALAR_MODE, VSEL_TENSOR_TENSOR_MODE };
enum class HardEvent : uint8_t {
  MTE2_MTE1, MTE1_MTE2, MTE1_M, M_MTE1, MTE2_V, V_MTE2, MTE3_V, V_MTE3, M_V, V_M, V_V, MTE3_MTE1, MTE1_MTE3, MTE1_V,
  MTE2_M, M_MTE2, V_MTE1, M_FIX, FIX_M, MTE3_MTE2, MTE2_MTE3, S_V, V_S, S_MTE2, MTE2_S, S_MTE3, MTE3_S, MTE2_FIX,
  FIX_MTE2, FIX_S, M_S, FIX_MTE3, MTE1_FIX, FIX_MTE1, FIX_FIX, MAX,
};
enum pipe_t { PIPE_S, PIPE_V, PIPE_MTE2, PIPE_MTE3, PIPE_ALL };

// ---------------------------------------------------------------------------------------- per-core state
constexpr uint32_t kSimUbBytes = 192 * 1024;
// Atlas A2 (and 310P): the API writes its own temporaries (Select's scalar block, ...) into the top 8 KiB of the
// UB (impl/basic_api/utils/kernel_utils_constants.h: TMP_UB_OFFSET = TOTAL_UB_SIZE - 8 KiB); kernels must not.
constexpr uint32_t kSimApiUbReserveBytes = 8 * 1024;
struct CoreState {
  uint32_t blockIdx = 0;
  uint32_t blockNum = 1;
  // Filled with 0xFF (NaN in every float format): a lane the kernel reads before writing poisons the result.
  std::vector<uint8_t> ub = std::vector<uint8_t>(kSimUbBytes, 0xFF);
  uint32_t ubUsed = 0;
  std::barrier<>* barrier = nullptr;
  int32_t pendingFlags[static_cast<int>(HardEvent::MAX)][8] = {};
};
inline thread_local CoreState* g_core = nullptr;

inline int64_t GetBlockIdx() { return g_core->blockIdx; }
inline int64_t GetBlockNum() { return g_core->blockNum; }
template <pipe_t pipe> inline void PipeBarrier() {}
template <bool isAIVOnly = true> inline void SyncAll() { g_core->barrier->arrive_and_wait(); }
template <HardEvent event> inline void SetFlag(int32_t eventID) {
  ASIM_CHECK(eventID >= 0 && eventID < 8, "SetFlag: event id out of range");
  ++g_core->pendingFlags[static_cast<int>(event)][eventID];
}
template <HardEvent event> inline void WaitFlag(int32_t eventID) {
  ASIM_CHECK(eventID >= 0 && eventID < 8, "WaitFlag: event id out of range");
  int32_t& n = g_core->pendingFlags[static_cast<int>(event)][eventID];
  ASIM_CHECK(n > 0, "WaitFlag without a SetFlag of the same event and id before it");
  --n;
}

inline uint8_t* UbAlloc(uint32_t bytes) {
  const uint32_t aligned = (bytes + 31) / 32 * 32;
  ASIM_CHECK(g_core->ubUsed + aligned <= kSimUbBytes - kSimApiUbReserveBytes,
             "unified buffer overflow (InitBuffer total reaches the API's reserved top 8 KiB)");
  uint8_t* p = g_core->ub.data() + g_core->ubUsed;
  g_core->ubUsed += aligned;
  return p;
}

// ------------------------------------------------------------------------------------------------ tensors
template <typename T>
class LocalTensor {
 public:
  using PrimType = T;
  LocalTensor() = default;
  LocalTensor(T* p, uint64_t n) : p_(p), n_(n) {}
  LocalTensor operator[](const uint32_t off) const {
    ASIM_CHECK(off <= n_, "LocalTensor offset out of range");
    return LocalTensor(p_ + off, n_ - off);
  }
  T GetValue(const uint32_t i) const {
    ASIM_CHECK(i < n_, "LocalTensor::GetValue out of range");
    return p_[i];
  }
  template <typename S> void SetValue(const uint32_t i, const S v) const {
    ASIM_CHECK(i < n_, "LocalTensor::SetValue out of range");
    p_[i] = static_cast<T>(v);
  }
  template <typename U> LocalTensor<U> ReinterpretCast() const {
    return LocalTensor<U>(reinterpret_cast<U*>(p_), n_ * sizeof(T) / sizeof(U));
  }
  // Stand-in only (not AscendC API): raw access for the simulated instructions.
  T* data() const { return p_; }
  uint64_t size() const { return n_; }
  void need(uint64_t count, const char* what) const { ASIM_CHECK(count <= n_, what); }

 private:
  T* p_ = nullptr;
  uint64_t n_ = 0;
};

// When set (by a driver), DataCopy (not DataCopyPad) also requires 32 B aligned GM addresses.
inline bool g_checkGmAlign = false;

template <typename T>
class GlobalTensor {
 public:
  void SetGlobalBuffer(__gm__ T* p, uint64_t n) { p_ = p; n_ = n; }
  GlobalTensor operator[](const uint64_t off) const {
    ASIM_CHECK(off <= n_, "GlobalTensor offset out of range");
    GlobalTensor g;
    g.p_ = p_ + off;
    g.n_ = n_ - off;
    return g;
  }
  T GetValue(const uint64_t i) const { return p_[i]; }
  T* data() const { return p_; }
  uint64_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  uint64_t n_ = 0;
};

class TPipe;

template <TPosition pos, int32_t depth, auto mask = 0>
class TQue {
 public:
  template <typename T> LocalTensor<T> AllocTensor() {
    ASIM_CHECK(!free_.empty(), "TQue::AllocTensor with every buffer in use");
    uint8_t* p = free_.front();
    free_.pop_front();
    return LocalTensor<T>(reinterpret_cast<T*>(p), bytes_ / sizeof(T));
  }
  template <typename T> bool EnQue(const LocalTensor<T>& t) {
    queued_.push_back(reinterpret_cast<uint8_t*>(t.data()));
    return true;
  }
  template <typename T> LocalTensor<T> DeQue() {
    ASIM_CHECK(!queued_.empty(), "TQue::DeQue on an empty queue");
    uint8_t* p = queued_.front();
    queued_.pop_front();
    return LocalTensor<T>(reinterpret_cast<T*>(p), bytes_ / sizeof(T));
  }
  template <typename T> void FreeTensor(LocalTensor<T>& t) { free_.push_back(reinterpret_cast<uint8_t*>(t.data())); }

 private:
  friend class TPipe;
  void init(uint32_t num, uint32_t bytes) {
    ASIM_CHECK(num <= static_cast<uint32_t>(depth) || depth == 0, "TQue initialised with more buffers than its depth");
    for (uint32_t i = 0; i < num; ++i) free_.push_back(UbAlloc(bytes));
    bytes_ = bytes;
  }
  std::deque<uint8_t*> free_, queued_;
  uint32_t bytes_ = 0;
};

template <TPosition pos = TPosition::LCM>
class TBuf {
 public:
  template <typename T> LocalTensor<T> Get() { return LocalTensor<T>(reinterpret_cast<T*>(p_), bytes_ / sizeof(T)); }

 private:
  friend class TPipe;
  void init(uint32_t bytes) { p_ = UbAlloc(bytes); bytes_ = bytes; }
  uint8_t* p_ = nullptr;
  uint32_t bytes_ = 0;
};

template <typename Q> struct IsTQue : std::false_type {};
template <TPosition P, int32_t D, auto M> struct IsTQue<TQue<P, D, M>> : std::true_type {};

class TPipe {
 public:
  template <class T> bool InitBuffer(T& que, uint8_t num, uint32_t len) {
    static_assert(IsTQue<T>::value, "InitBuffer(que, num, len) takes a TQue");
    que.init(num, len);
    return true;
  }
  template <TPosition pos> bool InitBuffer(TBuf<pos>& buf, uint32_t len) {
    buf.init(len);
    return true;
  }
};

// ------------------------------------------------------------------------------------------- data moves
struct DataCopyExtParams {
  DataCopyExtParams() = default;
  DataCopyExtParams(const uint16_t count, const uint32_t len, const uint32_t srcStrideIn, const uint32_t dstStrideIn,
                    const uint32_t rsvIn)
      : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn), rsv(rsvIn) {}
  uint16_t blockCount = 1;
  uint32_t blockLen = 0;  // bytes
  uint32_t srcStride = 0;
  uint32_t dstStride = 0;
  uint32_t rsv = 0;
};
template <typename T> struct DataCopyPadExtParams {
  DataCopyPadExtParams() = default;
  DataCopyPadExtParams(const bool isPadValue, const uint8_t leftPadValue, const uint8_t rightPadValue, T padValue)
      : isPad(isPadValue), leftPadding(leftPadValue), rightPadding(rightPadValue), paddingValue(padValue) {}
  bool isPad = false;
  uint8_t leftPadding = 0;
  uint8_t rightPadding = 0;
  T paddingValue = 0;
};

template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const uint32_t count) {
  ASIM_CHECK((count * sizeof(T)) % 32 == 0, "DataCopy GM->UB of a length that is not a whole number of 32 B blocks");
  ASIM_CHECK(!g_checkGmAlign || reinterpret_cast<uintptr_t>(src.data()) % 32 == 0,
             "DataCopy GM->UB from a GM address that is not 32 B aligned");
  ASIM_CHECK(count <= src.size(), "DataCopy reads past its GlobalTensor");
  dst.need(count, "DataCopy overflows the local tensor");
  std::memcpy(dst.data(), src.data(), count * sizeof(T));
}
template <typename T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count) {
  ASIM_CHECK((count * sizeof(T)) % 32 == 0, "DataCopy UB->GM of a length that is not a whole number of 32 B blocks");
  ASIM_CHECK(!g_checkGmAlign || reinterpret_cast<uintptr_t>(dst.data()) % 32 == 0,
             "DataCopy UB->GM to a GM address that is not 32 B aligned");
  ASIM_CHECK(count <= dst.size(), "DataCopy writes past its GlobalTensor");
  std::memcpy(dst.data(), src.data(), count * sizeof(T));
}
template <typename T>
void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& p,
                 const DataCopyPadExtParams<T>&) {
  ASIM_CHECK(p.blockCount == 1 && p.blockLen % sizeof(T) == 0, "DataCopyPad: unexpected parameters");
  ASIM_CHECK(p.blockLen / sizeof(T) <= src.size(), "DataCopyPad reads past its GlobalTensor");
  dst.need(p.blockLen / sizeof(T), "DataCopyPad overflows the local tensor");
  std::memcpy(dst.data(), src.data(), p.blockLen);
}
template <typename T>
void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p) {
  ASIM_CHECK(p.blockCount == 1 && p.blockLen % sizeof(T) == 0, "DataCopyPad: unexpected parameters");
  ASIM_CHECK(p.blockLen / sizeof(T) <= dst.size(), "DataCopyPad writes past its GlobalTensor");
  std::memcpy(dst.data(), src.data(), p.blockLen);
}

// ----------------------------------------------------------------------------------------- vector math
// The real API's PrimT<T> is T for the plain element types used here.
template <typename T> using PrimT = T;

template <typename T, typename U>
void Cast(const LocalTensor<T>& dst, const LocalTensor<U>& src, const RoundMode& roundMode, const uint32_t count) {
  (void)roundMode;  // the stand-in's half/bfloat16 conversions round to nearest even; widening is exact
  dst.need(count, "Cast dst too small");
  src.need(count, "Cast src too small");
  for (uint32_t i = 0; i < count; ++i) dst.data()[i] = static_cast<T>(static_cast<float>(src.data()[i]));
}

template <typename T, typename U>
void CompareScalar(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const T src1Scalar, CMPMODE cmpMode,
                   uint32_t count) {
  static_assert(std::is_same<U, uint8_t>::value, "the stand-in models a uint8_t bit mask only");
  ASIM_CHECK((count * sizeof(T)) % 256 == 0, "CompareScalar count not a whole number of 256 B repeats");
  src0.need(count, "CompareScalar src too small");
  dst.need(count / 8, "CompareScalar mask too small");
  std::memset(dst.data(), 0, count / 8);
  for (uint32_t i = 0; i < count; ++i) {
    const T v = src0.data()[i];
    bool r = false;
    switch (cmpMode) {
      case CMPMODE::LT: r = v < src1Scalar; break;
      case CMPMODE::GT: r = v > src1Scalar; break;
      case CMPMODE::EQ: r = v == src1Scalar; break;
      case CMPMODE::LE: r = v <= src1Scalar; break;
      case CMPMODE::GE: r = v >= src1Scalar; break;
      case CMPMODE::NE: r = v != src1Scalar; break;
    }
    if (r) dst.data()[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
  }
}

template <typename T>
void Not(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count) {
  static_assert(std::is_same<T, uint16_t>::value || std::is_same<T, int16_t>::value, "Not: int16/uint16 on 910B");
  dst.need(count, "Not dst too small");
  for (int32_t i = 0; i < count; ++i) dst.data()[i] = static_cast<T>(~src.data()[i]);
}

template <typename T, typename U>
void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0, T src1,
            SELMODE selMode, uint32_t count) {
  ASIM_CHECK(selMode == SELMODE::VSEL_TENSOR_SCALAR_MODE, "Select: only tensor-scalar mode is simulated");
  dst.need(count, "Select dst too small");
  const auto* bits = reinterpret_cast<const uint8_t*>(selMask.data());
  ASIM_CHECK((count + 7) / 8 <= selMask.size() * sizeof(U), "Select mask too small");
  for (uint32_t i = 0; i < count; ++i) {
    const bool bit = (bits[i / 8] >> (i % 8)) & 1;
    dst.data()[i] = bit ? src0.data()[i] : src1;
  }
}

#define ASIM_UNARY(NAME, EXPR)                                                                    \
  template <typename T>                                                                           \
  void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count) {         \
    static_assert(std::is_same<T, float>::value, #NAME ": the stand-in models float32 only");     \
    dst.need(count, #NAME " dst too small");                                                      \
    src.need(count, #NAME " src too small");                                                      \
    for (int32_t i = 0; i < count; ++i) {                                                         \
      const T v = src.data()[i];                                                                  \
      dst.data()[i] = (EXPR);                                                                     \
    }                                                                                             \
  }
ASIM_UNARY(Ln, std::log(v))
ASIM_UNARY(Exp, std::exp(v))
ASIM_UNARY(Abs, std::fabs(v))

#define ASIM_BINARY(NAME, EXPR)                                                                             \
  template <typename T>                                                                                     \
  void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,              \
            const int32_t& count) {                                                                         \
    static_assert(std::is_same<T, float>::value, #NAME ": the stand-in models float32 only");               \
    dst.need(count, #NAME " dst too small");                                                                \
    src0.need(count, #NAME " src0 too small");                                                              \
    src1.need(count, #NAME " src1 too small");                                                              \
    for (int32_t i = 0; i < count; ++i) {                                                                   \
      const T a = src0.data()[i], b = src1.data()[i];                                                       \
      dst.data()[i] = (EXPR);                                                                               \
    }                                                                                                       \
  }
ASIM_BINARY(Add, a + b)
ASIM_BINARY(Sub, a - b)
ASIM_BINARY(Mul, a * b)
ASIM_BINARY(Div, a / b)
// vmax/vmin: the result for a NaN operand is hardware-defined; the kernels never rely on it.
ASIM_BINARY(Max, a > b ? a : b)
ASIM_BINARY(Min, a < b ? a : b)

// Level-2 scalar ops: both real overloads, `const T&` and `const U&` with U == PrimT<T>, so a scalar of another
// type (a double literal for a float tensor) matches neither, as with ccec.
#define ASIM_SCALAR(NAME, EXPR)                                                                         \
  template <typename T, bool isSetMask = true>                                                          \
  void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue,                 \
            const int32_t& count) {                                                                     \
    static_assert(std::is_same<T, float>::value, #NAME ": the stand-in models float32 only");           \
    dst.need(count, #NAME " dst too small");                                                            \
    src.need(count, #NAME " src too small");                                                            \
    for (int32_t i = 0; i < count; ++i) {                                                               \
      const T a = src.data()[i], s = scalarValue;                                                       \
      dst.data()[i] = (EXPR);                                                                           \
    }                                                                                                   \
  }                                                                                                     \
  template <typename T, typename U, bool isSetMask = true,                                              \
            typename std::enable_if<std::is_same<PrimT<T>, U>::value, bool>::type = true>               \
  void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const U& scalarValue,                 \
            const int32_t& count) {                                                                     \
    NAME<T, isSetMask>(dst, src, static_cast<const T&>(scalarValue), count);                            \
  }
ASIM_SCALAR(Adds, a + s)
ASIM_SCALAR(Muls, a * s)

template <typename T>
void Duplicate(const LocalTensor<T>& dst, const T& scalarValue, const int32_t& count) {
  dst.need(count, "Duplicate dst too small");
  for (int32_t i = 0; i < count; ++i) dst.data()[i] = scalarValue;
}

// Pairwise fold (the hardware's order is its own; the NumPy model uses the same pairwise tree).
template <typename T, bool isSetMask = true>
void ReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& sharedTmpBuffer,
               const int32_t count) {
  static_assert(std::is_same<T, float>::value, "ReduceSum: the stand-in models float32 only");
  sharedTmpBuffer.need((count + 63) / 64, "ReduceSum work area smaller than one float per 64-element repeat");
  src.need(count, "ReduceSum src too small");
  std::vector<float> v(src.data(), src.data() + count);
  while (v.size() > 1) {
    if (v.size() % 2) v.push_back(0.0f);
    std::vector<float> next(v.size() / 2);
    for (size_t i = 0; i < next.size(); ++i) next[i] = v[2 * i] + v[2 * i + 1];
    v.swap(next);
  }
  dst.data()[0] = v.empty() ? 0.0f : v[0];
}

// Maximum of the first `count` elements into dst[0] (calIndex = false: no index). A NaN element gives NaN.
template <typename T>
void ReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& sharedTmpBuffer,
               const int32_t count, bool calIndex = 0) {
  static_assert(std::is_same<T, float>::value, "ReduceMax: the stand-in models float32 only");
  ASIM_CHECK(!calIndex, "ReduceMax: calIndex is not simulated");
  ASIM_CHECK(count > 0, "ReduceMax of no elements");
  sharedTmpBuffer.need((count + 63) / 64, "ReduceMax work area smaller than one float per 64-element repeat");
  src.need(count, "ReduceMax src too small");
  T m = src.data()[0];
  for (int32_t i = 1; i < count; ++i) {
    const T v = src.data()[i];
    if (std::isnan(v) || v > m) m = v;
    if (std::isnan(m)) break;
  }
  dst.data()[0] = m;
}

}  // namespace AscendC

// Kernel-side glue the CANN build generates. The CANN build knows each kernel's TilingData type from its
// registration; a stand-in driver names it with ASIM_TILING_TYPE (one operator family per driver).
#ifndef ASIM_TILING_TYPE
#define ASIM_TILING_TYPE KlDivCustomTilingData
#endif
#define GET_TILING_DATA(name, ptr) \
  const ASIM_TILING_TYPE name = *reinterpret_cast<const ASIM_TILING_TYPE*>(ptr)
#define TILING_KEY_IS(k) ((k) == 1)
inline GM_ADDR GetUserWorkspace(GM_ADDR ws) { return ws; }
