"""``python -m ms_kldiv.bench sparse`` runs end to end at tiny sizes (timings themselves are never asserted): each
cell is checked (the fused loss equals the composition's) before any of its rows is timed, every row prints, and
the records are written."""
import json
import os
import sys

import pytest

import _procs


@pytest.mark.slow
def test_sparse_subcommand_quick(tmp_path):
    out = tmp_path / "records.json"
    cmd = [sys.executable, "-m", "ms_kldiv.bench", "sparse", "--quick", "--ks", "4", "--repeats", "1",
           "--json", str(out)]
    proc = _procs.run(cmd, 300, cwd=tmp_path, env=_procs.with_repo_path(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads(out.read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.json"]  # nothing else in the working directory
    assert not [r for r in records if "error" in r or r.get("skipped")], records

    try:
        import torch  # noqa: F401
        has_torch = True
    except ImportError:
        has_torch = False
    timed_rows = {"fused", "composition", "read_once"} | ({"torch", "read_once_torch"} if has_torch else set())
    for dtype in ("float32", "bfloat16"):
        cell = [r for r in records if r["dtype"] == dtype]
        # the check comes first in the cell's records (it ran before any timing) and the two values agree
        check = cell[0]
        assert check["row"] == "check" and check["agree"] is True, check
        assert abs(check["fused_value"] - check["composition_value"]) <= \
            check["rtol"] * abs(check["composition_value"]), check
        timed = {(r["row"], r["mode"]): r for r in cell[1:] if r["row"] != "targets"}
        assert {row for row, _ in timed} == timed_rows
        for rec in timed.values():
            assert rec["seconds"] > 0, rec
        for row in timed_rows - {"read_once", "read_once_torch"}:
            for mode in ("fwd", "grad"):
                rec = timed[(row, mode)]
                assert rec["peak_bytes"] is not None and rec["agrees_with_fused"] is True, rec
        # the timed fused row computes the value the composition row computes
        for mode in ("fwd", "grad"):
            fused, comp = timed[("fused", mode)]["value"], timed[("composition", mode)]["value"]
            assert abs(fused - comp) <= check["rtol"] * abs(comp), (fused, comp)
        targets = cell[-1]
        assert targets["row"] == "targets" and targets["speedup"] > 0 and targets["forward"] > 0
        # the table prints every row of the cell, and the check line before them
        assert f"| 4 | 512 | {dtype} | fused |" in proc.stdout
        assert f"| 4 | 512 | {dtype} | composition |" in proc.stdout
        assert f"4 | 512 | {dtype}: fused " in proc.stdout and "before timing" in proc.stdout
        if has_torch:
            assert f"| 4 | 512 | {dtype} | torch |" in proc.stdout
    for header in ("fwd / read-once", "composition v+g / this v+g", "x logits", "Targets (fused row)"):
        assert header in proc.stdout


def test_sparse_subcommand_skips_a_row_too_big(tmp_path):
    # --max-gb below the inputs: nothing is run, the memory the cell would need is printed instead
    out = tmp_path / "records.json"
    cmd = [sys.executable, "-m", "ms_kldiv.bench", "sparse", "--quick", "--ks", "4", "--dtypes", "float32",
           "--max-gb", "0.00001", "--json", str(out)]
    proc = _procs.run(cmd, 120, cwd=tmp_path, env=_procs.with_repo_path(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads(out.read_text())
    assert [r["row"] for r in records] == ["check"] and records[0]["skipped"] and records[0]["needs_bytes"] > 0
    assert "not run: needs about" in proc.stdout


@pytest.mark.parametrize("argv, flag, valid", [
    (["--quick", "--ks", "1,x"], "--ks", ">= 1"),
    (["--quick", "--ks", "0"], "--ks", ">= 1"),
    (["--quick", "--rows", "fusd"], "--rows", "fused, composition, torch, read_once"),
    (["--n", "0"], "--n", ">= 1"),  # once meant the default 4096 rows
    (["--vocabs", "512,"], None, None),
    (["--vocabs", "5x"], "--vocabs", ">= 1"),
    (["--ks-at-large", "-1"], "--ks-at-large", ">= 1"),
    (["--dtypes", "float8"], "--dtypes", "float32, bfloat16, float16"),
    (["--temperature", "0"], "--temperature", "> 0"),
    (["--teacher-temperature", "nan"], "--teacher-temperature", "> 0"),
    (["--beta", "1.5"], "--beta", "[0, 1]"),
    (["--repeats", "0"], "--repeats", ">= 1"),
    (["--max-gb", "0"], "--max-gb", "> 0"),
])
def test_sparse_subcommand_refuses_bad_arguments(argv, flag, valid, capsys, monkeypatch):
    # argparse errors (exit code 2, the flag named) before any cell is checked or timed
    from ms_kldiv.bench import sparse
    monkeypatch.setattr(sparse, "run_cell", lambda *a: pytest.fail("ran a cell"))
    if flag is None:  # an empty item is left out
        monkeypatch.setattr(sparse, "run_cell", lambda n, v, k, *a: (seen.append((n, v, k)), None)[1])
        seen = []
        assert sparse.main(argv + ["--quick", "--ks", "4", "--dtypes", "float32", "--rows", "fused"]) == 0
        assert seen == [(64, 512, 4)]
        capsys.readouterr()
        return
    with pytest.raises(SystemExit) as exc:
        sparse.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"argument {flag}:" in err and valid in err, err
    assert "usage: python -m ms_kldiv.bench sparse" in err, err


def test_sparse_subcommand_sizes_given_win_over_quick(monkeypatch, capsys):
    from ms_kldiv.bench import sparse
    seen = []
    monkeypatch.setattr(sparse, "run_cell", lambda n, v, k, dtype, *a: seen.append((n, v, k, dtype)))
    sparse.main(["--quick", "--n", "16", "--vocabs", "1024,256", "--ks-at-large", "2", "--dtypes", "bfloat16",
                 "--rows", "fused"])
    assert seen == [(16, 256, 1, "bfloat16"), (16, 256, 8, "bfloat16"), (16, 1024, 2, "bfloat16")]
    assert "16 rows" in capsys.readouterr().out
