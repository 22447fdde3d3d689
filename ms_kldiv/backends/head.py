"""The fused linear head as one kernel (``FusedLinearDistillationLoss`` on CPU with the 'aot' library).

``AotDistillKernels.fused_head`` offers it (``ms_kldiv.backends.base``: the optional ``fused_head`` entry of the
distillation kernel contract); ``ms_kldiv.fused_linear`` uses it instead of its MindSpore chunk loop when offered.
The chunk loop, the products (oneDNN's sgemm, the library MindSpore's own CPU matmul runs on), the distillation
kernels and the hard term all run inside ``custom_ops/cpu/head_cpu.cc``, so the weight gradient is one buffer
accumulated in place: a compiled MindSpore loop keeps several copies of a loop-carried accumulator
(docs/mindspore-notes.md).
"""
import ctypes
import functools

import mindspore as ms
from mindspore import nn, ops

from .._distill_math import hyper
from .common import custom_reg_info

#: Default bound on one chunk's float32 logits (both models) in the kernel, its only scratch; its 128-row chunks at
#: V = 131072 run as fast as the chunk loop's 256 rows there (docs/distillation.md).
HEAD_CHUNK_BYTES = 128 * 2**20
#: ... but never fewer rows than this by default: each chunk re-reads both [V, H] weights and reads and writes the
#: weight gradient, traffic that the products of fewer rows no longer hide (measured at V = 262144).
HEAD_CHUNK_FLOOR = 128
#: ... unless their logits would pass this (float32 weights): the head's peak is the weight gradient plus this
#: scratch, d(hidden) and a few MB, and Liger's target for it is one weight gradient + 256 MB (96-row chunks at
#: V = 262144; head_cpu.cc's KLDivHeadChunkRows says why half-precision weights keep the floor).
HEAD_CHUNK_CEILING = 192 * 2**20

_INPUTS = ("hs", "ws", "bs", "ht", "wt", "bt", "labels", "weights", "count", "hyper")
#: Where the chunk entries start in the kernel's hyper (head_cpu.cc's kChunkRows): after the distillation kernels'
#: six and the head's five.
_CHUNK_HYPER_AT = 11


@functools.lru_cache(maxsize=None)
def head_ready(lib_path):
    """True when ``lib_path`` has the head kernel and it can find its products (MindSpore's libdnnl, loaded with
    MindSpore's CPU backend)."""
    try:
        lib = ctypes.CDLL(lib_path)
        return bool(lib.KLDivHeadReady())
    except (OSError, AttributeError):
        return False


class AotFusedHead(nn.Cell):
    """(hs, ws, bs, ht, wt, bt, labels, weights, count) -> (loss, d hs, d ws, d bs, d ht, d wt, d bt, row losses),
    the chunk loop's outputs (``ms_kldiv.fused_linear._ChunkLoop``): the student's pass (loss, its gradients and each
    row's loss) or the teacher's (its gradients); a 0-d zero for what the pass does not compute."""

    def __init__(self, lib_path, student, temperature, beta, variant, ignore_index, hard_weight, soft_weight,
                 hard_options, chunk_size, chunk_bytes, mark, chunk_cap):
        super().__init__()
        self.student = student
        self.hyper = ms.Tensor(hyper(temperature, beta, variant) + (
            float(ignore_index), float(hard_weight), float(soft_weight), float(hard_options[0]),
            float(hard_options[1])) + _chunk_hyper(chunk_size, chunk_bytes, mark, chunk_cap), ms.float64)
        name = "HeadStudent" if student else "HeadTeacher"
        outputs = ("loss", "dhs", "dws", "dbs", "rows") if student else ("dht", "dwt", "dbt")
        # (a function, not a tuple: the one form MindSpore's graph-mode type inference takes with dynamic shapes)
        self.op = ops.Custom(f"{lib_path}:{name}", out_shape=None, out_dtype=_float32s(len(outputs)),
                             func_type="aot", reg_info=custom_reg_info(name, "CPU", _INPUTS, outputs))

    def construct(self, hs, ws, bs, ht, wt, bt, labels, weights, count):
        out = self.op(_kernel_dtype(hs), _kernel_dtype(ws), ops.cast(bs, ms.float32), _kernel_dtype(ht),
                      _kernel_dtype(wt), ops.cast(bt, ms.float32), labels, weights, count, self.hyper)
        zero = ops.zeros((), ms.float32)
        if self.student:
            loss, dhs, dws, dbs, rows = out
            return ops.reshape(loss, ()), dhs, dws, _bias_grad(dbs, bs), zero, zero, zero, rows
        dht, dwt, dbt = out
        return zero, zero, zero, zero, dht, dwt, _bias_grad(dbt, bt), zero


def _chunk_hyper(chunk_size, chunk_bytes, mark, chunk_cap):
    """The kernel's hyper entries from ``kChunkRows`` on (head_cpu.cc): the rows given, the NaN mark, and the
    budget, cap, floor and ceiling its rows per chunk come from (the defaults, or the user's ``chunk_bytes`` alone)."""
    by_default = chunk_size is None and chunk_bytes is None
    return (float(chunk_size or 0), float(mark), float(HEAD_CHUNK_BYTES if by_default else chunk_bytes or 0),
            float(chunk_cap if by_default else 2**40), float(HEAD_CHUNK_FLOOR if by_default else 1),
            float(HEAD_CHUNK_CEILING if by_default else 2**62))


def head_chunk_rows(lib_path, rows, vocab, chunk_cap, chunk_size=None, chunk_bytes=None, half_weights=False):
    """The rows per chunk the head kernel of ``lib_path`` takes for ``rows`` x ``vocab`` logits (the kernel's own
    rule, ``KLDivHeadChunkRows``); ``chunk_cap``: the head's ``CHUNK_ROWS``; ``half_weights``: both weights
    float16 / bfloat16."""
    fn = ctypes.CDLL(lib_path).KLDivHeadChunkRows
    fn.restype = ctypes.c_int64
    fn.argtypes = (ctypes.POINTER(ctypes.c_double), ctypes.c_int64, ctypes.c_int64, ctypes.c_int)
    values = (0.0,) * _CHUNK_HYPER_AT + _chunk_hyper(chunk_size, chunk_bytes, False, chunk_cap)
    return fn((ctypes.c_double * len(values))(*values), rows, vocab, int(half_weights))


def _float32s(count):
    def out_dtype(*_):
        return (ms.float32,) * count
    return out_dtype


def _kernel_dtype(x):
    """float64 (which the kernel does not read) as float32, as the chunk loop computes it; other floats as given."""
    return ops.cast(x, ms.float32) if x.dtype == ms.float64 else x


def _bias_grad(grad, bias):
    """The kernel's bias gradient, a 0-d zero for an absent (0-d) bias (the kernel's output is [1] then)."""
    return ops.zeros((), ms.float32) if bias.ndim == 0 else grad
