"""The fused distillation kernels of libkldiv_cuda.so (custom_ops/gpu/distill_cuda.cu) on a real GPU, through
their AOT entry points (ctypes + torch CUDA tensors), against the float64 reference: statistics and both
gradients for every divergence and half/float32 dtype, a warp per row and a block per row, ignored rows, and
bitwise determinism. Skips cleanly without torch or a CUDA device (the same calls run on the CUDA-on-CPU stand-in
in test_cuda_distill_sim.py on every machine)."""
import numpy as np
import pytest

from _modules import reference as ref

from _gpu_checks import ATOL, TOL, close, distill_magnitudes
from _harness import call, to_f64, torch_cuda_reason

REASON = torch_cuda_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"needs a CUDA device: {REASON}")
STATS = 8


def run(s, t, temperature, beta, dloss):
    import torch
    hyper = torch.tensor([temperature, beta], dtype=torch.float64, device="cuda")
    stats = torch.empty(s.shape[:-1] + (STATS,), dtype=torch.float32, device="cuda")
    assert call("DistillFwd", [s, t, hyper, stats]) == 0
    ds, dt = torch.empty_like(s), torch.empty_like(t)
    assert call("DistillBwd", [s, t, hyper, stats, dloss, ds, dt]) == 0
    torch.cuda.synchronize()
    return stats, ds, dt


@pytest.mark.parametrize("dtype_id", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
@pytest.mark.parametrize("shape", [(64, 1000), (16, 32000), (3, 151936)])
def test_values_and_gradients(shape, beta, dtype_id):
    import torch
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype_id]
    rng = np.random.default_rng(0)
    s = torch.tensor(rng.normal(size=shape) * 3).to("cuda", dtype)
    t = torch.tensor(rng.normal(size=shape) * 3).to("cuda", dtype)
    g = rng.normal(size=shape[:-1])
    g[0] = 0.0
    stats, ds, dt = run(s, t, 2.0, beta, torch.tensor(g, dtype=torch.float32, device="cuda"))
    sv, tv = to_f64(s), to_f64(t)
    loss = ref.distillation_pointwise(sv, tv, 2.0, beta).sum(-1)
    loss_mag, grad_mag = distill_magnitudes(sv, tv, 2.0)
    close(to_f64(stats)[..., 0], loss, max(TOL[dtype_id], 1e-5), loss_mag, "row loss")
    eds, edt = ref.distillation_row_grads(sv, tv, 2.0, beta, g)
    mag = grad_mag * np.abs(g)[:, None]
    close(to_f64(ds), eds, max(TOL[dtype_id], 2e-5), mag, "d_student", max(ATOL[dtype_id], 2.0 ** -126))
    close(to_f64(dt), edt, max(TOL[dtype_id], 2e-5), mag, "d_teacher", max(ATOL[dtype_id], 2.0 ** -126))
    assert not to_f64(ds)[0].any() and not to_f64(dt)[0].any()
    again = run(s, t, 2.0, beta, torch.tensor(g, dtype=torch.float32, device="cuda"))
    assert all(torch.equal(a, b) for a, b in zip((stats, ds, dt), again))
