// Pieces shared by the SparseDistillCustom and SparseDistillCustomGrad AscendC kernels (distillation from a stored
// teacher: the student's logits s [rows, V] against the teacher's K ids (int32, negative: padding) and float32
// values per row).
//
// The math is custom_ops/common/sparse_math.h (the C++/CUDA kernels' single source; ms_kldiv/reference.py
// `sparse_support` the float64 definition), which AscendC cannot include: its scalar double math (exp, log) has no
// counterpart on the scalar unit, so the per-row statistics are computed here in float32 on the vector unit, over
// "id lanes": lane i < K is the i-th id's bucket, lane K the tail bucket (every class off the ids), lanes past K
// are empty (-inf in both models). With x = (s - max) / T,
//   log r_i = x[id_i] - log Z,   log r_tail = log Z_off - log Z,
//   y_i = ratio v_i,  y_tail = ratio log(1 - sum_i e^(v_i)) ('tail' and Z_off > 0; else -inf),
//   log q = y - log Q,  log Q = lse(y over the K + 1 buckets),
// and per bucket (sparse::bucket) the divergence term and a = r dD/dr:
//   forward KL: term = q (log q - log r), a = -q
//   reverse KL: term = a = r (log r - log q)
//   JSD:        a = (1 - beta) r (log r - log M), b = beta q (log q - log M), term = a + b,
//               log M = logaddexp(log q + log beta, log r + log(1 - beta))
// with 0 where the weighting probability is 0. Stats (sparse::Stat): loss = T^2 sum(term), the max (exponent base),
// log Z, log Z_off, A = sum(a), a_tail, log Q. A row with an id >= V, a repeated id or no teacher distribution has
// NaN loss and NaN A. Gradient of g T^2 D: off the ids g T (a_tail e^(x - log Z_off) - A e^(x - log Z)); at id i
// g T (a_i - r_i A).
#ifndef SPARSE_COMMON_H_
#define SPARSE_COMMON_H_

#include "distill_common.h"  // KlLanes, LogMixture, VectorToScalar/ScalarToVector, tile_io
#include "sparse_tiling_plan.h"

namespace sparse_kernel {

using namespace AscendC;
using namespace tile_io;
using distill_kernel::KlLanes;
using distill_kernel::LogMixture;
using distill_kernel::ScalarToVector;
using distill_kernel::VectorToScalar;

constexpr float kNaN = __builtin_nanf("");
// Marks an id's lane in a tile of exponentials (which are >= 0 or NaN): seen twice, the id is repeated.
constexpr float kIdMark = -1.0f;

// dst = float32(src), exactly (the raw logits: x is formed as (s - max) / T, the subtraction first).
template <typename T>
__aicore__ inline void RawFloat(const LocalTensor<float>& dst, const LocalTensor<T>& src, uint32_t count) {
  if constexpr (IsSameType<T, float>::value) {
    Muls(dst, src, 1.0f, count);
  } else {
    Cast(dst, src, RoundMode::CAST_NONE, count);
  }
}

// out = IO dtype of w (rounded once, to nearest even, from float32).
template <typename T>
__aicore__ inline void ToIo(const LocalTensor<T>& out, const LocalTensor<float>& w, uint32_t count) {
  if constexpr (IsSameType<T, float>::value) {
    Muls(out, w, 1.0f, count);
  } else {
    Cast(out, w, RoundMode::CAST_RINT, count);
  }
}

// The hyperparameters and the shapes every sparse kernel reads from the tiling data, and the core's rows.
struct SparseParams {
  template <typename TilingData>
  __aicore__ inline void Init(const TilingData& td) {
    rows = td.rows;
    vocab = td.vocab;
    tile = td.tileLength;
    ids = td.ids;
    lanes = td.idLanes;
    kind = td.kind;
    tail = td.tail != 0;
    invT = td.invTemperature;
    temperature = td.temperature;
    tSquared = td.tSquared;
    ratio = td.ratio;
    beta = td.beta;
    logBeta = td.logBeta;
    log1mBeta = td.log1mBeta;
    sparse_tiling::RowRange(td.baseRows, td.remRows, static_cast<uint32_t>(GetBlockIdx()), &rowStart, &rowCount);
  }

  // Elements of tile i of a row.
  __aicore__ inline uint32_t Valid(uint64_t i) const {
    const uint64_t off = i * tile;
    return static_cast<uint32_t>(vocab - off < tile ? vocab - off : tile);
  }

  uint64_t rows = 0, vocab = 0, rowStart = 0, rowCount = 0;
  uint32_t tile = 0, ids = 0, lanes = 0, kind = 0;
  bool tail = false;
  float invT = 1.0f, temperature = 1.0f, tSquared = 1.0f, ratio = 1.0f, beta = 0.0f, logBeta = 0.0f,
        log1mBeta = 0.0f;
};

// The row's ids and values, read from GM into id lanes (ids int32, values float32, `lanes` each).
struct RowIds {
  __aicore__ inline void Init(TPipe& pipe, GM_ADDR ids, GM_ADDR values, const SparseParams& p) {
    k = p.ids;
    idsGm.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(ids), p.rows * k);
    valsGm.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(values), p.rows * k);
    pipe.InitBuffer(idsBuf, p.lanes * sizeof(int32_t));
    pipe.InitBuffer(valsBuf, p.lanes * sizeof(float));
  }

  // Loads row `row`'s K ids and values; the scalar and vector units may read them afterwards. The previous row's
  // reads of the buffers finish first.
  __aicore__ inline void Load(uint64_t row) {
    SetFlag<HardEvent::V_MTE2>(0);
    WaitFlag<HardEvent::V_MTE2>(0);
    SetFlag<HardEvent::S_MTE2>(0);
    WaitFlag<HardEvent::S_MTE2>(0);
    LoadTile(Ids(), idsGm, row * k, k);
    LoadTile(Vals(), valsGm, row * k, k);
    SetFlag<HardEvent::MTE2_S>(0);
    WaitFlag<HardEvent::MTE2_S>(0);
    SetFlag<HardEvent::MTE2_V>(0);
    WaitFlag<HardEvent::MTE2_V>(0);
  }

  __aicore__ inline LocalTensor<int32_t> Ids() { return idsBuf.Get<int32_t>(); }
  __aicore__ inline LocalTensor<float> Vals() { return valsBuf.Get<float>(); }

  GlobalTensor<int32_t> idsGm;
  GlobalTensor<float> valsGm;
  TBuf<TPosition::VECCALC> idsBuf, valsBuf;
  uint32_t k = 0;
};

// a (and, withTerm, the divergence term) of each lane from log r (lr) and log q (lq) (see the header comment); lm
// and p are temporaries. lr, lq are left unchanged; every buffer distinct.
__aicore__ inline void BucketLanes(const SparseParams& h, const LocalTensor<float>& a, const LocalTensor<float>& term,
                                   bool withTerm, const LocalTensor<float>& lr, const LocalTensor<float>& lq,
                                   const LocalTensor<float>& lm, const LocalTensor<float>& p,
                                   const LocalTensor<uint8_t>& mask, uint32_t count) {
  if (h.kind == sparse_tiling::kForwardKL) {
    // term = q (log q - log r) (0 where q = 0), p = q; a = -q
    if (withTerm) {
      KlLanes(term, p, lq, lr, 0.0f, mask, count);
    } else {
      Exp(p, lq, count);
    }
    Muls(a, p, -1.0f, count);
  } else if (h.kind == sparse_tiling::kReverseKL) {
    KlLanes(a, p, lr, lq, 0.0f, mask, count);  // a = term = r (log r - log q), 0 where r = 0
    if (withTerm) Muls(term, a, 1.0f, count);
  } else {
    LogMixture(lm, lr, lq, a, p, h.logBeta, h.log1mBeta, count);  // a, p: temporaries here
    KlLanes(a, p, lr, lm, 0.0f, mask, count);
    Muls(a, a, 1.0f - h.beta, count);
    if (withTerm) {
      KlLanes(term, p, lq, lm, 0.0f, mask, count);
      Muls(term, term, h.beta, count);
      Add(term, term, a, count);
    }
  }
}

}  // namespace sparse_kernel

#endif  // SPARSE_COMMON_H_
