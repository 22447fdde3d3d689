"""custom_ops/gpu/sparse_cuda.cu (the fused stored-teacher distillation kernels of libkldiv_cuda.so) executed on the
CUDA-on-CPU stand-in through the sparse ABI (custom_ops/common/sparse_abi.h): the row losses against the float64
definition (ms_kldiv.reference.sparse_distillation_rows), the statistics and gradients against libkldiv_cpu.so's
kernels for the same ABI calls (the CPU backward reads the stand-in's statistics), and the gradients of a few
float32 cases against central differences of the reference. Both launch shapes (a warp per row up to 2048 classes,
a block per row beyond, with a vocabulary of more than one 16384-class tile), 128-bit and scalar loads, every dtype,
modes renormalize / tail and beta 0, 0.5, 1; padding ids, K = 1, K = V (dense distillation), bad rows (a repeated
id, an id >= V: NaN, and no read outside the row), ignored rows (exact zeros), huge logits, -inf logits off the
ids, a student with almost all its mass on the ids (the tail's sum is formed directly), a confident student whose
tail lies below float32's range (the tail's second read) or float64's (none), empty shapes. The stand-in aborts
on divergence, barrier, bounds and uninitialized-shared-memory errors, so each passing case also shows none of those
happened.

All cases run in four child processes (stand-in forward, stand-in backward, CPU forward, CPU backward), so the module
costs a few seconds beyond the stand-in library's build."""
import os

import numpy as np
import pytest

from _modules import reference as ref

import _sim
from _gpu_checks import ATOL, TOL, close

REASON = _sim.compiler_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"stand-in needs g++: {REASON}")

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
STATS = 8
K_LOSS, K_MAX, K_LOGZ, K_LOGZOFF, K_SUMA = 0, 1, 2, 3, 4


# ---------------------------------------------------------------------------------------------- cases
class Case:
    """One ABI call pair: student logits (float64, rounded to the dtype), ids, values, hyper, dloss."""

    def __init__(self, s, ids, vals, temperature=1.0, teacher_temperature=1.0, beta=0.0, mode="renormalize",
                 dtype_id="f32", dloss=None, offset=0, bad_rows=(), teacher=None):
        self.dtype_id, self.dtype = dtype_id, DTYPES[dtype_id]
        self.s = _sim.decode(_sim.encode(s, self.dtype), self.dtype)
        self.ids = np.asarray(ids, np.int32)
        self.vals = np.asarray(vals, np.float32)
        self.temperature, self.teacher_temperature, self.beta, self.mode = temperature, teacher_temperature, beta, mode
        self.hyper = np.array([temperature, teacher_temperature / temperature, beta, mode == "tail"], np.float64)
        lead = self.s.shape[:-1]
        self.dloss = (np.random.default_rng(1).normal(size=lead) if dloss is None
                      else np.broadcast_to(dloss, lead)).astype(np.float32)
        self.offset = offset
        self.bad = np.zeros(lead, bool)
        for r in bad_rows:
            self.bad[r] = True
        self.teacher = teacher  # teacher logits when the ids cover the vocabulary (dense distillation)

    def forward_call(self):
        es = _sim.encode(self.s, self.dtype)
        return dict(symbol="SparseFwd", dtype=self.dtype, spec=4,
                    dtypes=[self.dtype, "int32", "float32", "float64", "float32"],
                    arrays=[(es, self.offset), (self.ids, 0), (self.vals, 0), (self.hyper, 0),
                            (np.empty(self.s.shape[:-1] + (STATS,), np.float32), 0)])

    def backward_call(self, stats):
        es = _sim.encode(self.s, self.dtype)
        return dict(symbol="SparseBwd", dtype=self.dtype, spec=6,
                    dtypes=[self.dtype, "int32", "float32", "float64", "float32", "float32", self.dtype],
                    arrays=[(es, self.offset), (self.ids, 0), (self.vals, 0), (self.hyper, 0), (stats, 0),
                            (self.dloss, 0), (np.empty_like(es), self.offset)])

    def ref_ids(self):
        """The ids the reference sees: a bad row's (which it cannot index) as padding."""
        return np.where(self.bad[..., None], -1, self.ids)

    def reference_rows(self, s=None, ids=None, vals=None):
        return ref.sparse_distillation_rows(self.s if s is None else s, self.ref_ids() if ids is None else ids,
                                            self.vals if vals is None else vals, self.mode, self.temperature,
                                            self.teacher_temperature, self.beta)


def top_k(s_teacher, k, rng, temperature=1.0):
    """ids of the k largest teacher logits in random order, and their log-probabilities (float32)."""
    lp = ref.log_softmax(s_teacher / temperature)
    ids = np.argsort(-s_teacher, axis=-1)[..., :k]
    ids = np.take_along_axis(ids, rng.permuted(np.tile(np.arange(k), ids.shape[:-1] + (1,)), axis=-1), -1)
    return ids.astype(np.int32), np.take_along_axis(lp, ids, -1).astype(np.float32)


def random_case(shape, k, seed, **kw):
    rng = np.random.default_rng(seed)
    s = rng.normal(size=shape) * 3.0
    t = s + rng.normal(size=shape) * 2.0  # a teacher that agrees in part
    ids, vals = top_k(t, k, rng, kw.get("teacher_temperature", 1.0))
    return Case(s, ids, vals, **kw)


def build_cases():
    cases = {}
    # modes x beta x dtype, both launch shapes (V = 300: a warp per row; V = 5000: a block per row)
    for shape, k, tag in (((4, 300), 20, "warp"), ((2, 5000), 64, "block")):
        for dtype_id in DTYPES:
            for mode, beta in (("renormalize", 0.0), ("renormalize", 0.5), ("tail", 0.0), ("tail", 0.5),
                               ("tail", 1.0)):
                t = 2.0 if beta != 1.0 else 0.7
                c = random_case(shape, k, hash((tag, dtype_id, mode, beta)) % 997, temperature=t,
                                teacher_temperature=1.0, beta=beta, mode=mode, dtype_id=dtype_id)
                c.dloss[0] = 0.0  # an ignored row
                cases[f"{tag}-{mode}-b{beta}-{dtype_id}"] = c
    # scalar loads: rows not 16-byte aligned (element offset 1), and V not a whole number of packets
    cases["warp-misaligned"] = random_case((3, 300), 17, 5, temperature=1.5, mode="tail", beta=0.5, offset=1)
    cases["warp-odd-vocab-f16"] = random_case((3, 301), 9, 6, temperature=1.0, mode="tail", dtype_id="f16")
    cases["block-misaligned-bf16"] = random_case((2, 5000), 33, 7, temperature=1.0, mode="tail", beta=0.5,
                                                 dtype_id="bf16", offset=1)
    # more than one forward tile (256 threads x 64 classes = 16384 classes), packets and scalars
    cases["block-two-tiles"] = random_case((2, 17000), 40, 8, temperature=1.0, mode="tail", beta=0.5)
    cases["block-two-tiles-scalar"] = random_case((1, 16999), 40, 9, temperature=1.0, mode="tail")
    # padding ids (-1) with garbage values, K = 1, K = 0
    c = random_case((4, 300), 12, 10, temperature=2.0, mode="tail", beta=0.5)
    c.ids[0, 5:] = -1
    c.ids[1, ::3] = -1
    c.ids[2, :] = -1  # all padding: the teacher is all tail ('tail' mode)
    c.vals[c.ids < 0] = 7.0  # ignored
    cases["padding"] = c
    c = random_case((4, 300), 12, 10, temperature=2.0, mode="renormalize", beta=0.0)
    c.ids[0, 3:] = -1
    c.ids[1, ::2] = -1
    c.vals[c.ids < 0] = -3.0
    cases["padding-renormalize"] = c
    for mode in ("renormalize", "tail"):
        cases[f"k1-{mode}"] = random_case((3, 300), 1, 11, temperature=1.0, mode=mode, beta=0.5)
        cases[f"k1-{mode}-block"] = random_case((2, 5000), 1, 12, temperature=1.0, mode=mode, beta=0.0)
    # K = V: the ids cover the vocabulary, no tail in either model: dense distillation
    for shape, tag in (((3, 300), "warp"), ((2, 2500), "block")):
        for beta in (0.0, 0.5, 1.0):
            rng = np.random.default_rng(13)
            s, t = rng.normal(size=shape) * 2.0, rng.normal(size=shape) * 2.0
            ids, vals = top_k(t, shape[-1], rng)
            cases[f"dense-{tag}-b{beta}"] = Case(s, ids, vals, temperature=2.0, teacher_temperature=1.0, beta=beta,
                                                 mode="tail" if beta == 1.0 else "renormalize", teacher=t)
    # bad rows: a repeated id (row 1), an id >= V (row 2; V exactly and far past it), both launch shapes
    for shape, tag in (((4, 300), "warp"), ((3, 5000), "block")):
        c = random_case(shape, 10, 14, temperature=1.0, mode="tail", beta=0.5)
        c.ids[1, 7] = c.ids[1, 2]
        c.ids[2, 4] = shape[-1]
        c.ids[2, 6] = 2 ** 31 - 1
        c.dloss[:] = 1.0
        c.bad[1:3] = True
        cases[f"bad-{tag}"] = c
    # huge logits: |x| ~ 2e5 at T = 0.05, and a 1e30 offset (rows one float32 ulp apart: the student one-hot)
    c = random_case((3, 300), 16, 15, temperature=0.05, mode="tail", beta=0.5)
    c.s[1] = c.s[1] * 3e3
    cases["huge"] = c
    rng = np.random.default_rng(16)
    ulp = np.spacing(np.float32(1e30)).astype(np.float64)
    s = 1e30 + ulp * rng.integers(-3, 1, size=(3, 300))
    s[:, 0] = 1e30 + ulp  # the unique maximum: on the ids in row 0, off them in rows 1 and 2
    ids = np.stack([1 + rng.permutation(299)[:8] for _ in range(3)]).astype(np.int32)
    ids[0, 3] = 0
    vals = np.log(np.full((3, 8), 0.1, np.float32))
    cases["huge-offset"] = Case(s, ids, vals, temperature=1.0, mode="tail", beta=0.5)
    # -inf student logits off the ids (row 1: every class off the ids, so no tail at all)
    c = random_case((3, 300), 16, 17, temperature=1.0, mode="tail", beta=0.5)
    off = np.ones((3, 300), bool)
    np.put_along_axis(off, c.ids, False, -1)
    c.s[0, off[0] & (np.arange(300) % 3 == 0)] = -np.inf
    c.s[1, off[1]] = -np.inf
    cases["neg-inf-off-ids"] = c
    c = random_case((2, 5000), 16, 18, temperature=1.0, mode="renormalize", beta=1.0)
    off = np.ones((2, 5000), bool)
    np.put_along_axis(off, c.ids, False, -1)
    c.s[off] = -np.inf  # renormalized reverse KL is finite only without a student tail
    cases["neg-inf-reverse-block"] = c
    # almost all the student's mass on the ids: the tail's mass ~ 1e-11 of the row's
    rng = np.random.default_rng(19)
    s = np.full((2, 300), -30.0) + rng.normal(size=(2, 300)) * 0.1
    ids = np.stack([rng.permutation(300)[:16] for _ in range(2)]).astype(np.int32)
    np.put_along_axis(s, ids, 0.0, -1)
    cases["tiny-tail"] = Case(s, ids, np.log(np.full((2, 16), 0.05, np.float32)), temperature=1.0, mode="tail",
                              beta=0.5)
    cases.update(confident_cases())
    return cases


def confident_case(vocab, gaps, seed, k=5, **kw):
    """A student whose classes off the ids lie gaps[r] (+ U(-3, 0)) below the ids' (U(-1, 1)) in row r: their
    exponentials relative to the row's maximum underflow float32 from gap / T ~ 87 (flushed; ~103 otherwise). Row 1
    has a padding id; the teacher keeps 0.6 of its mass on the ids, 0.4 in its tail."""
    rng = np.random.default_rng(seed)
    rows = len(gaps)
    s = -np.asarray(gaps, np.float64)[:, None] + rng.uniform(-3.0, 0.0, size=(rows, vocab))
    ids = np.stack([rng.permutation(vocab)[:k] for _ in range(rows)]).astype(np.int32)
    ids[1, -1] = -1
    np.put_along_axis(s, np.where(ids < 0, ids[:, :1], ids), rng.uniform(-1.0, 1.0, size=(rows, k)), -1)
    vals = np.log(0.6 * rng.dirichlet(np.ones(k), rows))
    vals[ids < 0] = 0.0
    return Case(s, ids, vals, **kw)


def confident_cases():
    """A confident student (test_sparse_distillation.py::test_confident_student_keeps_the_teacher_tail's rows):
    gaps 110 and 60 at T = 1 and 55 at T = 0.5 take the tail's second read (Z_off < 2^-64 of the row's maximum), 40
    the ordinary path; a last row with an ordinary tail beside them. Both launch shapes, packets and scalars, every
    dtype, both modes, beta 0, 0.5, 1; at T = 0.05 a tail below float64's range (none, as in the definition) and
    one between float32's and float64's (kept)."""
    cases = {}
    for (temperature, gap), seed in zip(((1.0, 110.0), (0.5, 55.0), (1.0, 60.0), (1.0, 40.0)), range(20, 24)):
        for vocab, beta in ((37, 0.0), (300, 0.5)):
            cases[f"confident-V{vocab}-T{temperature}-gap{gap:g}"] = confident_case(
                vocab, (gap, gap, 0.0), seed, temperature=temperature, mode="tail", beta=beta)
    cases["confident-block-T1-gap110"] = confident_case(2500, (110.0, 110.0, 0.0), 24, k=40, mode="tail", beta=1.0)
    cases["confident-block-T0.5-gap55-scalar"] = confident_case(2501, (55.0, 55.0), 25, k=40, temperature=0.5,
                                                                mode="tail", beta=0.5)
    cases["confident-V300-T0.5-gap55-f16"] = confident_case(300, (55.0, 55.0, 0.0), 26, temperature=0.5, mode="tail",
                                                            beta=0.5, dtype_id="f16")
    cases["confident-V304-T1-gap110-bf16"] = confident_case(304, (110.0, 110.0, 0.0), 27, mode="tail", beta=0.0,
                                                            dtype_id="bf16")
    cases["confident-V300-T1-gap110-renormalize"] = confident_case(300, (110.0, 110.0, 0.0), 28, mode="renormalize",
                                                                   beta=0.5)
    # T = 0.05: gap 40 puts the tail's largest x below log(smallest double) ~ -745 (the definition has no tail), gap
    # 15 near x = -300 (below float32's range, within float64's)
    cases["confident-cold-T0.05"] = confident_case(300, (40.0, 40.0, 15.0), 29, temperature=0.05, mode="tail",
                                                   beta=0.5)
    return cases


CASES = build_cases()


def _run(lib_path):
    names = list(CASES)
    fwd = _sim.run_calls([CASES[n].forward_call() for n in names], lib_path)
    assert all(r[0] == 0 and r[2] == 0 for r in fwd), [(n, r[0], r[2]) for n, r in zip(names, fwd)]
    return names, [r[1][0] for r in fwd]


@pytest.fixture(scope="module")
def results():
    """{case: (stand-in stats, stand-in d_student, CPU stats, CPU d_student from the stand-in's stats)}."""
    from _modules import build as _build
    cpu = _build.ensure_library("CPU")
    names, sim_stats = _run(None)
    _, cpu_stats = _run(cpu)
    out = {}
    calls = [CASES[n].backward_call(st) for n, st in zip(names, sim_stats)]
    sim_bwd = _sim.run_calls(calls)
    cpu_bwd = _sim.run_calls(calls, cpu)
    for n, st, cst, sb, cb in zip(names, sim_stats, cpu_stats, sim_bwd, cpu_bwd):
        assert sb[0] == 0 and sb[2] == 0 and cb[0] == 0, (n, sb[0], sb[2], cb[0])
        dt = CASES[n].dtype
        out[n] = (st, _sim.decode(sb[1][0], dt), cst, _sim.decode(cb[1][0], dt))
    return out


# ---------------------------------------------------------------------------------------------- magnitudes
def _term_sizes(case):
    """Per row, the size of the bucket terms the loss sums, and per class the size of the gradient's terms."""
    ids = case.ref_ids()
    log_r, log_q = ref.sparse_support(case.s, ids, case.vals, case.mode, case.temperature,
                                      case.teacher_temperature)
    with np.errstate(all="ignore"):
        r, q = np.exp(log_r), np.exp(log_q)
        fin = lambda a: np.where(np.isfinite(a), np.abs(a), 0.0)  # noqa: E731
        per_bucket = (r + q) * (1.0 + fin(log_r) + fin(log_q))
        rows = per_bucket.sum(-1)
        p = np.exp(ref.log_softmax(case.s / case.temperature))
        valid = ids >= 0
        # the bucket of each class: its id's, else the tail's (index K)
        bucket = np.full(case.s.shape, ids.shape[-1])
        lead = np.indices(ids.shape[:-1])
        for i in range(ids.shape[-1]):
            idc = np.where(valid[..., i], ids[..., i], -1)
            sel = idc >= 0
            bucket[tuple(x[sel] for x in lead) + (idc[sel],)] = i
        size_b = np.take_along_axis(per_bucket, bucket, -1)
        r_b = np.take_along_axis(r, bucket, -1)
        w = np.where(r_b > 0, size_b / np.where(r_b > 0, r_b, 1.0), 0.0)
    grad = case.temperature * np.abs(case.dloss)[..., None] * p * (rows[..., None] + w)
    return case.temperature ** 2 * rows, np.where(np.isfinite(grad), grad, 0.0)


# ---------------------------------------------------------------------------------------------- tests
NAMES = list(CASES)


@pytest.mark.parametrize("name", NAMES)
def test_loss_matches_float64_reference(results, name):
    case = CASES[name]
    stats = results[name][0]
    good = ~case.bad
    assert np.isnan(stats[~good, K_LOSS]).all() and np.isnan(stats[~good, K_SUMA]).all(), "bad rows: NaN"
    loss_mag, _ = _term_sizes(case)
    close(stats[good, K_LOSS], case.reference_rows()[good], 1e-5, loss_mag[good], "row loss", 1e-30)
    if case.teacher is not None:  # ids covering the vocabulary: dense distillation
        dense = ref.distillation_pointwise(case.s, case.teacher, case.temperature, case.beta).sum(-1)
        close(stats[..., K_LOSS], dense, 1e-5, loss_mag, "dense loss", 1e-30)
        assert (stats[..., K_LOGZOFF] == -np.inf).all()


@pytest.mark.parametrize("name", NAMES)
def test_stats_and_gradient_match_cpu_library(results, name):
    """The CPU library's statistics for the same call (maxima identical, the rest within float rounding: the
    summation orders differ), and its gradient from the stand-in's statistics."""
    case = CASES[name]
    st, ds, cst, cds = results[name]
    np.testing.assert_array_equal(st[..., K_MAX], cst[..., K_MAX])
    np.testing.assert_allclose(st[..., :7], cst[..., :7], rtol=2e-6, atol=2e-6)
    _, grad_mag = _term_sizes(case)
    tol = 2 * max(TOL[case.dtype_id], 2e-5)
    close(ds, cds, tol, grad_mag, "d_student", max(2 * ATOL[case.dtype_id], 2.0 ** -126))
    bad = case.bad & (case.dloss != 0)
    assert np.isnan(ds[bad]).all(), "a bad row's gradient is NaN"


@pytest.mark.parametrize("name", [n for n in NAMES if CASES[n].dtype_id == "f32" and CASES[n].s.shape[-1] <= 300
                                  and not CASES[n].bad.any() and "huge" not in n])
def test_gradient_matches_central_differences(results, name):
    """d/ds of sum_rows dloss * loss, against central differences of the float64 reference (finite logits)."""
    case = CASES[name]
    ds = results[name][1]
    s, g, h = case.s, case.dloss.astype(np.float64), 1e-6
    num = np.zeros_like(s)
    v = s.shape[-1]
    for r in np.flatnonzero(g):  # row r's loss perturbed at each class at once: V rows of the reference
        rows = lambda sign: case.reference_rows(s[r][None] + sign * h * np.eye(v),  # noqa: E731
                                                np.broadcast_to(case.ids[r], (v, case.ids.shape[-1])),
                                                np.broadcast_to(case.vals[r], (v, case.ids.shape[-1])))
        num[r] = g[r] * (rows(1.0) - rows(-1.0)) / (2 * h)
    num[~np.isfinite(s)] = 0.0
    _, grad_mag = _term_sizes(case)
    close(ds, num, 1e-4, grad_mag, "d_student vs central differences", 1e-9)


def test_ignored_rows_are_exact_zeros(results):
    for name, case in CASES.items():
        ds = results[name][1]
        zero = case.dloss == 0
        assert not ds[zero].any() and not np.signbit(ds[zero]).any(), name


def test_tail_sum_is_formed_directly(results):
    """A student with ~1e-11 of its mass off the ids: log r_tail = log Z_off - log Z to float accuracy (Z minus the
    ids' terms would have lost it all in float and most of it in double)."""
    case = CASES["tiny-tail"]
    st = results["tiny-tail"][0]
    log_r, _ = ref.sparse_support(case.s, case.ids, case.vals, "tail")
    np.testing.assert_allclose(st[:, K_LOGZOFF].astype(np.float64) - st[:, K_LOGZ], log_r[:, -1], rtol=1e-6)
    assert (log_r[:, -1] < -20).all()


CONFIDENT = [n for n in CASES if n.startswith("confident-")]


@pytest.mark.parametrize("name", CONFIDENT)
def test_confident_student_keeps_the_teacher_tail(results, name):
    """The student's tail mass log r_tail = log Z_off - log Z against the float64 definition's, where it lies below
    float32's range relative to the row's maximum too (the forward's float32 terms read it as none, or a thread whose
    base sat on an id lost its later classes off the ids, and the teacher's tail mass was dropped or misweighed);
    none where the definition has none. The loss and gradients are checked by the tests above for every case."""
    case = CASES[name]
    st = results[name][0]
    log_r, _ = ref.sparse_support(case.s, case.ref_ids(), case.vals, case.mode, case.temperature,
                                  case.teacher_temperature)
    tail = log_r[:, -1]
    none = tail == -np.inf
    assert (st[none, K_LOGZOFF] == -np.inf).all(), "no tail in the definition: none in the kernel"
    # float32 statistics: log Z's rounding (|log Z| < 9 here) in the difference
    np.testing.assert_allclose(st[~none, K_LOGZOFF].astype(np.float64) - st[~none, K_LOGZ], tail[~none], rtol=1e-6,
                               atol=1e-5)
    rescued = tail < np.log(2.0 ** -64)  # the rows the second read serves (the float32 sweep's Z_off under 2^-64)
    assert rescued.any() == ("gap40" not in name), (name, tail)
    if name == "confident-cold-T0.05":
        assert none.tolist() == [True, True, False] and tail[2] < -200, tail


def test_masked_and_huge_logits(results):
    st, ds = results["neg-inf-off-ids"][:2]
    s = CASES["neg-inf-off-ids"].s
    assert (ds[np.isinf(s)] == 0).all()
    assert st[1, K_LOGZOFF] == -np.inf and np.isfinite(st[0, K_LOGZOFF])
    st, ds = results["huge-offset"][:2]
    assert np.isfinite(st[:, K_LOSS]).all() and np.isfinite(ds).all()
    assert st[0, K_LOGZOFF] == -np.inf  # the one-hot student's mass is on the ids in row 0
    assert (st[1:, K_LOGZOFF] == 0.0).all() and (st[:, K_MAX] == CASES["huge-offset"].s.max(-1)).all()


def test_deterministic_across_grids_and_schedules():
    """Bitwise the same statistics and gradients whatever the SM count and the order threads run in."""
    case = CASES["block-two-tiles"]
    outs = []
    for sms, rev in ((1, False), (3, True)):
        (rc, (st,), _), = _sim.run_calls([dict(case.forward_call(), sms=sms, reverse=rev)])
        (rc2, (ds,), _), = _sim.run_calls([dict(case.backward_call(st), sms=sms, reverse=rev)])
        assert rc == rc2 == 0
        outs.append((st, ds))
    assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])


def test_empty_shapes_and_rejected_layouts():
    hyper = np.array([1.0, 1.0, 0.0, 1.0])
    types = ["float32", "int32", "float32", "float64", "float32"]

    def fwd(s, ids, vals, dtypes=types):
        return dict(symbol="SparseFwd", dtype="float32", dtypes=dtypes, spec=4,
                    arrays=[(s, 0), (ids, 0), (vals, 0), (hyper, 0),
                            (np.empty(s.shape[:-1] + (STATS,), np.float32), 0)])

    z = np.zeros
    calls = [fwd(z((0, 5), np.float32), z((0, 3), np.int32), z((0, 3), np.float32)),            # no rows
             fwd(z((2, 0, 5), np.float32), z((2, 0, 3), np.int32), z((2, 0, 3), np.float32)),   # no rows, rank 3
             fwd(z((3, 5), np.float32), z((3, 3), np.int64), z((3, 3), np.float32),             # ids not int32
                 ["float32", "int64", "float32", "float64", "float32"]),
             fwd(z((3, 5), np.float32), z((3, 3), np.int32), z((3, 2), np.float32)),            # K differs
             fwd(z((3, 5), np.float32), z((2, 3), np.int32), z((2, 3), np.float32))]            # rows differ
    bwd = dict(symbol="SparseBwd", dtype="float32", spec=6,
               dtypes=["float32", "int32", "float32", "float64", "float32", "float32", "float32"],
               arrays=[(z((0, 5), np.float32), 0), (z((0, 3), np.int32), 0), (z((0, 3), np.float32), 0),
                       (hyper, 0), (z((0, STATS), np.float32), 0), (z((0,), np.float32), 0),
                       (z((0, 5), np.float32), 0)])
    out = _sim.run_calls(calls + [bwd])
    assert [r[0] for r in out] == [0, 0, 1, 1, 1, 0]


# Deliberate bugs in a copy of sparse_cuda.cu, each caught by the stand-in through the ordinary ABI calls.
MUTATIONS = {
    # an id >= V no longer marks the row bad: row_stats then gathers the logit past the row (and the buffer)
    "no_range_check": ("    if (id >= vocab) {\n      *bad = true;\n      continue;\n    }\n", "", "bad-warp",
                       "out-of-bounds"),
    "missing_syncthreads": ("if (lane == 0) part[warp] = v;\n    __syncthreads();", "if (lane == 0) part[warp] = v;",
                            "block-two-tiles", "shared memory"),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_mutated_kernel_is_caught(name, tmp_path):
    old, new, case, message = MUTATIONS[name]
    with open(os.path.join(_sim.SRC, "gpu", "sparse_cuda.cu"), encoding="utf-8") as f:
        text = f.read()
    assert text.count(old) == 1, f"mutation {name} no longer matches sparse_cuda.cu"
    mutated = tmp_path / "sparse_cuda.cu"
    mutated.write_text(text.replace(old, new), encoding="utf-8")
    lib = _sim.build([str(mutated)])
    with pytest.raises(_sim.SimError, match=message):
        _sim.run_calls([CASES[case].forward_call()], lib)
