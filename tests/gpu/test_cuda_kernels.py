"""libkldiv_cuda.so on a real GPU, through its AOT entry points (ctypes + torch CUDA tensors), against the
float64 reference: values and both gradients, every reduction, both target spaces, all four dtypes,
broadcast patterns (incl. 0-d operands and both operands broadcast), empty tensors, NaN/inf/zero mass,
alignment (vector and scalar paths), determinism, and sizes up to 2^27.

Skips cleanly without torch or a CUDA device. Run on a GPU machine with:
    PYTHONPATH=. python -m pytest -q tests/gpu
"""
import numpy as np
import pytest

from _modules import reference as ref

from _gpu_checks import ATOL, TOL, close, sample, term_magnitudes
from _harness import backward, backward_one, forward, lib, to_f64, torch_cuda_reason

REASON = torch_cuda_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"needs a CUDA device: {REASON}")

if REASON is None:
    import torch
    DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
else:  # collected but skipped
    torch = None
    DTYPES = {"f64": None, "f32": None, "f16": None, "bf16": None}

REDUCTIONS = ("none", "sum", "mean", "batchmean")


def tensors(x, t, dtype):
    xt = torch.tensor(np.asarray(x, np.float64)).to("cuda", dtype)
    tt = torch.tensor(np.asarray(t, np.float64)).to("cuda", dtype)
    return xt, tt, to_f64(xt), to_f64(tt)




def check_case(x, t, dtype_id, log_target, reductions=REDUCTIONS, dout_seed=0):
    dtype = DTYPES[dtype_id]
    xt, tt, xv, tv = tensors(x, t, dtype)
    bshape = np.broadcast_shapes(xv.shape, tv.shape)
    rng = np.random.default_rng(dout_seed)
    tol = TOL[dtype_id]
    for reduction in reductions:
        out = forward(xt, tt, reduction, log_target)
        exp = ref.kl_div(xv, tv, reduction, log_target)
        loss_m, pdx, pdt = term_magnitudes(xv, tv, log_target)
        loss_m = np.broadcast_to(loss_m, bshape)
        s = ref.reduction_scale(reduction, xv.shape, bshape)
        mag = loss_m if reduction == "none" else loss_m.sum() * abs(s)
        torch.cuda.synchronize()
        assert out.dtype == dtype and tuple(out.shape) == (bshape if reduction == "none" else ())
        close(to_f64(out), exp, tol, mag, f"{reduction} value", ATOL[dtype_id])
        # Incoming gradient: random elementwise for 'none', a random scalar otherwise.
        w = rng.normal(size=bshape) if reduction == "none" else np.asarray(rng.normal())
        wt = torch.tensor(w).to("cuda", dtype)
        wv = to_f64(wt)
        dx, dt = backward(xt, tt, wt, reduction, log_target)
        ex, et = ref.kl_div_grads(xv, tv, reduction, log_target, dout=wv)
        g = np.abs(np.broadcast_to(wv, bshape)) * (abs(s) if np.isfinite(s) else 1.0)
        mx = ref.sum_to(np.abs(pdx) * g, xv.shape)
        mt = ref.sum_to(np.abs(pdt) * g, tv.shape)
        torch.cuda.synchronize()
        assert dx.shape == xt.shape and dt.shape == tt.shape
        close(to_f64(dx), ex, tol, mx, f"{reduction} d/dinput", ATOL[dtype_id])
        close(to_f64(dt), et, tol, mt, f"{reduction} d/dtarget", ATOL[dtype_id])
        # the single-gradient kernels that compiled code uses
        dx1 = backward_one(xt, tt, wt, reduction, log_target, "input")
        dt1 = backward_one(xt, tt, wt, reduction, log_target, "target")
        torch.cuda.synchronize()
        close(to_f64(dx1), ex, tol, mx, f"{reduction} d/dinput alone", ATOL[dtype_id])
        close(to_f64(dt1), et, tol, mt, f"{reduction} d/dtarget alone", ATOL[dtype_id])



BROADCASTS = [
    ((), ()), ((7,), ()), ((), (7,)), ((4, 5), (4, 5)), ((4, 1, 3), (5, 3)), ((1, 5), (3, 1)),
    ((5,), (2, 3, 5)), ((2, 3, 4, 5), (3, 1, 5)), ((33, 17), (33, 17)), ((1,), (6,)),
    ((8, 1000), (1000,)),            # a shared target row: segmented reduction with many kept elements
    ((3, 1), (3, 4097)),             # few kept elements, long reduction: split + ordered finalize
]


@pytest.mark.parametrize("log_target", [False, True], ids=["prob", "logt"])
@pytest.mark.parametrize("dtype_id", list(DTYPES))
@pytest.mark.parametrize("xs, ts", BROADCASTS, ids=[f"{a}x{b}" for a, b in BROADCASTS])
def test_broadcast_patterns(xs, ts, dtype_id, log_target):
    rng = np.random.default_rng(hash((xs, ts)) & 0xffff)
    bshape = np.broadcast_shapes(xs, ts)
    x, t = sample(rng, bshape, log_target)
    x = x[tuple(slice(0, n) for n in (1,) * (len(bshape) - len(xs)) + xs)].reshape(xs) if xs else x.reshape(-1)[0]
    t = t[tuple(slice(0, n) for n in (1,) * (len(bshape) - len(ts)) + ts)].reshape(ts) if ts else t.reshape(-1)[0]
    check_case(x, t, dtype_id, log_target)


@pytest.mark.parametrize("dtype_id", list(DTYPES))
@pytest.mark.parametrize("xs, ts", [((0,), (0,)), ((2, 0), (0,)), ((0, 3), (3,)), ((1, 3), (0, 3))])
def test_empty(xs, ts, dtype_id):
    """'sum' of nothing is 0, 'mean' NaN, 'batchmean' NaN only when input.shape[0] == 0; gradients 0."""
    check_case(np.zeros(xs), np.zeros(ts), dtype_id, False)


@pytest.mark.parametrize("dtype_id", list(DTYPES))
def test_zero_mass_and_nan(dtype_id):
    inf, nan = np.inf, np.nan
    x = [0.5, -inf, inf, -2.0, -inf, 1e4, -0.7, nan, 0.3, nan]
    t = [0.0, 0.0, 0.0, -0.5, -inf, -3.0, 0.25, 0.5, nan, 0.0]
    check_case(x, t, dtype_id, False)
    tl = [-inf, -inf, -inf, -inf, -inf, -1.5, 0.0, -0.5, nan, -inf]
    check_case(x, tl, dtype_id, True)


@pytest.mark.parametrize("dtype_id", ["f32", "f16"])
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_misaligned_views(dtype_id, offset):
    """Pointers that are not 16-byte aligned take the scalar path and give the same results."""
    rng = np.random.default_rng(offset)
    x, t = sample(rng, (1027 + offset,), False)
    dtype = DTYPES[dtype_id]
    xt = torch.tensor(x).to("cuda", dtype)[offset:]
    tt = torch.tensor(t).to("cuda", dtype)[offset:]
    for reduction in REDUCTIONS:
        out = forward(xt, tt, reduction, False)
        torch.cuda.synchronize()
        loss_m = term_magnitudes(to_f64(xt), to_f64(tt), False)[0]
        close(to_f64(out), ref.kl_div(to_f64(xt), to_f64(tt), reduction), TOL[dtype_id],
              loss_m if reduction == "none" else loss_m.sum() * abs(ref.reduction_scale(reduction, xt.shape,
                                                                                         xt.shape)),
              f"offset {offset} {reduction}", ATOL[dtype_id])


def test_deterministic():
    """No atomics: repeated reductions are bitwise identical."""
    rng = np.random.default_rng(9)
    x, t = sample(rng, (3_000_001,), False)
    xt, tt = torch.tensor(x, device="cuda", dtype=torch.float32), torch.tensor(t, device="cuda", dtype=torch.float32)
    first = forward(xt, tt, "sum", False).item()
    assert all(forward(xt, tt, "sum", False).item() == first for _ in range(5))
    tb = tt[:1000]
    xb = xt[: 3000 * 1000].reshape(3000, 1000)
    g1 = backward(xb, tb, torch.ones(3000, 1000, device="cuda"), "none", False)[1].clone()
    g2 = backward(xb, tb, torch.ones(3000, 1000, device="cuda"), "none", False)[1]
    assert torch.equal(g1, g2)


def test_float32_sum_accuracy_32m():
    """SPEC: a float32 sum over 32M elements within 1e-6 relative of the float64 result."""
    n = 1 << 25
    g = torch.Generator(device="cuda").manual_seed(0)
    t = torch.rand(n, device="cuda", generator=g)
    x = torch.log1p(-torch.rand(n, device="cuda", generator=g)) - 2.0  # log of (0, 1]: finite
    got = forward(x, t, "sum", False).item()
    exp = float(ref.kl_div(x.double().cpu().numpy(), t.double().cpu().numpy(), "sum"))
    assert abs(got - exp) <= 1e-6 * abs(exp), (got, exp)


@pytest.mark.parametrize("dtype_id", ["f32", "bf16"])
def test_large_2_27(dtype_id):
    """2^27 elements (64-bit indexing territory for byte offsets of float64, grid-stride loops), checked
    against the reference on the GPU in float64 (the NumPy reference of 2^27 elements is checked on a
    strided sample)."""
    n = 1 << 27
    dtype = DTYPES[dtype_id]
    g = torch.Generator(device="cuda").manual_seed(1)
    t = torch.rand(n, device="cuda", generator=g).to(dtype)
    x = (torch.log1p(-torch.rand(n, device="cuda", generator=g)) - 1.0).to(dtype)  # log of (0, 1]: finite
    xd, td = x.double(), t.double()
    loss = torch.where(td > 0, td * (torch.log(torch.where(td > 0, td, 1.0)) - xd), 0.0)
    got = forward(x, t, "sum", False).item()
    exp = loss.sum().item()
    # the float32 accumulation within 1e-6 (SPEC), then the one rounding to the output dtype (bfloat16: 2^-9)
    stored = torch.tensor(exp, dtype=torch.float64).to(dtype).item()
    assert abs(got - exp) <= 1e-6 * abs(exp) + abs(stored - exp), (got, exp, stored)
    out = forward(x, t, "none", False)
    idx = torch.arange(0, n, 4099, device="cuda")
    close(to_f64(out[idx]), ref.pointwise_loss(to_f64(x[idx]), to_f64(t[idx])), TOL[dtype_id],
          term_magnitudes(to_f64(x[idx]), to_f64(t[idx]), False)[0], "2^27 none (sample)", ATOL[dtype_id])
    dx, dt = backward(x, t, torch.ones((), device="cuda", dtype=dtype), "mean", False)
    ex, et = ref.kl_div_grads(to_f64(x[idx]), to_f64(t[idx]), "none")
    close(to_f64(dx[idx]) * n, ex, TOL[dtype_id] * 4, what="2^27 d/dinput (sample)")
    close(to_f64(dt[idx]) * n, et, TOL[dtype_id] * 4, np.abs(et) + 1, what="2^27 d/dtarget (sample)")


def test_lib_info():
    info = lib().KLDivLibInfo().decode()
    assert "ABI 1" in info and "CUDA" in info
