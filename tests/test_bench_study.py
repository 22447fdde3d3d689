"""The roofline study (benchmarks/kldiv_roofline.py), which runs the CPU library built with diagnostics: its rows
compute what the MindSpore rows compute on the same buffers, the library's span brackets the kernel inside a
MindSpore call in both modes, and the study CLI pairs and splits the calls. Each runs in a child process, since the
study hands MindSpore the diagnostics build through MS_KLDIV_LIB_DIR. Also: the production library exports the ABI
alone, and the diagnostics build the ABI plus its three diagnostics."""
import json
import os
import re
import subprocess
import sys

import pytest

from ms_kldiv import _build

from conftest import distill_abi_kernels
import _libs
import _procs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDY = os.path.join(ROOT, "benchmarks", "kldiv_roofline.py")
DIAGNOSTICS = {"KLDivTakeLastSpan", "KLDivStreamRead", "KLDivPoolCheck"}
# the slow tier: every test here needs the diagnostics library, a whole build of its own
pytestmark = pytest.mark.slow


def _python(code, tmp_path, timeout=600):
    # From a file: MindSpore's graph compiler reads a jitted function's source, which `python -c` does not have.
    script = tmp_path / "check.py"
    script.write_text(code)
    env = dict(os.environ, GLOG_v="3")
    _libs.library(_build.DIAGNOSTICS)  # what the study loads: built here, not under the child's timeout
    return _procs.run([sys.executable, str(script)], timeout, cwd=tmp_path, env=env)


def _abi_exports():
    """Every name the ABI headers declare as exported (custom_ops/common/*_abi.h)."""
    src = _build.source_dir()
    names = set()
    for header in sorted(os.listdir(os.path.join(src, "common"))):
        if header.endswith("_abi.h"):
            with open(os.path.join(src, "common", header), encoding="utf-8") as f:
                text = f.read()
            names |= set(re.findall(r"KLDIV_EXPORT[^;{(]*?\b(\w+)\s*\(", text))
            kernels = distill_abi_kernels(text)
            names |= kernels | {k + "InferShape" for k in kernels}
    return names


def _exported(path):
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    # every defined dynamic symbol: functions (T), weak template instances (W), data (D/B/R)
    return {line.split()[-1] for line in out.splitlines() if len(line.split()) == 3}


@pytest.mark.skipif(subprocess.run(["which", "nm"], capture_output=True).returncode != 0, reason="no nm (binutils)")
def test_production_library_exports_the_abi_alone():
    prod = _exported(_libs.library("CPU"))
    diag = _exported(_libs.library(_build.DIAGNOSTICS))
    assert not prod & DIAGNOSTICS, prod & DIAGNOSTICS
    assert diag - prod == DIAGNOSTICS
    # what remains is the ABI: KLDiv<Fwd|Bwd|BwdInput|BwdTarget><Reduction><Space> (+ InferShape) and KLDivLibInfo
    pattern = re.compile(r"KLDiv(Fwd|Bwd|BwdInput|BwdTarget)(None|Sum|Mean|Batchmean)(Prob|Log)(InferShape)?")
    extra = {s for s in prod if not pattern.fullmatch(s)} - {"KLDivLibInfo"} - _abi_exports()
    assert not extra, f"exports outside custom_ops/common/*_abi.h: {sorted(extra)}"
    assert len([s for s in prod if pattern.fullmatch(s)]) == 4 * 4 * 2 * 2


KERNEL_ROW = r"""
import sys; sys.argv = ["x"]
import numpy as np
sys.path.insert(0, "benchmarks")
import kldiv_roofline as study
folder = study.use_diagnostics_library()
import ms_kldiv
from ms_kldiv import reference
from ms_kldiv.bench import rows
n = 3 << 12
for reduction in ("sum", "none"):
    got = study.kernel_factory(n, "float32", reduction, "fwd")()
    xa, ta = rows._tensor_memory(n, "float32")
    want = reference.kl_div(xa.astype(np.float64), ta.astype(np.float64), reduction=reduction)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    x, t = rows._tensors(n, "float32")
    np.testing.assert_array_equal(got, ms_kldiv.kl_div(x, t, reduction=reduction, backend="aot").asnumpy())
assert study.kernel_factory(n, "float32", "sum", "grad") is None
assert study.kernel_factory(n, "bfloat16", "sum", "fwd") is None
print("OK", folder)
"""


def test_kernel_row_computes_the_loss_on_the_mindspore_rows_buffers(tmp_path):
    proc = _python(KERNEL_ROW.replace('"benchmarks"', repr(os.path.join(ROOT, "benchmarks"))), tmp_path)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    folder = proc.stdout.split("OK", 1)[1].strip()
    assert folder and not os.path.exists(folder), "the diagnostics library's copy outlived the process"


SPAN = r"""
import sys, time
sys.path.insert(0, BENCH)
import kldiv_roofline as study
study.use_diagnostics_library()
import mindspore as ms
import ms_kldiv
from ms_kldiv.bench import rows
span = study._library_span()
assert span is not None
x, t = rows._tensors(1 << 17, "float32")

def loss(a, b):
    return ms_kldiv.kl_div(a, b, reduction="sum", backend="aot")
jitted = ms.jit(loss)
for call in (lambda: loss(x, t), lambda: jitted(x, t)):
    call().asnumpy()
    span()
    t0 = time.perf_counter()
    call().asnumpy()
    t1 = time.perf_counter()
    got = span()
    assert got is not None and t0 <= got[0] <= got[1] <= t1, (t0, got, t1)
    assert span() is None
print("OK")
"""


def test_library_span_brackets_the_kernel_in_both_modes(tmp_path):
    # The span the diagnostics library records lies inside the Python call that ran the kernel, in PyNative (the
    # host call) and under ms.jit (MindSpore's runtime calls the kernel from its own thread); it is taken once.
    proc = _python(SPAN.replace("BENCH", repr(os.path.join(ROOT, "benchmarks"))), tmp_path)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_study_cli_pairs_and_splits(tmp_path):
    out = tmp_path / "study.json"
    _libs.library(_build.DIAGNOSTICS)
    proc = _procs.run([sys.executable, STUDY, "--sizes", "4K", "--modes", "fwd,grad", "--no-torch", "--no-context",
                       "--rows", "aot_jit,aot_kernel,composite_jit,roofline,jit_floor", "--min-time", "0.01",
                       "--json", str(out)], 600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert "stream read (C++, same threads)" in json.dumps(data)
    paired = {(r["row"], r["mode"]): r.get("paired") for r in data["results"]}
    assert paired[("aot_jit", "fwd")] > 0 and paired[("aot_jit", "grad")] is None
    assert paired[("aot_kernel", "fwd")] > 0 and paired[("jit_floor", "fwd")] > 0
    assert paired[("composite_jit", "fwd")] is None
    split = {r["row"]: r.get("paired_split") for r in data["results"] if r["mode"] == "fwd"}
    for row in ("aot_jit", "aot_kernel"):
        before, kernel, after = split[row]
        assert before >= 0 and kernel > 0 and after >= 0
    assert split["jit_floor"] is None
    assert "split by the kernel library's clock" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.json"]
