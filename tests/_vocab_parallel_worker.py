"""One msrun worker of tests/test_vocab_parallel.py: vocabulary-parallel losses against one process on the whole
vocabulary, in PyNative and in GRAPH_MODE (under ms.jit or as a Cell, by turns).

Every rank of a tensor-parallel group builds the same full logits (seeded by its data-parallel index), keeps its
slice of the vocabulary (uneven when V is not divisible), and compares the sliced loss and the gradients of its
slices with the unsliced loss computed in this process. Each rank writes its records to OUT/rank<r>.json.
"""
import argparse
import json
import os

import numpy as np

import mindspore as ms
from mindspore import nn, ops
from mindspore.communication import GlobalComm, create_group, get_group_size, get_rank, init

import ms_kldiv

# (name, options of the loss); each runs in PyNative and in one GRAPH_MODE form (_modes)
CASES = {
    "full": [
        ("fwd_kl", dict(beta=0.0)),
        ("rev_kl_T2", dict(beta=1.0, temperature=2.0)),
        ("jsd", dict(beta=0.3, temperature=1.5)),
        ("tvd", dict(divergence="tvd")),
        ("skew_kl", dict(divergence="skew_kl", alpha=0.2)),
        ("skew_rkl", dict(divergence="skew_rkl")),
        ("symmetric_softcap", dict(divergence="symmetric_kl", softcap=3.0, logit_scale=1.5)),
        ("labels_weights_tokenmean", dict(beta=0.0, labels=True, weights=True, reduction="tokenmean")),
        ("composite_jsd_sum", dict(beta=0.5, backend="composite", reduction="sum", labels=True)),
        ("bf16_fwd", dict(beta=0.0, dtype="bfloat16")),
        ("padded_vocab", dict(beta=0.5, pad=True)),
        ("empty_first_slice", dict(beta=0.5, slices="empty_first", labels=True)),
        ("empty_batch", dict(beta=0.0, rows=0, labels=True)),
    ],
    "short": [
        ("fwd_kl", dict(beta=0.0, labels=True)),
        ("jsd", dict(beta=0.5, temperature=2.0)),
        ("tvd_composite", dict(divergence="tvd", backend="composite")),
    ],
}
MODES = ("pynative", "jit", "cell")


def _modes(index):
    """PyNative and one GRAPH_MODE form per case, the forms taking turns (functional under ms.jit, a Cell): both run
    in every launch, and a case's second graph compile (with the collectives, on every rank) would add no path."""
    return ("pynative", MODES[1 + index % 2])
# stored teachers: (name, options of SparseDistillationLoss); K = 6 global ids per row, some padding
SPARSE_CASES = {
    "full": [("sparse_tail", dict(mode="tail", temperature=2.0, teacher_temperature=1.0)),
             ("sparse_renormalize_jsd", dict(mode="renormalize", beta=0.5, labels=True)),
             ("sparse_empty_first_slice", dict(mode="tail", slices="empty_first"))],
    "short": [("sparse_tail_labels", dict(mode="tail", labels=True))],
}


def _slices(vocab, size, empty_first=False):
    """Each rank's [lo, hi) of the vocabulary in rank order (``empty_first``: rank 0 holds none)."""
    if empty_first:
        return [0] + [vocab * r // (size - 1) for r in range(size)]
    return [vocab * r // size for r in range(size + 1)]


def _max_abs(a):
    return float(np.abs(a).max()) if a.size else 0.0


class _LossCell(nn.Cell):
    def __init__(self, loss):
        super().__init__()
        self.loss = loss

    def construct(self, s, t, labels, weights, num_items):
        return self.loss(s, t, labels, weights, num_items)


def _inputs(rng, rows, vocab, opts, dtype):
    s = (rng.normal(size=(rows, vocab)) * 2.5).astype(np.float32)
    t = (rng.normal(size=(rows, vocab)) * 2.5).astype(np.float32)
    if opts.get("pad"):
        # -inf vocabulary padding in both models: the last classes of the last slice
        s[:, -3:] = -np.inf
        t[:, -3:] = -np.inf
    labels = rng.integers(0, 5, size=(rows,)).astype(np.int32)
    labels[::3] = -100
    weights = rng.uniform(0.0, 2.0, size=(rows,)).astype(np.float32)
    weights[1:2] = 0.0
    return s, t, labels, weights


def _value_and_grads(fn, mode, s, t, labels, weights, num_items):
    if mode == "cell":
        ms.set_context(mode=ms.GRAPH_MODE)
        try:
            vg = ms.value_and_grad(_LossCell(fn), grad_position=(0, 1))
            value, (gs, gt) = vg(s, t, labels, weights, num_items)
        finally:
            ms.set_context(mode=ms.PYNATIVE_MODE)
    else:
        vg = ms.value_and_grad(fn, grad_position=(0, 1))
        if mode == "jit":
            vg = ms.jit(vg)
        value, (gs, gt) = vg(s, t, labels, weights, num_items)
    return (float(ops.cast(value, ms.float32).asnumpy()), ops.cast(gs, ms.float32).asnumpy(),
            ops.cast(gt, ms.float32).asnumpy())


def _make_loss(opts, group, num_items):
    kwargs = {k: opts[k] for k in ("beta", "divergence", "alpha", "softcap", "logit_scale") if k in opts}
    loss = ms_kldiv.DistillationLoss(opts.get("temperature", 1.0), opts.get("reduction", "batchmean"),
                                     backend=opts.get("backend", "auto"), vocab_parallel_group=group, **kwargs)
    use_labels, use_weights = opts.get("labels", False), opts.get("weights", False)

    def fn(s, t, labels, weights, n):
        return loss(s, t, labels if use_labels else None, weights if use_weights else None,
                    n if num_items else None)
    return fn


class _Student(nn.Cell):
    """A replicated body (one Dense) and this rank's slice of the output head."""

    def __init__(self, body_w, head_w, head_b):
        super().__init__()
        self.body = ms.Parameter(ms.Tensor(body_w), name="body")
        # (MindSpore has no empty Parameter: a rank without classes holds its empty slice as a constant)
        self.head = ms.Parameter(ms.Tensor(head_w), name="head") if head_w.size else ms.Tensor(head_w)
        self.bias = ms.Parameter(ms.Tensor(head_b), name="bias") if head_b.size else ms.Tensor(head_b)

    def construct(self, x):
        return ops.tanh(ops.matmul(x, self.body))


class _HeadStep(nn.Cell):
    def __init__(self, student, loss, teacher_w):
        super().__init__()
        self.student, self.loss = student, loss
        self.teacher_w = ms.Parameter(ms.Tensor(teacher_w), name="teacher_w", requires_grad=False)

    def construct(self, x, teacher_hidden, labels):
        return self.loss(self.student(x), self.student.head, teacher_hidden, self.teacher_w, labels,
                         self.student.bias)


class _StoredHeadStep(nn.Cell):
    """The head against a stored teacher: global top-k ids and log-probabilities."""

    def __init__(self, student, loss):
        super().__init__()
        self.student, self.loss = student, loss

    def construct(self, x, ids, values, labels):
        return self.loss.from_teacher_topk(self.student(x), self.student.head, ids, values, labels, self.student.bias)


def _train_head(group, lo, hi, mode, opts, steps=3):
    """Parameters after ``steps`` SGD steps of a TrainOneStepCell with the fused head on vocabulary columns
    [lo, hi) (the whole vocabulary without a group)."""
    rng = np.random.default_rng(5)
    rows, h_in, hidden, vocab = 10, 6, 8, 37
    body = (rng.normal(size=(h_in, hidden)) * 0.5).astype(np.float32)
    head = (rng.normal(size=(vocab, hidden)) * 0.5).astype(np.float32)
    bias = (rng.normal(size=(vocab,)) * 0.1).astype(np.float32)
    teacher_w = (rng.normal(size=(vocab, hidden)) * 0.5).astype(np.float32)
    x = ms.Tensor(rng.normal(size=(rows, h_in)).astype(np.float32))
    teacher_hidden = ms.Tensor(rng.normal(size=(rows, hidden)).astype(np.float32))
    labels = rng.integers(0, vocab, size=(rows,)).astype(np.int32)
    labels[::4] = -100
    stored = opts.pop("stored", False)
    ids = np.stack([rng.permutation(vocab)[:5] for _ in range(rows)]).astype(np.int32)
    ids[0, -1] = -1  # padding
    values = np.log(rng.dirichlet(np.ones(6), rows)[:, :5]).astype(np.float32)
    ms.set_context(mode=ms.GRAPH_MODE if mode == "cell" else ms.PYNATIVE_MODE)
    try:
        student = _Student(body, head[lo:hi], bias[lo:hi])
        loss = ms_kldiv.FusedLinearDistillationLoss(vocab_parallel_group=group, chunk_size=3, **opts)
        net = _StoredHeadStep(student, loss) if stored else _HeadStep(student, loss, teacher_w[lo:hi])
        step = nn.TrainOneStepCell(net, nn.SGD(student.trainable_params(), learning_rate=0.5))
        inputs = (ms.Tensor(ids), ms.Tensor(values)) if stored else (teacher_hidden,)
        losses = [float(step(x, *inputs, ms.Tensor(labels)).asnumpy()) for _ in range(steps)]
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    return losses, {p.name: p.asnumpy() for p in student.trainable_params()}


HEAD_CASES = [
    ("head_kl_hard", dict(temperature=2.0, hard_weight=0.5, label_smoothing=0.1, z_loss=1e-3)),
    ("head_jsd_teacher_logits_free", dict(beta=0.5, teacher_grad=False)),
    ("head_stored_teacher_tail", dict(stored=True, temperature=2.0, stored_mode="tail", hard_weight=0.3)),
    # the hard term and the soft term's collectives on a rank with no classes (they ran out of order there)
    ("head_empty_first_slice_hard", dict(slices="empty_first", beta=0.5, hard_weight=0.5, label_smoothing=0.1,
                                         z_loss=1e-3)),
]


def _head_records(group, tp, tp_index, rank):
    records = []
    for name, opts in HEAD_CASES:
        opts = dict(opts)
        lo, hi = _slices(37, tp, opts.pop("slices", None) == "empty_first")[tp_index:tp_index + 2]
        ref_losses, ref = _train_head(None, 0, 37, "pynative", dict(opts))
        for mode in ("pynative", "cell"):
            losses, got = _train_head(group, lo, hi, mode, dict(opts))
            err = 0.0
            for pname, value in got.items():
                want = ref[pname][lo:hi] if pname.split(".")[-1] in ("head", "bias") else ref[pname]
                err = max(err, float(np.abs(value - want).max() / max(np.abs(want).max(), 1e-30)))
            records.append({"case": name, "mode": mode, "num_items": False, "rank": rank, "dtype": "Float32",
                            "value": losses[-1], "reference": ref_losses[-1],
                            "value_rel": max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)),
                            "grad_rel": err, "finite": bool(np.all(np.isfinite(losses)))})
    return records


class _SparseCell(nn.Cell):
    def __init__(self, loss, use_labels):
        super().__init__()
        self.loss, self.use_labels = loss, use_labels

    def construct(self, s, ids, values, labels):
        return self.loss(s, ids, values, labels if self.use_labels else None)


def _sparse_records(suites, group, lo, hi, rank, dp_index, empty_first, rows=6, vocab=37, k=6):
    """``empty_first``: this rank's (lo, hi) where rank 0 holds an empty slice (cases with slices='empty_first')."""
    records = []
    for index, (name, opts) in enumerate(case for suite in suites for case in SPARSE_CASES.get(suite, [])):
        rng = np.random.default_rng(300 + 17 * dp_index + len(name))
        s = (rng.normal(size=(rows, vocab)) * 2.5).astype(np.float32)
        ids = np.stack([rng.permutation(vocab)[:k] for _ in range(rows)]).astype(np.int32)
        ids[0, -2:] = -1  # padding
        p = rng.dirichlet(np.ones(vocab), rows)
        values = np.log(np.take_along_axis(p, np.maximum(ids, 0), -1)).astype(np.float32)
        labels = rng.integers(0, 5, size=(rows,)).astype(np.int32)
        labels[::3] = -100
        use_labels = opts.pop("labels", False) if "labels" in opts else False
        args = (ms.Tensor(ids), ms.Tensor(values), ms.Tensor(labels))
        part = empty_first if opts.get("slices") == "empty_first" else (lo, hi)
        options = {key: value for key, value in opts.items() if key != "slices"}

        def value_and_grad(group_name, logits, mode):
            cell = _SparseCell(ms_kldiv.SparseDistillationLoss(vocab_parallel_group=group_name, **options),
                               use_labels)
            if mode == "cell":
                ms.set_context(mode=ms.GRAPH_MODE)
            try:
                vg = ms.value_and_grad(cell, grad_position=0)
                if mode == "jit":
                    vg = ms.jit(vg)
                v, g = vg(ms.Tensor(logits), *args)
            finally:
                ms.set_context(mode=ms.PYNATIVE_MODE)
            return float(v.asnumpy()), g.asnumpy()

        ref_v, ref_g = value_and_grad(None, s, "pynative")
        for mode in _modes(index):
            v, g = value_and_grad(group, np.ascontiguousarray(s[:, part[0]:part[1]]), mode)
            records.append({"case": name, "mode": mode, "num_items": False, "rank": rank, "dtype": "Float32",
                            "value": v, "reference": ref_v, "value_rel": abs(v - ref_v) / max(abs(ref_v), 1e-30),
                            "grad_rel": _max_abs(g - ref_g[:, part[0]:part[1]]) / max(_max_abs(ref_g), 1e-30),
                            "finite": bool(np.isfinite(v) and np.all(np.isfinite(g)))})
    return records


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tp", required=True, help="comma-separated tensor-parallel sizes, each run in turn: one "
                        "launch serves several layouts (a launch's start-up is most of its time)")
    parser.add_argument("--cases", default="full", help="comma-separated: full, short, head")
    parser.add_argument("--vocab", type=int, default=37)
    parser.add_argument("--rows", type=int, default=6)
    args = parser.parse_args()
    init()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    rank, world = get_rank(), get_group_size()
    records = []
    for tp in (int(x) for x in args.tp.split(",")):
        records += [dict(r, tp=tp) for r in _layout_records(args, rank, world, tp)]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(records, f)
    print(f"rank {rank}/{world}: {len(records)} records", flush=True)


def _layout_records(args, rank, world, tp):
    """The records of one layout: groups of tp ranks (the data-parallel groups beside them when tp < world)."""
    dp_index, tp_index = rank // tp, rank % tp
    if tp == world:
        group = GlobalComm.WORLD_COMM_GROUP
    else:
        group = f"vocab_tp{tp}_dp{dp_index}"
        create_group(group, list(range(dp_index * tp, (dp_index + 1) * tp)))
    bounds = _slices(args.vocab, tp)
    lo, hi = bounds[tp_index], bounds[tp_index + 1]
    try:  # chunks sized by each rank's own slice width would differ across uneven slices: refused
        ms_kldiv.FusedLinearDistillationLoss(vocab_parallel_group=group, chunk_bytes=1 << 20)
        raise AssertionError("chunk_bytes with a vocabulary-parallel group was not refused")
    except ValueError as err:
        assert "'chunk_bytes'" in str(err), err
    records = []
    suites = args.cases.split(",")
    if "head" in suites:
        records = _head_records(group, tp, tp_index, rank)
    records += _sparse_records(suites, group, lo, hi, rank, dp_index,
                               _slices(args.vocab, tp, True)[tp_index:tp_index + 2], vocab=args.vocab)
    for index, (name, opts) in enumerate(case for suite in suites for case in CASES.get(suite, [])):
        rng = np.random.default_rng(1000 + 17 * dp_index + len(name))
        dtype = getattr(ms, opts.get("dtype", "float32"))
        s, t, labels, weights = _inputs(rng, opts.get("rows", args.rows), args.vocab, opts, dtype)
        lo, hi = _slices(args.vocab, tp, opts.get("slices") == "empty_first")[tp_index:tp_index + 2]
        if dp_index == 1 and opts.get("labels"):
            labels[:] = -100  # a data-parallel rank whose rows are all ignored
        num_items = opts.get("reduction", "batchmean") != "sum"
        count = float(np.sum(weights[labels != -100]) if opts.get("weights") and opts.get("labels") else
                      np.sum(labels != -100) if opts.get("labels") else args.rows)
        n_t = ms.Tensor(max(count, 1.0), ms.float32)
        full = [ms.Tensor(s, dtype), ms.Tensor(t, dtype)]
        part = [ms.Tensor(np.ascontiguousarray(s[:, lo:hi]), dtype), ms.Tensor(np.ascontiguousarray(t[:, lo:hi]),
                                                                                 dtype)]
        lab, wts = ms.Tensor(labels), ms.Tensor(weights)
        ref_v, ref_gs, ref_gt = _value_and_grads(_make_loss(opts, None, False), "pynative", *full, lab, wts, n_t)
        for mode in _modes(index):
            # the sliced loss, and (batchmean / tokenmean) the same with the count passed as num_items_in_batch
            for with_count in ((False, True) if num_items and mode == "pynative" else (False,)):
                v, gs, gt = _value_and_grads(_make_loss(opts, group, with_count), mode, *part, lab, wts, n_t)
                scale = max(_max_abs(ref_gs), _max_abs(ref_gt), 1e-30)
                records.append({
                    "case": name, "mode": mode, "num_items": with_count, "rank": rank, "dtype": str(dtype),
                    "value": v, "reference": ref_v,
                    "value_rel": abs(v - ref_v) / max(abs(ref_v), 1e-30),
                    "grad_rel": max(_max_abs(gs - ref_gs[:, lo:hi]), _max_abs(gt - ref_gt[:, lo:hi])) / scale,
                    "finite": bool(np.isfinite(v) and np.all(np.isfinite(gs)) and np.all(np.isfinite(gt))),
                })
    return records


if __name__ == "__main__":
    main()
