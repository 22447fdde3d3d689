"""Property-based fuzzing (hypothesis) of distillation_loss at its edges, on every available backend, against the
float64 reference (``ms_kldiv.reference.distillation_loss`` / ``distillation_grads``), plus bad-input fuzzing.

Valid inputs: student logits of rank 1-4 with leading dims 0-3 (empty batches included) and 1-6 classes, the
teacher of the student's shape or broadcasting to it, beta in {0, 0.5, 1, a random one}, temperatures from 0.25
to 5, every reduction ('tokenmean' included), labels with ignored entries, and rows of every kind: regular,
masked classes (-inf in the student, the teacher or both), NaN, +inf, every logit -inf, in counted and in ignored
rows. float32 (what the fused kernels take) and float64 logits.

Checks (docs/SPEC.md's distillation edge table):
* the value: NaN and +-inf exactly where the reference has them, finite values within float32 accuracy;
* both gradients of ``sum(loss * w)`` (w varying over every element for 'none'): exact zeros on ignored rows, the
  reference on every row whose terms are all finite (a row with a NaN / inf term has no specified gradient), the
  teacher's summed back to its shape; shapes and dtypes like the operands.

* PyNative: ``ms.value_and_grad`` of the functional or the Cell, one reduction per example.
* Compiled: GRAPH_MODE Cells and ``ms.jit``, the value and both gradients of all five reductions in one graph.
  Each family (mode, rank, labels, beta, temperature, dtype, teacher layout) is compiled once with its leading
  dims unknown (``set_inputs``) and reused by every example; the classes stay known in most families, so the fused
  kernels ('auto'/'aot') run with row counts, 0 included, that the graph learns only at run time. 'akg' compiles per
  static shape, so its examples draw from a few fixed shapes.

Runs are derandomized (fixed seed, no example database). ``EXAMPLES`` gives the volume per backend (at least
1,000 each); ``MS_KLDIV_FUZZ_SCALE`` scales it for quick local runs.
"""
import os
import time
from collections import namedtuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mindspore as ms
from mindspore import Tensor

import ms_kldiv
from ms_kldiv import distillation, reference
from ms_kldiv.distillation import DistillationLoss

from conftest import DISTILL_BACKENDS, graph_mode, to_numpy
from _distill_cells import REDUCTIONS, Loss, Weighted, all_reductions_cell

# (PyNative, compiled) examples per backend.
EXAMPLES = {"aot": (300, 900), "akg": (150, 900), "composite": (150, 900)}
DEFAULT_EXAMPLES = (150, 900)
SCALE = float(os.environ.get("MS_KLDIV_FUZZ_SCALE", "1"))
assert all(sum(n) >= 1000 for n in list(EXAMPLES.values()) + [DEFAULT_EXAMPLES])
IGNORE = -100


def _examples(backend, compiled):
    return max(1, int(SCALE * EXAMPLES.get(backend, DEFAULT_EXAMPLES)[compiled]))


def _settings(n):
    return settings(max_examples=n, derandomize=True, database=None, deadline=None, print_blob=True,
                    suppress_health_check=list(HealthCheck))


# ------------------------------------------------------------------------------------------------ data
# Row kinds: what a row of (student, teacher) holds. Regular logits are N(0, 3).
ROW_KINDS = ("regular", "regular", "regular", "regular", "masked-student", "masked-teacher", "masked-both",
             "nan-student", "nan-teacher", "pinf-student", "pinf-teacher", "all-ninf-both", "all-ninf-student",
             "all-ninf-teacher")


def _fill_row(rng, kind, s_row, t_row):
    v = s_row.shape[-1]
    j = int(rng.integers(0, v))
    if kind == "masked-student":
        s_row[j] = -np.inf
    elif kind == "masked-teacher":
        t_row[j] = -np.inf
    elif kind == "masked-both":
        s_row[j] = t_row[j] = -np.inf
    elif kind == "nan-student":
        s_row[j] = np.nan
    elif kind == "nan-teacher":
        t_row[j] = np.nan
    elif kind == "pinf-student":
        s_row[j] = np.inf
    elif kind == "pinf-teacher":
        t_row[j] = np.inf
    elif kind == "all-ninf-both":
        s_row[:] = t_row[:] = -np.inf
    elif kind == "all-ninf-student":
        s_row[:] = -np.inf
    elif kind == "all-ninf-teacher":
        t_row[:] = -np.inf


Case = namedtuple("Case", "s t labels w_none w_red")


def make_case(seed, s_shape, t_shape, with_labels, special_rate, ignore_rate):
    """Logits (float64 arrays), labels and cotangents from ``seed``. Specials go in whole rows of both models; a
    broadcast teacher keeps its own rows regular or masked (a NaN teacher row would poison every student row)."""
    rng = np.random.default_rng(seed)
    s = rng.standard_normal(s_shape) * 3.0
    t_own = rng.standard_normal(t_shape) * 3.0
    same = tuple(t_shape) == tuple(s_shape)
    t = t_own.copy() if same else np.broadcast_to(t_own, s_shape).copy()  # a broadcast teacher: specials unused
    rows = s.reshape(-1, s_shape[-1])
    trows = t.reshape(-1, s_shape[-1])
    for r in range(rows.shape[0]):
        if rng.random() < special_rate:
            kind = ROW_KINDS[int(rng.integers(0, len(ROW_KINDS)))]
            if same or kind in ("masked-student", "nan-student", "pinf-student", "all-ninf-student"):
                _fill_row(rng, kind, rows[r], trows[r])
    if not same:
        t = t_own
    labels = None
    if with_labels:
        labels = rng.integers(-3, 50, s_shape[:-1]).astype(np.int32)  # any value other than IGNORE counts
        labels[rng.random(s_shape[:-1]) < ignore_rate] = IGNORE
    w_none = rng.uniform(0.5, 1.5, s_shape) * rng.choice([1.0, -1.0])
    return Case(s.astype(np.float32), t.astype(np.float32), labels, w_none, float(rng.choice([1.0, -0.5, 2.0])))


# ------------------------------------------------------------------------------------------------ checking
def _close(got, exp, rtol, atol, what):
    got, exp = np.asarray(got, np.float64), np.asarray(exp, np.float64)
    assert got.shape == exp.shape, f"{what}: shape {got.shape} != {exp.shape}"
    nan_g, nan_e = np.isnan(got), np.isnan(exp)
    assert np.array_equal(nan_g, nan_e), f"{what}: NaN at {np.argwhere(nan_g != nan_e)[:5].tolist()}\n{got}\n{exp}"
    inf_e = np.isinf(exp)
    assert np.array_equal(got[inf_e], exp[inf_e]) and not np.isinf(got[~inf_e]).any(), f"{what}: inf\n{got}\n{exp}"
    fin = np.isfinite(exp)
    err = np.abs(got[fin] - exp[fin])
    atol = np.broadcast_to(atol, exp.shape)[fin]
    bound = atol + rtol * np.abs(exp[fin])
    assert (err <= bound).all(), f"{what}: max excess {np.max(err - bound):.3g}\n{got}\n{exp}"


def check(results, case, temperature, beta, dtype, teacher_shape, what):
    """results: {reduction: (value, d_student, d_teacher)} of MindSpore Tensors."""
    s64, t64 = case.s.astype(np.float64), case.t.astype(np.float64)
    if dtype == ms.float64:
        rtol, atol = 1e-9, 1e-12
    else:
        rtol, atol = 1e-4, 4e-6 * max(1.0, temperature ** 2)
    terms = reference.distillation_loss(s64, t64, temperature, "none", beta, case.labels)
    row_ok = np.isfinite(terms).all(axis=-1)          # rows whose gradient is specified
    keep = np.ones(row_ok.shape, bool) if case.labels is None else case.labels != IGNORE
    for reduction, (value, ds, dt) in results.items():
        tag = f"{what} reduction={reduction!r}"
        assert value.dtype == dtype and ds.dtype == dtype and dt.dtype == dtype, tag
        exp = reference.distillation_loss(s64, t64, temperature, reduction, beta, case.labels)
        # the value's tolerance scales with the magnitude of what was summed (the JSD cancels)
        count = max(reference.distillation_count(s64.shape, reduction, case.labels if case.labels is None
                                                  else keep), 1)
        mag = np.abs(np.where(np.isfinite(terms), terms, 0.0)).sum() / (1 if reduction == "none" else count)
        _close(to_numpy(value), exp, rtol, atol + rtol * (np.abs(terms) if reduction == "none" else mag),
               tag + " value")
        w = case.w_none if reduction == "none" else case.w_red
        es, et = reference.distillation_grads(s64, t64, temperature, reduction, beta, case.labels, dout=w)
        gs, gt = to_numpy(ds), to_numpy(dt)
        assert gs.shape == s64.shape and gt.shape == tuple(teacher_shape), f"{tag}: {gs.shape} {gt.shape}"
        ignored = ~keep
        assert (gs[ignored] == 0).all() and (gt.shape != s64.shape or (gt[ignored] == 0).all()), \
            f"{tag}: ignored rows' gradients not exactly 0"
        gscale = max(1.0, temperature) * (np.abs(w).max() if np.size(w) else 1.0)
        _close(gs[row_ok], es[row_ok], 10 * rtol, 10 * atol * gscale, tag + " d_student")
        if gt.shape == s64.shape:
            _close(gt[row_ok], et[row_ok], 10 * rtol, 10 * atol * gscale, tag + " d_teacher")
        elif row_ok.all():
            _close(gt, et, 10 * rtol, 10 * atol * gscale * max(1, row_ok.size), tag + " d_teacher")


# ------------------------------------------------------------------------------------------------ PyNative
BETAS = (0.0, 0.5, 1.0, 0.3)  # the last stands for "random" in the compiled families (fixed per family)


@st.composite
def pynative_cases(draw, akg):
    if akg:  # AKG compiles per shape: a few fixed ones (empty batch, 1-D, rank 4, teacher broadcast)
        s_shape, t_shape = draw(st.sampled_from([((3, 5), (3, 5)), ((0, 4), (0, 4)), ((6,), (6,)),
                                                  ((2, 1, 2, 3), (2, 1, 2, 3)), ((4, 5), (5,))]))
    else:
        rank = draw(st.integers(1, 4))
        lead = [draw(st.sampled_from((0, 1, 2, 3, 3))) for _ in range(rank - 1)]
        if lead and draw(st.integers(0, 5)):
            lead = [max(d, 1) for d in lead]  # empty batches in one example of six
        s_shape = tuple(lead) + (draw(st.integers(1, 6)),)
        t_shape = s_shape
        if rank > 1 and draw(st.integers(0, 4)) == 0:
            t_shape = draw(st.sampled_from((s_shape[-1:], (1,) * (rank - 1) + s_shape[-1:])))
    beta = draw(st.one_of(st.sampled_from((0.0, 0.5, 1.0)), st.floats(0.01, 0.99)))
    temperature = draw(st.one_of(st.sampled_from((1.0, 2.0, 0.5)), st.floats(0.25, 5.0)))
    with_labels = t_shape == s_shape and len(s_shape) > 1 and draw(st.booleans())
    case = make_case(draw(st.integers(0, 2 ** 32 - 1)), s_shape, t_shape, with_labels,
                     draw(st.sampled_from((0.0, 0.3, 0.8))), draw(st.sampled_from((0.0, 0.4, 1.0))))
    dtype = draw(st.sampled_from((ms.float32, ms.float32, ms.float64)))
    return (case, t_shape, beta, temperature, draw(st.sampled_from(REDUCTIONS)), dtype,
            draw(st.sampled_from(("functional", "cell"))))


def _run_pynative(backend, drawn):
    case, t_shape, beta, temperature, reduction, dtype, kind = drawn
    loss = Loss(kind, temperature, reduction, beta, backend)
    s, t = Tensor(case.s, dtype), Tensor(case.t, dtype)
    labels = None if case.labels is None else Tensor(case.labels)
    w = Tensor(case.w_none if reduction == "none" else case.w_red, dtype)
    weighted = Weighted(loss)
    _, (ds, dt) = ms.value_and_grad(weighted, grad_position=(0, 1))(s, t, labels, w)
    check({reduction: (loss(s, t, labels), ds, dt)}, case, temperature, beta, dtype, t_shape,
          f"{backend} PyNative {kind} beta={beta} T={temperature} {case}")


@pytest.mark.slow
@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
def test_distill_fuzz_pynative(backend):
    count = []
    examples = _examples(backend, compiled=False)
    start = time.perf_counter()

    @_settings(examples)
    @given(drawn=pynative_cases(backend == "akg"))
    def run(drawn):
        count.append(1)
        _run_pynative(backend, drawn)

    run()
    assert len(count) >= examples, f"hypothesis ran {len(count)} examples"
    print(f"{backend}: {len(count)} PyNative examples in {time.perf_counter() - start:.1f} s")


# ------------------------------------------------------------------------------------------------ compiled
Family = namedtuple("Family", "mode rank labels beta temperature dtype teacher vocab")
# teacher: 'same', 'row' ([1, ..., 1, V]) or 'vector' ([V]); vocab: a fixed number of classes (the fused kernels
# run) or None (unknown to the graph: the composition).
FAMILIES = [
    Family("graph", 2, True, 0.0, 2.0, ms.float32, "same", 5),
    Family("jit", 2, False, 0.5, 1.0, ms.float32, "same", 4),
    Family("graph", 3, True, 1.0, 0.5, ms.float32, "same", 3),
    Family("jit", 3, True, 0.3, 4.0, ms.float32, "same", 6),
    Family("graph", 1, False, 0.7, 1.5, ms.float32, "same", None),
    Family("jit", 2, False, 0.0, 1.0, ms.float32, "row", 5),
    Family("graph", 4, False, 0.5, 2.0, ms.float32, "same", 2),
    # (a [V] teacher against a dynamic [None, None, V] student: MindSpore 2.10's compile of the composite gradient
    # crashes with SIGSEGV, on main as well; the PyNative examples and the static shapes cover the [V] teacher)
    Family("jit", 3, False, 1.0, 3.0, ms.float32, "row", None),
    Family("graph", 2, True, 0.9, 1.0, ms.float64, "same", None),
]
AKG_SHAPES = {1: (7,), 2: (3, 5), 3: (2, 2, 3), 4: (1, 2, 2, 2)}


def _teacher_shape(family, s_shape):
    if family.teacher == "vector":
        return s_shape[-1:]
    if family.teacher == "row":
        return (1,) * (len(s_shape) - 1) + s_shape[-1:]
    return s_shape


def _compiled_cell(backend, family):
    """The family's AllReductions graph: leading dims unknown (static shapes for akg), compiled once."""
    specs = None
    if backend != "akg":
        v = family.vocab
        specs = [Tensor(shape=[None] * (family.rank - 1) + [v], dtype=family.dtype),
                 Tensor(shape=list(_teacher_shape(family, (None,) * (family.rank - 1) + (v,))), dtype=family.dtype)]
        if family.labels:
            specs.append(Tensor(shape=[None] * (family.rank - 1), dtype=ms.int32))
        specs += [Tensor(shape=[None] * (family.rank - 1) + [v], dtype=family.dtype),
                  Tensor(shape=[], dtype=family.dtype)]
    kind = "cell" if family.mode == "graph" else "functional"
    return all_reductions_cell(family.mode, backend, family.temperature, family.beta, family.labels, kind, specs,
                               key=("fuzz", family))


@st.composite
def compiled_cases(draw, family, akg):
    if akg:
        s_shape = AKG_SHAPES[family.rank][:-1] + (family.vocab or AKG_SHAPES[family.rank][-1],)
    else:
        lead = [draw(st.sampled_from((0, 1, 2, 3, 3))) for _ in range(family.rank - 1)]
        if lead and draw(st.integers(0, 5)):
            lead = [max(d, 1) for d in lead]
        s_shape = tuple(lead) + (family.vocab or draw(st.integers(1, 6)),)
    t_shape = _teacher_shape(family, s_shape)
    case = make_case(draw(st.integers(0, 2 ** 32 - 1)), s_shape, t_shape, family.labels,
                     draw(st.sampled_from((0.0, 0.3, 0.8))), draw(st.sampled_from((0.0, 0.4, 1.0))))
    return case, t_shape


def _fuzz_family(backend, index, family, examples, count):
    @_settings(examples)
    @given(drawn=compiled_cases(family, backend == "akg"))
    def run(drawn):
        case, t_shape = drawn
        count.append(1)
        cell = _compiled_cell(backend, family)
        args = [Tensor(case.s, family.dtype), Tensor(case.t, family.dtype)]
        if family.labels:
            args.append(Tensor(case.labels))
        args += [Tensor(case.w_none, family.dtype), Tensor(case.w_red, family.dtype)]
        if family.mode == "graph":
            with graph_mode():
                res = cell(*args)
        else:
            res = cell(*args)
        check(dict(zip(REDUCTIONS, res)), case, family.temperature, family.beta, family.dtype, t_shape,
              f"{backend} {family} {case}")

    run()


@pytest.mark.slow
@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
def test_distill_fuzz_compiled(backend):
    examples = _examples(backend, compiled=True)
    families = FAMILIES
    count = []
    start = time.perf_counter()
    for index, family in enumerate(families):
        if os.environ.get("MS_KLDIV_FUZZ_VERBOSE"):
            print(family, flush=True)
        _fuzz_family(backend, index, family, -(-examples // len(families)), count)
    assert len(count) >= examples, f"hypothesis ran {len(count)} examples"
    print(f"{backend}: {len(count)} compiled examples over {len(families)} graphs in "
          f"{time.perf_counter() - start:.1f} s")


# ------------------------------------------------------------------------------------------------ bad input
# Every documented argument check, combined: the call raises the documented TypeError / ValueError (a message
# starting "For 'distillation_loss'" / "For 'DistillationLoss'") before any op runs.
_BAD_LOGITS = {
    "list": (lambda: [[0.1, 0.2, 0.3]] * 2, TypeError), "ndarray": (lambda: np.ones((2, 3), np.float32), TypeError),
    "float": (lambda: 0.5, TypeError), "None": (lambda: None, TypeError),
    "int32": (lambda: Tensor(np.ones((2, 3), np.int32)), TypeError),
    "bool": (lambda: Tensor(np.ones((2, 3), np.bool_)), TypeError),
    "0-d": (lambda: Tensor(1.0, ms.float32), ValueError),
}
_BAD_SHAPES = [((2, 3), (2, 4)), ((2, 1), (2, 4)), ((1, 3), (4, 3)), ((3,), (2, 3)), ((2, 3), (3, 3)),
               ((2, 0), (2, 0)), ((2, 1, 3), (2, 2, 3)), ((0,), (0,))]
_BAD_OPTIONS = {
    "temperature": [(0, ValueError), (-1.0, ValueError), (float("inf"), ValueError), (float("nan"), ValueError),
                    ("2", TypeError), (None, TypeError), (True, TypeError)],
    "reduction": [(1, TypeError), (None, TypeError), ("avg", ValueError), ("tokens", ValueError),
                  ("Mean", ValueError), ("", ValueError)],
    "beta": [(1.5, ValueError), (-0.1, ValueError), (float("nan"), ValueError), ("0.5", TypeError),
             (True, TypeError), (None, TypeError)],
    "ignore_index": [(1.0, TypeError), (None, TypeError), (True, TypeError), ("-100", TypeError),
                     (2**32 - 100, ValueError)],
    "backend": [("quantum", ValueError), ("", ValueError), ("AOT", ValueError), (["auto"], TypeError),
                (None, TypeError), (3, TypeError)],
}
_BAD_LABELS = [(lambda: Tensor(np.zeros(2, np.float32)), TypeError), (lambda: Tensor(np.zeros(3, np.int32)), ValueError),
               (lambda: np.zeros(2, np.int32), TypeError), (lambda: Tensor(np.zeros((2, 1), np.int32)), ValueError),
               (lambda: [0, 1], TypeError)]
_PIECES = ("student", "teacher", "shapes", "labels") + tuple(_BAD_OPTIONS)


@st.composite
def bad_calls(draw):
    pieces = draw(st.sets(st.sampled_from(_PIECES), min_size=1, max_size=3))
    ss, ts = draw(st.sampled_from(_BAD_SHAPES)) if "shapes" in pieces else ((2, 3), (2, 3))
    s, t = Tensor(np.zeros(ss, np.float32)), Tensor(np.zeros(ts, np.float32))
    kwargs = {"temperature": 2.0, "reduction": draw(st.sampled_from(REDUCTIONS)), "beta": 0.5,
              "ignore_index": IGNORE, "backend": draw(st.sampled_from(("auto",) + DISTILL_BACKENDS))}
    expected = {ValueError} if "shapes" in pieces else set()
    for name in ("student", "teacher"):
        if name in pieces:
            make_bad, exc = _BAD_LOGITS[draw(st.sampled_from(sorted(_BAD_LOGITS)))]
            s, t = (make_bad(), t) if name == "student" else (s, make_bad())
            expected.add(exc)
    for name, bad in _BAD_OPTIONS.items():
        if name in pieces:
            kwargs[name], exc = draw(st.sampled_from(bad))
            expected.add(exc)
    labels = None
    if "labels" in pieces:
        make_bad, exc = draw(st.sampled_from(_BAD_LABELS))
        labels = make_bad()
        expected.add(exc)
    return s, t, labels, kwargs, tuple(expected), pieces


def _starts(excinfo, name):
    msg = str(excinfo.value).strip().lstrip("'\"")
    assert msg.startswith(f"For '{name}'"), msg[:300]


@pytest.mark.slow
def test_distill_fuzz_bad_input(monkeypatch):
    ran = []

    def spy(*args, **kwargs):
        ran.append(1)
        raise AssertionError("the loss ran before a bad argument was reported")
    monkeypatch.setattr(distillation, "_distill", spy)
    count = []

    @_settings(max(1, int(SCALE * 400)))
    @given(call=bad_calls())
    def run(call):
        s, t, labels, kwargs, expected, pieces = call
        count.append(1)
        with pytest.raises(expected) as excinfo:
            ms_kldiv.distillation_loss(s, t, labels=labels, **kwargs)
        _starts(excinfo, "distillation_loss")
        options = {k: v for k, v in kwargs.items() if k != "temperature"}
        if pieces & set(_BAD_OPTIONS):
            with pytest.raises(expected) as excinfo:  # the Cell checks its options when it is built
                DistillationLoss(kwargs["temperature"], **options)
            _starts(excinfo, "DistillationLoss")
        else:
            loss = DistillationLoss(kwargs["temperature"], **options)
            with pytest.raises(expected) as excinfo:
                loss(s, t, labels)
            _starts(excinfo, "DistillationLoss")
        assert not ran

    run()
    assert len(count) >= int(SCALE * 400)


@st.composite
def bad_graph_operands(draw):
    kind = draw(st.sampled_from(("dtype", "shapes", "labels")))
    good = Tensor(np.zeros((2, 3), np.float32))
    if kind == "shapes":
        ss, ts = draw(st.sampled_from(_BAD_SHAPES))
        return Tensor(np.zeros(ss, np.float32)), Tensor(np.zeros(ts, np.float32)), None, ValueError
    if kind == "labels":
        return good, good, Tensor(np.zeros(3, np.int32)), ValueError
    bad = Tensor(np.ones((2, 3), draw(st.sampled_from((np.int32, np.bool_, np.int64)))))
    return (bad, good, None, TypeError) if draw(st.booleans()) else (good, bad, None, TypeError)


@pytest.mark.slow
@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
def test_distill_fuzz_bad_input_graph_cell_keeps_working(backend):
    """Bad operands against one GRAPH_MODE Cell (each refused at compile time), then good ones: the Cell computes
    the reference value and both gradients."""
    loss = DistillationLoss(2.0, "batchmean", beta=0.5, backend=backend)

    @_settings(max(1, int(SCALE * 15)))
    @given(call=bad_graph_operands())
    def run(call):
        s, t, labels, exc = call
        with graph_mode():
            with pytest.raises(exc) as excinfo:
                loss(s, t, labels)
        _starts(excinfo, "DistillationLoss")

    run()
    case = make_case(5, (3, 4), (3, 4), True, 0.0, 0.3)
    s, t, labels = Tensor(case.s), Tensor(case.t), Tensor(case.labels)
    with graph_mode():
        value = loss(s, t, labels)
        ds, dt = ms.grad(loss, grad_position=(0, 1))(s, t, labels)
    one = Case(case.s, case.t, case.labels, case.w_none, 1.0)
    check({"batchmean": (value, ds, dt)}, one, 2.0, 0.5, ms.float32, (3, 4), f"{backend} after bad operands")


def test_distill_fuzz_volume():
    """The volume the docstring promises: >= 1,000 examples per backend."""
    for backend in DISTILL_BACKENDS:
        assert _examples(backend, False) + _examples(backend, True) >= min(1000, int(SCALE * 1000))
