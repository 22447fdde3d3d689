"""The Ascend fused distillation operators (AscendC DistillCustom/DistillCustomGrad) through
ascend.distill_rows_op, without an Ascend device: the operators' declaration and detection in an installed
package, and the Python wiring (stats as the forward's output, the loss column, the bprop through the backward
kernel, ignored rows, frozen teacher, second order) in PyNative, GRAPH_MODE and ms.jit, with the kernels replaced by
pyfunc Custom ops that run the kernel sources on the AscendC stand-in (tests/ascend/distill_sim.py).
The KL-divergence operators are in test_ascend_kldiv.py.
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops
from mindspore.ops import constexpr

import ms_kldiv
from ms_kldiv import reference as ref
from ms_kldiv.backends import ascend

from conftest import make, to_numpy
import _ascend_common
from _ascend_common import F16, F32, NP_DTYPE, WIRING_MODES, Bound, distill_sim, fake_vendor, run_in_mode

clean_env = _ascend_common.clean_env  # a fixture: pytest looks it up in this module


class SimulatedDistillKernels:
    """The AscendCDistillKernels contract, computed by op_kernel/distill_custom*.cpp on the CPU stand-in."""

    dtypes = ascend.AscendCDistillKernels.dtypes

    def __init__(self, cores=3):
        self.sims = {}
        self.cores = cores
        self.backward_calls = []
        self.variants = []  # the variant of each forward Cell built

    def _sim(self, np_dtype):
        name = NP_DTYPE[np.dtype(np_dtype)]
        if name not in self.sims:
            self.sims[name] = distill_sim.DistillKernelSimulator(name)
        return self.sims[name]

    def unsupported(self, variant):
        return ascend.AscendCDistillKernels().unsupported(variant)

    def forward(self, temperature, beta, variant=None):
        self.variants.append(variant)

        def kernel(s, t):
            return self._sim(s.dtype).forward(s, t, temperature, beta, cores=self.cores, variant=variant)

        return Bound(ops.Custom(kernel, out_shape=lambda s, t: list(s[:-1]) + [8],
                                out_dtype=lambda s, t: ms.float32, func_type="pyfunc"))

    def backward(self, temperature, beta, teacher_grad, variant=None):
        def kernel(s, t, stats, g):
            self.backward_calls.append(teacher_grad)
            ds, dt = self._sim(s.dtype).backward(s, t, stats, g, temperature, beta, teacher_grad, cores=self.cores,
                                                 variant=variant)
            return np.asarray(ds, s.dtype), (np.asarray(dt, t.dtype) if teacher_grad else np.zeros(1, t.dtype))

        out_shape = (lambda s, t, st, g: (s, t)) if teacher_grad else (lambda s, t, st, g: (s, [1]))
        return Bound(ops.Custom(kernel, out_shape=out_shape, out_dtype=lambda s, t, st, g: (s, t),
                                func_type="pyfunc"))


class _MaskedBatchmean(nn.Cell):
    """What the distillation front end does with the row losses: ignored rows out, 'batchmean' over the rest."""

    def __init__(self, rows_op, ignore_index=-100):
        super().__init__()
        self.rows = rows_op
        self.ignore_index = ignore_index

    def construct(self, s, t, labels):
        rows = self.rows(s, t)
        keep = labels != self.ignore_index
        count = ops.maximum(ops.cast(keep, ms.float32).sum(), 1.0)
        return ops.where(keep, rows, 0.0).sum() / count


class _DistillValueAndGrads(nn.Cell):
    def __init__(self, loss):
        super().__init__()
        self.loss = loss
        self.grad = ops.GradOperation(get_all=True)(loss)

    def construct(self, s, t, labels):
        ds, dt, _ = self.grad(s, t, labels)
        return self.loss(s, t, labels), ds, dt


_DISTILL_CELLS = {}


def _distill_cell(temperature, beta, teacher_grad):
    key = (temperature, beta, teacher_grad)
    if key not in _DISTILL_CELLS:
        kernels = SimulatedDistillKernels()
        rows_op = ascend.distill_rows_op(temperature, beta, teacher_grad=teacher_grad, kernels=kernels)
        _DISTILL_CELLS[key] = (_DistillValueAndGrads(_MaskedBatchmean(rows_op)), kernels)
    return _DISTILL_CELLS[key]


def test_distill_op_is_declared_and_harmless_off_ascend():
    """Importable and constructible on CPU: no Ascend primitive is touched until a Cell is built."""
    assert ascend.DISTILL_OP_NAME == "DistillCustom" and ascend.DISTILL_GRAD_OP_NAME == "DistillCustomGrad"
    assert ascend.distill_ops_installed() is False or ascend.find_custom_opp()[0] is not None
    # The real aot Cells can be built anywhere (they only launch on Ascend).
    both = ascend.distill_rows_op(2.0, 0.5)
    frozen = ascend.distill_rows_op(1.0, 0.0, teacher_grad=False)
    assert isinstance(both.core.kernel, ascend._DistillKernelForward)
    assert isinstance(both.core.grad.kernel, ascend._DistillKernelBackward) and both.core.grad.kernel.teacher_grad
    assert not frozen.core.grad.kernel.teacher_grad


def test_distill_ops_detected_in_an_installed_package(clean_env, tmp_path):
    old = fake_vendor(str(tmp_path), name="old")
    clean_env.setenv("ASCEND_CUSTOM_OPP_PATH", old)
    ascend._find_custom_opp.cache_clear()
    assert ascend.find_custom_opp()[0] == old and not ascend.distill_ops_installed()
    new = fake_vendor(str(tmp_path), name="new", ops_in_json=("KlDivCustom", "KlDivCustomGrad", "DistillCustom",
                                                              "DistillCustomGrad"))
    clean_env.setenv("ASCEND_CUSTOM_OPP_PATH", new)
    ascend._find_custom_opp.cache_clear()
    assert ascend.distill_ops_installed()


@pytest.mark.parametrize("mode", WIRING_MODES)
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_distill_rows_op_values_and_both_gradients(mode, beta):
    rng = np.random.default_rng(5)
    rows, vocab, temperature = 7, 301, 2.0
    s_np = rng.standard_normal((rows, vocab)) * 2
    t_np = rng.standard_normal((rows, vocab)) * 2
    s_np[0, ::9] = t_np[0, ::9] = -np.inf             # shared padded vocabulary
    labels_np = np.array([1, -100, 3, 4, -100, 6, 7], np.int32)
    cell, kernels = _distill_cell(temperature, beta, True)
    s, sv = make(s_np, F32)
    t, tv = make(t_np, F32)
    loss, ds, dt = run_in_mode(mode, cell, s, t, ms.Tensor(labels_np))
    exp = ref.distillation_loss(sv, tv, temperature, "batchmean", beta, labels=labels_np)
    np.testing.assert_allclose(to_numpy(loss), exp, rtol=1e-5, err_msg=f"{mode} beta={beta} value")
    keep = (labels_np != -100).astype(np.float64)
    eds, edt = distill_sim.reference_grads_f64(sv, tv, temperature, beta, keep / keep.sum())
    np.testing.assert_allclose(to_numpy(ds), eds, rtol=1e-4, atol=1e-7, err_msg=f"{mode} beta={beta} d_student")
    np.testing.assert_allclose(to_numpy(dt), edt, rtol=1e-4, atol=1e-7, err_msg=f"{mode} beta={beta} d_teacher")
    assert (to_numpy(ds)[labels_np == -100] == 0).all() and (to_numpy(dt)[labels_np == -100] == 0).all()
    assert kernels.backward_calls and all(kernels.backward_calls)


@pytest.mark.parametrize("mode", WIRING_MODES)
def test_distill_rows_op_frozen_teacher(mode):
    """teacher_grad=False: the backward kernel runs without teacher work, the teacher's gradient is zeros and
    d_student is unchanged."""
    rng = np.random.default_rng(6)
    s_np, t_np = rng.standard_normal((5, 64)), rng.standard_normal((5, 64))
    labels = ms.Tensor(np.arange(5, dtype=np.int32))
    cell, kernels = _distill_cell(1.0, 0.0, False)
    both, _ = _distill_cell(1.0, 0.0, True)
    s, _ = make(s_np, F32)
    t, _ = make(t_np, F32)
    loss, ds, dt = run_in_mode(mode, cell, s, t, labels)
    loss2, ds2, _ = run_in_mode(mode, both, s, t, labels)
    assert float(to_numpy(loss)) == float(to_numpy(loss2))
    np.testing.assert_array_equal(to_numpy(ds), to_numpy(ds2))
    assert (to_numpy(dt) == 0).all() and tuple(dt.shape) == (5, 64)
    assert kernels.backward_calls and not any(kernels.backward_calls)


@pytest.mark.parametrize("mode", WIRING_MODES)
def test_distill_rows_op_float16(mode):
    rng = np.random.default_rng(8)
    s_np, t_np = rng.standard_normal((4, 100)), rng.standard_normal((4, 100))
    cell, _ = _distill_cell(1.0, 0.5, True)
    s, sv = make(s_np, F16)
    t, tv = make(t_np, F16)
    loss, ds, dt = run_in_mode(mode, cell, s, t, ms.Tensor(np.zeros(4, np.int32)))
    assert ds.dtype == F16 and dt.dtype == F16
    np.testing.assert_allclose(to_numpy(loss), ref.distillation_loss(sv, tv, 1.0, "batchmean", 0.5), rtol=1e-5)
    eds, edt = distill_sim.reference_grads_f64(sv, tv, 1.0, 0.5, np.full(4, 0.25))
    np.testing.assert_allclose(to_numpy(ds), eds, rtol=2e-3, atol=2e-6)
    np.testing.assert_allclose(to_numpy(dt), edt, rtol=2e-3, atol=2e-6)


class _DistillFirstOrder(nn.Cell):
    def __init__(self, rows_op):
        super().__init__()
        self.grad = ops.GradOperation(get_all=True)(_DistillWeightedRows(rows_op))

    def construct(self, s, t, g, v1, v2):
        ds, dt, _ = self.grad(s, t, g)
        return (ds * v1).sum() + (dt * v2).sum()


class _DistillWeightedRows(nn.Cell):
    def __init__(self, rows_op):
        super().__init__()
        self.rows = rows_op

    def construct(self, s, t, g):
        return (self.rows(s, t) * g).sum()


@pytest.mark.parametrize("mode", WIRING_MODES)
@pytest.mark.parametrize("beta, teacher_grad", [(0.0, True), (0.5, True), (1.0, True), (0.5, False)])
def test_distill_rows_op_second_order(mode, beta, teacher_grad):
    """Gradient of <v1, d_student> + <v2, d_teacher> w.r.t. both logits and the row weights, against central
    differences of the float64 reference gradients (frozen teacher: d_teacher is zeros, so only the first term)."""
    rng = np.random.default_rng(9)
    s_np, t_np = rng.standard_normal((3, 6)), rng.standard_normal((3, 6))
    s_np[0, 1] = t_np[0, 1] = -np.inf
    g_np, v1, v2 = rng.uniform(0.5, 1.5, 3), rng.standard_normal((3, 6)), rng.standard_normal((3, 6))
    temperature = 1.5
    key = ("second", beta, teacher_grad)
    if key not in _DISTILL_CELLS:
        rows_op = ascend.distill_rows_op(temperature, beta, teacher_grad=teacher_grad,
                                         kernels=SimulatedDistillKernels())
        _DISTILL_CELLS[key] = ops.GradOperation(get_all=True)(_DistillFirstOrder(rows_op))
    got = run_in_mode(mode, _DISTILL_CELLS[key], *[make(a, F32)[0] for a in (s_np, t_np, g_np, v1, v2)])

    def f(s_, t_, g_):
        ds, dt = distill_sim.reference_grads_f64(s_, t_, temperature, beta, g_)
        first = (np.where(np.isfinite(s_), ds, 0.0) * v1).sum()
        return float(first + (np.where(np.isfinite(t_), dt, 0.0) * v2).sum() if teacher_grad else first)

    args = [s_np.copy(), t_np.copy(), g_np.copy()]
    for which, name in enumerate(("student", "teacher", "row weights")):
        fd = np.zeros_like(args[which])
        for i in np.ndindex(fd.shape):
            if not np.isfinite(args[which][i]):
                continue
            old = args[which][i]
            args[which][i] = old + 1e-6
            hi = f(*args)
            args[which][i] = old - 1e-6
            lo = f(*args)
            args[which][i] = old
            fd[i] = (hi - lo) / 2e-6
        g_ = to_numpy(got[which])
        g_ = np.where(np.isfinite(args[which]), g_, 0.0) if which < 2 else g_
        np.testing.assert_allclose(g_, fd, rtol=2e-3, atol=2e-4, err_msg=f"{mode} beta={beta} d2/d{name}")


# ------------------------------------------------------------------------- the fused head on the AscendC kernels
@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_fused_head_takes_the_ascendc_kernels(clean_env, tmp_path, monkeypatch, mode):
    """On Ascend with the distillation operators installed, the registry gives FusedLinearDistillationLoss the
    AscendC kernels (not the closed forms): with the device target read as 'Ascend', an installed package faked, and
    the kernels run on the AscendC stand-in, the head's value and all six gradients equal the float64 composition
    and the stand-in's kernels are the ones that ran (the teacher's gradient included)."""
    from ms_kldiv import FusedLinearDistillationLoss, backends
    from _head_checks import Net, case, reference_grads, reference_loss, value_and_grads

    vendor = fake_vendor(tmp_path, ops_in_json=("KlDivCustom", "KlDivCustomGrad", "DistillCustom", "DistillCustomGrad"))
    clean_env.setenv("ASCEND_CUSTOM_OPP_PATH", vendor)
    simulated = SimulatedDistillKernels()
    monkeypatch.setattr(ascend.AscendAotBackend, "distill_kernels", lambda self, device: simulated)
    monkeypatch.setattr(backends, "device_target", lambda: "Ascend")
    backends._kernels.cache_clear()
    try:
        rows = {r["name"]: r for r in backends.backend_info("Ascend", op="distillation")}
        assert rows["aot"]["auto"], rows
        loss_fn = FusedLinearDistillationLoss(1.5, beta=0.5, hard_weight=0.3, chunk_size=4)
    finally:
        backends._kernels.cache_clear()
    assert loss_fn.backend == "aot"
    c = case(seed=4)
    value, grads = value_and_grads(Net(loss_fn), c, mode)
    np.testing.assert_allclose(value, reference_loss(c, 1.5, 0.5, 0.3, 1.0), rtol=1e-5)
    for name, want in reference_grads(c, 1.5, 0.5, 0.3, 1.0).items():
        np.testing.assert_allclose(grads[name], want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=name)
    assert False in simulated.backward_calls and True in simulated.backward_calls, simulated.backward_calls


# ------------------------------------------------------------ the loss menu (divergences, logits transform) on Ascend
def test_ascendc_distill_kernels_take_every_variant():
    """The AscendC operators compute every divergence and logits transform: none is sent to the composite kernels,
    and the Cells bind the variant as the operators' attributes (divergence code, alpha, softcap, logit_scale)."""
    from ms_kldiv._distill_math import DIVERGENCES, KL, Variant
    kernels = ascend.AscendCDistillKernels()
    for div in DIVERGENCES:
        for cap, scale in ((0.0, 1.0), (3.0, 0.5), (0.0, 2.0)):
            assert kernels.unsupported(Variant(div, 0.3 if div != "kl" else 0.0, cap, scale)) is None
    fwd = kernels.forward(2.0, 0.0, Variant("skew_rkl", 0.1, 3.0, 0.5))
    assert (fwd.divergence, fwd.alpha, fwd.softcap, fwd.logit_scale) == (3, 0.1, 3.0, 0.5)
    bwd = kernels.backward(2.0, 0.0, False, Variant("tvd", 0.0, 0.0, 2.0))
    assert (bwd.divergence, bwd.softcap, bwd.logit_scale, bwd.teacher_grad) == (1, 0.0, 2.0, False)
    plain = kernels.forward(1.0, 0.5, KL)
    assert (plain.divergence, plain.alpha, plain.softcap, plain.logit_scale) == (0, 0.0, 0.0, 1.0)


class _MenuLoss(nn.Cell):
    def __init__(self, divergence, alpha, softcap, logit_scale):
        super().__init__()
        self.divergence, self.alpha, self.softcap, self.logit_scale = divergence, alpha, softcap, logit_scale

    def construct(self, s, t, labels):
        return ms_kldiv.distillation_loss(s, t, 1.5, "batchmean", labels=labels, backend="aot",
                                          divergence=self.divergence, alpha=self.alpha, softcap=self.softcap,
                                          logit_scale=self.logit_scale)


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("divergence, alpha, softcap, logit_scale",
                         [("tvd", None, 3.0, 0.5), ("skew_kl", 0.1, None, 2.0)])
def test_distillation_loss_menu_takes_the_ascendc_kernels(clean_env, monkeypatch, tmp_path, mode, divergence, alpha,
                                                          softcap, logit_scale):
    """ms_kldiv.distillation_loss(..., divergence=..., softcap=..., backend='aot') on a faked Ascend device with the
    distillation operators installed: the AscendC kernels (run on the stand-in) compute the variant, value and both
    gradients equal the float64 reference, ignored rows get exact zeros."""
    from ms_kldiv import backends, distillation
    from ms_kldiv._distill_math import Variant

    vendor = fake_vendor(tmp_path, ops_in_json=("KlDivCustom", "KlDivCustomGrad", "DistillCustom", "DistillCustomGrad"))
    clean_env.setenv("ASCEND_CUSTOM_OPP_PATH", vendor)
    simulated = SimulatedDistillKernels()
    monkeypatch.setattr(ascend.AscendAotBackend, "distill_kernels", lambda self, device: simulated)
    monkeypatch.setattr(backends, "device_target", lambda: "Ascend")
    # distillation_loss reads the device through a constexpr (graph code): that one reads 'Ascend' too
    monkeypatch.setattr(distillation, "_device_target_const", constexpr(lambda: "Ascend"))
    backends._kernels.cache_clear()
    distillation._fused_rows.cache_clear()
    try:
        rng = np.random.default_rng(12)
        s_np, t_np = rng.standard_normal((5, 300)) * 3, rng.standard_normal((5, 300)) * 3
        s_np[0, -20:] = t_np[0, -20:] = -np.inf  # padded vocabulary
        labels_np = np.array([1, -100, 3, 4, 5], np.int32)
        s, sv = make(s_np, F32)
        t, tv = make(t_np, F32)
        cell = _DistillValueAndGrads(_MenuLoss(divergence, alpha, softcap, logit_scale))
        loss, ds, dt = run_in_mode(mode, cell, s, t, ms.Tensor(labels_np))
    finally:
        backends._kernels.cache_clear()
        distillation._fused_rows.cache_clear()
    variant = Variant(divergence, alpha or 0.0, softcap or 0.0, logit_scale)
    assert variant in simulated.variants and simulated.backward_calls, (simulated.variants, simulated.backward_calls)
    exp = ref.distillation_loss(sv, tv, 1.5, "batchmean", labels=labels_np, divergence=divergence,
                                alpha=variant.alpha, softcap=variant.softcap, logit_scale=logit_scale)
    np.testing.assert_allclose(to_numpy(loss), exp, rtol=1e-5, err_msg=mode)
    keep = (labels_np != -100).astype(np.float64)
    eds, edt = distill_sim.reference_variant_grads_f64(sv, tv, 1.5, 0.0, variant, keep / keep.sum())
    scale = np.abs(eds).max()
    np.testing.assert_allclose(to_numpy(ds), eds, rtol=1e-4, atol=1e-5 * scale, err_msg=f"{mode} d_student")
    np.testing.assert_allclose(to_numpy(dt), edt, rtol=1e-4, atol=1e-5 * scale, err_msg=f"{mode} d_teacher")
    assert (to_numpy(ds)[1] == 0).all() and (to_numpy(dt)[1] == 0).all()
