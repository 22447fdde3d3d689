"""Data-parallel training under msrun, with KLDivLoss and with FusedLinearDistillationLoss: 2 CPU workers (mccl)
must end with identical parameters, equal to one process trained on the concatenated batches
(examples/distributed_kd.py does the training)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import _procs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "distributed_kd.py")
STEPS = 8
TIMEOUT_S = 240


def _run(cmd, cwd, what):
    """Run in its own process group, so that a hung worker or scheduler is killed with the launcher."""
    # (msrun's scheduler and workers share the group: nothing may outlive the test)
    proc = _procs.run(cmd, TIMEOUT_S, what=what, cwd=cwd, env=_procs.msrun_env(), stderr=subprocess.STDOUT)
    return proc.returncode, proc.stdout


def _load(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.slow
@pytest.mark.skipif(_procs.msrun_path() is None, reason="msrun (MindSpore's launcher) is not installed")
@pytest.mark.parametrize("loss", ["kldiv", "fused-linear"])
def test_data_parallel_matches_single_process(tmp_path, loss):
    cwd, out_dir, log_dir = tmp_path / "cwd", tmp_path / "params", tmp_path / "logs"
    cwd.mkdir()
    rc, out, logs = _procs.msrun(2, SCRIPT, ["--steps", str(STEPS), "--out", str(out_dir), "--loss", loss], log_dir,
                                 cwd, TIMEOUT_S)
    assert rc == 0, f"msrun failed (rc={rc}):\n{out[-3000:]}\n{logs}"
    for rank in (0, 1):
        assert f"rank {rank}/2:" in logs, f"worker {rank} did not report:\n{logs}"

    rc, single_out = _run([sys.executable, SCRIPT, "--steps", str(STEPS), "--out", str(out_dir), "--loss", loss],
                          cwd, "single")
    assert rc == 0, single_out[-3000:]
    assert "rank 0/1:" in single_out

    r0, r1 = _load(out_dir / "params_rank0.npz"), _load(out_dir / "params_rank1.npz")
    single = _load(out_dir / "params_single.npz")
    assert set(r0) == set(r1) == set(single) and len(single) == 4
    for name, ref in single.items():
        # Same averaged gradient, same update: the ranks agree bit for bit.
        np.testing.assert_array_equal(r0[name], r1[name], err_msg=name)
        # Only the summation order differs from one process on the full batch.
        np.testing.assert_allclose(r0[name], ref, rtol=1e-5, atol=1e-6, err_msg=name)
    # The run did train: parameters moved away from their (shared) initial values.
    init = np.random.default_rng(1)
    moved = [np.abs(single[n] - (init.standard_normal(single[n].shape) * 0.3).astype(np.float32)).max()
             for n in ("net.fc1.weight",)]
    assert moved[0] > 1e-3
    assert list(cwd.iterdir()) == [], "msrun or the workers wrote into the working directory"
