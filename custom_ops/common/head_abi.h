// The exported ABI of the fused linear head kernel of the CPU library (custom_ops/cpu/head_cpu.cc), called by
// ms_kldiv/backends/head.py through ops.Custom(func_type="aot"); the CUDA library does not have it (GPU runs the
// head's MindSpore chunk loop around the distillation kernels, distill_abi.h).
//
// Inputs 0-9 (both kernels): 0 hs [N, H], 1 ws [V, H], 2 bs [V] or 0-d (no bias), 3 ht [N, Ht], 4 wt [V, Ht],
//   5 bt [V] or 0-d: hidden states and weights float32 / float16 / bfloat16 (each its own), biases float32;
//   6 labels int32 [N], 7 weights float32 [N] (each row's weight), 8 count float32 0-d (the means divide by it:
//   scale = 1 / count, 0 when count <= 0), 9 hyper float64 [17] (head_cpu.cc's enum Hyper: the distillation
//   kernels' six, then ignore_index, hard_weight, soft_weight, z_loss, label_smoothing, chunk rows (0: from the
//   budget), mark, chunk bytes, chunk cap, chunk floor, chunk ceiling in bytes).
//   HeadStudent      nparam 15: outputs 10 loss float32 [1], 11 d hs float32 [N, H], 12 d ws float32 [V, H],
//                    13 d bs float32 (bs' shape, [1] for none), 14 row losses float32 [N] (each counted row's
//                    soft_weight * soft loss + hard_weight * hard loss, unweighted and unscaled; 0 where not
//                    counted): the gradient of the loss towards the row weights is scale * row loss.
//   HeadTeacher      nparam 13: outputs 10 d ht, 11 d wt, 12 d bt (float32, the inputs' shapes, [1] for no bias)
// A row is counted when its label is not ignore_index; rows not counted have their hidden states read as zeros and
// give exact zero gradients. The loss is
//   scale * sum over counted rows of weight * (soft_weight * soft loss (+ NaN where `mark` and the student row has
//   no distribution) + hard_weight * hard loss),
// the soft loss the distillation kernels' row loss (distill_abi.h), the hard loss the cross-entropy of the
// (transformed) student logits with z-loss and label smoothing (ms_kldiv._distill_math.cross_entropy_and_grad).
// The gradients are those of the loss. Return value 0, or 1 for a layout Python excludes. Each kernel has a C++
// <Fn>InferShape (dynamic row counts).
#pragma once

#include "kldiv_abi.h"

// 1 when the head kernels can run: MindSpore's libdnnl is loaded and has dnnl_sgemm (Python checks before use).
KLDIV_EXPORT int KLDivHeadReady(void);
// The rows per chunk the head kernels take for N rows and vocabulary V under `hyper` (input 9); half_weights: 1 when
// both weights are float16 / bfloat16.
KLDIV_EXPORT int64_t KLDivHeadChunkRows(const double *hyper, int64_t n, int64_t v, int half_weights);
