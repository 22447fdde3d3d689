"""The public surface: mint-shaped aliases and signatures, backend reporting and 'auto' dispatch, 0-d reduced
outputs in every mode, the docstring examples (doctest), and the CI guard MS_KLDIV_REQUIRE_BACKENDS."""
import doctest
import importlib
import inspect
import pkgutil
import warnings

import numpy as np
import pytest

import mindspore as ms
from mindspore import mint

import ms_kldiv
import conftest
from conftest import MODES, REDUCTIONS, make, run, to_numpy

registry = importlib.import_module("ms_kldiv.backends")


# ------------------------------------------------------------------------------------------- aliases
def test_mint_shaped_aliases():
    from ms_kldiv import nn
    assert nn.KLDivLoss is ms_kldiv.KLDivLoss
    assert nn.functional.kl_div is ms_kldiv.kl_div
    assert ms_kldiv.nn.functional.kl_div is ms_kldiv.kl_div
    assert isinstance(nn.KLDivLoss(), ms.nn.Cell)


def _leading_params(fn, n):
    return [(p.name, p.default) for p in list(inspect.signature(fn).parameters.values())[:n]]


def test_signatures_extend_mint():
    """Every mint argument, in mint's order and with mint's defaults; extras are keyword-only."""
    mint_cell = [p for p in inspect.signature(mint.nn.KLDivLoss.__init__).parameters.values() if p.name != "self"]
    ours_cell = [p for p in inspect.signature(ms_kldiv.KLDivLoss.__init__).parameters.values() if p.name != "self"]
    assert [(p.name, p.default) for p in ours_cell[:len(mint_cell)]] == [(p.name, p.default) for p in mint_cell]
    mint_fn = inspect.signature(mint.nn.functional.kl_div).parameters
    assert _leading_params(ms_kldiv.kl_div, len(mint_fn)) == [(p.name, p.default) for p in mint_fn.values()]
    ours_fn = list(inspect.signature(ms_kldiv.kl_div).parameters.values())
    for p in ours_fn[len(mint_fn):] + ours_cell[len(mint_cell):]:
        assert p.kind is inspect.Parameter.KEYWORD_ONLY, p.name


def test_cell_repr_shows_settings():
    text = repr(ms_kldiv.KLDivLoss("batchmean", log_target=True, backend="composite"))
    assert "batchmean" in text and "log_target=True" in text and "composite" in text


def test_version():
    assert isinstance(ms_kldiv.__version__, str) and ms_kldiv.__version__.count(".") >= 1


# ------------------------------------------------------------------------------------------ backends
def test_backends_is_the_subpackage():
    # A function of the same name once shadowed the subpackage: `import ms_kldiv.backends` must give the module.
    import importlib
    mod = importlib.import_module("ms_kldiv.backends")
    assert ms_kldiv.backends is mod and mod.__name__ == "ms_kldiv.backends"
    code = "import ms_kldiv.backends as b; print(b.__name__)"
    import sys
    import _procs
    out = _procs.run([sys.executable, "-c", code], 300)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "ms_kldiv.backends", out.stderr[-2000:]


def test_backends_and_backend_info():
    names = ms_kldiv.backend_names()
    assert "composite" in names
    rows = ms_kldiv.backend_info()
    assert {row["name"] for row in rows} == set(names)
    device = ms.get_context("device_target")
    for row in rows:
        assert {"name", "device", "available", "reason", "preference", "auto", "description"} <= set(row)
        assert row["device"] == device
        assert isinstance(row["available"], bool)
        assert (row["reason"] is None) == row["available"], row
        assert isinstance(row["description"], str) and row["description"]
    autos = [row for row in rows if row["auto"]]
    assert len(autos) == 1 and autos[0]["available"]
    composite = next(row for row in rows if row["name"] == "composite")
    assert composite["available"], "the composite backend must run everywhere"
    # 'auto' picks the most preferred available backend.
    best = max((row for row in rows if row["available"] and row["preference"] is not None),
               key=lambda row: row["preference"])
    assert autos[0]["preference"] == best["preference"]
    assert registry.resolve("auto").name == autos[0]["name"]


def test_backend_fixture_covers_every_available_backend():
    available = tuple(row["name"] for row in ms_kldiv.backend_info() if row["available"])
    assert set(conftest.BACKENDS) == set(available)


def test_auto_matches_the_backend_it_picks(backend):
    chosen = next(row["name"] for row in ms_kldiv.backend_info() if row["auto"])
    rng = np.random.default_rng(9)
    xt, _ = make(rng.normal(size=(3, 4)), ms.float32)
    tt, _ = make(rng.uniform(0.0, 1.0, (3, 4)), ms.float32)
    auto = to_numpy(ms_kldiv.kl_div(xt, tt, "none"))
    explicit = to_numpy(ms_kldiv.kl_div(xt, tt, "none", backend=chosen))
    np.testing.assert_array_equal(auto, explicit)
    # And every backend agrees with every other one to float32 accuracy.
    np.testing.assert_allclose(to_numpy(ms_kldiv.kl_div(xt, tt, "none", backend=backend)), explicit,
                               rtol=1e-5, atol=1e-6)


class _PreferredButBroken(registry.Backend):
    name = "test-preferred-broken"
    description = "registered by test_api only"

    def __init__(self, device):
        self.preference = {device: 10 ** 6}

    def unavailable_reason(self, device, op="kl_div"):
        return "it is a test double"

    def make_op(self, reduction, log_target):
        raise AssertionError("never called")


def test_auto_falls_back_and_says_so_once(monkeypatch):
    device = ms.get_context("device_target")
    monkeypatch.setitem(registry._REGISTRY, _PreferredButBroken.name, [_PreferredButBroken(device)])
    monkeypatch.setattr(registry, "_WARNED", set())
    registry.get_op.cache_clear()
    try:
        x, t = make([-1.0, -2.0], ms.float32)[0], make([0.5, 0.5], ms.float32)[0]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ms_kldiv.backend_info()  # a query: it neither warns nor spends the run's warning
        with pytest.warns(RuntimeWarning, match="test-preferred-broken") as record:
            first = ms_kldiv.kl_div(x, t, reduction="sum")
        assert "it is a test double" in str(record[0].message)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            second = ms_kldiv.kl_div(x, t, reduction="sum")  # no second warning
            ms_kldiv.kl_div(x, t, reduction="mean")  # nor for another reduction on the same device
        np.testing.assert_array_equal(to_numpy(first), to_numpy(second))
        info = {row["name"]: row for row in ms_kldiv.backend_info()}
        assert not info[_PreferredButBroken.name]["available"]
        assert not info[_PreferredButBroken.name]["auto"]
    finally:
        registry.get_op.cache_clear()


class _CountingComposite(registry.Backend):
    """The composite math under another name, preferred over every backend, counting what each op builds."""
    name = "test-counting"
    description = "registered by test_api only"
    ops = ("kl_div", "distillation", "sparse_distillation")

    def __init__(self, device):
        self.preference = {device: 10 ** 6}
        self.built = []
        self.inner = registry.get("composite", device)

    def make_op(self, reduction, log_target):
        self.built.append("kl_div")
        return self.inner.make_op(reduction, log_target)

    def distill_kernels(self, device):
        self.built.append("distillation")
        return self.inner.distill_kernels(device)

    def sparse_kernels(self, device):
        self.built.append("sparse_distillation")
        return self.inner.sparse_kernels(device)


def test_register_reaches_every_op(monkeypatch):
    """A backend registered after every op has run (and cached its choice) is what 'auto' runs next, for every op:
    backend_info's 'auto' row and the op that runs agree (the distillation and stored-teacher losses kept their
    cached kernels before)."""
    device = ms.get_context("device_target")
    rng = np.random.default_rng(3)
    x, t = make(rng.normal(size=(3, 4)) - 1, ms.float32)[0], make(rng.uniform(0, 1, (3, 4)), ms.float32)[0]
    s, te = make(rng.normal(size=(3, 5)), ms.float32)[0], make(rng.normal(size=(3, 5)), ms.float32)[0]
    ids, values = ms.Tensor(np.array([[0, 2]] * 3, np.int32)), ms.Tensor(np.full((3, 2), -1.0, np.float32))

    def run_every_op():
        return (ms_kldiv.kl_div(x, t, "sum"), ms_kldiv.distillation_loss(s, te), ms_kldiv.DistillationLoss()(s, te),
                ms_kldiv.sparse_distillation_loss(s, ids, values))
    before = [float(v) for v in run_every_op()]
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    counting = _CountingComposite(device)
    try:
        registry.register(counting)
        for op in registry.OPS:
            assert [r["name"] for r in ms_kldiv.backend_info(op=op) if r["auto"]] == [counting.name], op
        after = [float(v) for v in run_every_op()]
        assert set(counting.built) == set(registry.OPS), counting.built
        np.testing.assert_allclose(after, before, rtol=1e-5)
    finally:
        monkeypatch.undo()
        for cache in registry._CHOICE_CACHES:  # what was built from the test's backend goes with it
            cache.cache_clear()
    assert counting.name not in ms_kldiv.backend_names()


def test_backend_info_checks_its_device():
    for bad in ("cpu", "TPU", "gpu"):
        with pytest.raises(ValueError, match="For 'backend_info', 'device' must be None or one of"):
            ms_kldiv.backend_info(bad)


def test_cells_name_themselves_in_backend_errors():
    """A Cell's backend errors name the Cell and come from its constructor, as its other argument errors do."""
    with pytest.raises(ValueError, match="For 'KLDivLoss', 'backend' must be 'auto' or one of"):
        ms_kldiv.KLDivLoss(backend="nope")
    with pytest.raises(ValueError, match="For 'DistillationLoss', 'backend' must be 'auto' or one of"):
        ms_kldiv.DistillationLoss(backend="nope")
    for op, cell in (("kl_div", ms_kldiv.KLDivLoss), ("distillation", ms_kldiv.DistillationLoss)):
        for row in ms_kldiv.backend_info(op=op):
            if not row["available"]:
                with pytest.raises(RuntimeError, match=f"For '{cell.__name__}', backend '{row['name']}' cannot"):
                    cell(backend=row["name"])


def test_unreadable_settings_warn():
    """A set variable the package cannot read is named in one warning at import (the kernels fell back to their
    defaults without a word: MS_KLDIV_ISA=AVX2, MS_KLDIV_NUM_THREADS=abc); readable and unset ones say nothing."""
    from ms_kldiv import _env
    good = {"MS_KLDIV_NUM_THREADS": "4", "MS_KLDIV_ISA": "avx2", "MS_KLDIV_PREFETCH": "0", "MS_KLDIV_HOST_CALL": "0",
            "MS_KLDIV_NO_BUILD": "1", "MS_KLDIV_HEAD_KERNEL": ""}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _env.check_settings(good) == []
    bad = {"MS_KLDIV_NUM_THREADS": "abc", "MS_KLDIV_ISA": "AVX2", "MS_KLDIV_PREFETCH": "-5",
           "MS_KLDIV_HOST_CALL": "false", "MS_KLDIV_PARALLEL_MIN": "0"}
    with pytest.warns(RuntimeWarning) as record:
        found = _env.check_settings(bad)
    assert len(record) == 1 and len(found) == len(bad)
    for name, value in bad.items():
        assert f"{name}={value!r} is not" in str(record[0].message)


def test_require_backends_guard(monkeypatch):
    """CI sets MS_KLDIV_REQUIRE_BACKENDS so that a backend that failed to build cannot silently drop out."""
    available = [row["name"] for row in ms_kldiv.backend_info() if row["available"]]
    monkeypatch.setenv("MS_KLDIV_REQUIRE_BACKENDS", ",".join(available))
    conftest.pytest_configure(None)  # all present: no error
    monkeypatch.setenv("MS_KLDIV_REQUIRE_BACKENDS", "composite,definitely-not-a-backend")
    with pytest.raises(pytest.UsageError, match="definitely-not-a-backend"):
        conftest.pytest_configure(None)


# ------------------------------------------------------------------------------------- output forms
@pytest.mark.parametrize("mode", MODES)
def test_reduced_outputs_are_0d_tensors(backend, mode):
    xt, _ = make([[-0.5, -1.0], [-2.0, -0.1]], ms.float64)
    tt, _ = make([[0.3, 0.7], [0.0, 1.0]], ms.float64)
    results = run(mode, backend, xt, tt, grads=False)
    for reduction in REDUCTIONS:
        out = results[reduction].out
        assert isinstance(out, ms.Tensor), f"{reduction}: {type(out).__name__}"
        assert tuple(out.shape) == ((2, 2) if reduction == "none" else ()), reduction


# ----------------------------------------------------------------------------------------- doctests
def _modules_with_examples():
    names = []
    for info in pkgutil.walk_packages(ms_kldiv.__path__, "ms_kldiv."):
        names.append(info.name)
    found = []
    for name in ["ms_kldiv"] + sorted(names):
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module that cannot import here has no runnable examples here
            continue
        if any(t.examples for t in doctest.DocTestFinder(exclude_empty=True).find(module, name)):
            found.append(name)
    return found


DOCTEST_MODULES = _modules_with_examples()


def test_docstring_examples_exist():
    assert "ms_kldiv.functional" in DOCTEST_MODULES and "ms_kldiv.nn.loss" in DOCTEST_MODULES


@pytest.mark.parametrize("module_name", DOCTEST_MODULES)
def test_docstring_examples_run(module_name):
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, module_name):
        if test.examples:
            runner.run(test, out=lambda text: None)
    result = runner.summarize(verbose=False)
    if result.failed:
        report = []
        runner2 = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        for test in finder.find(module, module_name):
            if test.examples:
                runner2.run(test, out=report.append)
        pytest.fail(f"{result.failed} of {result.attempted} doctest examples failed in {module_name}:\n"
                    + "".join(report)[:3000])


@pytest.mark.parametrize("name,error", [(123, TypeError), ("", TypeError), (None, TypeError), ("auto", ValueError)])
def test_register_refuses_names_that_cannot_be_chosen(monkeypatch, name, error):
    """A backend named by a non-str, an empty str or 'auto' (the automatic choice) could never be picked with
    backend=: register() says so instead of listing it."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    backend = _CountingComposite(ms.get_context("device_target"))
    backend.name = name
    with pytest.raises(error, match="register"):
        registry.register(backend)
    assert name not in registry._REGISTRY
