"""The Ascend KL-divergence backends ('aot': AscendC KlDivCustom/KlDivCustomGrad, 'native': aclnnKlDiv + our
gradients).

Without an Ascend device, everything except the kernels themselves runs here:
  * registration and availability reporting on CPU (nothing Ascend is touched) and with a fake installed
    custom-op package on disk;
  * the Python layer of both ops (routing, broadcasting, scaling, dtype handling, first- and second-order
    gradients) in PyNative, GRAPH_MODE and under ms.jit, with the AscendC kernels run as pyfunc Custom ops:
    the kernel sources compiled for the CPU stand-in of AscendC (tests/ascend/ascendc_sim), and
    aclnnKlDiv replaced by PyTorch's convention (NaN for negative targets) written in MindSpore ops;
  * the real operators, only on an Ascend device with the package installed (skipped otherwise, saying why);
  * benchmarks/ascend/bench_ascend.py's rows and its no-Ascend exit path.
The distillation operators are in test_ascend_distill.py.
"""
import os
import sys
import warnings

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops

import ms_kldiv
from ms_kldiv import reference as ref
from ms_kldiv.backends import ascend

from conftest import TOL, assert_close, make, to_numpy
import _ascend_common
from _ascend_common import F16, F32, NP_DTYPE, WIRING_MODES, Bound, backends, fake_vendor, model, run_in_mode

clean_env = _ascend_common.clean_env  # a fixture: pytest looks it up in this module

REDUCTIONS = ("none", "sum", "mean", "batchmean")


# ------------------------------------------------------------------------------------ registration
def test_registered_for_ascend_only_and_harmless_on_cpu():
    assert {"aot", "native"} <= set(ms_kldiv.backend_names())
    aot = backends.get("aot", "Ascend")
    native = backends.get("native", "Ascend")
    assert isinstance(aot, ascend.AscendAotBackend) and isinstance(native, ascend.AscendNativeBackend)
    assert aot.preference == {"Ascend": 100} and native.preference == {"Ascend": 50}
    for device in ("CPU", "GPU"):
        assert "does not support device target" in native.unavailable_reason(device)
        assert "does not support device target" in aot.unavailable_reason(device)
        assert backends.resolve("auto", device).name not in ("native",)
    rows = {r["name"]: r for r in ms_kldiv.backend_info("CPU")}
    assert rows["native"]["available"] is False and rows["native"]["preference"] is None
    assert "CPU" in rows["native"]["reason"]


def test_aot_unavailable_without_package_says_how_to_get_it(clean_env):
    reason = backends.get("aot", "Ascend").unavailable_reason("Ascend")
    assert "not installed" in reason and "build.sh" in reason and "ASCEND_CUSTOM_OPP_PATH" in reason
    with pytest.raises(RuntimeError, match="build.sh"):
        backends.resolve("aot", "Ascend")
    # 'auto' on Ascend falls back to 'native', saying so once.
    backends._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert backends.resolve("auto", "Ascend").name == "native"
        assert backends.resolve("auto", "Ascend").name == "native"
    assert len([w for w in caught if "'aot' is unavailable" in str(w.message)]) == 1


def test_aot_found_through_custom_opp_path(clean_env, tmp_path):
    vendor = fake_vendor(str(tmp_path))
    clean_env.setenv("ASCEND_CUSTOM_OPP_PATH", f"/nonexistent:{vendor}")
    ascend._find_custom_opp.cache_clear()
    assert ascend.find_custom_opp()[0] == vendor
    assert backends.get("aot", "Ascend").unavailable_reason("Ascend") is None
    assert backends.resolve("auto", "Ascend").name == "aot"
    rows = {r["name"]: r for r in ms_kldiv.backend_info("Ascend")}
    assert rows["aot"]["auto"] and rows["aot"]["available"] and rows["native"]["available"]


def test_aot_found_in_opp_vendors(clean_env, tmp_path):
    opp = tmp_path / "opp"
    vendors = opp / "vendors"
    vendors.mkdir(parents=True)
    fake_vendor(str(vendors), name="other_vendor", ops_in_json=("SomethingElse",))
    vendor = fake_vendor(str(vendors), name="ms_kldiv")
    (vendors / "config.ini").write_text("load_priority=other_vendor,ms_kldiv\n")
    clean_env.setenv("ASCEND_OPP_PATH", str(opp))
    ascend._find_custom_opp.cache_clear()
    assert ascend.find_custom_opp()[0] == vendor


@pytest.mark.parametrize("broken", ["no_grad_op", "no_header"])
def test_incomplete_package_is_not_used(clean_env, tmp_path, broken):
    vendor = fake_vendor(str(tmp_path), ops_in_json=("KlDivCustom",) if broken == "no_grad_op" else
                         ("KlDivCustom", "KlDivCustomGrad"), header=broken != "no_header")
    clean_env.setenv("ASCEND_CUSTOM_OPP_PATH", vendor)
    ascend._find_custom_opp.cache_clear()
    assert ascend.find_custom_opp()[0] is None
    assert vendor in backends.get("aot", "Ascend").unavailable_reason("Ascend")


# --------------------------------------------------------------------- kernels replaced by the model
class SimulatedKernels:
    """The AscendCKernels contract, computed by the kernel sources themselves (op_kernel/*.cpp run on the
    CPU stand-in of AscendC, see kldiv_tile_model.KernelSimulator), wrapped in pyfunc Custom ops."""

    def __init__(self, cores=40):
        self.sims = {}
        self.cores = cores

    def _sim(self, np_dtype):
        name = NP_DTYPE[np.dtype(np_dtype)]
        if name not in self.sims:
            self.sims[name] = model.KernelSimulator(name)
        return self.sims[name]

    def forward(self, reduction, log_target):
        def kernel(x, t):
            y = self._sim(x.dtype).forward(x, t, reduction, log_target, cores=self.cores)
            return np.asarray(y, x.dtype)

        out_shape = (lambda x, t: x) if reduction == "none" else (lambda x, t: [])
        return Bound(ops.Custom(kernel, out_shape=out_shape, out_dtype=lambda x, t: x, func_type="pyfunc"))

    def backward(self, reduction, log_target):
        def kernel(x, t, g):
            dx, dt = self._sim(x.dtype).backward(x, t, g, reduction, log_target, cores=self.cores)
            return np.asarray(dx, x.dtype), np.asarray(dt, t.dtype)

        return Bound(ops.Custom(kernel, out_shape=lambda x, t, g: (x, t), out_dtype=lambda x, t, g: (x, t),
                                func_type="pyfunc"))


def _torch_convention(summed, log_target):
    """aclnnKlDiv stand-in following PyTorch: xlogy(t, t) - t * x, so NaN for t < 0 and for t = 0, x = -inf.
    Branch-free per variant (it runs inside a Cell with a bprop)."""
    def prob(x, t, reduction, log_target_):
        loss = ops.xlogy(t, t) - t * x
        return ops.sum(loss) if summed else loss

    def log(x, t, reduction, log_target_):
        loss = ops.exp(t) * (t - x)
        return ops.sum(loss) if summed else loss

    return log if log_target else prob


class TorchConventionKernel:
    def __init__(self, summed, log_target):
        self.fn = _torch_convention(summed, log_target)

    def __call__(self):
        return self.fn


_OPS = {}


def _op(kind, reduction, log_target):
    if kind == "aot" and model.compiler() is None:
        pytest.skip("no C++ compiler (g++ or $CXX) to build the CPU stand-in of the AscendC kernels")
    key = (kind, reduction, log_target)
    if key not in _OPS:
        fallback = backends.get("composite").make_op(reduction, log_target)
        if kind == "aot":
            _OPS[key] = ascend.aot_op(reduction, log_target, kernels=_KERNELS(), fallback=fallback)
        else:
            _OPS[key] = ascend.native_op(reduction, log_target, fallback=fallback,
                                           kernel=TorchConventionKernel(reduction != "none", log_target))
    return _OPS[key]


_KERNEL_SINGLETON = []


def _KERNELS():
    if not _KERNEL_SINGLETON:
        _KERNEL_SINGLETON.append(SimulatedKernels())
    return _KERNEL_SINGLETON[0]


class ValueAndGrads(nn.Cell):
    """(loss, d/dx, d/dt) of sum(loss * w)."""

    def __init__(self, op):
        super().__init__()
        self.op = op
        self.grad = ops.GradOperation(get_all=True)(_Weighted(op))

    def construct(self, x, t, w):
        dx, dt, _ = self.grad(x, t, w)
        return self.op(x, t), dx, dt


class _Weighted(nn.Cell):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def construct(self, x, t, w):
        return (self.op(x, t) * w).sum()


_CELLS = {}


class AllReductions(nn.Cell):
    """(loss, d/dx, d/dt) for every reduction in one Cell, so one graph compile serves all four."""

    def __init__(self, kind, log_target):
        super().__init__()
        self.vgs = nn.CellList([ValueAndGrads(_op(kind, r, log_target)) for r in REDUCTIONS])
        self.n = len(REDUCTIONS)

    def construct(self, x, t, w_none, w_red):
        res = ()
        for i in range(self.n):
            w = w_none if i == 0 else w_red  # REDUCTIONS[0] == 'none'
            res = res + (self.vgs[i](x, t, w),)
        return res


def _all(kind, log_target):
    key = ("all", kind, log_target)
    if key not in _CELLS:
        _CELLS[key] = AllReductions(kind, log_target)
    return _CELLS[key]


def _loss_terms(x, t, log_target):
    """|first term| + |second term| of the pointwise loss: its float32 cancellation scale; 0 without mass."""
    x, t = np.broadcast_arrays(x, t)
    mass = ref.has_mass(t, log_target)
    ts, xs = np.where(mass, t, 1.0), np.where(mass, x, 0.0)
    with np.errstate(all="ignore"):
        m = np.exp(ts) * (np.abs(ts) + np.abs(xs)) if log_target else np.abs(ts) * (np.abs(np.log(ts)) + np.abs(xs))
    return np.where(mass & np.isfinite(m), m, 0.0)


def _grad_terms(x, t, log_target):
    """Sizes of the terms each pointwise derivative adds up (its float32 cancellation scale); 0 without mass."""
    x, t = np.broadcast_arrays(x, t)
    mass = ref.has_mass(t, log_target)
    ts, xs = np.where(mass, t, 1.0), np.where(mass, x, 0.0)
    with np.errstate(all="ignore"):
        if log_target:
            e = np.exp(ts)
            dx, dt = e, e * (np.abs(ts) + np.abs(xs) + 1)
        else:
            dx, dt = np.abs(ts), np.abs(np.log(ts)) + 1 + np.abs(xs)
    clean = lambda a: np.where(mass & np.isfinite(a), a, 0.0)  # noqa: E731
    return clean(dx), clean(dt)


def _check_case(kind, mode, x_np, t_np, log_target, dtype, seed=0):
    x, xv = make(x_np, dtype)
    t, tv = make(t_np, dtype)
    bshape = np.broadcast_shapes(xv.shape, tv.shape)
    rng = np.random.default_rng(seed)
    (w_none, wv_none), (w_red, wv_red) = make(rng.uniform(0.5, 1.5, bshape), dtype), make(rng.uniform(0.5, 1.5), dtype)
    results = run_in_mode(mode, _all(kind, log_target), x, t, w_none, w_red)
    for reduction, (out, dx, dt) in zip(REDUCTIONS, results):
        wv = wv_none if reduction == "none" else wv_red
        tag = f"{kind} {mode} {reduction} log_target={log_target} {dtype}"
        assert out.dtype == dtype and tuple(out.shape) == (bshape if reduction == "none" else ()), tag
        with np.errstate(all="ignore"):
            exp = ref.kl_div(xv, tv, reduction, log_target)
            ex, et = ref.kl_div_grads(xv, tv, reduction, log_target, dout=wv)
            s = ref.reduction_scale(reduction, xv.shape, bshape)
            mag = _loss_terms(xv, tv, log_target)
            mag = mag if reduction == "none" else np.nansum(mag) * abs(s)
        assert_close(to_numpy(out), exp, dtype, mag, f"{tag} value")
        assert tuple(dx.shape) == xv.shape and dx.dtype == dtype, tag
        assert tuple(dt.shape) == tv.shape and dt.dtype == dtype, tag
        gx, gt = _grad_terms(xv, tv, log_target)
        g = np.abs(np.broadcast_to(wv, bshape) * s)
        with np.errstate(all="ignore"):
            mx = ref.sum_to(gx * g, xv.shape)
            mt = ref.sum_to(gt * g, tv.shape)
        # Gradients returned in float16 can be subnormal (e.g. 'mean' over thousands of elements): their
        # spacing, 2**-24, is an absolute floor on the error.
        floor = 2.0 ** -24 / TOL[dtype] if dtype == F16 else 0.0
        assert_close(to_numpy(dx), ex, dtype, mx + floor, f"{tag} d/dinput")
        assert_close(to_numpy(dt), et, dtype, mt + floor, f"{tag} d/dtarget")


def _probs(shape, rng, log_target):
    if log_target:
        return rng.standard_normal(shape) - 1.0
    return rng.uniform(0.01, 1.0, shape)


KINDS = ("aot", "native")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", WIRING_MODES)
@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_values_and_gradients(kind, mode, log_target, dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 700)) - 1.0     # 4200 elements: two cores, ragged tiles
    t = _probs((6, 700), rng, log_target)
    _check_case(kind, mode, x, t, log_target, dtype)


# x shape, t shape: target broadcast, input broadcast ('batchmean' must use input's first dim), 0-d input.
BROADCASTS = [((4, 5), (5,)), ((1, 5), (3, 5)), ((5,), (2, 5)), ((), (3,)), ((2, 1, 3), (4, 1))]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", WIRING_MODES)
@pytest.mark.parametrize("shapes", BROADCASTS, ids=[f"{a}-{b}" for a, b in BROADCASTS])
def test_broadcast_gradients_summed_back(kind, mode, shapes):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shapes[0]) - 1.0
    t = _probs(shapes[1], rng, False)
    _check_case(kind, mode, x, t, False, F32)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", WIRING_MODES)
def test_broadcast_half_sums_back_in_float32(kind, mode):
    """A float16 target broadcast over 512 rows: its gradient is a 512-term sum, done in float32."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((512, 24)) - 1.0
    t = _probs((24,), rng, True)
    _check_case(kind, mode, x, t, True, F16)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", WIRING_MODES)
@pytest.mark.parametrize("log_target", [False, True])
def test_zero_mass_and_nan(kind, mode, log_target):
    """Zero-mass lanes are exactly 0 even where the 'native' value function would give NaN (t < 0, t = 0
    with x = -inf); NaN in t, or in x with mass, propagates."""
    none = -np.inf if log_target else 0.0
    x = np.array([-np.inf, np.nan, 0.3, np.nan, -1.0, -np.inf, 0.5, -2.0])
    t = np.array([none, none, np.nan, 0.4, -0.5 if not log_target else none, 0.2, 0.7, none])
    _check_case(kind, mode, x, t, log_target, F32)
    x2 = np.array([-np.inf, 0.3, 1.0, -0.2])
    t2 = np.array([none, none, -3.0 if not log_target else none, 0.5])
    _check_case(kind, mode, x2, t2, log_target, F32)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", WIRING_MODES)
def test_float64_and_empty_go_to_composite(kind, mode):
    rng = np.random.default_rng(4)
    _check_case(kind, mode, rng.standard_normal((3, 4)) - 1, rng.uniform(0.1, 1, (3, 4)), False, ms.float64)
    x, _ = make(np.zeros((0, 4)), F32)
    t, _ = make(np.zeros((0, 4)), F32)
    for reduction in REDUCTIONS:
        out = run_in_mode(mode, _op(kind, reduction, False), x, t)
        exp = ref.kl_div(np.zeros((0, 4)), np.zeros((0, 4)), reduction)
        assert tuple(out.shape) == np.shape(exp)
        np.testing.assert_equal(to_numpy(out), exp)


# ----------------------------------------------------------------------------------- second order
class _FirstOrder(nn.Cell):
    def __init__(self, op):
        super().__init__()
        self.grad = ops.GradOperation(get_all=True)(_Weighted(op))

    def construct(self, x, t, w, v1, v2):
        dx, dt, _ = self.grad(x, t, w)
        return (dx * v1).sum() + (dt * v2).sum()


class _SecondOrder(nn.Cell):
    def __init__(self, op):
        super().__init__()
        self.grad = ops.GradOperation(get_all=True)(_FirstOrder(op))

    def construct(self, x, t, w, v1, v2):
        return self.grad(x, t, w, v1, v2)


def _fd_second(x, t, w, v1, v2, reduction, log_target, eps=1e-6):
    """Gradient w.r.t. (x, t, w) of sum(dx * v1 + dt * v2), by central differences of the float64
    reference gradients."""
    def f(x_, t_, w_):
        dx, dt = ref.kl_div_grads(x_, t_, reduction, log_target, dout=w_)
        return float((dx * v1).sum() + (dt * v2).sum())

    res = []
    for which, arr in enumerate((x, t, w)):
        g = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            if which == 1 and not ref.has_mass(t[i], log_target):
                continue  # t = 0 sits on the zero-mass boundary: the SPEC's derivatives there are 0
            args = [x.copy(), t.copy(), np.array(w, dtype=np.float64, copy=True)]
            args[which][i] += eps
            hi = f(*args)
            args[which][i] -= 2 * eps
            lo = f(*args)
            g[i] = (hi - lo) / (2 * eps)
        res.append(g)
    return res


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", WIRING_MODES)
@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean", "batchmean"])
def test_second_order(kind, mode, log_target, reduction):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 4)) - 1.0
    t = _probs((3, 4), rng, log_target)
    t[0, 0] = -np.inf if log_target else 0.0      # a zero-mass lane: all its derivatives are 0
    w = rng.uniform(0.5, 1.5, (3, 4)) if reduction == "none" else np.asarray(rng.uniform(0.5, 1.5))
    v1 = rng.standard_normal((3, 4))
    v2 = rng.standard_normal((3, 4))
    tensors = [make(a, F32) for a in (x, t, w, v1, v2)]
    key = ("second", kind, reduction, log_target)
    if key not in _CELLS:
        _CELLS[key] = _SecondOrder(_op(kind, reduction, log_target))
    got = run_in_mode(mode, _CELLS[key], *[a for a, _ in tensors])
    vals = [v for _, v in tensors]
    expected = _fd_second(*vals, reduction, log_target)
    for name, g, e in zip(("x", "t", "w"), got[:3], expected):
        np.testing.assert_allclose(to_numpy(g), e, rtol=2e-3, atol=2e-4,
                                   err_msg=f"{kind} {mode} {reduction} log_target={log_target} d2/d{name}")


# ------------------------------------------------------------------------------------ on Ascend only
@pytest.mark.skipif(ms.get_context("device_target") != "Ascend",
                    reason="needs an Ascend device (device target is not 'Ascend'); the Ascend path was only "
                           "checked through the NumPy kernel model here")
@pytest.mark.parametrize("backend_name", ["aot", "native"])
@pytest.mark.parametrize("mode", WIRING_MODES)
def test_on_ascend_hardware(backend_name, mode):
    reason = backends.get(backend_name, "Ascend").unavailable_reason("Ascend")
    if reason:
        pytest.skip(f"'{backend_name}' unavailable on this Ascend machine: {reason}")
    rng = np.random.default_rng(3)
    for log_target in (False, True):
        x = rng.standard_normal((64, 1000)) - 1
        t = _probs((64, 1000), rng, log_target)
        for reduction in REDUCTIONS:
            xt, xv = make(x, F32)
            tt, tv = make(t, F32)
            op = ms_kldiv.KLDivLoss(reduction, log_target, backend=backend_name)
            out = run_in_mode(mode, op, xt, tt)
            mag = np.abs(ref.pointwise_loss(xv, tv, log_target))
            assert_close(to_numpy(out), ref.kl_div(xv, tv, reduction, log_target), F32,
                         mag if reduction == "none" else mag.sum() * ref.reduction_scale(reduction, xv.shape, xv.shape))


# ------------------------------------------------------------------------------------------ benchmark
ROOT = os.path.join(os.path.dirname(__file__), "..")
BENCH = os.path.join(ROOT, "benchmarks", "ascend", "bench_ascend.py")


def _python(code_or_args, cwd):
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.path.abspath(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable] + code_or_args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.skipif(ms.get_context("device_target") == "Ascend", reason="checks the no-Ascend exit path")
def test_bench_without_ascend_exits_cleanly(tmp_path):
    res = _python([os.path.abspath(BENCH), "--sizes", "4K"], str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no Ascend device, nothing measured" in res.stdout
    assert "Traceback" not in res.stderr
    assert os.listdir(tmp_path) == []


def test_bench_rows_run_through_the_shared_harness(tmp_path):
    """The rows' step functions (Cells under ms.jit, synchronize) work; on CPU only the rows that can run
    here are timed. A subprocess keeps the rows out of this process's harness registry."""
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import bench_ascend as b\n"
            "from ms_kldiv.bench import harness\n"
            "b._rows(harness)\n"
            "r = harness.run(sizes=[4096], keys=['composite', 'ops'], modes=['fwd', 'grad'], min_time=0.01,"
            " log=None)\n"
            "bad = [x for x in r if not x['ms']]\n"
            "assert not bad, bad\n"
            "print(harness.table(r, ref_key='composite'))\n") % os.path.abspath(os.path.dirname(BENCH))
    res = _python(["-c", code], str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ms_kldiv composite" in res.stdout and "ops.kl_div" in res.stdout
    assert os.listdir(tmp_path) == []
