// A CPU stand-in for the subset of the AscendC kernel API that op_kernel/*.cpp uses, written for this project
// from the documented semantics, so the kernel SOURCES can be compiled with g++ and executed on a CPU:
// each vector core is a thread with its own 192 KiB "unified buffer", SyncAll is a thread barrier.
//
// It checks, rather than trusts, the constraints the kernels must respect on real hardware:
//   * every UB allocation of a core fits its unified buffer, 32 B aligned;
//   * DataCopy moves whole 32 B blocks only (ragged transfers must use DataCopyPad);
//   * CompareScalar counts cover whole 256 B repeats;
//   * a TQue never hands out more buffers than it was initialised with, and DeQue follows EnQue.
// A violated constraint throws; the driver stops that core, reports the message, and the launch fails.
// Not modelled: pipelining and its events (everything here is sequential, so a missing barrier is not
// detected), hardware Ln/Exp accuracy (libm float functions), performance.
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

enum class TPosition { VECIN, VECOUT, VECCALC };
using QuePosition = TPosition;
enum class RoundMode { CAST_NONE, CAST_RINT, CAST_ROUND, CAST_FLOOR, CAST_CEIL, CAST_TRUNC };
enum class CMPMODE { LT, GT, EQ, LE, GE, NE };
enum class SELMODE { VSEL_CMPMASK_SPR, VSEL_TENSOR_SCALAR_MODE, VSEL_TENSOR_TENSOR_MODE };
enum pipe_t { PIPE_S, PIPE_V, PIPE_MTE2, PIPE_MTE3, PIPE_ALL };

// ---------------------------------------------------------------------------------------- per-core state
constexpr uint32_t kSimUbBytes = 192 * 1024;
struct CoreState {
  uint32_t blockIdx = 0;
  uint32_t blockNum = 1;
  // Filled with 0xFF (NaN in every float format): a lane the kernel reads before writing poisons the result.
  std::vector<uint8_t> ub = std::vector<uint8_t>(kSimUbBytes, 0xFF);
  uint32_t ubUsed = 0;
  std::barrier<>* barrier = nullptr;
};
inline thread_local CoreState* g_core = nullptr;

inline uint32_t GetBlockIdx() { return g_core->blockIdx; }
inline uint32_t GetBlockNum() { return g_core->blockNum; }
template <pipe_t P> inline void PipeBarrier() {}
inline void SyncAll() { g_core->barrier->arrive_and_wait(); }

inline uint8_t* UbAlloc(uint32_t bytes) {
  const uint32_t aligned = (bytes + 31) / 32 * 32;
  ASIM_CHECK(g_core->ubUsed + aligned <= g_core->ub.size(), "unified buffer overflow (InitBuffer total > UB size)");
  uint8_t* p = g_core->ub.data() + g_core->ubUsed;
  g_core->ubUsed += aligned;
  return p;
}

// ------------------------------------------------------------------------------------------------ tensors
template <typename T>
class LocalTensor {
 public:
  LocalTensor() = default;
  LocalTensor(T* p, uint64_t n) : p_(p), n_(n) {}
  LocalTensor operator[](uint64_t off) const {
    ASIM_CHECK(off <= n_, "LocalTensor offset out of range");
    return LocalTensor(p_ + off, n_ - off);
  }
  T GetValue(uint64_t i) const {
    ASIM_CHECK(i < n_, "LocalTensor::GetValue out of range");
    return p_[i];
  }
  void SetValue(uint64_t i, T v) const {
    ASIM_CHECK(i < n_, "LocalTensor::SetValue out of range");
    p_[i] = v;
  }
  template <typename U> LocalTensor<U> ReinterpretCast() const {
    return LocalTensor<U>(reinterpret_cast<U*>(p_), n_ * sizeof(T) / sizeof(U));
  }
  T* data() const { return p_; }
  uint64_t size() const { return n_; }
  void need(uint64_t count, const char* what) const { ASIM_CHECK(count <= n_, what); }

 private:
  T* p_ = nullptr;
  uint64_t n_ = 0;
};

template <typename T>
class GlobalTensor {
 public:
  void SetGlobalBuffer(T* p, uint64_t n) { p_ = p; n_ = n; }
  GlobalTensor operator[](uint64_t off) const {
    ASIM_CHECK(off <= n_, "GlobalTensor offset out of range");
    GlobalTensor g;
    g.p_ = p_ + off;
    g.n_ = n_ - off;
    return g;
  }
  T GetValue(uint64_t i) const { return p_[i]; }
  T* data() const { return p_; }
  uint64_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  uint64_t n_ = 0;
};

template <TPosition P, int Depth>
class TQue {
 public:
  void init(uint32_t num, uint32_t bytes) {
    ASIM_CHECK(num <= static_cast<uint32_t>(Depth) || Depth == 0, "TQue initialised with more buffers than its depth");
    for (uint32_t i = 0; i < num; ++i) free_.push_back(UbAlloc(bytes));
    bytes_ = bytes;
  }
  template <typename T> LocalTensor<T> AllocTensor() {
    ASIM_CHECK(!free_.empty(), "TQue::AllocTensor with every buffer in use");
    uint8_t* p = free_.front();
    free_.pop_front();
    return LocalTensor<T>(reinterpret_cast<T*>(p), bytes_ / sizeof(T));
  }
  template <typename T> void EnQue(const LocalTensor<T>& t) { queued_.push_back(reinterpret_cast<uint8_t*>(t.data())); }
  template <typename T> LocalTensor<T> DeQue() {
    ASIM_CHECK(!queued_.empty(), "TQue::DeQue on an empty queue");
    uint8_t* p = queued_.front();
    queued_.pop_front();
    return LocalTensor<T>(reinterpret_cast<T*>(p), bytes_ / sizeof(T));
  }
  template <typename T> void FreeTensor(const LocalTensor<T>& t) { free_.push_back(reinterpret_cast<uint8_t*>(t.data())); }

 private:
  std::deque<uint8_t*> free_, queued_;
  uint32_t bytes_ = 0;
};

template <TPosition P>
class TBuf {
 public:
  void init(uint32_t bytes) { p_ = UbAlloc(bytes); bytes_ = bytes; }
  template <typename T> LocalTensor<T> Get() const { return LocalTensor<T>(reinterpret_cast<T*>(p_), bytes_ / sizeof(T)); }

 private:
  uint8_t* p_ = nullptr;
  uint32_t bytes_ = 0;
};

class TPipe {
 public:
  template <TPosition P, int D> void InitBuffer(TQue<P, D>& q, uint32_t num, uint32_t bytes) { q.init(num, bytes); }
  template <TPosition P> void InitBuffer(TBuf<P>& b, uint32_t bytes) { b.init(bytes); }
};

// ------------------------------------------------------------------------------------------- data moves
struct DataCopyExtParams {
  uint16_t blockCount;
  uint32_t blockLen;  // bytes
  uint32_t srcStride;
  uint32_t dstStride;
  uint32_t rsv;
};
template <typename T> struct DataCopyPadExtParams {
  bool isPad;
  uint8_t leftPadding;
  uint8_t rightPadding;
  T paddingValue;
};

template <typename T> void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, uint32_t count) {
  ASIM_CHECK((count * sizeof(T)) % 32 == 0, "DataCopy GM->UB of a length that is not a whole number of 32 B blocks");
  ASIM_CHECK(count <= src.size(), "DataCopy reads past its GlobalTensor");
  dst.need(count, "DataCopy overflows the local tensor");
  std::memcpy(dst.data(), src.data(), count * sizeof(T));
}
template <typename T> void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count) {
  ASIM_CHECK((count * sizeof(T)) % 32 == 0, "DataCopy UB->GM of a length that is not a whole number of 32 B blocks");
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
template <typename D, typename S> void Cast(const LocalTensor<D>& dst, const LocalTensor<S>& src, RoundMode,
                                            uint32_t count) {
  dst.need(count, "Cast dst too small");
  src.need(count, "Cast src too small");
  for (uint32_t i = 0; i < count; ++i) dst.data()[i] = static_cast<D>(static_cast<float>(src.data()[i]));
}

inline void CompareScalar(const LocalTensor<uint8_t>& dst, const LocalTensor<float>& src, float s, CMPMODE mode,
                          uint32_t count) {
  ASIM_CHECK((count * sizeof(float)) % 256 == 0, "CompareScalar count not a whole number of 256 B repeats");
  src.need(count, "CompareScalar src too small");
  dst.need(count / 8, "CompareScalar mask too small");
  std::memset(dst.data(), 0, count / 8);
  for (uint32_t i = 0; i < count; ++i) {
    const float v = src.data()[i];
    bool r = false;
    switch (mode) {
      case CMPMODE::LT: r = v < s; break;
      case CMPMODE::GT: r = v > s; break;
      case CMPMODE::EQ: r = v == s; break;
      case CMPMODE::LE: r = v <= s; break;
      case CMPMODE::GE: r = v >= s; break;
      case CMPMODE::NE: r = v != s; break;
    }
    if (r) dst.data()[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
  }
}

inline void Not(const LocalTensor<uint16_t>& dst, const LocalTensor<uint16_t>& src, uint32_t count) {
  dst.need(count, "Not dst too small");
  for (uint32_t i = 0; i < count; ++i) dst.data()[i] = static_cast<uint16_t>(~src.data()[i]);
}

inline void Select(const LocalTensor<float>& dst, const LocalTensor<uint8_t>& mask, const LocalTensor<float>& src0,
                   float src1, SELMODE mode, uint32_t count) {
  ASIM_CHECK(mode == SELMODE::VSEL_TENSOR_SCALAR_MODE, "Select: only tensor-scalar mode is simulated");
  dst.need(count, "Select dst too small");
  mask.need((count + 7) / 8, "Select mask too small");
  for (uint32_t i = 0; i < count; ++i) {
    const bool bit = (mask.data()[i / 8] >> (i % 8)) & 1;
    dst.data()[i] = bit ? src0.data()[i] : src1;
  }
}

#define ASIM_UNARY(NAME, EXPR)                                                                  \
  inline void NAME(const LocalTensor<float>& dst, const LocalTensor<float>& src, uint32_t count) { \
    dst.need(count, #NAME " dst too small");                                                    \
    for (uint32_t i = 0; i < count; ++i) {                                                      \
      const float v = src.data()[i];                                                            \
      dst.data()[i] = (EXPR);                                                                   \
    }                                                                                           \
  }
ASIM_UNARY(Ln, std::log(v))
ASIM_UNARY(Exp, std::exp(v))

#define ASIM_BINARY(NAME, OP)                                                                        \
  inline void NAME(const LocalTensor<float>& dst, const LocalTensor<float>& a, const LocalTensor<float>& b, \
                   uint32_t count) {                                                                 \
    dst.need(count, #NAME " dst too small");                                                         \
    for (uint32_t i = 0; i < count; ++i) dst.data()[i] = a.data()[i] OP b.data()[i];                 \
  }
ASIM_BINARY(Add, +)
ASIM_BINARY(Sub, -)
ASIM_BINARY(Mul, *)

inline void Muls(const LocalTensor<float>& dst, const LocalTensor<float>& src, float s, uint32_t count) {
  dst.need(count, "Muls dst too small");
  for (uint32_t i = 0; i < count; ++i) dst.data()[i] = src.data()[i] * s;
}
inline void Adds(const LocalTensor<float>& dst, const LocalTensor<float>& src, float s, uint32_t count) {
  dst.need(count, "Adds dst too small");
  for (uint32_t i = 0; i < count; ++i) dst.data()[i] = src.data()[i] + s;
}
template <typename T> void Duplicate(const LocalTensor<T>& dst, T v, uint32_t count) {
  dst.need(count, "Duplicate dst too small");
  for (uint32_t i = 0; i < count; ++i) dst.data()[i] = v;
}
// Pairwise fold (the hardware's order is its own; the NumPy model uses the same pairwise tree).
inline void ReduceSum(const LocalTensor<float>& dst, const LocalTensor<float>& src, const LocalTensor<float>& work,
                      uint32_t count) {
  work.need(count / 64, "ReduceSum work area smaller than one float per 64-element repeat");
  std::vector<float> v(src.data(), src.data() + count);
  while (v.size() > 1) {
    if (v.size() % 2) v.push_back(0.0f);
    std::vector<float> next(v.size() / 2);
    for (size_t i = 0; i < next.size(); ++i) next[i] = v[2 * i] + v[2 * i + 1];
    v.swap(next);
  }
  dst.data()[0] = v.empty() ? 0.0f : v[0];
}

}  // namespace AscendC

// Kernel-side glue the CANN build generates.
#define GET_TILING_DATA(name, ptr) \
  const KlDivCustomTilingData name = *reinterpret_cast<const KlDivCustomTilingData*>(ptr)
#define TILING_KEY_IS(k) ((k) == 1)
inline GM_ADDR GetUserWorkspace(GM_ADDR ws) { return ws; }
