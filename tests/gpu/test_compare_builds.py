"""benchmarks/gpu/compare_builds.py's arithmetic (it runs only on a CUDA device): each op's median over rounds, B / A,
and each divergence's fwd + bwd against forward KL's under each build."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "benchmarks", "gpu"))
import compare_builds  # noqa: E402

pytestmark = pytest.mark.isa_independent


def run(fkl_fwd, jsd_fwd):
    return {"64x100 float32": {"copy": 1.0, "fkl fwd": fkl_fwd, "fkl bwd": 3.0, "jsd fwd": jsd_fwd, "jsd bwd": 3.0,
                               "stored top-64 fwd": 1.5}}


def test_medians_and_table():
    a = compare_builds.medians([run(2.0, 5.0), run(2.2, 4.0), run(9.0, 6.0)])
    b = compare_builds.medians([run(2.0, 4.0), run(2.0, 4.0)])
    assert a == run(2.2, 5.0) and b == run(2.0, 4.0)
    rows = {line[:24].strip(): line[24:].split() for line in compare_builds.table(a, b)}  # op column: 24 wide
    assert rows["jsd fwd"] == ["5.000", "4.000", "0.800"]
    assert rows["fkl fwd"][2] == "0.909" and rows["copy"][2] == "1.000"
    assert rows["stored top-64 fwd"][2] == "1.000" and "stored top-64" not in rows  # not a divergence
    assert rows["jsd"] == [f"{8.0 / 5.2:.2f}", f"{7.0 / 5.0:.2f}"]  # (5 + 3) / (2.2 + 3), (4 + 3) / (2 + 3)
    assert rows["fkl"] == ["1.00", "1.00"]
