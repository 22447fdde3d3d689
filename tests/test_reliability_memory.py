"""Memory over time: repeated calls of each kind (PyNative and ``ms.jit``, forward and value+grad, the batch size
cycling, under ``set_inputs`` with an unknown batch dim for ``ms.jit``) grow RSS by less than a bound and open no
file descriptors and no threads. Each backend runs in its own child process (a fresh heap, nothing from other
tests in it); the counts are taken after a warm-up pass over every batch size, so one-off caches (compiled graphs,
PyNative's per-shape op info, HostCall's per-shape layouts, bounded at 257) are already filled.

'aot' (what 'auto' picks on CPU) runs 10,000 calls of every kind. 'composite' and 'akg' are MindSpore ops in
PyNative: MindSpore 2.10's PyNative itself grows RSS by about 1.8 KB per call of a plain-op expression
(``(t * (log(t) - x)).sum()``, no ms_kldiv; 3.9 KB with value_and_grad) and those backends cost 20 ms and 11 ms
per PyNative call here, so they run fewer calls (CALLS below) against the same bound.
"""
import json
import os
import sys

import pytest

from conftest import BACKENDS
import _procs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# calls per kind: (PyNative forward, PyNative value+grad, jit forward, jit value+grad)
CALLS = {"aot": (10_000, 10_000, 10_000, 10_000), "composite": (500, 250, 1_000, 1_000),
         "akg": (500, 250, 1_000, 1_000)}
# Measured after warm-up (MindSpore 2.10, CPU): aot 0.1 MB per 10,000 calls for PyNative forward and both jit
# kinds, 13 MB for PyNative value+grad (1.3 KB per call: MindSpore's autograd, below its 3.9 KB for plain ops);
# composite / akg ~5 MB per 1,000 PyNative forward calls (MindSpore's per-op growth), < 0.3 MB for jit.
RSS_BOUND_MB = 20

CHILD = r"""
import gc, json, os, sys, threading, time
import numpy as np, mindspore as ms
from mindspore import nn
import ms_kldiv
backend, calls = sys.argv[1], [int(c) for c in sys.argv[2].split(",")]
BATCHES = (1, 2, 3, 5, 8, 13)
rng = np.random.default_rng(0)
data = [(ms.Tensor(rng.standard_normal((b, 64)).astype(np.float32) - 2), ms.Tensor(rng.random((b, 64)).astype(np.float32)))
        for b in BATCHES]


def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")) / 1024


def native_threads():
    return len(os.listdir("/proc/self/task"))


class Loss(nn.Cell):
    def __init__(self):
        super().__init__()
        self.loss = ms_kldiv.KLDivLoss("batchmean", backend=backend)

    def construct(self, x, t):
        return self.loss(x, t)


class ValueAndGrad(nn.Cell):
    def __init__(self):
        super().__init__()
        self.loss = Loss()

    def construct(self, x, t):
        return ms.value_and_grad(self.loss, grad_position=(0, 1))(x, t)


def dynamic(cell):
    spec = ms.Tensor(shape=[None, 64], dtype=ms.float32)
    cell.set_inputs(spec, spec)
    return ms.jit(cell)


def forward(x, t):
    return ms_kldiv.kl_div(x, t, "batchmean", backend=backend)


kinds = {
    "pynative_forward": forward,
    "pynative_value_and_grad": ms.value_and_grad(forward, grad_position=(0, 1)),
    "jit_forward": dynamic(Loss()),
    "jit_value_and_grad": dynamic(ValueAndGrad()),
}


def sync(out):
    if isinstance(out, (tuple, list)):
        for o in out:
            sync(o)
    else:
        out.asnumpy()


report = {}
for (name, fn), n in zip(kinds.items(), calls):
    for x, t in data * 3:  # warm-up: every batch size, compiled and cached
        sync(fn(x, t))
    gc.collect()
    rss0, fds0, thr0, pythr0 = rss_mb(), len(os.listdir("/proc/self/fd")), native_threads(), threading.active_count()
    start = time.perf_counter()
    for i in range(n):
        sync(fn(*data[i % len(data)]))
    seconds = time.perf_counter() - start
    gc.collect()
    report[name] = {"calls": n, "seconds": round(seconds, 2), "rss_growth_mb": round(rss_mb() - rss0, 2),
                    "rss_mb": round(rss_mb(), 1), "new_fds": len(os.listdir("/proc/self/fd")) - fds0,
                    "new_threads": native_threads() - thr0, "new_python_threads": threading.active_count() - pythr0}
print("REPORT", json.dumps(report))
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_rss_fds_threads_over_many_calls(backend, tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    script = tmp_path / "memory.py"  # graph mode reads a Cell's source: it cannot come from `python -c`
    script.write_text(CHILD)
    work = tmp_path / "cwd"
    work.mkdir()
    calls = ",".join(map(str, CALLS.get(backend, CALLS["composite"])))
    proc = _procs.run([sys.executable, str(script), backend, calls], 600, env=env, cwd=str(work))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    report = json.loads(lines[-1][len("REPORT "):])
    print(backend, report)
    for kind, r in report.items():
        assert r["rss_growth_mb"] < RSS_BOUND_MB, (kind, r)
        assert r["new_fds"] <= 0, (kind, r)
        assert r["new_threads"] <= 0 and r["new_python_threads"] <= 0, (kind, r)
    assert os.listdir(work) == []
