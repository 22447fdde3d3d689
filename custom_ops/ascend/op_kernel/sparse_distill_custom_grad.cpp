// SparseDistillCustomGrad kernel (AscendC, vector cores): d_student of the stored-teacher loss, in one read and one
// write of each logit row, from the row statistics the forward saved (sparse_distill_custom.cpp) and the incoming
// per-row gradient g (float32 [rows]).
//
// Same row split and vocabulary tiles as the forward. Per tile, with g_t = g T, x = (s - max) / T:
//   d = c_tail e^(x - log Z_off) + c_all e^(x - log Z),   c_tail = g_t a_tail, c_all = -g_t A
// (only the second term when log Z_off = -inf: no class off the ids has mass), then the lanes of the ids in the
// tile are overwritten with g_t (a_i - r_i A) (sparse::id_grad): the scalar unit gathers the tile's ids' x and
// values into id lanes, the vector unit computes their gradients, the scalar unit scatters them back, and the tile
// is rounded once to the IO dtype. The tail's share is spread by e^(x - log Z_off), never divided by r_tail: a
// confident student's log Z_off (which the forward summed relative to the tail's own maximum) may lie far below
// float32's range of e^x, while x - log Z_off stays in range. A row with g == 0 (an ignored row) gets exact zeros
// without reading its logits or ids, whatever its statistics hold. An id >= V matches no tile: nothing outside the
// row is touched.
#include "sparse_common.h"

using namespace AscendC;
using namespace sparse_kernel;

template <typename T>
class SparseBackward {
 public:
  __aicore__ inline SparseBackward() {}

  __aicore__ inline void Init(GM_ADDR student, GM_ADDR ids, GM_ADDR values, GM_ADDR stats, GM_ADDR dloss,
                              GM_ADDR dStudent, const SparseDistillCustomTilingData& td) {
    h_.Init(td);
    const uint64_t n = h_.rows * h_.vocab;
    sGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(student), n);
    dsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(dStudent), n);
    statsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(stats), h_.rows * sparse_tiling::kStatsStride);
    gGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(dloss), h_.rows);
    const uint32_t tile = h_.tile, lanes = h_.lanes;
    pipe_.InitBuffer(inQue_, sparse_tiling::kBufferNum, tile * sizeof(T));
    pipe_.InitBuffer(outQue_, sparse_tiling::kBufferNum, tile * sizeof(T));
    pipe_.InitBuffer(xBuf_, tile * sizeof(float));
    pipe_.InitBuffer(wBuf_, tile * sizeof(float));
    pipe_.InitBuffer(w2Buf_, tile * sizeof(float));
    pipe_.InitBuffer(statBuf_, sparse_tiling::kStatsStride * sizeof(float));
    pipe_.InitBuffer(gBuf_, 8 * sizeof(float));
    row_.Init(pipe_, ids, values, h_);
    pipe_.InitBuffer(lrBuf_, lanes * sizeof(float));
    pipe_.InitBuffer(lqBuf_, lanes * sizeof(float));
    pipe_.InitBuffer(lmBuf_, lanes * sizeof(float));
    pipe_.InitBuffer(pBuf_, lanes * sizeof(float));
    pipe_.InitBuffer(aBuf_, lanes * sizeof(float));
    pipe_.InitBuffer(laneMaskBuf_, lanes / 8);
  }

  __aicore__ inline void Process() {
    for (uint64_t r = 0; r < h_.rowCount; ++r) Row(h_.rowStart + r);
  }

 private:
  __aicore__ inline void Row(uint64_t row) {
    // The row's statistics (one 32 B block) and its incoming gradient (4 bytes).
    LocalTensor<float> st = statBuf_.Get<float>();
    LocalTensor<float> g1 = gBuf_.Get<float>();
    DataCopy(st, statsGm_[row * sparse_tiling::kStatsStride], sparse_tiling::kStatsStride);
    LoadTile(g1, gGm_, row, 1);  // 4 bytes: DataCopyPad
    SetFlag<HardEvent::MTE2_S>(0);
    WaitFlag<HardEvent::MTE2_S>(0);
    const float g = g1.GetValue(0);
    base_ = st.GetValue(sparse_tiling::kMax);
    logZ_ = st.GetValue(sparse_tiling::kLogZ);
    logZOff_ = st.GetValue(sparse_tiling::kLogZOff);
    sumA_ = st.GetValue(sparse_tiling::kSumA);
    logQ_ = st.GetValue(sparse_tiling::kLogQ);
    gT_ = g * h_.temperature;
    cAll_ = -gT_ * sumA_;
    cTail_ = gT_ * st.GetValue(sparse_tiling::kATail);
    const bool zero = g == 0.0f;
    if (!zero) row_.Load(row);

    const uint64_t tiles = sparse_tiling::TileCount(h_.vocab, h_.tile);
    // Tile i + 1 is loaded before tile i is computed (the input queue is kBufferNum = 2 deep).
    if (!zero) Prefetch(row, 0, tiles);
    for (uint64_t i = 0; i < tiles; ++i) {
      const uint32_t valid = h_.Valid(i);
      const uint32_t count = sparse_tiling::ComputeCount(valid);
      LocalTensor<float> w = wBuf_.Get<float>();
      if (zero) {
        Duplicate(w, 0.0f, count);
      } else {
        Prefetch(row, i + 1, tiles);
        Compute(i * h_.tile, valid, count);
      }
      LocalTensor<T> out = outQue_.template AllocTensor<T>();
      ToIo(out, w, count);
      outQue_.EnQue(out);
      StoreFromQueue(dsGm_, outQue_, row * h_.vocab + i * h_.tile, valid);
    }
  }

  // The gradient of the tile at vocabulary offset b0 (valid elements) into wBuf_, float32.
  __aicore__ inline void Compute(uint64_t b0, uint32_t valid, uint32_t count) {
    LocalTensor<float> x = xBuf_.Get<float>();
    LocalTensor<float> w = wBuf_.Get<float>();
    LocalTensor<T> in = inQue_.template DeQue<T>();
    RawFloat(x, in, count);
    inQue_.FreeTensor(in);
    Adds(x, x, -base_, count);
    Muls(x, x, h_.invT, count);  // x = (s - max) / T
    Adds(w, x, -logZ_, count);
    Exp(w, w, count);
    Muls(w, w, cAll_, count);
    if (logZOff_ != kNegInf) {
      LocalTensor<float> w2 = w2Buf_.Get<float>();
      Adds(w2, x, -logZOff_, count);
      Exp(w2, w2, count);
      Muls(w2, w2, cTail_, count);
      Add(w, w2, w, count);
    }

    // The ids in this tile: their x and values gathered into id lanes, in the order of the ids.
    LocalTensor<int32_t> ids = row_.Ids();
    LocalTensor<float> vals = row_.Vals();
    LocalTensor<float> lr = lrBuf_.Get<float>();
    LocalTensor<float> lq = lqBuf_.Get<float>();
    VectorToScalar();
    uint32_t hits = 0;
    for (uint32_t i = 0; i < h_.ids; ++i) {
      const int32_t id = ids.GetValue(i);
      if (id < 0 || static_cast<uint64_t>(id) < b0 || static_cast<uint64_t>(id) - b0 >= valid) continue;
      lr.SetValue(hits, x.GetValue(static_cast<uint32_t>(static_cast<uint64_t>(id) - b0)));
      lq.SetValue(hits, vals.GetValue(i));
      ++hits;
    }
    if (hits == 0) return;
    const uint32_t lanes = sparse_tiling::ComputeCount(hits);
    for (uint32_t j = hits; j < lanes; ++j) {  // the rest of the last repeat: empty buckets
      lr.SetValue(j, kNegInf);
      lq.SetValue(j, kNegInf);
    }
    ScalarToVector();
    // g_t (a_i - r_i A) with log r = x - log Z, log q = ratio v - log Q (sparse::id_grad).
    LocalTensor<float> lm = lmBuf_.Get<float>();
    LocalTensor<float> p = pBuf_.Get<float>();
    LocalTensor<float> a = aBuf_.Get<float>();
    Adds(lr, lr, -logZ_, lanes);
    Muls(lq, lq, h_.ratio, lanes);
    Adds(lq, lq, -logQ_, lanes);
    BucketLanes(h_, a, a, false, lr, lq, lm, p, laneMaskBuf_.Get<uint8_t>(), lanes);
    Exp(p, lr, lanes);
    Muls(p, p, sumA_, lanes);
    Sub(a, a, p, lanes);
    Muls(a, a, gT_, lanes);
    VectorToScalar();
    uint32_t j = 0;
    for (uint32_t i = 0; i < h_.ids; ++i) {
      const int32_t id = ids.GetValue(i);
      if (id < 0 || static_cast<uint64_t>(id) < b0 || static_cast<uint64_t>(id) - b0 >= valid) continue;
      w.SetValue(static_cast<uint32_t>(static_cast<uint64_t>(id) - b0), a.GetValue(j++));
    }
    ScalarToVector();
  }

  __aicore__ inline void Prefetch(uint64_t row, uint64_t i, uint64_t tiles) {
    if (i >= tiles) return;
    LoadToQueue(inQue_, sGm_, row * h_.vocab + i * h_.tile, h_.Valid(i));
  }

  TPipe pipe_;
  SparseParams h_;
  RowIds row_;
  TQue<QuePosition::VECIN, sparse_tiling::kBufferNum> inQue_;
  TQue<QuePosition::VECOUT, sparse_tiling::kBufferNum> outQue_;
  TBuf<TPosition::VECCALC> xBuf_, wBuf_, w2Buf_, statBuf_, gBuf_;
  TBuf<TPosition::VECCALC> lrBuf_, lqBuf_, lmBuf_, pBuf_, aBuf_, laneMaskBuf_;
  GlobalTensor<T> sGm_, dsGm_;
  GlobalTensor<float> statsGm_, gGm_;
  float base_ = 0.0f, logZ_ = 0.0f, logZOff_ = 0.0f, sumA_ = 0.0f, logQ_ = 0.0f;
  float gT_ = 0.0f, cAll_ = 0.0f, cTail_ = 0.0f;
};

extern "C" __global__ __aicore__ void sparse_distill_custom_grad(GM_ADDR student, GM_ADDR ids, GM_ADDR values,
                                                                 GM_ADDR stats, GM_ADDR dloss, GM_ADDR dStudent,
                                                                 GM_ADDR workspace, GM_ADDR tiling) {
  (void)workspace;
  GET_TILING_DATA(td, tiling);
  if (TILING_KEY_IS(1)) {
    SparseBackward<DTYPE_STUDENT> op;
    op.Init(student, ids, values, stats, dloss, dStudent, td);
    op.Process();
  }
}
