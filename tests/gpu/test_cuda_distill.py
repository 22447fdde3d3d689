"""The fused distillation kernels of libkldiv_cuda.so (custom_ops/gpu/distill_cuda.cu) on a real GPU, through
their AOT entry points (ctypes + torch CUDA tensors), against the float64 reference: statistics and both
gradients for every divergence and half/float32 dtype, a warp per row and a block per row, ignored rows, and
bitwise determinism; the loss menu's divergences at LLM vocabularies. Skips cleanly without torch or a CUDA device
(the same calls run on the CUDA-on-CPU stand-in in test_cuda_distill_sim.py on every machine)."""
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


@pytest.mark.parametrize("dtype_id", ["f32", "bf16"])
@pytest.mark.parametrize("shape", [(4, 32000), (2, 151936)])
@pytest.mark.parametrize("name", ["tvd", "skew_kl-0.1", "skew_rkl-0.3", "symmetric_kl-0.3", "symmetric_kl-0.3-scale2"])
def test_menu_at_llm_vocabularies(name, shape, dtype_id):
    """The menu's divergences (symmetric KL in one pass, the others in two) with -inf vocabulary padding and an
    ignored row, at vocabularies the stand-in's tests do not reach: row loss and both gradients against float64."""
    import torch
    from test_cuda_divergences_sim import VARIANTS, case_inputs, hyper_of, magnitudes, ref_grads, ref_loss
    variant = VARIANTS[name]
    dtype_name = {"f32": "float32", "bf16": "bfloat16"}[dtype_id]
    s64, t64, g = case_inputs(shape, 7, dtype_name)
    dtype = getattr(torch, dtype_name)
    s, t = torch.tensor(s64).to("cuda", dtype), torch.tensor(t64).to("cuda", dtype)
    hyper = torch.tensor(hyper_of(0.7, variant), dtype=torch.float64, device="cuda")
    stats = torch.empty(shape[:-1] + (STATS,), dtype=torch.float32, device="cuda")
    assert call("DistillFwd", [s, t, hyper, stats]) == 0
    ds, dt = torch.empty_like(s), torch.empty_like(t)
    assert call("DistillBwd", [s, t, hyper, stats, torch.tensor(g, dtype=torch.float32, device="cuda"), ds, dt]) == 0
    torch.cuda.synchronize()
    sv, tv = to_f64(s), to_f64(t)
    loss_mag, s_mag, t_mag = magnitudes(sv, tv, 0.7, variant)
    close(to_f64(stats)[..., 0], ref_loss(sv, tv, 0.7, variant), 1e-5, loss_mag, f"{name} row loss", 1e-30)
    eds, edt = ref_grads(sv, tv, 0.7, variant, g)
    gmag = np.abs(g)[:, None]
    tol, atol = max(TOL[dtype_id], 2e-5), max(ATOL[dtype_id], 2.0 ** -126)
    close(to_f64(ds), eds, tol, s_mag * gmag, f"{name} d_student", atol)
    close(to_f64(dt), edt, tol, t_mag * gmag, f"{name} d_teacher", atol)
    assert not to_f64(ds)[0].any() and not to_f64(dt)[0].any()
