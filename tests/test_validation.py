"""Every bad input of the SPEC, in PyNative, at Cell construction, inside a GRAPH_MODE Cell and under ms.jit:
the right exception type, a message that starts "For 'kl_div'" (or names KLDivLoss) and shows what was
received. Plus the deprecated size_average/reduce mapping and the backend selection errors."""
import importlib
import warnings

import numpy as np
import pytest

import mindspore as ms

import ms_kldiv
from ms_kldiv.backends.base import Backend
from conftest import graph_mode, make, reference, to_numpy

# ``ms_kldiv.backends`` is the public function; the registry is the subpackage of the same name.
registry = importlib.import_module("ms_kldiv.backends")

X = ms.Tensor(np.full((2, 3), -1.0, np.float32))
T = ms.Tensor(np.full((2, 3), 0.5, np.float32))


def _msg(excinfo):
    # Under ms.jit MindSpore re-raises compile-time errors with the message quoted and its own trace appended.
    return str(excinfo.value).strip().lstrip("'\"")


def _expect(excinfo, name, *fragments):
    msg = _msg(excinfo)
    assert msg.startswith(f"For '{name}'"), msg[:200]
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg[:300]!r}"


# ---------------------------------------------------------------------------------- tensor arguments
BAD_TENSORS = [
    pytest.param([[0.1, 0.2, 0.3]] * 2, TypeError, ("mindspore.Tensor", "list"), id="list"),
    pytest.param(np.ones((2, 3), np.float32), TypeError, ("mindspore.Tensor", "ndarray"), id="ndarray"),
    pytest.param(0.5, TypeError, ("mindspore.Tensor", "float"), id="python-float"),
    pytest.param(ms.Tensor(np.ones((2, 3), np.int32)), TypeError, ("floating", "Int32"), id="int32"),
    pytest.param(ms.Tensor(np.ones((2, 3), np.int64)), TypeError, ("floating", "Int64"), id="int64"),
    pytest.param(ms.Tensor(np.ones((2, 3), np.bool_)), TypeError, ("floating", "Bool"), id="bool"),
    pytest.param(ms.Tensor(np.ones((2, 3), np.complex64)), TypeError, ("floating", "Complex64"), id="complex64"),
    pytest.param(ms.Tensor(np.ones((4,), np.float32)), ValueError, ("(2, 3)", "(4,)"), id="not-broadcastable"),
]


def _jit_kl_div(backend):
    def f(x, t):
        return ms_kldiv.kl_div(x, t, "mean", backend=backend)
    return ms.jit(f)


@pytest.mark.parametrize("bad, exc, fragments", BAD_TENSORS)
@pytest.mark.parametrize("position", ["input", "target"])
def test_bad_tensor_pynative(backend, bad, exc, fragments, position):
    args = (bad, T) if position == "input" else (X, bad)
    with pytest.raises(exc) as excinfo:
        ms_kldiv.kl_div(*args, backend=backend)
    _expect(excinfo, "kl_div", *fragments)
    if exc is TypeError:
        assert f"'{position}'" in _msg(excinfo)


# Non-Tensor Python values become compile-time constants under ms.jit and in GRAPH_MODE; MindSpore itself
# rejects a list/ndarray/float as a top-level Cell input in some versions, so the compiled checks use tensors
# and a float constant built inside the compiled function.
COMPILED_BAD = [p for p in BAD_TENSORS if p.id not in ("list", "ndarray", "python-float")]


@pytest.mark.parametrize("bad, exc, fragments", COMPILED_BAD)
def test_bad_tensor_under_jit(backend, bad, exc, fragments):
    with pytest.raises(exc) as excinfo:
        _jit_kl_div(backend)(X, bad)
    _expect(excinfo, "kl_div", *fragments)


def test_non_tensor_constant_under_jit(backend):
    def f(x):
        return ms_kldiv.kl_div(x, 0.5, backend=backend)
    with pytest.raises(TypeError) as excinfo:
        ms.jit(f)(X)
    _expect(excinfo, "kl_div", "mindspore.Tensor", "float")


@pytest.mark.parametrize("bad, exc, fragments", COMPILED_BAD)
def test_bad_tensor_graph_cell(backend, bad, exc, fragments):
    loss = ms_kldiv.KLDivLoss(backend=backend)
    with graph_mode():
        with pytest.raises(exc) as excinfo:
            loss(bad, T) if exc is TypeError else loss(X, bad)
    _expect(excinfo, "KLDivLoss", *fragments)


def test_graph_cell_still_works_after_a_rejected_call(backend):
    """Validation fails before any kernel runs, so the Cell is not left broken (a failed kernel launch in
    GRAPH_MODE would make the same Cell refuse every later step)."""
    loss = ms_kldiv.KLDivLoss("sum", backend=backend)
    with graph_mode():
        with pytest.raises(ValueError):
            loss(X, ms.Tensor(np.ones((4,), np.float32)))
        out = loss(X, T)
    np.testing.assert_allclose(to_numpy(out), reference(to_numpy(X), to_numpy(T), "sum", False).out, rtol=1e-6)


# ------------------------------------------------------------------------------- reduction/log_target
BAD_OPTIONS = [
    pytest.param({"reduction": 1}, TypeError, ("'reduction'", "int", "1"), id="reduction-int"),
    pytest.param({"reduction": None}, TypeError, ("'reduction'", "None"), id="reduction-None"),
    pytest.param({"reduction": "avg"}, ValueError, ("'reduction'", "avg", "batchmean"), id="reduction-unknown"),
    pytest.param({"reduction": "Mean"}, ValueError, ("'reduction'", "Mean"), id="reduction-case"),
    pytest.param({"log_target": 1}, TypeError, ("'log_target'", "int"), id="log_target-int"),
    pytest.param({"log_target": "yes"}, TypeError, ("'log_target'", "yes"), id="log_target-str"),
    pytest.param({"log_target": None}, TypeError, ("'log_target'", "None"), id="log_target-None"),
]


@pytest.mark.parametrize("kwargs, exc, fragments", BAD_OPTIONS)
def test_bad_options_pynative(backend, kwargs, exc, fragments):
    with pytest.raises(exc) as excinfo:
        ms_kldiv.kl_div(X, T, backend=backend, **kwargs)
    _expect(excinfo, "kl_div", *fragments)


@pytest.mark.parametrize("kwargs, exc, fragments", BAD_OPTIONS)
def test_bad_options_cell_constructor(backend, kwargs, exc, fragments):
    with pytest.raises(exc) as excinfo:
        ms_kldiv.KLDivLoss(backend=backend, **kwargs)
    _expect(excinfo, "KLDivLoss", *fragments)
    with pytest.raises(exc):
        ms_kldiv.nn.KLDivLoss(backend=backend, **kwargs)


@pytest.mark.parametrize("kwargs, exc, fragments",
                         [p for p in BAD_OPTIONS if p.id in ("reduction-int", "reduction-unknown", "log_target-int")])
def test_bad_options_under_jit(backend, kwargs, exc, fragments):
    def f(x, t):
        return ms_kldiv.kl_div(x, t, backend=backend, **kwargs)
    with pytest.raises(exc) as excinfo:
        ms.jit(f)(X, T)
    # MindSpore re-formats the constant in the message (repr quotes may be dropped): check the name only.
    _expect(excinfo, "kl_div", fragments[0].strip("'"))


# --------------------------------------------------------------------------------------- backends
def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(ValueError) as excinfo:
        ms_kldiv.kl_div(X, T, backend="no-such-backend")
    _expect(excinfo, "kl_div", "no-such-backend")
    for name in ms_kldiv.backend_names():
        assert name in _msg(excinfo), f"known backend {name!r} not listed"
    with pytest.raises(ValueError) as excinfo:
        ms_kldiv.KLDivLoss(backend="no-such-backend")
    assert "no-such-backend" in _msg(excinfo)


def test_backend_not_a_str():
    with pytest.raises(TypeError) as excinfo:
        ms_kldiv.kl_div(X, T, backend=3)
    _expect(excinfo, "kl_div", "'backend'", "int")


class _NeverHere(Backend):
    name = "test-unavailable"
    description = "registered by test_validation only"
    preference = {}  # targets no device, so 'auto' never considers it

    def unavailable_reason(self, device, op="kl_div"):
        return f"this test backend never runs (device {device})"

    def make_op(self, reduction, log_target):
        raise AssertionError("make_op must not be reached for an unavailable backend")


@pytest.fixture
def unavailable_backend(monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, _NeverHere.name, [_NeverHere()])
    registry.get_op.cache_clear()
    yield _NeverHere.name
    registry.get_op.cache_clear()


def test_unavailable_backend_raises_runtime_error_with_reason(unavailable_backend):
    for make_call in (lambda: ms_kldiv.kl_div(X, T, backend=unavailable_backend),
                      lambda: ms_kldiv.KLDivLoss(backend=unavailable_backend)):
        with pytest.raises(RuntimeError) as excinfo:
            make_call()
        assert unavailable_backend in _msg(excinfo) and "never runs" in _msg(excinfo)
    # 'auto' is unaffected.
    assert np.isfinite(to_numpy(ms_kldiv.kl_div(X, T)))


def test_really_unavailable_backends_say_why():
    """Whatever backend_info() reports unavailable on this machine (e.g. a kernel not built) raises
    RuntimeError carrying that reason."""
    for row in ms_kldiv.backend_info():
        if row["available"]:
            continue
        with pytest.raises(RuntimeError) as excinfo:
            ms_kldiv.kl_div(X, T, backend=row["name"])
        assert row["name"] in _msg(excinfo) and row["reason"] and row["reason"] in _msg(excinfo)


# ------------------------------------------------------------------------ deprecated size_average/reduce
LEGACY = [  # PyTorch's mapping: reduce=False -> 'none'; else size_average=False -> 'sum'; else 'mean'
    ({"reduce": False}, "none"),
    ({"reduce": False, "size_average": True}, "none"),
    ({"size_average": False}, "sum"),
    ({"size_average": False, "reduce": True}, "sum"),
    ({"size_average": True}, "mean"),
    ({"reduce": True}, "mean"),
]


@pytest.mark.parametrize("kwargs, mapped", LEGACY, ids=[str(k) for k, _ in LEGACY])
def test_legacy_arguments_pynative_and_cell(backend, kwargs, mapped):
    xt, xv = make([[-0.4, -1.2, -2.0], [-0.1, -0.9, -1.5]], ms.float32)
    tt, tv = make([[0.2, 0.3, 0.5], [0.6, 0.0, 0.4]], ms.float32)
    expected = reference(xv, tv, mapped, False).out
    with pytest.warns(DeprecationWarning, match="size_average"):
        out = ms_kldiv.kl_div(xt, tt, reduction="batchmean", backend=backend, **kwargs)  # overridden
    np.testing.assert_allclose(to_numpy(out), expected, rtol=1e-6, atol=1e-7)
    with pytest.warns(DeprecationWarning):
        loss = ms_kldiv.KLDivLoss(reduction="batchmean", backend=backend, **kwargs)
    assert loss.reduction == mapped
    with graph_mode():
        np.testing.assert_allclose(to_numpy(loss(xt, tt)), expected, rtol=1e-6, atol=1e-7)


def test_legacy_arguments_under_jit(backend):
    def f(x, t):
        return ms_kldiv.kl_div(x, t, backend=backend, size_average=False)
    with pytest.warns(DeprecationWarning):
        out = ms.jit(f)(X, T)
    np.testing.assert_allclose(to_numpy(out), reference(to_numpy(X), to_numpy(T), "sum", False).out, rtol=1e-6)


def test_legacy_arguments_must_be_bool_or_none():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError) as excinfo:
            ms_kldiv.kl_div(X, T, size_average="no")
    _expect(excinfo, "kl_div", "'size_average'", "no")


def test_no_warning_without_legacy_arguments(backend):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        ms_kldiv.kl_div(X, T, reduction="sum", backend=backend)
        ms_kldiv.KLDivLoss(reduction="sum", backend=backend)
