"""The benchmark CLI runs end to end (tiny sizes) and writes its JSON; timings themselves are never asserted."""
import json
import subprocess
import sys


def test_bench_cli_smoke(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "ms_kldiv.bench", "--sizes", "4K", "--modes", "fwd,grad", "--no-torch",
           "--rows", "aot_jit,composite_jit,akg_jit,ops_jit,roofline", "--min-time", "0.01", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ms_kldiv aot (ms.jit)" in proc.stdout and "mindspore ops.kl_div (ms.jit)" in proc.stdout
    data = json.loads(out.read_text())
    text = json.dumps(data)
    for label in ("ms_kldiv aot (ms.jit)", "ms_kldiv akg (ms.jit)", "stream read (C++, same threads)"):
        assert label in text
    # aot_jit (a default paired row) was also timed in pairs with the streaming read, forward only
    paired = {(r["row"], r["mode"]): r.get("paired") for r in data["results"]}
    assert paired[("aot_jit", "fwd")] > 0 and paired[("aot_jit", "grad")] is None
    assert paired[("composite_jit", "fwd")] is None
    assert "paired with stream read" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json"]


def test_bench_cuda_option_explains_without_a_gpu(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ms_kldiv.bench", "--cuda"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode in (0, 2), proc.stderr[-2000:]
    assert "CUDA" in proc.stdout or "checkout" in proc.stdout


def test_roofline_reads_the_mindspore_rows_buffers():
    # The roofline must read the very bytes the kernel rows read: on this VM the fused forward's speed from DRAM
    # depended on where its input buffers landed, the streaming read's did not (docs/cpu_aot.md).
    import numpy as np
    from ms_kldiv.bench import harness, rows
    n = 1 << 12
    x, t = rows._tensors(n, "float32")
    xa, ta = rows._tensor_memory(n, "float32")
    assert xa.ctypes.data == x.asnumpy().ctypes.data and ta.ctypes.data == t.asnumpy().ctypes.data
    for got, want in zip((xa, ta), harness.make_data(n, "float32")):
        np.testing.assert_array_equal(got, want)
    assert rows._tensors(n, "float32")[0] is x  # one set of inputs per cell, shared by its rows


def test_paired_ratios_alternate_and_pair_each_call_with_its_neighbour(monkeypatch):
    # A fake clock: fn takes 3 units, ref 2, and a slow phase doubles both for the calls made while it lasts. Each
    # pair's ratio must still be 1.5, whichever runs first: the pairing is what cancels the drift.
    from ms_kldiv.bench import harness
    clock = [0.0]
    calls = []

    def make(name, cost):
        def f():
            slow = 2.0 if 10 <= len(calls) < 30 else 1.0
            calls.append(name)
            clock[0] += cost * slow
        return f

    monkeypatch.setattr(harness.time, "perf_counter", lambda: clock[0])
    ratios = harness.paired_ratios(make("fn", 3.0), make("ref", 2.0), pairs=20, warmup=1)
    assert ratios == [1.5] * 20
    timed = calls[2:]  # after the warm-up pair
    assert timed[:4] == ["ref", "fn", "fn", "ref"]  # the order alternates
