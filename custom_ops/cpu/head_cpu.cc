// kldiv-cxxflags(any):
// The fused linear distillation head in one op (FusedLinearDistillationLoss on CPU; ms_kldiv/backends/head.py).
//
// The chunked head written as a MindSpore loop keeps several copies of its loop-carried [V, H] weight gradient
// alive (docs/mindspore-notes.md); here the whole chunk loop is one kernel, so the weight gradient is one output
// buffer that each chunk's product is accumulated into (GEMM with beta = 1) and the scratch is one chunk's logits.
// The products are oneDNN's dnnl_sgemm, from the libdnnl that MindSpore's CPU backend has loaded (its own matmul
// library); that build is sequential per call, so each product is split over the library's pool by columns.
// Half-precision weights are read in blocks converted to float32 (the products are those of the float32 values,
// as the chunk loop's casts give), never as a whole float32 copy.
//
// ABI: custom_ops/common/head_abi.h.
#include <dlfcn.h>
#include <link.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "../common/distill_abi.h"
#include "../common/head_abi.h"
#include "../common/kldiv_half.h"
#include "kldiv_cpu.h"

namespace {

using kldiv::cpu::DistillJob;

// hyper: the distillation kernels' six, then the head's.
enum Hyper : int {
  kIgnoreIndex = 6, kHardWeight = 7, kSoftWeight = 8, kZLoss = 9, kLabelSmoothing = 10, kChunkRows = 11,
  kMark = 12, kChunkBytes = 13, kChunkCap = 14, kChunkFloor = 15, kChunkCeiling = 16, kHyper = 17
};

// ------------------------------------------------------------------------------------------ dnnl_sgemm
typedef int (*SgemmFn)(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

// Only copies the name: dl_iterate_phdr holds the loader's write lock while it calls this, and a dlopen from here
// would take the loader's other lock in the opposite order to a dlopen running in another thread (a deadlock).
int find_dnnl(struct dl_phdr_info *info, size_t, void *out) {
  if (info->dlpi_name && strstr(info->dlpi_name, "libdnnl.so")) {
    *static_cast<std::string *>(out) = info->dlpi_name;
    return 1;
  }
  return 0;
}

// dnnl_sgemm of the libdnnl already in the process (MindSpore's), or null.
SgemmFn sgemm() {
  static const SgemmFn fn = []() -> SgemmFn {
    std::string name;
    dl_iterate_phdr(&find_dnnl, &name);
    void *lib = name.empty() ? nullptr : dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD);
    return lib ? reinterpret_cast<SgemmFn>(dlsym(lib, "dnnl_sgemm")) : nullptr;
  }();
  return fn;
}

// ------------------------------------------------------------------------------------------ conversions
using kldiv::cpu::kBF16;
using kldiv::cpu::kF16;
using kldiv::cpu::kF32;

// n elements of a float32 / float16 / bfloat16 array from `offset` on, as float32.
void load_floats(const void *src, int dtype, int64_t offset, int64_t n, float *dst) {
  if (dtype == kF32) {
    memcpy(dst, static_cast<const float *>(src) + offset, sizeof(float) * n);
  } else if (dtype == kBF16) {
    const uint16_t *p = static_cast<const uint16_t *>(src) + offset;
    for (int64_t i = 0; i < n; ++i) dst[i] = kldiv::bf16_to_float(p[i]);
  } else {
    const uint16_t *p = static_cast<const uint16_t *>(src) + offset;
    for (int64_t i = 0; i < n; ++i) dst[i] = kldiv::f16_to_float(p[i]);
  }
}

// A [V, H] weight matrix of any of the three dtypes.
struct Weight {
  const void *data;
  int dtype;
  int64_t rows, cols;
  const float *f32() const { return dtype == kF32 ? static_cast<const float *>(data) : nullptr; }
};

// Rows of a half-precision weight converted per block (4 MB of float32): products of enough rows to run at full
// speed, and a block still in cache (L2/L3) between its conversion and its use.
constexpr int64_t kBlockElems = 1 << 20;

int64_t block_rows(int64_t cols) { return std::max<int64_t>(16, kBlockElems / std::max<int64_t>(cols, 1)); }

// ------------------------------------------------------------------------------------------ products
// Each product is split over the pool into column ranges of at least kMinCols (a multiple of 16).
constexpr int64_t kMinCols = 64;

int parts_for(int64_t cols) {
  const int64_t most = (cols + kMinCols - 1) / kMinCols;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kldiv::cpu::pool_limits().max_threads, most)));
}

void range_of(int64_t n, int part, int parts, int64_t *lo, int64_t *hi) {
  *lo = (n * part / parts) & ~int64_t(15);
  *hi = part + 1 == parts ? n : (n * (part + 1) / parts) & ~int64_t(15);
}

struct Products {
  int64_t c, v, h;        // chunk rows, vocabulary, hidden size
  const float *x;         // [c, h] the chunk's hidden states
  Weight w;               // [v, h]
  const float *bias;      // [v] or null
  float *logits;          // [c, v] out (logits)
  const float *d;         // [c, v] the logits' gradient (d_hidden, d_weight)
  float *dx;              // [c, h], row stride h (d_hidden)
  float *dw;              // [v, h] (d_weight), accumulated unless `first`
  float *db;              // [v] or null, accumulated unless `first`
  bool first;
};

void logits_part(void *ctx, int part, int parts) {
  const Products &p = *static_cast<const Products *>(ctx);
  int64_t v0, v1;
  range_of(p.v, part, parts, &v0, &v1);
  if (v1 <= v0) return;
  if (const float *w = p.w.f32()) {
    sgemm()('N', 'T', p.c, v1 - v0, p.h, 1.0f, p.x, p.h, w + v0 * p.h, p.h, 0.0f, p.logits + v0, p.v);
  } else {
    const int64_t step = block_rows(p.h);
    std::vector<float> block(static_cast<size_t>(step * p.h));
    for (int64_t b = v0; b < v1; b += step) {
      const int64_t n = std::min(step, v1 - b);
      load_floats(p.w.data, p.w.dtype, b * p.h, n * p.h, block.data());
      sgemm()('N', 'T', p.c, n, p.h, 1.0f, p.x, p.h, block.data(), p.h, 0.0f, p.logits + b, p.v);
    }
  }
  if (p.bias) {
    for (int64_t r = 0; r < p.c; ++r) {
      float *row = p.logits + r * p.v;
      for (int64_t j = v0; j < v1; ++j) row[j] += p.bias[j];
    }
  }
}

void d_weight_part(void *ctx, int part, int parts) {
  const Products &p = *static_cast<const Products *>(ctx);
  int64_t v0, v1;
  range_of(p.v, part, parts, &v0, &v1);
  if (v1 <= v0) return;
  sgemm()('T', 'N', v1 - v0, p.h, p.c, 1.0f, p.d + v0, p.v, p.x, p.h, p.first ? 0.0f : 1.0f, p.dw + v0 * p.h, p.h);
  if (p.db) {
    for (int64_t j = v0; j < v1; ++j) {
      float sum = p.first ? 0.0f : p.db[j];
      for (int64_t r = 0; r < p.c; ++r) sum += p.d[r * p.v + j];
      p.db[j] = sum;
    }
  }
}

void d_hidden_part(void *ctx, int part, int parts) {
  const Products &p = *static_cast<const Products *>(ctx);
  int64_t h0, h1;
  range_of(p.h, part, parts, &h0, &h1);
  if (h1 <= h0) return;
  if (const float *w = p.w.f32()) {
    sgemm()('N', 'N', p.c, h1 - h0, p.v, 1.0f, p.d, p.v, w + h0, p.h, 0.0f, p.dx + h0, p.h);
    return;
  }
  const int64_t cols = h1 - h0, step = block_rows(cols);
  std::vector<float> block(static_cast<size_t>(step * cols));
  for (int64_t b = 0; b < p.v; b += step) {
    const int64_t n = std::min(step, p.v - b);
    for (int64_t r = 0; r < n; ++r) load_floats(p.w.data, p.w.dtype, (b + r) * p.h + h0, cols, &block[r * cols]);
    sgemm()('N', 'N', p.c, cols, n, 1.0f, p.d + b, p.v, block.data(), cols, b == 0 ? 0.0f : 1.0f, p.dx + h0, p.h);
  }
}

void run_parts(kldiv::cpu::TaskFn fn, Products *p, int64_t cols) { kldiv::cpu::parallel_run(parts_for(cols), fn, p); }

// ------------------------------------------------------------------------------------------ the chunk loop
struct Model {
  const void *hidden;
  int hidden_dtype;
  Weight w;
  const float *bias;  // null: none
  float *dhidden, *dw, *db;
};

struct Chunk {
  int64_t r0, c;
  const int32_t *labels;
  int64_t ignore_index;
  const Model *m;
  float *x;  // [c, h] out: the counted rows' hidden states, zeros for the others
};

void gather_part(void *ctx, int part, int parts) {
  const Chunk &k = *static_cast<const Chunk *>(ctx);
  const int64_t h = k.m->w.cols;
  for (int64_t r = k.c * part / parts; r < k.c * (part + 1) / parts; ++r) {
    if (k.labels[k.r0 + r] == k.ignore_index) {
      memset(k.x + r * h, 0, sizeof(float) * h);
    } else {
      load_floats(k.m->hidden, k.m->hidden_dtype, (k.r0 + r) * h, h, k.x + r * h);
    }
  }
}

struct HardRows {
  const float *s;
  float *d;
  int64_t v, r0;
  const int32_t *labels;
  const float *g;  // each row's weight, 0 for rows not counted
  const bool *counted;
  const kldiv::cpu::HardOptions *h;
  double coef;  // hard_weight * scale
  int64_t c;
  double *out;  // [c] each row's loss (unweighted)
};

void hard_part(void *ctx, int part, int parts) {
  const HardRows &k = *static_cast<const HardRows *>(ctx);
  for (int64_t r = part; r < k.c; r += parts) {
    k.out[r] = k.counted[r] ? kldiv::cpu::hard_row(k.s + r * k.v, k.v, k.labels[k.r0 + r], *k.h,
                                                   static_cast<float>(k.g[r] * k.coef), k.d + r * k.v)
                            : 0.0;
  }
}

}  // namespace

// Rows per chunk: given, or as many as keep both models' float32 logits within the budget, between the floor (fewer
// rows re-read the weights per chunk more often than the products can hide) and the cap, and, unless both weights
// are half precision, never so many that the logits pass the ceiling (the floor gives way there: the logits are what
// the head adds to the weight gradient). Half-precision weights are converted block by block in every chunk, so
// smaller chunks cost them more, and with the floor's rows their peak already stays within the target the ceiling
// is for (both measured in docs/distillation.md).
KLDIV_EXPORT int64_t KLDivHeadChunkRows(const double *hyper, int64_t n, int64_t v, int half_weights) {
  const int64_t most = std::max<int64_t>(n, 1);
  if (hyper[kChunkRows] > 0) return std::max<int64_t>(1, std::min<int64_t>(most, hyper[kChunkRows]));
  const int64_t row_bytes = std::max<int64_t>(8 * v, 1);
  const int64_t fit = std::max<int64_t>(1, static_cast<int64_t>(hyper[kChunkBytes]) / row_bytes);
  const int64_t under_ceiling =
      half_weights ? INT64_MAX : std::max<int64_t>(1, static_cast<int64_t>(hyper[kChunkCeiling]) / row_bytes);
  const int64_t rows = std::min({static_cast<int64_t>(hyper[kChunkCap]), under_ceiling,
                                 std::max(static_cast<int64_t>(hyper[kChunkFloor]), fit)});
  return std::max<int64_t>(1, std::min<int64_t>(most, rows));
}

namespace {

int run(bool student, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  if (nparam != (student ? 15 : 13) || ndims[0] != 2 || ndims[1] != 2 || ndims[3] != 2 || ndims[4] != 2) return 1;
  if (strcmp(dtypes[9], "float64") != 0 || strcmp(dtypes[6], "int32") != 0 || !sgemm()) return 1;
  const int64_t n = shapes[0][0], v = shapes[1][0];
  const double *hyper = static_cast<const double *>(params[9]);
  Model models[2];
  for (int i = 0; i < 2; ++i) {
    Model &m = models[i];
    const int hp = 3 * i, wp = hp + 1, bp = hp + 2;
    m.hidden = params[hp];
    m.hidden_dtype = kldiv::cpu::parse_dtype(dtypes[hp]);
    m.w = Weight{params[wp], kldiv::cpu::parse_dtype(dtypes[wp]), shapes[wp][0], shapes[wp][1]};
    if (m.hidden_dtype < 0 || m.hidden_dtype == kldiv::cpu::kF64 || m.w.dtype < 0 || m.w.dtype == kldiv::cpu::kF64 ||
        shapes[hp][1] != m.w.cols || shapes[hp][0] != n || m.w.rows != v) {
      return 1;
    }
    m.bias = ndims[bp] == 1 ? static_cast<const float *>(params[bp]) : nullptr;
    m.dhidden = m.dw = m.db = nullptr;
  }
  Model &grads = models[student ? 0 : 1];
  const int out0 = student ? 11 : 10;
  grads.dhidden = static_cast<float *>(params[out0]);
  grads.dw = static_cast<float *>(params[out0 + 1]);
  grads.db = grads.bias ? static_cast<float *>(params[out0 + 2]) : nullptr;
  if (!grads.bias) *static_cast<float *>(params[out0 + 2]) = 0.0f;  // (the [1] gradient of an absent bias)
  float *loss_out = student ? static_cast<float *>(params[10]) : nullptr;
  // each row's soft_weight * soft + hard_weight * hard loss, 0 where not counted: the weights' gradient (times scale)
  float *rows_out = student ? static_cast<float *>(params[14]) : nullptr;
  const int32_t *labels = static_cast<const int32_t *>(params[6]);
  const float *row_weights = static_cast<const float *>(params[7]);
  const float count = *static_cast<const float *>(params[8]);
  // 0 when nothing is counted; NaN for a negative or NaN count (a bad num_items_in_batch in compiled code, which
  // cannot raise on values): the loss and every gradient NaN, never a clean-looking 0 (ms_kldiv._math.over_count)
  const double scale = count > 0.0f ? 1.0 / count : count == 0.0f ? 0.0 : NAN;
  const int64_t ignore_index = static_cast<int64_t>(hyper[kIgnoreIndex]);
  const double hard_weight = student ? hyper[kHardWeight] : 0.0, soft_weight = hyper[kSoftWeight];
  const bool mark = hyper[kMark] != 0.0;
  const int64_t chunk = KLDivHeadChunkRows(hyper, n, v, models[0].w.dtype != kF32 && models[1].w.dtype != kF32);
  if (v == 0 || n == 0) {  // no products: zero gradients, a zero loss
    memset(grads.dhidden, 0, sizeof(float) * n * grads.w.cols);
    memset(grads.dw, 0, sizeof(float) * v * grads.w.cols);
    if (grads.db) memset(grads.db, 0, sizeof(float) * v);
    if (loss_out) *loss_out = 0.0f;
    if (rows_out) memset(rows_out, 0, sizeof(float) * n);
    return 0;
  }
  std::vector<float> s(static_cast<size_t>(chunk * v)), t(static_cast<size_t>(chunk * v));
  std::vector<float> xs(static_cast<size_t>(chunk * models[0].w.cols)), xt(static_cast<size_t>(chunk * models[1].w.cols));
  std::vector<float> stats(static_cast<size_t>(chunk * distill::kStats)), dloss(chunk);
  std::vector<double> hard_loss(chunk);
  std::unique_ptr<bool[]> counted(new bool[chunk]);
  DistillJob job;
  kldiv::cpu::init_distill_job(hyper, &job);
  job.dtype = kF32;
  job.vocab = v;
  job.given = nullptr;
  const kldiv::cpu::HardOptions hard = kldiv::cpu::hard_options(hyper, kZLoss, kLabelSmoothing);
  double soft_sum = 0.0, hard_sum = 0.0;
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t c = std::min(chunk, n - r0);
    float *x[2] = {xs.data(), xt.data()};
    float *logits[2] = {s.data(), t.data()};
    for (int i = 0; i < 2; ++i) {
      Chunk k{r0, c, labels, ignore_index, &models[i], x[i]};
      kldiv::cpu::parallel_run(static_cast<int>(std::min<int64_t>(c, kldiv::cpu::threads_for(c * models[i].w.cols))),
                               &gather_part, &k);
      Products p{c, v, models[i].w.cols, x[i], models[i].w, models[i].bias, logits[i], nullptr, nullptr, nullptr,
                 nullptr, false};
      run_parts(&logits_part, &p, v);
    }
    job.rows = c;
    job.s = s.data();
    job.t_logits = t.data();
    job.op = distill::kForward;
    job.stats = stats.data();
    job.dloss = nullptr;
    job.ds = job.dt = nullptr;
    kldiv::cpu::run_distill_job(job);
    for (int64_t r = 0; r < c; ++r) {
      counted[r] = labels[r0 + r] != ignore_index;
      const float g = counted[r] ? row_weights[r0 + r] : 0.0f;
      dloss[r] = static_cast<float>(g * soft_weight * scale);
      if (counted[r] && student) {
        const float *row = &stats[r * distill::kStats];
        const double loss = mark && !isfinite(row[distill::kLogZStudent]) ? NAN : row[distill::kLoss];
        soft_sum += loss * g;
        rows_out[r0 + r] = static_cast<float>(loss * soft_weight);
      } else if (student) {
        rows_out[r0 + r] = 0.0f;
      }
    }
    // the gradient of the logits overwrites the other model's logits (the kernels read each class before writing it)
    job.op = student ? distill::kStudent : distill::kTeacher;
    job.dloss = dloss.data();
    float *d = student ? t.data() : s.data();
    (student ? job.ds : job.dt) = d;
    kldiv::cpu::run_distill_job(job);
    if (hard_weight != 0.0) {
      for (int64_t r = 0; r < c; ++r) dloss[r] = counted[r] ? row_weights[r0 + r] : 0.0f;
      HardRows k{s.data(), d, v, r0, labels, dloss.data(), counted.get(), &hard, hard_weight * scale, c,
                 hard_loss.data()};
      kldiv::cpu::parallel_run(static_cast<int>(std::min<int64_t>(c, kldiv::cpu::threads_for(c * v * 4))),
                               &hard_part, &k);
      for (int64_t r = 0; r < c; ++r) {
        hard_sum += hard_loss[r] * dloss[r];
        if (counted[r]) rows_out[r0 + r] = static_cast<float>(rows_out[r0 + r] + hard_loss[r] * hard_weight);
      }
    }
    const int i = student ? 0 : 1;
    Products p{c, v, grads.w.cols, x[i], grads.w, nullptr, nullptr, d, grads.dhidden + r0 * grads.w.cols, grads.dw,
               grads.db, r0 == 0};
    run_parts(&d_hidden_part, &p, grads.w.cols);
    run_parts(&d_weight_part, &p, v);
  }
  if (loss_out) *loss_out = static_cast<float>((soft_sum * soft_weight + hard_sum * hard_weight) * scale);
  return 0;
}

// Outputs: (loss, d hs, d ws, d bs, row losses) / (d ht, d wt, d bt): the shapes of the inputs they differentiate;
// the loss and the gradient of an absent (0-d) bias as [1] (a 0-d output of a multi-output op becomes a scalar in
// graph mode); the row losses [N].
std::vector<std::vector<int64_t>> grad_shapes(bool student, int *ndims, int64_t **shapes) {
  std::vector<std::vector<int64_t>> out;
  if (student) out.push_back({1});
  for (int i = student ? 0 : 3, k = 0; k < 3; ++i, ++k) {
    out.push_back(ndims[i] == 0 ? std::vector<int64_t>{1} : std::vector<int64_t>(shapes[i], shapes[i] + ndims[i]));
  }
  if (student) out.push_back({shapes[0][0]});
  return out;
}

}  // namespace

KLDIV_DECLARE_KERNEL(HeadStudent) {
  (void)stream;
  (void)extra;
  return run(true, nparam, params, ndims, shapes, dtypes);
}

KLDIV_DECLARE_KERNEL(HeadTeacher) {
  (void)stream;
  (void)extra;
  return run(false, nparam, params, ndims, shapes, dtypes);
}

KLDIV_DECLARE_BWD_INFER(HeadStudent) {
  (void)extra;
  return grad_shapes(true, ndims, shapes);
}

KLDIV_DECLARE_BWD_INFER(HeadTeacher) {
  (void)extra;
  return grad_shapes(false, ndims, shapes);
}

KLDIV_EXPORT int KLDivHeadReady(void) { return sgemm() != nullptr; }
