"""Vocabulary-parallel distillation (``vocab_parallel_group=``).

In one process: the slice kernels of every backend (``states``, ``forward_given``, ``backward_given``) with the
ranks' collectives done by hand (the merge of ``ms_kldiv._distill_math``) give the whole rows' loss and gradients,
and bad arguments raise before anything runs. Under msrun (CPU workers, MindSpore's mccl): tensor-parallel groups
of 2 and 4 ranks and 2 x 2 (tensor x data parallel, sub-groups) against one process on the whole vocabulary, in
PyNative and in GRAPH_MODE (under ms.jit or as a Cell, by turns): the logits losses, the stored-teacher loss and the
fused head in training (tests/_vocab_parallel_worker.py runs them).
"""
import json
import os
import sys

import numpy as np
import pytest

import mindspore as ms
from mindspore import ops

import ms_kldiv
from ms_kldiv import reference
from ms_kldiv._distill_math import KL, Variant, merged_log_z
from ms_kldiv.backends import get_distill_kernels
import _procs

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_vocab_parallel_worker.py")
MSRUN_TIMEOUT_S = 600

VARIANTS = [
    ("fwd_kl", 0.0, KL),
    ("rev_kl", 1.0, KL),
    ("jsd", 0.3, KL),
    ("tvd", 0.0, Variant("tvd", 0.0, 0.0, 1.0)),
    ("skew_rkl", 0.0, Variant("skew_rkl", 0.1, 0.0, 1.0)),
    ("symmetric_softcap", 0.0, Variant("symmetric_kl", 0.5, 4.0, 1.5)),
]


def _sliced_by_hand(kernels, s, t, bounds, temperature, beta, variant, dloss):
    """The vocabulary-parallel forward and backward of ``kernels`` over slices ``bounds`` of [R, V] logits, the
    collectives done here: (row losses [R], d_student [R, V], d_teacher [R, V])."""
    states_op = kernels.states(temperature, variant)
    given_op = kernels.forward_given(temperature, beta, variant)
    backward_op = kernels.backward_given(temperature, beta, True, variant)
    parts = [(ms.Tensor(s[:, a:b]), ms.Tensor(t[:, a:b])) for a, b in zip(bounds[:-1], bounds[1:])]
    states = [states_op(ps, pt) for ps, pt in parts]
    gathered = ops.stack([ops.gather(st, ms.Tensor([5, 1, 6, 2], ms.int32), 1) for st in states], 0)
    merged = []
    for st in states:
        log_z_s, log_z_t = merged_log_z(st, gathered, temperature)
        m = st.asnumpy().copy()
        m[:, 1], m[:, 2] = log_z_s.asnumpy(), log_z_t.asnumpy()
        merged.append(m)
    sums = sum(given_op(ps, pt, ms.Tensor(m)).asnumpy()[:, [0, 3, 4]] for (ps, pt), m in zip(parts, merged))
    ds, dt = [], []
    for (ps, pt), m in zip(parts, merged):
        m[:, [0, 3, 4]] = sums
        gs, gt = backward_op(ps, pt, ms.Tensor(m), ms.Tensor(dloss))
        ds.append(gs.asnumpy())
        dt.append(gt.asnumpy())
    return sums[:, 0], np.concatenate(ds, 1), np.concatenate(dt, 1)


@pytest.mark.parametrize("backend", ["aot", "composite"])
@pytest.mark.parametrize("name,beta,variant", VARIANTS, ids=[v[0] for v in VARIANTS])
@pytest.mark.parametrize("bounds", [(0, 7, 13), (0, 4, 4, 9, 13)], ids=["tp2", "tp4_one_empty_slice"])
def test_slice_kernels_against_float64_reference(backend, name, beta, variant, bounds):
    rng = np.random.default_rng(len(name) + 3 * len(bounds))
    rows, vocab, temperature = 5, 13, 1.7
    s = (rng.normal(size=(rows, vocab)) * 3).astype(np.float32)
    t = (rng.normal(size=(rows, vocab)) * 3).astype(np.float32)
    s[0, 2] = t[0, 2] = -np.inf  # a class masked in both
    s[1] += 200.0  # huge logits: the merge never subtracts two large log-sum-exps
    t[1] += 200.0
    _, kernels = get_distill_kernels(backend, "CPU")
    dloss = rng.uniform(0.5, 1.5, size=rows).astype(np.float32)
    loss, ds, dt = _sliced_by_hand(kernels, s, t, bounds, temperature, beta, variant, dloss)
    ref = reference.distillation_pointwise(s.astype(np.float64), t.astype(np.float64), temperature, beta,
                                           variant.divergence, variant.alpha, variant.softcap,
                                           variant.logit_scale).sum(-1)
    np.testing.assert_allclose(loss, ref, rtol=2e-6, atol=1e-6)
    # the gradients: those of the same kernels on the whole rows (tested against float64 in their own files)
    full_s, full_t = ms.Tensor(s), ms.Tensor(t)
    stats = kernels.forward(temperature, beta, variant)(full_s, full_t)
    ref_ds, ref_dt = kernels.backward(temperature, beta, True, variant)(full_s, full_t, stats, ms.Tensor(dloss))
    scale = max(np.abs(ref_ds.asnumpy()).max(), np.abs(ref_dt.asnumpy()).max())
    np.testing.assert_allclose(ds, ref_ds.asnumpy(), rtol=0, atol=2e-6 * scale)
    np.testing.assert_allclose(dt, ref_dt.asnumpy(), rtol=0, atol=2e-6 * scale)


# ------------------------------------------------------------------------------------------------ bad arguments
def _logits():
    return ms.Tensor(np.zeros((2, 5), np.float32)), ms.Tensor(np.zeros((2, 5), np.float32))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(vocab_parallel_group=3), TypeError, "vocab_parallel_group"),
    (dict(vocab_parallel_group="no_such_group"), ValueError, "vocab_parallel_group"),
    (dict(vocab_parallel_group="g", reduction="none"), ValueError, "reducing"),
    (dict(vocab_parallel_group="g", reduction="mean"), ValueError, "'mean'"),
    (dict(num_items_in_batch=-1), ValueError, "num_items_in_batch"),
    (dict(num_items_in_batch="7"), TypeError, "num_items_in_batch"),
    (dict(num_items_in_batch=4.0, reduction="sum"), ValueError, "num_items_in_batch"),
])
def test_bad_arguments_raise_before_running(kwargs, error, match):
    s, t = _logits()
    reduction = kwargs.pop("reduction", "batchmean")
    with pytest.raises(error, match=match):
        ms_kldiv.distillation_loss(s, t, reduction=reduction, **kwargs)
    if "vocab_parallel_group" in kwargs:
        with pytest.raises(error, match=match):
            ms_kldiv.DistillationLoss(reduction=reduction, **kwargs)
    if kwargs.get("vocab_parallel_group") in (3, "no_such_group"):
        with pytest.raises(error, match=match):
            ms_kldiv.SparseDistillationLoss(**kwargs)
        with pytest.raises(error, match=match):
            ms_kldiv.FusedLinearDistillationLoss(**kwargs)


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_num_items_in_batch_makes_micro_batches_add_up(mode):
    """Two micro-batches with different counted tokens, each divided by the whole batch's count: their losses and
    gradients add up to the whole batch's 'tokenmean' loss (each dividing by its own count would not)."""
    rng = np.random.default_rng(7)
    s = rng.normal(size=(2, 6, 11)).astype(np.float32)
    t = rng.normal(size=(2, 6, 11)).astype(np.float32)
    labels = np.zeros((2, 6), np.int32)
    labels[0, 4:] = -100
    labels[1, 1:] = -100  # 4 counted tokens in the first micro-batch, 1 in the second
    loss = ms_kldiv.DistillationLoss(2.0, "tokenmean", beta=0.5)

    def micro(a, b, lab, n):
        return loss(a, b, lab, None, n)

    def whole(a, b, lab):
        return loss(a, b, lab)

    vg_micro, vg_whole = ms.value_and_grad(micro), ms.value_and_grad(whole)
    if mode == "graph":
        vg_micro, vg_whole = ms.jit(vg_micro), ms.jit(vg_whole)
    n = ms.Tensor(float((labels != -100).sum()), ms.float32)
    parts = [vg_micro(ms.Tensor(s[i:i + 1]), ms.Tensor(t[i:i + 1]), ms.Tensor(labels[i:i + 1]), n) for i in (0, 1)]
    value, grad = vg_whole(ms.Tensor(s), ms.Tensor(t), ms.Tensor(labels))
    np.testing.assert_allclose(sum(float(v) for v, _ in parts), float(value), rtol=1e-6)
    np.testing.assert_allclose(np.concatenate([g.asnumpy() for _, g in parts]), grad.asnumpy(), rtol=1e-5,
                               atol=1e-8)
    own = sum(float(loss(ms.Tensor(s[i:i + 1]), ms.Tensor(t[i:i + 1]), ms.Tensor(labels[i:i + 1]))) for i in (0, 1))
    assert abs(own - float(value)) > 1e-3 * abs(float(value))  # per-micro-batch normalization is not the same


# ------------------------------------------------------------------------------------------------------- msrun
def _records(out_dir, ranks):
    records = []
    for r in range(ranks):
        with open(out_dir / f"rank{r}.json") as f:
            records += json.load(f)
    return records


@pytest.mark.slow
@pytest.mark.skipif(_procs.msrun_path() is None, reason="msrun (MindSpore's launcher) is not installed")
@pytest.mark.parametrize("workers,tps,cases", [(2, "2", "full,head"), (4, "4,2", "short")],
                         ids=["tp2_and_fused_head_training", "tp4_then_tp2_x_dp2"])
def test_sharded_equals_one_process(tmp_path, workers, tps, cases):
    """Losses: value and both gradients of each rank's slices. The fused head ('head'): a replicated body and the
    head's slices trained 3 SGD steps in a TrainOneStepCell (hard term with label smoothing and z-loss; a frozen
    teacher): every step's loss and the parameters after the last equal one process's on the whole vocabulary.
    One launch runs each layout of ``tps`` in turn (tp 2 of 4 workers: two data-parallel groups)."""
    cwd, out_dir, log_dir = tmp_path / "cwd", tmp_path / "out", tmp_path / "logs"
    cwd.mkdir()
    rc, out, logs = _procs.msrun(workers, WORKER, ["--out", str(out_dir), "--tp", tps, "--cases", cases],
                                 log_dir, cwd, MSRUN_TIMEOUT_S)
    assert rc == 0, f"msrun failed (rc={rc}):\n{out[-3000:]}\n{logs}"
    records = _records(out_dir, workers)
    assert {r["mode"] for r in records} == {"pynative", "jit", "cell"}
    heads = {r["case"] for r in records if r["case"].startswith("head")}
    assert {r["mode"] for r in records if r["case"] in heads} == ({"pynative", "cell"} if heads else set())
    for tp in map(int, tps.split(",")):
        cases_run = {r["case"] for r in records if r["tp"] == tp}
        assert len(cases_run) == sum({"full": 16, "short": 4, "head": 4}[c] for c in cases.split(",")), (tp, cases_run)
        if tp < workers:  # the second data-parallel group's labelled rows are all ignored: loss 0
            ignored = [r for r in records if r["tp"] == tp and r["rank"] >= tp and r["case"] == "fwd_kl"]
            assert ignored and all(r["value"] == 0.0 == r["reference"] for r in ignored)
    for r in records:
        half = "BFloat16" in r["dtype"]
        what = f"{r['case']} {r['mode']} tp {r['tp']} rank {r['rank']} num_items={r['num_items']}"
        assert r["finite"], what
        assert r["value_rel"] <= (1e-2 if half else 1e-6), (what, r)
        assert r["grad_rel"] <= (1e-2 if half else 1e-5), (what, r)
    assert list(cwd.iterdir()) == [], "msrun or the workers wrote into the working directory"


@pytest.mark.slow
@pytest.mark.skipif(_procs.msrun_path() is None, reason="msrun (MindSpore's launcher) is not installed")
def test_tensor_parallel_example(tmp_path):
    """examples/tensor_parallel_kd.py: 2 ranks (uneven vocabulary slices, GRAPH_MODE) train as one process on the
    whole vocabulary (PyNative) does: the same losses at every step, the same body, and each rank's head slice."""
    script = os.path.join(_procs.REPO, "examples", "tensor_parallel_kd.py")
    cwd, out_dir, log_dir = tmp_path / "cwd", tmp_path / "out", tmp_path / "logs"
    cwd.mkdir()
    rc, out, logs = _procs.msrun(2, script, ["--graph", "--steps", "6", "--out", str(out_dir)], log_dir, cwd,
                                 MSRUN_TIMEOUT_S)
    assert rc == 0, f"msrun failed (rc={rc}):\n{out[-3000:]}\n{logs}"
    single = _procs.run([sys.executable, script, "--steps", "6", "--out", str(out_dir)], 300,
                        cwd=cwd, env=_procs.msrun_env())
    assert single.returncode == 0, single.stdout[-2000:] + single.stderr[-2000:]
    with open(out_dir / "losses_single.json") as f:
        ref = json.load(f)
    ref_params = np.load(out_dir / "params_single.npz")
    assert ref["losses"][-1] < ref["losses"][0]  # it trains
    for rank in (0, 1):
        with open(out_dir / f"losses_rank{rank}.json") as f:
            got = json.load(f)
        np.testing.assert_allclose(got["losses"], ref["losses"], rtol=1e-6)
        params = np.load(out_dir / f"params_rank{rank}.npz")
        lo, hi = got["lo"], got["hi"]
        np.testing.assert_allclose(params["body"], ref_params["body"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(params["head"], ref_params["head"][lo:hi], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(params["bias"], ref_params["bias"][lo:hi], rtol=1e-5, atol=1e-7)
    assert list(cwd.iterdir()) == [], "the example wrote into the working directory"


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("which", ["fused_head", "stored_teacher"])
def test_num_items_in_batch_head_and_stored_teacher(mode, which):
    """The same rule for FusedLinearDistillationLoss and SparseDistillationLoss: micro-batches divided by the whole
    batch's count add up to the whole batch's loss and gradients."""
    rng = np.random.default_rng(11)
    rows, hidden, vocab = 8, 5, 13
    labels = rng.integers(0, vocab, rows).astype(np.int32)
    labels[[1, 2, 3, 6]] = -100  # 1 counted row in the first half, 3 in the second
    if which == "fused_head":
        x = rng.normal(size=(rows, hidden)).astype(np.float32)
        teacher = rng.normal(size=(rows, hidden)).astype(np.float32)
        w, wt = (ms.Tensor(v) for v in rng.normal(size=(2, vocab, hidden)).astype(np.float32))
        loss = ms_kldiv.FusedLinearDistillationLoss(2.0, hard_weight=0.5, chunk_size=3)

        def micro(a, t, lab, n):
            return loss(a, w, t, wt, lab, None, None, None, n)

        def whole(a, t, lab):
            return loss(a, w, t, wt, lab)
    else:
        x = rng.normal(size=(rows, vocab)).astype(np.float32)
        teacher = np.stack([rng.permutation(vocab)[:4] for _ in range(rows)]).astype(np.int32)  # top-4 ids
        loss = ms_kldiv.SparseDistillationLoss("tail", 2.0, "tokenmean")

        def logprobs(ids):  # each stored id at log-probability -2 (the tail holds the rest)
            return ops.ones(ids.shape, ms.float32) * -2.0

        def micro(a, t, lab, n):
            return loss(a, t, logprobs(t), lab, n)

        def whole(a, t, lab):
            return loss(a, t, logprobs(t), lab)
    vg_micro, vg_whole = ms.value_and_grad(micro), ms.value_and_grad(whole)
    if mode == "graph":
        vg_micro, vg_whole = ms.jit(vg_micro), ms.jit(vg_whole)
    n = ms.Tensor(float((labels != -100).sum()), ms.float32)
    parts = [vg_micro(ms.Tensor(x[h]), ms.Tensor(teacher[h]), ms.Tensor(labels[h]), n)
             for h in (slice(0, 4), slice(4, 8))]
    value, grad = vg_whole(ms.Tensor(x), ms.Tensor(teacher), ms.Tensor(labels))
    np.testing.assert_allclose(sum(float(v) for v, _ in parts), float(value), rtol=1e-6)
    np.testing.assert_allclose(np.concatenate([g.asnumpy() for _, g in parts]), grad.asnumpy(), rtol=1e-5,
                               atol=1e-8)
