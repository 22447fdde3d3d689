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
                                  "1", "--chunk-size", "5", "--hard-weight", "0.5")
    assert {r["row"] for r in records} == {"fused", "fused_pynative", "fused_loop", "matmuls", "kernels",
                                           "composition"}
    assert {r["row"]: r["hard_weight"] for r in records} == {"fused": 0.5, "fused_pynative": 0.5, "fused_loop": 0.5,
                                                             "matmuls": 0.0, "kernels": 0.0, "composition": 0.0}
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


# --- the command lines refuse bad values (argparse: usage, the flag's name, exit code 2) before building or timing

def _refused(main, argv, capsys):
    """The stderr of ``main(argv)``, which must exit with argparse's code 2."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2, argv
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, flag, valid", [
    (["--modes", "Grad"], "--modes", "fwd, grad"),  # a typo once timed the forward under a value+grad heading
    (["--modes", "fwd,"], None, None),  # an empty item is left out: not an error by itself (see below)
    (["--rows", "nosuch"], "--rows", "aot, aot_jit"),
    (["--rows", "aot,aot_jt"], "--rows", "aot_jit"),
    (["--sizes", "4X"], "--sizes", "4K"),
    (["--sizes", ","], "--sizes", None),
    (["--rounds", "0"], "--rounds", ">= 1"),
    (["--min-time", "-1"], "--min-time", ">= 0"),
    (["--dtypes", "float8"], "--dtypes", "float32, float64, float16, bfloat16"),
    (["--reductions", "avg"], "--reductions", "none, sum, mean, batchmean"),
    (["--ref", "aot_jt"], "--ref", "aot_jit"),
    (["--paired-ref", "nosuch"], "--paired-ref", "aot_jit"),
    (["--paired-ref", "aot", "--paired-rows", "aot,nosuch"], "--paired-rows", "aot_jit"),
])
def test_main_bench_refuses_bad_arguments(argv, flag, valid, capsys, monkeypatch):
    from ms_kldiv.bench import __main__ as cli
    if flag is None:  # parsed, not refused: the rest of the run is not this test's business
        args = cli.parser().parse_args(argv)
        assert args.modes == ["fwd"]
        return
    monkeypatch.setattr(cli, "run", lambda *a: pytest.fail("parsed a bad value"))
    err = _refused(cli.main, argv, capsys)
    assert f"argument {flag}:" in err and "usage: python -m ms_kldiv.bench" in err, err
    assert valid is None or valid in err, err


def test_main_bench_parses_lists_as_before():
    from ms_kldiv.bench import __main__ as cli
    args = cli.parser().parse_args(["--sizes", "4K,1.5k,100", "--rows", "aot,ops_jit", "--paired-ref", ""])
    assert args.sizes == [4096, 1536, 100] and args.rows == ["aot", "ops_jit"] and args.paired_ref == ""
    args = cli.parser().parse_args([])
    assert args.sizes == [4 << 10, 64 << 10, 1 << 20, 4 << 20, 32 << 20] and args.modes == ["fwd", "grad"]
    assert args.rows == [] and args.dtypes == ["float32"] and args.paired_rows == ["aot", "aot_jit"]


def test_main_bench_row_keys_are_the_registered_rows(monkeypatch):
    # --rows, --ref and --paired-ref are checked against ROW_KEYS before anything is registered: the two must agree
    from ms_kldiv.bench import __main__ as cli, harness, rows
    monkeypatch.setattr(harness, "_ROWS", [])
    rows.register_default_rows(with_torch=False)
    assert sorted(key for key, _, _ in harness.rows()) == sorted(set(cli.ROW_KEYS) - {"torch"})


def test_main_bench_refuses_a_row_not_registered_here(capsys, monkeypatch):
    # 'torch' is a valid key, but with --no-torch it has no row: refused, not an empty table or a dropped ratio table
    import mindspore as ms
    from ms_kldiv.bench import __main__ as cli, harness
    monkeypatch.setattr(harness, "_ROWS", [])
    monkeypatch.setattr(ms, "set_context", lambda **kwargs: None)  # this process's mode stays as it is
    monkeypatch.setattr(harness, "run", lambda *a, **k: pytest.fail("timed with a row missing"))
    for argv, flag in ((["--rows", "torch"], "--rows"), (["--ref", "torch"], "--ref"),
                       (["--paired-ref", "torch"], "--paired-ref")):
        err = _refused(cli.main, ["--no-torch", "--sizes", "4K"] + argv, capsys)
        assert f"argument {flag}: row 'torch' is not available here" in err and "aot_jit" in err, err


def test_help_describes_every_command_and_lists_the_subcommands(capsys):
    from ms_kldiv.bench import __main__ as cli, distill, fused_linear, sparse
    for main, description in ((cli.main, cli.DESCRIPTION), (distill.main, distill.DESCRIPTION),
                              (fused_linear.main, fused_linear.DESCRIPTION), (sparse.main, sparse.DESCRIPTION)):
        with pytest.raises(SystemExit) as exc:
            main(["--help"])
        assert exc.value.code == 0
        out = capsys.readouterr().out
        assert description.endswith(".") and " ".join(description.split()) in " ".join(out.split()), out
        flags = [line.split()[0] for line in out.split("options:")[1].splitlines() if line.startswith("  --")]
        assert flags and " ".join(out.split("options:")[1].split()).count("(default:") >= len(flags), out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    epilog = capsys.readouterr().out.split("subcommands")[1]
    for name in cli.SUBCOMMANDS:
        assert f"\n  {name} " in epilog, epilog


@pytest.mark.parametrize("argv, flag, valid", [
    (["--modes", "bad"], "--modes", "fwd, grad, step"),
    (["--rows", "fusd,stream"], "--rows", "fused, composition, ms_ops, torch, stream"),
    (["--sizes", "4096x"], "--sizes", "rows x V"),
    (["--sizes", "8x16x4"], "--sizes", "rows x V"),
    (["--betas", "0.5x"], "--betas", "[0, 1]"),
    (["--betas", "2"], "--betas", "[0, 1]"),
    (["--repeats", "0"], "--repeats", ">= 1"),
    (["--dtypes", "float8"], "--dtypes", "float32, bfloat16"),
    (["--divergences", "jds"], "--divergences", "jsd, tvd"),
])
def test_distill_refuses_bad_arguments(argv, flag, valid, capsys, monkeypatch):
    from ms_kldiv.bench import distill
    monkeypatch.setattr(distill, "in_child", lambda *a: pytest.fail("ran a row"))
    err = _refused(distill.main, argv, capsys)
    assert f"argument {flag}:" in err and valid in err and "usage: python -m ms_kldiv.bench distill" in err, err


@pytest.mark.parametrize("argv, flag, valid", [
    (["--rows", "fusd"], "--rows", "fused, fused_pynative"),
    (["--rows", "fused_pynativ"], "--rows", "fused_pynative"),  # once ran the GRAPH_MODE head under this name
    (["--sizes", "16x16"], "--sizes", "N x H x V"),
    (["--sizes", "16x16x0"], "--sizes", "N x H x V"),
    (["--dtypes", "float8"], "--dtypes", "float32, bfloat16"),
    (["--repeats", "0"], "--repeats", ">= 1"),
    (["--chunk-size", "-1"], "--chunk-size", ">= 0"),
    (["--hard-weight", "-0.5"], "--hard-weight", ">= 0"),
])
def test_fused_linear_refuses_bad_arguments(argv, flag, valid, capsys, monkeypatch):
    from ms_kldiv.bench import fused_linear
    monkeypatch.setattr(fused_linear, "in_child", lambda *a: pytest.fail("ran a row"))
    err = _refused(fused_linear.main, argv, capsys)
    assert f"argument {flag}:" in err and valid in err and "usage: python -m ms_kldiv.bench fused-linear" in err, err


def test_subcommands_are_refused_through_the_main_command(capsys):
    from ms_kldiv.bench import __main__ as cli
    for argv, flag in ((["distill", "--modes", "bad"], "--modes"), (["fused-linear", "--sizes", "16x16"], "--sizes"),
                       (["sparse", "--n", "0"], "--n")):
        assert f"argument {flag}:" in _refused(cli.main, argv, capsys)


def _distill_record(**extra):
    return dict({"row": "fused", "n": 64, "v": 512, "dtype": "float32", "beta": 0.0, "mode": "fwd", "seconds": 0.0031,
                 "peak_bytes": 2**20, "logits_bytes": 64 * 512 * 4}, **extra)


def test_distill_table_ratios_are_the_times_shown_over_the_fused_time_shown():
    # A (paired) row's ratio is the median of its pairs: the table shows that pair's two calls, not the row's
    # separate best (0.0145 s here) beside the fused row's (0.0031 s), whose ratio (4.7x) contradicted 0.86x.
    from ms_kldiv.bench import distill
    fused = _distill_record()
    paired = _distill_record(row="fused-tvd", seconds=0.0145, paired_ratio=0.86, paired_ref_seconds=0.0116,
                             paired_median_seconds=0.0129, paired_median_ref_seconds=0.0150)
    composition = _distill_record(row="composition", seconds=0.0084)
    for rec in (fused, paired, composition):
        seconds, peak, mult, ref, ratio = distill.table_row(rec, fused)
        assert abs(float(seconds) / float(ref) - float(ratio.split("x")[0])) < 0.01, (seconds, ref, ratio)
        assert peak == "1.00 MB" and mult == "8.00"
    assert distill.table_row(paired, fused)[-1] == "0.86x (paired)" and distill.table_row(paired, fused)[3] == "0.0150"
    assert distill.table_row(composition, fused)[3:] == ("0.0031", "2.71x")
    assert distill.table_row(composition, {})[3:] == ("-", "-")  # the cell's fused row failed


def test_distill_pairs_record_the_median_pair(monkeypatch):
    # The median pair's own two times are recorded, their ratio the recorded paired_ratio. A fake clock: each call
    # advances it by its cost, the calls in order (warm-up: the row, then forward KL; then the pairs, alternating).
    import time
    from ms_kldiv.bench import distill
    clock = [0.0]
    costs = iter([5.0, 2.0] + [3.0, 2.0] + [2.0, 1.0] + [4.0, 2.0] + [3.0, 2.0] + [2.0, 4.0])
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def call(s, t):
        clock[0] += next(costs)
    # pairs' ratios (row / forward KL): 2/3, 2/1, 2/4, 3/2, 4/2: the median is the fourth pair's
    rec = distill._paired_with_forward_kl(call, call, None, None, lambda out: out, repeats=1)
    assert rec == {"paired_ratio": 1.5, "paired_ref_seconds": 1.0, "paired_median_seconds": 3.0,
                   "paired_median_ref_seconds": 2.0}


def _roofline_study():
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                        "kldiv_roofline.py")
    spec = importlib.util.spec_from_file_location("kldiv_roofline_cli", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_roofline_study_parses_its_arguments_before_building(capsys, monkeypatch):
    # --help and bad values must not wait for (or start) the diagnostics library's build
    study = _roofline_study()
    monkeypatch.setattr(study, "use_diagnostics_library", lambda: pytest.fail("built before parsing"))
    with pytest.raises(SystemExit) as exc:
        study.main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.startswith("usage: python benchmarks/kldiv_roofline.py"), out
    assert " ".join(study.DESCRIPTION.split()) in " ".join(out.split()) and "jit_floor" in out
    err = _refused(study.main, ["--rows", "aot,nosuch"], capsys)
    assert "argument --rows:" in err and "roofline" in err and "kldiv_roofline.py" in err, err
