"""The benchmark CLI runs end to end (tiny sizes) and writes its JSON; timings themselves are never asserted."""
import json
import os
import sys

import pytest

import _procs


def test_bench_cli_smoke(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "ms_kldiv.bench", "--sizes", "4K", "--modes", "fwd,grad", "--no-torch",
           "--rows", "aot,aot_jit,composite_jit,akg_jit,ops_jit", "--min-time", "0.01", "--json", str(out),
           "--paired-ref", "ops_jit", "--paired-rows", "aot_jit"]
    # GLOG_v=2: MindSpore's warnings on (the suite quiets them), so that the check below can fail
    proc = _procs.run(cmd, 600, cwd=tmp_path, env=dict(os.environ, GLOG_v="2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ms_kldiv aot (ms.jit)" in proc.stdout and "mindspore ops.kl_div (ms.jit)" in proc.stdout
    assert "has been compiled again" not in proc.stderr  # one ms.jit function per row, by design: not reported
    data = json.loads(out.read_text())
    text = json.dumps(data)
    for label in ("ms_kldiv aot (ms.jit)", "ms_kldiv akg (ms.jit)", "mindspore ops.kl_div (ms.jit)"):
        assert label in text
    # every row was also timed in context (each call preceded by other work), and the table says so
    for r in data["results"]:
        assert r["error"] is None and r["ms"] > 0 and r["ms_context"] > 0, r
    assert "in context" in proc.stdout
    # the pairing runs only where asked: aot_jit with ops_jit
    paired = {(r["row"], r["mode"]): r.get("paired") for r in data["results"]}
    assert paired[("aot_jit", "fwd")] > 0 and paired[("aot_jit", "grad")] > 0
    assert paired[("composite_jit", "fwd")] is None and paired[("aot", "fwd")] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json"]


def test_bench_cli_without_context(tmp_path):
    out = tmp_path / "bench.json"
    proc = _procs.run([sys.executable, "-m", "ms_kldiv.bench", "--sizes", "4K", "--modes", "fwd", "--no-torch",
                       "--rows", "aot", "--min-time", "0.01", "--no-context", "--json", str(out)], 300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all("ms_context" not in r for r in json.loads(out.read_text())["results"])
    assert "in context" not in proc.stdout


def test_tensor_memory_is_the_mindspore_rows_buffers():
    # The study rows (benchmarks/kldiv_roofline.py) must read the very bytes the kernel rows read: the fused
    # forward's speed from DRAM can depend on where its input buffers landed, a streaming read's does not.
    import numpy as np
    from ms_kldiv.bench import harness, rows
    n = 1 << 12
    x, t = rows._tensors(n, "float32")
    xa, ta = rows._tensor_memory(n, "float32")
    assert xa.ctypes.data == x.asnumpy().ctypes.data and ta.ctypes.data == t.asnumpy().ctypes.data
    for got, want in zip((xa, ta), harness.make_data(n, "float32")):
        np.testing.assert_array_equal(got, want)
    assert rows._tensors(n, "float32")[0] is x  # one set of inputs per cell, shared by its rows


def _fake_clock(monkeypatch, slow_from, slow_to):
    """A fake perf_counter and a maker of calls that advance it by their cost, doubled for the calls made while a
    slow phase lasts (the calls numbered slow_from to slow_to - 1); returns (make, calls made so far)."""
    from ms_kldiv.bench import harness
    clock = [0.0]
    calls = []

    def make(name, cost):
        def f():
            slow = 2.0 if slow_from <= len(calls) < slow_to else 1.0
            calls.append(name)
            clock[0] += cost * slow
        return f

    monkeypatch.setattr(harness.time, "perf_counter", lambda: clock[0])
    return make, calls


def test_paired_ratios_alternate_and_pair_each_call_with_its_neighbour(monkeypatch):
    # fn takes 3 units, ref 2, and a slow phase doubles both for the calls made while it lasts. Each pair's ratio
    # must still be 1.5, whichever runs first: the pairing is what cancels the drift.
    from ms_kldiv.bench import harness
    make, calls = _fake_clock(monkeypatch, 10, 30)
    ratios, = harness.paired_ratios([make("fn", 3.0)], make("ref", 2.0), pairs=20, warmup=1)
    assert ratios == [1.5] * 20
    timed = calls[2:]  # after the warm-up pair
    assert timed[:4] == ["ref", "fn", "fn", "ref"]  # the order alternates


def test_paired_rows_take_turns_pair_by_pair(monkeypatch):
    # Two rows paired with one reference: pair i of each row comes before pair i + 1 of either, so both see the
    # same phases (here a slow phase doubling every call made while it lasts) and keep their own exact ratios.
    from ms_kldiv.bench import harness
    make, calls = _fake_clock(monkeypatch, 8, 20)
    r1, r2 = harness.paired_ratios([make("a", 3.0), make("b", 4.0)], make("ref", 2.0), pairs=6, warmup=1)
    assert r1 == [1.5] * 6 and r2 == [2.0] * 6
    timed = calls[4:]  # after the warm-up: a, ref, b, ref
    assert timed[:8] == ["ref", "a", "ref", "b", "a", "ref", "b", "ref"]


def test_a_row_failing_in_its_pairs_keeps_its_rounds(monkeypatch):
    # A row that fails only while paired keeps the best-of numbers of its rounds; the failure is reported.
    from ms_kldiv.bench import harness
    monkeypatch.setattr(harness, "_ROWS", [])
    pairing = {"on": False}
    paired_ratios = harness.paired_ratios

    def pairing_now(*args, **kwargs):
        pairing["on"] = True
        return paired_ratios(*args, **kwargs)

    monkeypatch.setattr(harness, "paired_ratios", pairing_now)

    def flaky(n, dtype, reduction, mode):
        def step():
            if pairing["on"]:
                raise ValueError("gone")
        return step

    harness.add_row("flaky", "flaky row", flaky)
    harness.add_row("ref", "reference row", lambda n, dtype, reduction, mode: (lambda: None))
    logged = []
    res = harness.run(sizes=(8,), modes=("fwd",), min_time=0.0, rounds=2, settle=0.0, paired_ref="ref",
                      paired_keys=("flaky",), log=logged.append)
    rec = next(r for r in res if r["row"] == "flaky")
    assert rec["error"] is None and rec["ms"] is not None and "paired" not in rec
    assert "gone" in rec["paired_error"] and any("gone" in m for m in logged)


def test_paired_calls_split_by_the_kernel_span(monkeypatch):
    # A row whose calls report their kernel's span: each timed call is split into before / kernel / after, each
    # over its pair's reference time, whichever of the pair runs first; a row without a span gets no split.
    from ms_kldiv.bench import harness
    make, calls = _fake_clock(monkeypatch, 99, 99)
    clock = harness.time.perf_counter
    last = {}

    def fn():  # 1 unit before its kernel, 3 of kernel, 2 after
        make("pre", 1.0)()
        start = clock()
        make("kernel", 3.0)()
        last["span"] = (start, clock())
        make("post", 2.0)()

    def span():
        return last.pop("span", None)

    fn.kernel_span = span
    splits = []
    with_span, without = harness.paired_ratios([fn, make("plain", 5.0)], make("ref", 2.0), pairs=4, warmup=1,
                                               splits=splits)
    assert with_span == [3.0] * 4 and without == [2.5] * 4
    assert splits == [[(0.5, 1.5, 1.0)] * 4, []]
    # without ``splits`` nobody reads the spans: the last one is still there to take
    harness.paired_ratios([fn], make("ref", 2.0), pairs=2, warmup=0)
    assert span() is not None


def test_split_of_middle_pairs_adds_up_to_the_middle_total():
    # The split averages the middle half of the pairs ranked by total (here the four pairs of total 1.6, leaving
    # out the two fastest and the two slowest), so its parts add up to that half's mean total.
    from ms_kldiv.bench import harness
    split = [(0.1, 1.0, 0.1)] * 2 + [(0.5, 1.0, 0.1), (0.1, 1.0, 0.5)] * 2 + [(0.9, 2.0, 0.9)] * 2
    before, kernel, after = harness.split_of_middle_pairs(split)
    assert abs(before + kernel + after - 1.6) < 1e-12
    assert abs(before - 0.3) < 1e-12 and abs(kernel - 1.0) < 1e-12 and abs(after - 0.3) < 1e-12
    assert harness.split_of_middle_pairs([(0.2, 1.0, 0.3)]) == [0.2, 1.0, 0.3]


def _subcommand(tmp_path, *args):
    out = tmp_path / "records.json"
    proc = _procs.run([sys.executable, "-m", "ms_kldiv.bench", *args, "--json", str(out)], 900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads(out.read_text())
    assert records and all("error" not in r and r["seconds"] > 0 for r in records), records
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.json"]  # nothing else in the working directory
    return proc.stdout, records


@pytest.mark.slow
def test_distill_subcommand_smoke(tmp_path):
    # Every row is a child process of its own (~8 s here): two modes, not three ('fwd' is 'grad' less the vjp).
    stdout, records = _subcommand(tmp_path, "distill", "--sizes", "8x64", "--dtypes", "float32", "--betas", "0,0.5",
                                  "--modes", "grad,step", "--rows", "fused,composition,ms_ops,stream",
                                  "--divergences", "skew_rkl", "--repeats", "1")
    cells = {(r["row"], r["beta"], r["mode"]) for r in records}
    assert cells == {("fused", b, m) for b in (0.0, 0.5) for m in ("grad", "step")} | {
        ("composition", b, m) for b in (0.0, 0.5) for m in ("grad", "step")} | {
        ("ms_ops", 0.0, "grad"), ("stream", 0.0, "grad"), ("fused-skew_rkl", 0.0, "grad")}, cells
    # ms_ops and stream: forward KL only, as documented; no step rows. A divergence row is timed against forward KL
    # in its own process (beta 0, fwd and grad only).
    paired = [r for r in records if r["row"] == "fused-skew_rkl"]
    assert all(r["paired_ratio"] > 0 for r in paired) and stdout.count("x (paired)") == 1
    assert all(r["peak_bytes"] is not None for r in records) and "time vs fused" in stdout


def test_fused_linear_unchunked_rows_that_cannot_fit_are_not_run(tmp_path):
    """An unchunked row whose estimated peak exceeds this machine's memory is reported with that estimate (its
    PEAK_PER_ELEMENT bytes per N x V element) instead of being run."""
    from ms_kldiv.bench.fused_linear import PEAK_PER_ELEMENT
    out = tmp_path / "records.json"
    n, v = 1 << 20, 1 << 22
    proc = _procs.run([sys.executable, "-m", "ms_kldiv.bench", "fused-linear", "--sizes", f"{n}x8x{v}", "--dtypes",
                       "float32", "--rows", "composition,composition_unfused", "--json", str(out)], 300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads(out.read_text())
    assert [(r["row"], r["skipped"], r["needs_bytes"]) for r in records] == [
        (row, True, n * v * PEAK_PER_ELEMENT[row]) for row in ("composition", "composition_unfused")]
    assert proc.stdout.count("not run: needs about") == 2, proc.stdout


def test_fused_linear_subcommand_smoke(tmp_path):
    stdout, records = _subcommand(tmp_path, "fused-linear", "--sizes", "16x8x32", "--dtypes", "float32",
                                  "--rows", "fused,fused_pynative,fused_loop,matmuls,kernels,composition", "--repeats",
                                  "1", "--chunk-size", "5")
    assert {r["row"] for r in records} == {"fused", "fused_pynative", "fused_loop", "matmuls", "kernels",
                                           "composition"}
    assert all(r["compile_seconds"] >= 0 for r in records) and "time vs matmuls + kernels" in stdout
    # each head row also ran at the tiny size; its peak there (the framework's first call) is taken off the row's
    heads = [r for r in records if r["row"].startswith("fused")]
    assert len(heads) == 3 and "head's own peak" in stdout
    for r in heads:
        assert r["first_call_bytes"] > 0 and r["own_peak_bytes"] == max(0, r["peak_bytes"] - r["first_call_bytes"])


def test_small_divergence_study_runs(tmp_path):
    """benchmarks/distill_small_divergence.py (docs/distillation.md#accuracy's table) at a tiny size: a row per noise,
    temperature and divergence, each error a number, nothing left in the working directory."""
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                          "distill_small_divergence.py")
    proc = _procs.run([sys.executable, script, "--vocab", "64", "--rows", "2"], 300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines()[1:] if line.strip()]
    assert len(rows) == 3 * 3 * 6, proc.stdout
    for row in rows:
        float(row[-1]), float(row[-4])  # the identical inputs' D / T^2 and the loss's relative error
    assert list(tmp_path.iterdir()) == []
