"""Values, gradients and second-order gradients against PyTorch 2.x (``tests/golden/kldiv_torch_golden.json``,
made by ``tests/golden/make_golden.py``; torch is not needed here). The cases have positive targets, where the
SPEC and PyTorch agree; zero-mass second derivatives are checked by finite differences in test_gradients."""
import json
import os

import numpy as np
import pytest

import mindspore as ms

from conftest import REDUCTIONS, make, run_second_order, to_numpy

pytestmark = pytest.mark.async_dispatch  # the golden values in the dispatch users get (tests/conftest.py)

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "kldiv_torch_golden.json")
with open(GOLDEN, encoding="utf-8") as _f:
    DOC = json.load(_f)
CASES = DOC["cases"]
RTOL = {ms.float64: 1e-12, ms.float32: 2e-5}


def test_golden_file_is_complete():
    assert DOC["dtype"] == "float64" and DOC["torch"].startswith("2.")
    assert len(CASES) >= 6
    assert {c["log_target"] for c in CASES} == {False, True}
    assert any(c["x_shape"] != c["t_shape"] for c in CASES), "no broadcast case"
    assert any(c["x_shape"] == [] for c in CASES), "no 0-d input case"
    for c in CASES:
        assert set(c["results"]) == set(REDUCTIONS)


def _check(got, expected, dtype, what):
    got = to_numpy(got)
    expected = np.asarray(expected, np.float64)
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    # Error scale: the largest golden entry of that array (entries are O(1); some second-order terms cancel).
    atol = RTOL[dtype] * max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(got, expected, rtol=RTOL[dtype], atol=atol, err_msg=what)


# Every case eagerly and in one compiled mode (jit and GRAPH_MODE taking turns): the second-order graphs are
# the slowest compiles of the suite, and it runs once per backend.
GOLDEN_PARAMS = [pytest.param(mode, c, id=f"{c['name']}-{mode}")
                 for i, c in enumerate(CASES) for mode in ("pynative", ("jit", "graph")[i % 2])]


@pytest.mark.parametrize("mode, case", GOLDEN_PARAMS)
def test_matches_pytorch_to_second_order(backend, mode, case):
    dtype = ms.float64
    x, _ = make(case["x"], dtype)
    t, _ = make(case["t"], dtype)
    w_none, _ = make(case["w_none"], dtype)
    w_red, _ = make(case["w_red"], dtype)
    v1, _ = make(case["v1"], dtype)
    v2, _ = make(case["v2"], dtype)
    results = run_second_order(mode, backend, x, t, case["log_target"], w_none, w_red, v1, v2)
    for reduction, res in results.items():
        gold = case["results"][reduction]
        for key in ("out", "dx", "dt", "gx", "gt"):
            _check(getattr(res, key), gold[key], dtype, f"{case['name']} {reduction} {key} [{mode} {backend}]")


@pytest.mark.parametrize("mode", ("pynative",))
def test_matches_pytorch_float32(backend, mode):
    """One broadcast case in float32: values and both gradients within float32 accuracy of PyTorch's float64."""
    case = next(c for c in CASES if c["name"] == "bcast-prob")
    dtype = ms.float32
    args = [make(case[k], dtype)[0] for k in ("x", "t", "w_none", "w_red", "v1", "v2")]
    results = run_second_order(mode, backend, args[0], args[1], case["log_target"], *args[2:])
    for reduction, res in results.items():
        gold = case["results"][reduction]
        for key in ("out", "dx", "dt", "gx", "gt"):
            assert getattr(res, key).dtype == dtype
            _check(getattr(res, key), gold[key], dtype, f"{case['name']} {reduction} {key} [{mode} {backend} f32]")
