// SparseDistillCustom forward kernel (AscendC, vector cores): per row of student logits [rows, V] and the stored
// teacher's K ids and values, the row statistics of custom_ops/common/sparse_math.h (loss, max, log Z, log Z_off,
// A, a_tail, log Q), with no [rows, V] intermediate.
//
// Rows are split over the cores (sparse_tiling_plan.h RowRange). A row is read once, in vocabulary tiles through a
// double-buffered queue: an online max (raw units) and two sums of e^x, Z over every class and Z_off over the
// classes off the row's ids. Z_off is formed directly: each tile's exponentials have the ids' lanes marked
// (kIdMark) by the scalar unit, then selected to 0 before the second sum, never Z minus the ids' terms. The mark
// also finds a repeated id (its lane is marked already), and the raw logit at each id is kept as the tile passes
// (the "K gathers" cost no extra GM reads). Then the K + 1 buckets' math on the id lanes (sparse_common.h).
// Everything is float32 inside. Scalar work per tile: one look at each of the K ids.
//
// A confident student: where the classes off the ids lie ~87 T or more below the row's maximum (which sits on an
// id), their exponentials relative to it underflow float32 and Z_off reads as 0, which would drop the tail bucket
// and the teacher's tail mass with it. Rows whose Z_off falls below kTailRescue read their logits a second time
// (OffIdsLogZ) and sum the classes off the ids relative to their own maximum: log Z_off = x_off + log Z_off', a
// float32 log even where Z_off itself is no float32. That keeps the float64 definition's whole range (its tail
// vanishes below log r_tail ~ -745, float64's smallest positive value; so does the kernel's), with log Z_off as
// exact as x = (s - max) / T is in float32. The backward's tail term e^(x - log Z_off) takes it as it is. Other
// rows read their logits once, as before.
#include "sparse_common.h"

using namespace AscendC;
using namespace sparse_kernel;

template <typename T>
class SparseForward {
 public:
  __aicore__ inline SparseForward() {}

  __aicore__ inline void Init(GM_ADDR student, GM_ADDR ids, GM_ADDR values, GM_ADDR stats,
                              const SparseDistillCustomTilingData& td) {
    h_.Init(td);
    sGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(student), h_.rows * h_.vocab);
    statsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(stats), h_.rows * sparse_tiling::kStatsStride);
    const uint32_t tile = h_.tile, lanes = h_.lanes;
    pipe_.InitBuffer(inQue_, sparse_tiling::kBufferNum, tile * sizeof(T));
    pipe_.InitBuffer(rawBuf_, tile * sizeof(float));
    pipe_.InitBuffer(expBuf_, tile * sizeof(float));
    pipe_.InitBuffer(maskBuf_, tile / 8);
    pipe_.InitBuffer(workBuf_, (tile / 32 + sparse_tiling::kReduceWorkFixedFloats) * sizeof(float));
    pipe_.InitBuffer(scalarBuf_, sparse_tiling::kScalarFloats * sizeof(float));
    pipe_.InitBuffer(statBuf_, sparse_tiling::kStatsStride * sizeof(float));
    row_.Init(pipe_, ids, values, h_);
    pipe_.InitBuffer(xBuf_, lanes * sizeof(float));
    pipe_.InitBuffer(lmBuf_, lanes * sizeof(float));
    pipe_.InitBuffer(pBuf_, lanes * sizeof(float));
    pipe_.InitBuffer(aBuf_, lanes * sizeof(float));
    pipe_.InitBuffer(termBuf_, lanes * sizeof(float));
    pipe_.InitBuffer(laneMaskBuf_, lanes / 8);
    work_ = workBuf_.Get<float>();
    sc_ = scalarBuf_.Get<float>();
  }

  __aicore__ inline void Process() {
    for (uint64_t r = 0; r < h_.rowCount; ++r) Row(h_.rowStart + r);
  }

 private:
  // Slots of scalarBuf_ (32 B apart, so every vector result starts a block).
  static constexpr uint32_t kMaxSlot = 0, kZ = 8, kZOff = 16, kA = 24, kD = 32, kFn = 40;
  // Below this the sweep's Z_off has lost terms to underflow (each < 2^-126, flushed on the device): above it,
  // what is lost weighs less than V 2^-62 of it, and the sweep's Z_off stands.
  static constexpr float kTailRescue = 0x1p-64f;
  // log of float64's smallest positive value: the float64 definition's tail mass e^(log r_tail) is 0 below it.
  static constexpr float kF64LogMin = -745.1332191f;

  // f(v) of one scalar through the vector unit (the scalar unit has no exp or log): Exp (ln = false) or Ln.
  __aicore__ inline float VectorFn(float v, bool ln) {
    sc_.SetValue(kFn, v);
    ScalarToVector();
    if (ln) {
      Ln(sc_[kFn], sc_[kFn], 8);
    } else {
      Exp(sc_[kFn], sc_[kFn], 8);
    }
    VectorToScalar();
    return sc_.GetValue(kFn);
  }

  // log of a sum of exponentials (>= 0, or NaN): -inf for 0, without asking the vector unit for Ln(0).
  __aicore__ inline float LogSum(float z) { return z == 0.0f ? kNegInf : VectorFn(z, true); }

  // log sum_{lanes < count} e^(v) of a lane buffer (p: temporary); -inf when every lane is -inf, NaN for a NaN lane.
  __aicore__ inline float LaneLse(const LocalTensor<float>& v, const LocalTensor<float>& p, uint32_t count) {
    ReduceMax(sc_[kMaxSlot], v, work_, count);
    VectorToScalar();
    const float hi = sc_.GetValue(kMaxSlot);
    if (!(hi > kNegInf)) return hi;  // -inf (no mass) or NaN
    Adds(p, v, -hi, h_.lanes);
    Exp(p, p, h_.lanes);
    ReduceSum(sc_[kZ], p, work_, count);
    VectorToScalar();
    return hi + LogSum(sc_.GetValue(kZ));
  }

  __aicore__ inline void Row(uint64_t row) {
    LocalTensor<int32_t> ids = row_.Ids();
    LocalTensor<float> v = row_.Vals();
    LocalTensor<float> x = xBuf_.Get<float>();
    const uint32_t k = h_.ids, lanes = h_.lanes;
    row_.Load(row);
    // The logits at the ids: -inf until a tile holds them (padding and ids >= V stay -inf, and are never read).
    Duplicate(x, kNegInf, lanes);
    VectorToScalar();
    bool bad = false;
    for (uint32_t i = 0; i < k; ++i) {
      const int32_t id = ids.GetValue(i);
      if (id < 0) {
        v.SetValue(i, kNegInf);  // padding: an empty bucket in both models
      } else if (static_cast<uint64_t>(id) >= h_.vocab) {
        bad = true;
      }
    }
    for (uint32_t i = k; i < lanes; ++i) v.SetValue(i, kNegInf);

    // One walk over the row: online max (raw units) and the sums Z, Z_off of e^((s - max) / T).
    float m = kNegInf, z = 0.0f, zOff = 0.0f;
    const uint64_t tiles = sparse_tiling::TileCount(h_.vocab, h_.tile);
    Prefetch(row, 0, tiles);
    for (uint64_t t = 0; t < tiles; ++t) {
      const uint32_t n = h_.Valid(t);
      const uint32_t count = sparse_tiling::ComputeCount(n);
      LocalTensor<float> raw = TileAsFloat(row, t, tiles, count);
      LocalTensor<float> e = expBuf_.Get<float>();
      ReduceMax(sc_[kMaxSlot], raw, work_, n);
      VectorToScalar();
      const float tileMax = sc_.GetValue(kMaxSlot);
      // Both sums move to a grown maximum: factor e^((m - m') / T) (1 while nothing had mass: the sums are 0).
      float shift = 0.0f;
      if (tileMax > m) {
        if (m != kNegInf) shift = (m - tileMax) * h_.invT;
        m = tileMax;
      }
      const float base = m == kNegInf ? 0.0f : m;
      sc_.SetValue(kFn, shift);
      ScalarToVector();
      Exp(sc_[kFn], sc_[kFn], 8);
      Adds(e, raw, -base, count);
      Muls(e, e, h_.invT, count);
      Exp(e, e, count);
      ReduceSum(sc_[kZ], e, work_, n);
      VectorToScalar();
      // The ids of this tile: keep their raw logits, mark their exponentials (a second mark: a repeated id).
      const uint64_t b0 = t * h_.tile;
      for (uint32_t i = 0; i < k; ++i) {
        const int32_t id = ids.GetValue(i);
        if (id < 0 || static_cast<uint64_t>(id) < b0 || static_cast<uint64_t>(id) - b0 >= n) continue;
        const uint32_t c = static_cast<uint32_t>(static_cast<uint64_t>(id) - b0);
        x.SetValue(i, raw.GetValue(c));
        if (e.GetValue(c) == kIdMark) bad = true;
        e.SetValue(c, kIdMark);
      }
      ScalarToVector();
      LocalTensor<uint8_t> mask = maskBuf_.Get<uint8_t>();
      CompareScalar(mask, e, kIdMark, CMPMODE::NE, count);
      Select(e, mask, e, 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, count);
      ReduceSum(sc_[kZOff], e, work_, n);
      VectorToScalar();
      const float f = sc_.GetValue(kFn);
      z = z * f + sc_.GetValue(kZ);
      zOff = zOff * f + sc_.GetValue(kZOff);
    }
    const float base = m == kNegInf ? 0.0f : m;
    const float logZ = LogSum(z);
    // A NaN Z_off is no rescue case (the comparison fails); a bad row's loss is NaN whatever its tail.
    const float logZOff = !bad && m != kNegInf && zOff < kTailRescue ? OffIdsLogZ(row, base, logZ) : LogSum(zOff);

    // The teacher's tail logit: ratio log(1 - sum_i e^(v_i)) over the non-padding ids (-inf without a tail).
    LocalTensor<float> lm = lmBuf_.Get<float>();
    LocalTensor<float> p = pBuf_.Get<float>();
    LocalTensor<float> a = aBuf_.Get<float>();
    LocalTensor<float> term = termBuf_.Get<float>();
    ScalarToVector();
    float yTail = kNegInf;
    if (h_.tail && logZOff != kNegInf) {
      const float kept = LaneLse(v, p, k);
      const float missing = 1.0f - VectorFn(kept < 0.0f ? kept : 0.0f, false);
      yTail = h_.ratio * LogSum(missing > 0.0f ? missing : 0.0f);
    }
    // Student: log r = (s - max) / T - log Z at the ids; teacher: y = ratio v. Lane K: the tail bucket.
    Adds(x, x, -base, lanes);
    Muls(x, x, h_.invT, lanes);
    Adds(x, x, -logZ, lanes);
    Muls(v, v, h_.ratio, lanes);
    VectorToScalar();
    x.SetValue(k, logZOff - logZ);
    v.SetValue(k, yTail);
    ScalarToVector();
    const float logQ = LaneLse(v, p, k + 1);
    bad = bad || !(logQ > kNegInf);  // no teacher distribution (every id padding, no tail): NaN, as dense
    Adds(v, v, -logQ, lanes);  // log q
    BucketLanes(h_, a, term, true, x, v, lm, p, laneMaskBuf_.Get<uint8_t>(), lanes);
    if (h_.kind == sparse_tiling::kReverseKL && yTail == kNegInf && logZOff != kNegInf) {
      // The student's tail r > 0 against no teacher tail: r (log r - log q) = +inf, as in the definition. Where r
      // underflows float32 (a tail from OffIdsLogZ: log r finite, e^(log r) = 0) the lane read 0 * inf = NaN.
      VectorToScalar();
      term.SetValue(k, distill_kernel::kPosInf);
      a.SetValue(k, distill_kernel::kPosInf);
      ScalarToVector();
    }
    ReduceSum(sc_[kD], term, work_, k + 1);
    ReduceSum(sc_[kA], a, work_, k + 1);
    VectorToScalar();
    const float d = sc_.GetValue(kD);
    const float bigA = sc_.GetValue(kA);
    const float aTail = logZOff == kNegInf ? 0.0f : a.GetValue(k);
    WriteStats(row, bad ? kNaN : h_.tSquared * d, base, logZ, logZOff, bad ? kNaN : bigA, aTail, logQ);
  }

  // log Z_off of a row whose sweep lost it to underflow: a second read of the row, each tile's x = (s - base) / T
  // formed as the backward forms it (so its tail terms e^(x - log Z_off) add up to 1 over the classes off the ids),
  // the ids' lanes set to -inf, an online maximum x_off of the rest and their sum Z_off' of e^(x - x_off) (the
  // first pass's scheme), then log Z_off = x_off + log Z_off'. -inf when no class off the ids has mass, or where
  // the definition's tail is 0 in float64 (x_off - log Z below kF64LogMin).
  __aicore__ inline float OffIdsLogZ(uint64_t row, float base, float logZ) {
    LocalTensor<int32_t> ids = row_.Ids();
    float hi = kNegInf, zo = 0.0f;
    const uint64_t tiles = sparse_tiling::TileCount(h_.vocab, h_.tile);
    Prefetch(row, 0, tiles);
    for (uint64_t t = 0; t < tiles; ++t) {
      const uint32_t n = h_.Valid(t);
      const uint32_t count = sparse_tiling::ComputeCount(n);
      LocalTensor<float> raw = TileAsFloat(row, t, tiles, count);
      LocalTensor<float> e = expBuf_.Get<float>();
      Adds(e, raw, -base, count);
      Muls(e, e, h_.invT, count);
      VectorToScalar();
      const uint64_t b0 = t * h_.tile;
      for (uint32_t i = 0; i < h_.ids; ++i) {
        const int32_t id = ids.GetValue(i);
        if (id < 0 || static_cast<uint64_t>(id) < b0 || static_cast<uint64_t>(id) - b0 >= n) continue;
        e.SetValue(static_cast<uint32_t>(static_cast<uint64_t>(id) - b0), kNegInf);
      }
      ScalarToVector();
      ReduceMax(sc_[kMaxSlot], e, work_, n);
      VectorToScalar();
      const float tileMax = sc_.GetValue(kMaxSlot);
      float shift = 0.0f;  // the sum moves to a grown maximum, as in the first pass
      if (tileMax > hi) {
        if (hi != kNegInf) shift = hi - tileMax;
        hi = tileMax;
      }
      if (hi == kNegInf) continue;  // no class off the ids with mass yet: the sum stays 0
      sc_.SetValue(kFn, shift);
      ScalarToVector();
      Exp(sc_[kFn], sc_[kFn], 8);
      Adds(e, e, -hi, count);
      Exp(e, e, count);
      ReduceSum(sc_[kZOff], e, work_, n);
      VectorToScalar();
      zo = zo * sc_.GetValue(kFn) + sc_.GetValue(kZOff);
    }
    if (hi == kNegInf || hi - logZ < kF64LogMin) return kNegInf;
    return hi + LogSum(zo);  // zo >= 1: the maximum's own term
  }

  // Tile t of a row (queued by the previous call or by Prefetch(row, 0, tiles)) as float32 in rawBuf_, the next
  // tile queued behind it: the one walk over a row that both reads of it take.
  __aicore__ inline LocalTensor<float> TileAsFloat(uint64_t row, uint64_t t, uint64_t tiles, uint32_t count) {
    Prefetch(row, t + 1, tiles);
    LocalTensor<float> raw = rawBuf_.Get<float>();
    LocalTensor<T> in = inQue_.template DeQue<T>();
    RawFloat(raw, in, count);
    inQue_.FreeTensor(in);
    return raw;
  }

  // Tile i of a row into the queue, if the row has one (loaded one tile ahead of the compute).
  __aicore__ inline void Prefetch(uint64_t row, uint64_t i, uint64_t tiles) {
    if (i >= tiles) return;
    LoadToQueue(inQue_, sGm_, row * h_.vocab + i * h_.tile, h_.Valid(i));
  }

  __aicore__ inline void WriteStats(uint64_t row, float loss, float base, float logZ, float logZOff, float bigA,
                                    float aTail, float logQ) {
    LocalTensor<float> st = statBuf_.Get<float>();
    st.SetValue(sparse_tiling::kLoss, loss);
    st.SetValue(sparse_tiling::kMax, base);
    st.SetValue(sparse_tiling::kLogZ, logZ);
    st.SetValue(sparse_tiling::kLogZOff, logZOff);
    st.SetValue(sparse_tiling::kSumA, bigA);
    st.SetValue(sparse_tiling::kATail, aTail);
    st.SetValue(sparse_tiling::kLogQ, logQ);
    st.SetValue(sparse_tiling::kLogQ + 1, 0.0f);
    SetFlag<HardEvent::S_MTE3>(0);
    WaitFlag<HardEvent::S_MTE3>(0);
    DataCopy(statsGm_[row * sparse_tiling::kStatsStride], st, sparse_tiling::kStatsStride);
    // The next row's SetValue must not overwrite the block before it left.
    SetFlag<HardEvent::MTE3_S>(0);
    WaitFlag<HardEvent::MTE3_S>(0);
  }

  TPipe pipe_;
  SparseParams h_;
  RowIds row_;
  TQue<QuePosition::VECIN, sparse_tiling::kBufferNum> inQue_;
  TBuf<TPosition::VECCALC> rawBuf_, expBuf_, maskBuf_, workBuf_, scalarBuf_, statBuf_;
  TBuf<TPosition::VECCALC> xBuf_, lmBuf_, pBuf_, aBuf_, termBuf_, laneMaskBuf_;
  GlobalTensor<T> sGm_;
  GlobalTensor<float> statsGm_;
  LocalTensor<float> work_, sc_;  // the reductions' work area; scalarBuf_, the scalar exchange
};

extern "C" __global__ __aicore__ void sparse_distill_custom(GM_ADDR student, GM_ADDR ids, GM_ADDR values,
                                                            GM_ADDR stats, GM_ADDR workspace, GM_ADDR tiling) {
  (void)workspace;
  GET_TILING_DATA(td, tiling);
  if (TILING_KEY_IS(1)) {
    SparseForward<DTYPE_STUDENT> op;
    op.Init(student, ids, values, stats, td);
    op.Process();
  }
}
