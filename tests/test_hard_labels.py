"""The fused head's hard-label term as a kernel (contract: ms_kldiv.backends.base, ``hard``): the CPU library's
DistillHard (custom_ops/cpu/hard_cpu.cc, math in custom_ops/common/distill_math.h) and the composite kernels' twin,
against the float64 reference (ms_kldiv.reference.hard_label_rows) in PyNative, under ``ms.jit`` and as a
GRAPH_MODE Cell, static and dynamic row counts: label smoothing, z-loss, soft cap and logit scale, -inf vocabulary
padding, ignored rows (the soft gradient passed through bit for bit), labels outside the vocabulary and rows without
a distribution (NaN), row coefficients of 0. The chunk loop's use of it: tests/test_fused_linear_loop.py and
tests/test_divergences.py; its memory: the benchmark's head table and docs/distillation.md."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn

import ms_kldiv
from ms_kldiv import reference
from ms_kldiv._distill_math import Variant
from ms_kldiv.backends import get_kernels

from conftest import graph_mode

IGNORE = -100
_AOT = any(r["name"] == "aot" and r["available"] for r in ms_kldiv.backend_info("CPU", op="distillation"))
BACKENDS = [pytest.param("aot", marks=pytest.mark.skipif(not _AOT, reason="the CPU kernel library is not here")),
            "composite"]
# (z_loss, label_smoothing, softcap, logit_scale)
OPTIONS = {"plain": (0.0, 0.0, 0.0, 1.0), "smoothing-zloss": (1e-3, 0.1, 0.0, 1.0),
           "cap-smoothing": (0.0, 0.2, 5.0, 1.0), "scale-zloss": (0.01, 0.0, 0.0, 0.5)}
DTYPES = {"float32": (ms.float32, 2e-6), "bfloat16": (ms.bfloat16, 2e-2), "float16": (ms.float16, 4e-3)}


def _kernel(backend, options):
    z_loss, smoothing, cap, scale = options
    variant = Variant("kl", 0.0, cap, scale)
    return get_kernels("distillation", backend, "CPU")[1].hard(variant, z_loss, smoothing, IGNORE)


def _case(rows, vocab, seed=0):
    """Logits with -inf padding (the last 3 classes, every 13th), an ignored row, a row whose label is outside the
    vocabulary, a row with a NaN logit (holding a padding class's -inf elsewhere: still NaN), a row of coefficient 0;
    the soft gradient ds to add onto."""
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(rows, vocab)) * 3.0
    s[:, -3:] = -np.inf
    s[:, 4::13] = -np.inf
    labels = rng.integers(0, vocab - 3, rows)
    labels[labels % 13 == 4] = 0
    labels[1] = IGNORE
    labels[2] = vocab + 5
    s[3, 7] = np.nan
    g = rng.uniform(0.5, 2.0, rows)
    g[4] = 0.0
    ds = rng.normal(size=(rows, vocab)) * 1e-2
    return s, labels.astype(np.int32), g.astype(np.float32), ds


class _Cell(nn.Cell):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def construct(self, s, labels, g, ds):
        return self.op(s, labels, g, ds)


def _call(mode, op, *args, dynamic=False):
    if mode == "pynative":
        return op(*args)
    if mode == "jit":
        return ms.jit(op)(*args)
    with graph_mode():
        cell = _Cell(op)
        if dynamic:
            dtype = args[0].dtype
            cell.set_inputs(ms.Tensor(shape=[None, args[0].shape[1]], dtype=dtype),
                            ms.Tensor(shape=[None], dtype=ms.int32), ms.Tensor(shape=[None], dtype=ms.float32),
                            ms.Tensor(shape=[None, args[0].shape[1]], dtype=dtype))
        return cell(*args)


def _check(out, s, labels, g, ds, options, tol):
    z_loss, smoothing, cap, scale = options
    rows, d = out
    assert rows.dtype == ms.float32 and d.dtype == ds.dtype
    s64, ds64 = s.astype(np.float32).astype(np.float64), ds.float().asnumpy().astype(np.float64)
    want_rows, grad = reference.hard_label_rows(s64, labels, z_loss, smoothing, cap, scale, IGNORE)
    want_d = ds64 + g[:, None] * grad
    rows, d = rows.asnumpy(), d.float().asnumpy()
    np.testing.assert_array_equal(np.isnan(rows), np.isnan(want_rows))
    assert np.isnan(rows[2]) and np.isnan(rows[3]) and rows[1] == 0.0
    ok = ~np.isnan(want_rows)
    np.testing.assert_allclose(rows[ok], want_rows[ok], rtol=tol, atol=tol)
    np.testing.assert_array_equal(d[1], ds64[1])  # ignored: the soft gradient as it came
    assert np.all(np.isnan(d[2]))
    np.testing.assert_array_equal(d[4], ds64[4])  # coefficient 0 on finite logits: exactly the soft gradient
    np.testing.assert_allclose(d[ok], want_d[ok], rtol=tol, atol=tol * np.abs(grad[ok]).max())
    # padded classes: no probability and no smoothing share, so exactly the soft gradient
    padded = np.isneginf(s64) & ok[:, None]
    np.testing.assert_array_equal(d[padded], ds64[padded])


@pytest.mark.parametrize("mode", ["pynative", "jit", "graph"])
@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_and_gradient_against_reference(backend, options, mode):
    s, labels, g, ds = _case(9, 300)
    op = _kernel(backend, options)
    args = ms.Tensor(s, ms.float32), ms.Tensor(labels), ms.Tensor(g), ms.Tensor(ds, ms.float32)
    _check(_call(mode, op, *args), s, labels, g, args[3], options, DTYPES["float32"][1])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_half_precision_logits(backend, dtype):
    ms_dtype, tol = DTYPES[dtype]
    s, labels, g, ds = _case(6, 2100, seed=3)
    s_t = ms.Tensor(s, ms.float32).astype(ms_dtype)
    ds_t = ms.Tensor(ds, ms.float32).astype(ms_dtype)
    options = OPTIONS["smoothing-zloss"]
    out = _call("graph", _kernel(backend, options), s_t, ms.Tensor(labels), ms.Tensor(g), ds_t)
    _check(out, s_t.float().asnumpy(), labels, g, ds_t, options, tol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dynamic_row_counts_in_graph_mode(backend):
    op = _kernel(backend, OPTIONS["cap-smoothing"])
    for rows in (7, 12, 5):
        s, labels, g, ds = _case(rows, 64, seed=rows)
        args = ms.Tensor(s, ms.float32), ms.Tensor(labels), ms.Tensor(g), ms.Tensor(ds, ms.float32)
        _check(_call("graph", op, *args, dynamic=True), s, labels, g, args[3], OPTIONS["cap-smoothing"], 2e-6)


def test_reference_gradient_is_the_derivative_of_its_rows():
    """The float64 reference's closed-form gradient against central differences of its row losses."""
    rng = np.random.default_rng(5)
    s = rng.normal(size=(3, 11)) * 2.0
    s[:, 9] = -np.inf
    labels = np.array([2, 0, 10])
    for options in OPTIONS.values():
        _, grad = reference.hard_label_rows(s, labels, *options)
        for r in range(3):
            for j in range(9):
                step = np.zeros_like(s)
                step[r, j] = 1e-6
                hi = reference.hard_label_rows(s + step, labels, *options)[0][r]
                lo = reference.hard_label_rows(s - step, labels, *options)[0][r]
                assert abs((hi - lo) / 2e-6 - grad[r, j]) < 1e-6, (options, r, j)
