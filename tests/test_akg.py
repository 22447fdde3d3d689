"""What is specific to the 'akg' backend (the core suite also runs against it, through conftest's fixture).

- availability, and the reasons given when it cannot run;
- the generated kernel sources: one per (kind, target space, compute dtype), each defined once;
- sums over lengths that are not multiples of AKG's CPU vector width: AKG 2.10's reduce-vectorizer keeps
  one lane of four unless the kernel is written around it, so this pins the workaround;
- second-order gradients through the backward kernel's own bprop, with broadcasting, against the reference;
- a fresh process with an empty kernel cache (so the AKG compiler really starts) leaves its cwd empty.
"""
import json
import os
import sys
import textwrap

import numpy as np
import pytest

import mindspore as ms

import ms_kldiv
from ms_kldiv import reference as ref
from ms_kldiv.backends import akg as akg_mod
from ms_kldiv.backends import _REGISTRY, resolve

from conftest import TOL, assert_close, check_outcomes, make, run, run_second_order, to_numpy
import _procs

F32 = ms.float32
F64 = ms.float64
MODES3 = ("pynative", "jit", "graph")
_AKG_ROW = next((r for r in ms_kldiv.backend_info() if r["name"] == "akg"), None)
needs_akg = pytest.mark.skipif(_AKG_ROW is None or not _AKG_ROW["available"],
                               reason=f"backend 'akg' cannot run here: {_AKG_ROW and _AKG_ROW['reason']}")


# ------------------------------------------------------------------------------------------ availability
def test_registered_with_preferences():
    assert "akg" in ms_kldiv.backend_names()
    b = akg_mod.AkgBackend()
    assert b.preference["CPU"] > 0 and b.preference["GPU"] > b.preference["CPU"]
    # Below the compiled AOT kernels wherever both exist.
    for impl in _REGISTRY.get("aot", []):
        for device, pref in impl.preference.items():
            if device in b.preference:
                assert b.preference[device] < pref, (device, impl)


def test_reason_without_decorator(monkeypatch):
    """MindSpore does not declare AKG's dependency on 'decorator'; the reason must say how to fix it."""
    real = akg_mod.importlib.util.find_spec
    monkeypatch.setattr(akg_mod.importlib.util, "find_spec",
                        lambda name, *a: None if name == "decorator" else real(name, *a))
    reason = akg_mod.AkgBackend().unavailable_reason("CPU")
    assert reason is not None and "decorator" in reason and "pip install" in reason


def test_reason_on_unsupported_device():
    reason = akg_mod.AkgBackend().unavailable_reason("Ascend")
    assert reason is not None and "Ascend" in reason


@needs_akg
def test_explicit_request_names_the_reason(monkeypatch):
    monkeypatch.setattr(akg_mod.AkgBackend, "unavailable_reason", lambda self, device, op="kl_div": "AKG is broken here")
    with pytest.raises(RuntimeError, match="AKG is broken here"):
        resolve("akg", "CPU")


def test_kernel_sources_distinct_and_cached():
    seen = set()
    for kind in ("fwd_none", "fwd_sum", "bwdx_none", "bwdt_none", "bwdx_scalar", "bwdt_scalar"):
        for log_target in (False, True):
            for dtype in ("float32", "float64"):
                for rank in (1, 3):
                    name, src = akg_mod._source(kind, log_target, dtype, rank)
                    assert name not in seen
                    seen.add(name)
                    # AKG rejects float32 literals in float64 arithmetic: every literal carries the dtype.
                    if dtype == "float64":
                        assert "float32" not in src
                    fn = akg_mod._kernel_fn(kind, log_target, dtype, rank)
                    assert fn is akg_mod._kernel_fn(kind, log_target, dtype, rank)


# ------------------------------------------------------------------------------------------ values
@needs_akg
@pytest.mark.parametrize("mode", MODES3)
@pytest.mark.parametrize("log_target", [False, True], ids=["prob", "logt"])
def test_sum_over_odd_lengths(mode, log_target):
    """Every element counts in a sum, whatever the length modulo the vector width. (Each length is an AKG
    compile and a graph compile, so a few well-chosen ones.)"""
    rng = np.random.default_rng(11)
    for n, dtype in ((5, F32), (13, F64), (1031, F32)):
        t = rng.uniform(-0.2, 1.0, n)  # some zero-mass terms too
        if log_target:
            t = np.where(t > 0, np.log(np.abs(t) + 1e-3), -np.inf)
        x = rng.normal(size=n)
        xt, xv = make(x, dtype)
        tt, tv = make(t, dtype)
        res = run(mode, "akg", xt, tt, log_target, reductions=("sum", "mean", "batchmean"))
        check_outcomes(res, xv, tv, log_target, None, None, dtype, what=f"n={n}")


@needs_akg
@pytest.mark.parametrize("mode", ("pynative", "graph"))
def test_long_float32_sum(mode):
    """4M float32 terms of one sign: the float64 in-kernel accumulator stays within 1e-6 of float64."""
    n = 1 << 22
    rng = np.random.default_rng(5)
    t = rng.uniform(0.0, 1.0, n).astype(np.float32)
    x = (np.log(rng.uniform(0.0, 1.0, n)) - 2.0).astype(np.float32)
    res = run(mode, "akg", ms.Tensor(x), ms.Tensor(t), False, reductions=("sum",), grads=False)
    exp = float(ref.kl_div(x, t, "sum"))
    got = float(to_numpy(res["sum"].out))
    assert abs(got - exp) <= 1e-6 * abs(exp), (got, exp)


# ------------------------------------------------------------------------------------------ second order
def _second_order_reference(x, t, reduction, log_target, w, v1, v2, eps=1e-6):
    """d/d(x, t) of sum(dx * v1 + dt * v2), dx, dt the weighted first-order gradients: central differences
    of the float64 reference gradients (exact enough in float64 for a smooth function away from t = 0)."""
    def phi(xa, ta):
        dx, dt = ref.kl_div_grads(xa, ta, reduction, log_target, dout=w)
        return float((dx * v1).sum() + (dt * v2).sum())
    gx = np.zeros_like(x)
    gt = np.zeros_like(t)
    for arr, g in ((x, gx), (t, gt)):
        for i in np.ndindex(arr.shape):
            old = arr[i]
            arr[i] = old + eps
            up = phi(x, t)
            arr[i] = old - eps
            down = phi(x, t)
            arr[i] = old
            g[i] = (up - down) / (2 * eps)
    return gx, gt


@needs_akg
@pytest.mark.parametrize("mode", MODES3)
@pytest.mark.parametrize("log_target", [False, True], ids=["prob", "logt"])
def test_second_order_with_broadcast(mode, log_target):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(3, 4))
    t = rng.uniform(0.2, 1.0, size=(4,))
    if log_target:
        t = np.log(t)
    w_none = rng.normal(size=(3, 4))
    w_red = 0.7
    v1 = rng.normal(size=(3, 4))
    v2 = rng.normal(size=(4,))
    xt, tt, wn, wr, v1t, v2t = [make(a, F64)[0] for a in (x, t, w_none, w_red, v1, v2)]
    res = run_second_order(mode, "akg", xt, tt, log_target, wn, wr, v1t, v2t)
    for reduction, so in res.items():
        gx, gt = so.gx, so.gt
        w = w_none if reduction == "none" else w_red
        ex, et = _second_order_reference(x.copy(), t.copy(), reduction, log_target, w, v1, v2)
        assert tuple(gx.shape) == x.shape and tuple(gt.shape) == t.shape
        np.testing.assert_allclose(to_numpy(gx), ex, rtol=1e-6, atol=1e-7, err_msg=f"{reduction} d2/dx")
        np.testing.assert_allclose(to_numpy(gt), et, rtol=1e-6, atol=1e-7, err_msg=f"{reduction} d2/dt")


@needs_akg
@pytest.mark.parametrize("mode", MODES3)
def test_second_order_zero_mass_is_zero(mode):
    """Masked terms (t <= 0, t = -inf) contribute nothing to second-order gradients either, even at x = -inf."""
    x = np.array([-np.inf, 0.3, -1.0])
    for log_target, t in ((False, np.array([0.0, -1.0, 0.5])), (True, np.array([-np.inf, -np.inf, -0.5]))):
        xt, tt, wn, wr, v1t, v2t = [make(a, F64)[0] for a in (x, t, np.ones(3), 1.0, np.ones(3), np.ones(3))]
        res = run_second_order(mode, "akg", xt, tt, log_target, wn, wr, v1t, v2t, reductions=("none", "sum"))
        for reduction, so in res.items():
            gx, gt = to_numpy(so.gx), to_numpy(so.gt)
            assert np.all(gx[:2] == 0) and np.all(gt[:2] == 0), (log_target, reduction, gx, gt)
            assert np.all(np.isfinite(gx)) and np.all(np.isfinite(gt))


# ------------------------------------------------------------------------------------------ working dir
_CHILD = textwrap.dedent("""
    import json, time
    import numpy as np
    import mindspore as ms
    import ms_kldiv
    from ms_kldiv.backends import akg
    x = ms.Tensor(np.random.default_rng(0).normal(size=(5, 7)).astype(np.float32))
    t = ms.Tensor(np.random.default_rng(1).uniform(size=(7,)).astype(np.float32))
    timings = {}
    for mode in (ms.PYNATIVE_MODE, ms.GRAPH_MODE):
        ms.set_context(mode=mode)
        for reduction in ("none", "sum"):
            loss = ms_kldiv.KLDivLoss(reduction, backend="akg")

            def total(a, b):
                return loss(a, b).sum()
            start = time.perf_counter()
            ms.grad(total, grad_position=(0, 1))(x, t)[1].asnumpy()
            timings[f"{mode}-{reduction}"] = time.perf_counter() - start
    print("RESULT" + json.dumps({"compiler_start_s": akg.COMPILER_START_SECONDS, "first_call_s": timings}))
""")


@needs_akg
def test_fresh_process_leaves_cwd_empty(tmp_path):
    """With an empty kernel cache the AKG compiler really starts (and writes its hard-coded
    ./dsa_transfrom.log); it must do so inside ms_kldiv's cache, never in the user's directory."""
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ)
    for var in ("MS_COMPILER_CACHE_PATH", "MS_OM_PATH"):  # set by ms_kldiv in this process: start clean
        env.pop(var, None)
    env["MS_KLDIV_CACHE"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(ms_kldiv.__file__)),
                                         env.get("PYTHONPATH", "")])
    env.setdefault("GLOG_v", "3")
    script = tmp_path / "child.py"  # graph mode needs the source in a file
    script.write_text(_CHILD)
    proc = _procs.run([sys.executable, str(script)], 600, cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    info = json.loads(line[len("RESULT"):])
    print("akg timings (fresh cache):", info)
    assert info["compiler_start_s"] is not None
    assert sorted(os.listdir(work)) == []
    assert os.path.isdir(tmp_path / "cache" / "compiler" / "akg_kernel_meta")
