"""The stored-teacher ("sparse") AscendC operators SparseDistillCustom / SparseDistillCustomGrad, without an Ascend
device: the kernel sources (custom_ops/ascend/op_kernel/sparse_distill_custom*.cpp) run on the AscendC stand-in
(tests/ascend/sparse_sim.py) against the float64 definition (ms_kldiv.reference.sparse_distillation_rows) and its
closed-form gradient (checked here against central differences); their tiling plan (op_kernel/sparse_tiling_plan.h);
and the Python wiring: the operators' declaration and detection, and ``sparse_distillation_loss(backend='aot')``
on a faked Ascend device running the stand-in's kernels, PyNative and GRAPH_MODE.
"""
import sys

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops

import ms_kldiv
from ms_kldiv import reference as ref
from ms_kldiv.backends import ascend

from conftest import to_numpy
import _ascend_common
from _ascend_common import CORES, UBS, fake_vendor, needs_compiler, sparse_sim

clean_env = _ascend_common.clean_env  # a fixture: pytest looks it up in this module

MODES = ("renormalize", "tail")
SMALL_UB = 32 * 1024  # short tiles: several tiles a row on small vocabularies (fast on the stand-in)
ALL_OPS = ("KlDivCustom", "KlDivCustomGrad", "DistillCustom", "DistillCustomGrad", "SparseDistillCustom",
           "SparseDistillCustomGrad")


@pytest.fixture(scope="module")
def sim32():
    return sparse_sim.simulator("float32")


def _teacher(rows, vocab, k, seed, scale=3.0):
    """Student logits and a stored top-k teacher (ids, log-probabilities), float32."""
    rng = np.random.default_rng(seed)
    s = (rng.standard_normal((rows, vocab)) * scale).astype(np.float32)
    t = rng.standard_normal((rows, vocab)) * scale + 0.5 * s
    lt = t - np.log(np.exp(t - t.max(-1, keepdims=True)).sum(-1, keepdims=True)) - t.max(-1, keepdims=True)
    ids = np.argsort(-lt, -1)[:, :k]
    ids = np.stack([rng.permutation(r) for r in ids]).astype(np.int32)  # any order
    vals = np.take_along_axis(lt, ids, -1).astype(np.float32)
    return s, ids, vals


def _hyper(mode, temperature, teacher_temperature):
    return dict(temperature=temperature, ratio=teacher_temperature / temperature, tail=mode == "tail")


def _check(sim, s, ids, vals, mode, temperature, beta, teacher_temperature=1.0, cores=3, g=None, ub=None,
           loss_rtol=1e-5, grad_rtol=2e-5, what=""):
    """Forward + backward on the stand-in against float64; returns (stats, d_student)."""
    kw = _hyper(mode, temperature, teacher_temperature)
    if ub is not None:
        kw["ub"] = ub
    sq = sparse_sim.quantize(s, sim.dtype)
    stats = sim.forward(sq, ids, vals, beta=beta, cores=cores, **kw)
    assert stats.shape == s.shape[:-1] + (8,)
    exp = ref.sparse_distillation_rows(sq, ids, vals, mode, temperature, teacher_temperature, beta)
    log_r, log_q = ref.sparse_support(sq, ids, vals, mode, temperature, teacher_temperature)
    with np.errstate(all="ignore"):
        size = np.where(np.isfinite(log_r), np.abs(log_r), 0) + np.where(np.isfinite(log_q), np.abs(log_q), 0) + 1
        mag = temperature ** 2 * ((np.exp(log_r) + np.exp(log_q)) * size).sum(-1)
    loss = stats[..., 0].astype(np.float64)
    fin = np.isfinite(exp)
    assert np.array_equal(np.isnan(loss), np.isnan(exp)), (what, loss, exp)
    assert np.array_equal(loss[np.isinf(exp)], exp[np.isinf(exp)]), what
    err = np.abs(loss[fin] - exp[fin])
    assert (err <= loss_rtol * mag[fin]).all(), (what, err.max(), (err / mag[fin]).max())
    # the saved exponent base (the raw max) and log Z = log sum e^((s - max) / T); log Z_off - log Z = log r_tail
    m = sq.astype(np.float64).max(-1)
    np.testing.assert_array_equal(stats[..., 1], m, err_msg=what)
    with np.errstate(all="ignore"):
        log_z = np.log(np.exp((sq - m[..., None]) / temperature).sum(-1))
    np.testing.assert_allclose(stats[..., 2], log_z, rtol=1e-5, atol=1e-5, err_msg=what)
    np.testing.assert_allclose(stats[..., 3] - stats[..., 2], log_r[..., -1], rtol=1e-5, atol=1e-5, err_msg=what)

    rows = int(np.prod(s.shape[:-1]))
    rng = np.random.default_rng(rows)
    g = rng.uniform(0.5, 1.5, s.shape[:-1]).astype(np.float32) if g is None else np.asarray(g, np.float32)
    ds = sim.backward(sq, ids, vals, stats, g, beta=beta, cores=cores, **kw)
    eds, gmag = sparse_sim.reference_grads_f64(sq, ids, vals, mode, temperature, teacher_temperature, beta, g,
                                               magnitude=True)
    tol_io = {"float32": 0.0, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[sim.dtype]
    floor = 2.0 ** -24 if sim.dtype == "float16" else 1e-30
    ok_rows = fin & (g != 0)
    e, got = eds[ok_rows], ds[ok_rows].astype(np.float64)
    bad = ~(np.abs(got - e) <= grad_rtol * gmag[ok_rows] + tol_io * np.abs(e) + floor)
    assert not bad.any(), (what, int(bad.sum()), got[bad][:4], e[bad][:4])
    assert (ds[g == 0] == 0).all(), (what, "rows with dloss = 0 must be exact zeros")
    return stats, ds


# --------------------------------------------------------------------------------------- the float64 reference
@pytest.mark.parametrize("mode, beta", [("renormalize", 0.0), ("renormalize", 0.5), ("tail", 0.0), ("tail", 0.3),
                                        ("tail", 1.0)])
def test_sparse_gradient_reference_is_the_derivative(mode, beta):
    """The closed-form float64 gradient the kernels are checked against, against central differences of the
    float64 loss (padding ids, a tail, T != T0)."""
    s, ids, vals = _teacher(3, 7, 3, seed=1)
    ids[1, 2] = -1
    s = s.astype(np.float64)
    g = np.array([0.7, 1.1, 1.3])
    got = sparse_sim.reference_grads_f64(s, ids, vals, mode, 1.5, 2.0, beta, g)

    def loss(x):
        return float((ref.sparse_distillation_rows(x, ids, vals, mode, 1.5, 2.0, beta) * g).sum())

    fd = np.zeros_like(s)
    for i in np.ndindex(s.shape):
        old = s[i]
        s[i] = old + 1e-6
        hi = loss(s)
        s[i] = old - 1e-6
        lo = loss(s)
        s[i] = old
        fd[i] = (hi - lo) / 2e-6
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------------------------------------- the kernels
@needs_compiler
@pytest.mark.parametrize("mode, beta", [("renormalize", 0.0), ("renormalize", 0.5), ("tail", 0.0), ("tail", 0.5),
                                        ("tail", 1.0)])
@pytest.mark.parametrize("temperature, teacher_temperature", [(1.0, 1.0), (2.0, 1.0), (0.5, 0.7)])
def test_sparse_kernel_float32(sim32, mode, beta, temperature, teacher_temperature):
    """Several tiles a row (short UB tiles), ids spread over them in any order, padding ids, K = 1 and K = V, rows
    not a multiple of the cores, a ragged last tile, V * 4 not a multiple of 32 B."""
    s, ids, vals = _teacher(7, 3001, 20, seed=3)
    ids[0, 5:] = -1                    # padding
    ids[1, :] = -1
    ids[1, 7] = 3000                   # one id, the last class (ragged last tile)
    vals[1, 7] = -0.2
    ids[2, 3] = 0                      # the first class
    _check(sim32, s, ids, vals, mode, temperature, beta, teacher_temperature, ub=SMALL_UB, what="K=20")
    s1, ids1, vals1 = _teacher(5, 1001, 1, seed=4)
    _check(sim32, s1, ids1, vals1, mode, temperature, beta, teacher_temperature, cores=2, ub=SMALL_UB, what="K=1")
    # K = V: the ids cover the vocabulary, Z_off = 0: no tail in either model (the dense distillation loss)
    sv, idsv, valsv = _teacher(3, 300, 300, seed=5)
    stats, _ = _check(sim32, sv, idsv, valsv, mode, temperature, beta, teacher_temperature, cores=2, what="K=V")
    assert (stats[:, 3] == -np.inf).all() and (stats[:, 5] == 0).all()
    # the teacher's logits at T: T0 * values, which ratio = T0 / T makes of them
    dense = ref.distillation_pointwise(sv, _scatter(idsv, valsv, 300) * teacher_temperature, temperature,
                                       beta).sum(-1)
    np.testing.assert_allclose(stats[:, 0], dense, rtol=2e-5)


def _scatter(ids, vals, vocab):
    out = np.full(ids.shape[:-1] + (vocab,), -np.inf)
    np.put_along_axis(out, ids, vals, -1)
    return out


@needs_compiler
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("mode, beta", [("renormalize", 0.0), ("tail", 0.5), ("tail", 1.0)])
def test_sparse_kernel_half_logits(dtype, mode, beta):
    """float16/bfloat16 logits: float32 inside (the stats are float32), the gradient rounded once."""
    sim = sparse_sim.simulator(dtype)
    s, ids, vals = _teacher(5, 2000, 16, seed=6)
    ids[3, ::2] = -1
    _check(sim, s, ids, vals, mode, 2.0, beta, cores=3, ub=SMALL_UB, what=dtype)


@needs_compiler
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_sparse_kernel_bad_rows_are_nan(sim32, beta):
    """A repeated id (in one tile, and in the same tile again after others), an id >= V (far past the row: the
    stand-in's GM bounds would stop any read of it) and a row of padding only (no teacher distribution in
    'renormalize') give NaN loss and NaN A; their gradient is NaN, the other rows are exact as usual, and nothing
    outside the tensors is touched."""
    s, ids, vals = _teacher(6, 2500, 8, seed=7)
    ids[0, 5] = ids[0, 2]                 # repeated
    ids[1, 1] = 2500                      # = V
    ids[2, 0] = 2_000_000_000             # far past V
    ids[3, :] = -1                        # padding only
    ids[4, 7] = ids[4, 0]                 # repeated, first and last
    stats = sim32.forward(s, ids, vals, beta=beta, cores=3, ub=SMALL_UB)
    assert np.isnan(stats[:5, 0]).all() and np.isnan(stats[:5, 4]).all() and np.isfinite(stats[5, :7]).all()
    ds = sim32.backward(s, ids, vals, stats, np.ones(6, np.float32), beta=beta, cores=3, ub=SMALL_UB)
    assert np.isnan(ds[:5]).all() and np.isfinite(ds[5]).all()
    # the good row is exact, next to the bad ones
    one, dsone = _check(sim32, s[5:], ids[5:], vals[5:], "renormalize", 1.0, beta, g=np.ones(1), ub=SMALL_UB)
    np.testing.assert_array_equal(one[0], stats[5])
    np.testing.assert_array_equal(dsone[0], ds[5])
    # 'tail': padding only still has the tail bucket (the teacher's whole mass): a distribution, finite
    stats = sim32.forward(s, ids, vals, beta=beta, tail=True, cores=3, ub=SMALL_UB)
    assert np.isfinite(stats[3, 0]) and np.isnan(stats[[0, 1, 2, 4], 0]).all()


@needs_compiler
def test_sparse_kernel_zero_dloss_rows(sim32):
    """dloss == 0 rows come back as exact zeros even when their stats are NaN and their ids bad (never read)."""
    s, ids, vals = _teacher(4, 700, 5, seed=8)
    for beta in (0.0, 0.5, 1.0):
        stats = sim32.forward(s, ids, vals, beta=beta, tail=True, cores=2)
        stats[1] = np.nan
        bad_ids = ids.copy()
        bad_ids[1] = 10 ** 9
        ds = sim32.backward(s, bad_ids, vals, stats, np.array([1, 0, 0.5, 1], np.float32), beta=beta, tail=True,
                            cores=2)
        assert (ds[1] == 0).all() and np.isfinite(ds[[0, 2, 3]]).all()
    _check(sim32, s, ids, vals, "tail", 1.0, 0.5, g=np.array([0, 1, 0, 1], np.float32), cores=2, what="g=0")


@needs_compiler
@pytest.mark.parametrize("mode, beta", [("renormalize", 0.0), ("tail", 0.5), ("tail", 1.0)])
def test_sparse_kernel_huge_logits(sim32, mode, beta):
    """|s| ~ 1e4 and T = 0.05: x = (s - max) / T, the subtraction first, so nothing overflows or cancels; -inf logits
    (a padded vocabulary) at and off the ids; a maximum that grows in every tile (every online rescale)."""
    s, ids, vals = _teacher(4, 3000, 10, seed=9, scale=1.0)
    s = s * 1e4
    s[1] = np.linspace(-30, 30, 3000, dtype=np.float32) * 100 + s[1] * 1e-3
    s[2, ::7] = -np.inf
    s[2, ids[2, 0]] = -np.inf          # the student rules out one of the teacher's ids
    s[3, :1500] = -np.inf              # whole first tiles without mass
    stats, _ = _check(sim32, s, ids, vals, mode, 0.05, beta, ub=SMALL_UB, loss_rtol=2e-5, grad_rtol=5e-5,
                      what="huge")
    assert np.isfinite(stats[[0, 1], 0]).all()


def _confident(rows, vocab, k, gap, seed):
    """A student whose classes off the ids lie ``gap`` (raw units) below its logits at the ids, which hold the row's
    maximum (but in row 1); ids in any order with one padding id; a teacher keeping 0.6 of its mass on the ids, 0.4
    in its tail."""
    rng = np.random.default_rng(seed)
    s = np.full((rows, vocab), -gap) + rng.uniform(-3.0, 0.0, size=(rows, vocab))
    ids = np.stack([1 + rng.permutation(vocab - 1)[:k] for _ in range(rows)]).astype(np.int32)  # never class 0
    ids[1, -1] = -1  # padding, which also lifts class 0 to the ids' level: row 1 keeps an ordinary tail
    np.put_along_axis(s, np.maximum(ids, 0), rng.uniform(-1.0, 1.0, size=(rows, k)), -1)
    vals = np.log(0.6 * rng.dirichlet(np.ones(k), rows)).astype(np.float32)
    vals[ids < 0] = 0.0
    return s.astype(np.float32), ids, vals


@needs_compiler
@pytest.mark.parametrize("temperature, gap", [(1.0, 110.0), (0.5, 55.0), (1.0, 100.0), (1.0, 60.0), (1.0, 40.0)],
                         ids=["T1-gap110", "T0.5-gap55", "T1-gap100", "T1-gap60", "T1-gap40"])
def test_sparse_kernel_confident_student_keeps_the_teacher_tail(sim32, temperature, gap):
    """The AscendC twin of test_sparse_distillation.py::test_confident_student_keeps_the_teacher_tail: the classes
    off the ids lie ``gap`` below the row's maximum, so their float32 exponentials relative to it underflow (from
    gap / T ~ 87, ~103 with subnormals); the forward must sum them again relative to their own maximum, or the tail
    reads as none and the teacher's tail mass is dropped (loss and gradient 0 where the definition gives ~gap / 2).
    Gap 100: subnormal terms on the stand-in (no flush), a few digits each. Gap 40 stays on the ordinary path. V = 37
    and 300 (one tile), 3001 on short tiles (the ids and the classes off them spread over several tiles, both passes'
    online maxima moving between them); values, stats and gradients against float64."""
    for op in (sparse_sim.FORWARD, sparse_sim.BACKWARD):
        assert sim32.plan(3, 3001, 5, 4, op, ub=SMALL_UB)["tile_length"] * 2 < 3001
    for vocab, beta, ub in ((37, 0.0, None), (300, 0.5, None), (3001, 1.0, SMALL_UB), (3001, 0.0, SMALL_UB)):
        s, ids, vals = _confident(3, vocab, 5, gap, seed=17 + vocab)
        what = f"T={temperature} gap={gap} V={vocab} beta={beta}"
        stats, _ = _check(sim32, s, ids, vals, "tail", temperature, beta, cores=2, ub=ub, what=what)
        assert np.isfinite(stats[:, 3]).all(), what
        if beta == 0.0:  # forward KL: the teacher's tail mass costs ~0.4 gap T (T^2 D), and moves the tail
            want = ref.sparse_distillation_rows(s, ids, vals, "tail", temperature, 1.0, beta)
            assert (want[[0, 2]] > 0.1 * gap * temperature).all(), (what, want)
            eds = sparse_sim.reference_grads_f64(s, ids, vals, "tail", temperature, 1.0, beta)
            off = np.ones((3, vocab + 1), bool)  # a padding id marks the spare column
            np.put_along_axis(off, np.where(ids >= 0, ids, vocab), False, -1)
            assert (np.abs(np.where(off[:, :-1], eds, 0)).sum(-1) > 0.1).all(), what
        if vocab == 3001:  # 'renormalize': no teacher tail; against the student's, reverse KL is +inf as defined
            _check(sim32, s, ids, vals, "renormalize", temperature, beta, cores=2, ub=ub, what=what + " renorm")


@needs_compiler
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_sparse_kernel_confident_student_up_to_float64s_range(sim32, beta):
    """At T = 0.05 a gap of 30 puts the tail ~600 below the row's maximum (x = (s - max) / T): far below float32's
    range, inside float64's, where the definition keeps the tail; a gap of 40 (~800) and of 1e4 lie below
    float64's range too, where the definition has no tail (log r_tail = -inf), and neither has the kernel. One row
    holds no class off the ids with mass (every other logit -inf): no tail either; row 1 keeps an ordinary tail.
    Every tail term there is e^(x - log Z_off) with x ~ -600 formed in float32 relative to the row's maximum: x's
    rounding (an ulp of 600 is 6e-5, plus s - max's) reaches each term, ~8e-5 relative; hence grad_rtol 1e-4."""
    for gap in (30.0, 40.0, 1e4):
        s, ids, vals = _confident(3, 700, 5, gap, seed=23)
        s[2] = np.where(np.isin(np.arange(700), ids[2]), s[2], -np.inf)
        what = f"gap={gap}"
        stats, _ = _check(sim32, s, ids, vals, "tail", 0.05, beta, cores=2, ub=SMALL_UB, loss_rtol=2e-5,
                          grad_rtol=1e-4, what=what)
        assert stats[2, 3] == -np.inf and stats[2, 5] == 0.0, what
        assert np.isfinite(stats[1, 3]) and np.isfinite(stats[0, 3]) == (gap == 30.0), (what, stats[:, 3])


@needs_compiler
def test_sparse_kernel_zero_rows_and_core_counts(sim32):
    """0 rows: nothing launched on any row, empty results; the split of rows over cores changes nothing, bit for
    bit; leading dims are flattened."""
    s = np.zeros((0, 50), np.float32)
    stats = sim32.forward(s, np.zeros((0, 3), np.int32), np.zeros((0, 3), np.float32), cores=4)
    assert stats.shape == (0, 8)
    ds = sim32.backward(s, np.zeros((0, 3), np.int32), np.zeros((0, 3), np.float32), stats, np.zeros(0), cores=4)
    assert ds.shape == (0, 50)
    s, ids, vals = _teacher(13, 900, 6, seed=10)
    a = sim32.forward(s, ids, vals, beta=0.5, tail=True, cores=1, ub=SMALL_UB)
    for cores in (2, 5, 13, 40):
        np.testing.assert_array_equal(sim32.forward(s, ids, vals, beta=0.5, tail=True, cores=cores, ub=SMALL_UB), a)
    b = sim32.forward(s.reshape(13, 1, 900), ids.reshape(13, 1, 6), vals.reshape(13, 1, 6), beta=0.5, tail=True,
                      cores=3, ub=SMALL_UB)
    np.testing.assert_array_equal(b.reshape(13, 8), a)


# ------------------------------------------------------------------------------------------------- tiling
def _sparse_bytes(sim, op, io, tile, lanes):
    """The kernels' InitBuffer calls, listed (each rounded up to 32 B as the stand-in allocates)."""
    r32 = lambda b: -(-b // 32) * 32  # noqa: E731
    lane_bufs = 7 * r32(lanes * 4) + r32(lanes // 8)
    if op == sparse_sim.FORWARD:
        return (sim.const["buffer_num"] * r32(io * tile) + 2 * r32(4 * tile) + r32(tile // 8)
                + r32((tile // 32 + 64) * 4) + 64 * 4 + 32 + lane_bufs)
    return 2 * sim.const["buffer_num"] * r32(io * tile) + 3 * r32(4 * tile) + 32 + 32 + lane_bufs


@needs_compiler
@pytest.mark.parametrize("ub", UBS + (64 * 1024,))
def test_sparse_tiles_fit_below_the_api_reserve(sim32, ub):
    api = sim32.const["api_ub_reserve_bytes"]
    assert api == 8192 and sim32.const["stats_stride"] == 8
    for op in (sparse_sim.FORWARD, sparse_sim.BACKWARD):
        for io in (2, 4):
            for k in (1, 63, 64, 500, sim32.const["max_ids"]):
                plan = sim32.plan(8, 1 << 20, k, io, op, ub=ub)
                if plan is None:  # only a small UB may refuse the largest K
                    assert ub < 192 * 1024 and k > 500, (op, io, k, ub)
                    continue
                tile, lanes = plan["tile_length"], plan["id_lanes"]
                assert lanes == -(-(k + 1) // 64) * 64
                assert tile % sim32.const["tile_align"] == 0 and 0 < tile <= sim32.const["max_tile"]
                assert _sparse_bytes(sim32, op, io, tile, lanes) <= plan["ub_bytes_used"] <= ub - api
    # more ids: shorter tiles; the backward (two queues, three work tiles) has shorter tiles than the forward
    t = lambda k, op, io=4: sim32.plan(1, 1 << 20, k, io, op)["tile_length"]  # noqa: E731
    assert t(4000, sparse_sim.FORWARD) < t(8, sparse_sim.FORWARD)
    assert t(8, sparse_sim.BACKWARD) < t(8, sparse_sim.FORWARD) and t(8, sparse_sim.FORWARD, 2) > t(8, 0)
    # refused: no ids, more than kMaxIds, a UB without room for one tile
    assert sim32.plan(1, 100, 0, 4, sparse_sim.FORWARD) is None
    assert sim32.plan(1, 100, sim32.const["max_ids"] + 1, 4, sparse_sim.FORWARD) is None
    assert sim32.plan(1, 100, 8, 4, sparse_sim.FORWARD, ub=api + 1024) is None
    assert sim32.plan(1, 100, 8, 3, sparse_sim.FORWARD) is None and sim32.plan(1, 100, 8, 4, 2) is None
    assert ascend.SPARSE_MAX_IDS == sim32.const["max_ids"]


@needs_compiler
@pytest.mark.parametrize("rows", [0, 1, 7, 40, 41, 12345])
@pytest.mark.parametrize("cores", CORES)
def test_sparse_every_row_exactly_once(sim32, rows, cores):
    plan = sim32.plan(rows, 4096, 16, 4, sparse_sim.FORWARD, cores=cores)
    assert plan["used_cores"] == max(1, min(rows, cores))
    pos = 0
    for core in range(plan["used_cores"]):
        start, length = sim32.row_range(plan, core)
        assert start == pos and length in (rows // plan["used_cores"], rows // plan["used_cores"] + 1)
        pos += length
    assert pos == rows


@needs_compiler
@pytest.mark.parametrize("vocab", [1, 7, 255, 257, 32000, 152064, 262144])
def test_sparse_tile_counts(sim32, vocab):
    """A row is whole tiles plus one ragged tile; short rows get one tile no longer than needed."""
    for op in (sparse_sim.FORWARD, sparse_sim.BACKWARD):
        for io in (2, 4):
            full = sim32.plan(3, 1 << 20, 64, io, op)["tile_length"]
            tile = sim32.plan(3, vocab, 64, io, op)["tile_length"]
            assert tile == min(full, -(-vocab // 256) * 256)
            n = sim32.tile_count(vocab, tile)
            assert (n - 1) * tile < vocab <= n * tile
    assert sim32.tile_count(152064, sim32.plan(3, 1 << 20, 64, 4, sparse_sim.FORWARD)["tile_length"]) > 10


@needs_compiler
def test_sparse_kernel_ub_footprint_matches_the_plan(sim32):
    """What the kernels' InitBuffer calls allocate on the stand-in is what the tiling budgeted, below the API's
    reserve (the stand-in also refuses any allocation reaching it)."""
    s, ids, vals = _teacher(2, 1 << 15, 100, seed=11)
    stats = sim32.forward(s, ids, vals, cores=2)
    for op, run in ((sparse_sim.FORWARD, lambda: sim32.forward(s, ids, vals, cores=2)),
                    (sparse_sim.BACKWARD, lambda: sim32.backward(s, ids, vals, stats, np.ones(2), cores=2))):
        run()
        plan = sim32.plan(2, 1 << 15, 100, 4, op)
        used = sim32.max_ub_used()
        assert _sparse_bytes(sim32, op, 4, plan["tile_length"], plan["id_lanes"]) == used, op
        assert used <= plan["ub_bytes_used"] <= sparse_sim.ASCEND910B_UB - sim32.const["api_ub_reserve_bytes"]


# --------------------------------------------------------------------------------------- the Python backend
def test_sparse_op_is_declared_and_harmless_off_ascend():
    """Importable and constructible on CPU: the Custom primitives are only launched on Ascend."""
    assert (ascend.SPARSE_OP_NAME, ascend.SPARSE_GRAD_OP_NAME) == ("SparseDistillCustom", "SparseDistillCustomGrad")
    assert "sparse_distillation" in ascend.AscendAotBackend.ops
    kernels = ascend.AscendCSparseKernels()
    assert ms.float64 not in kernels.dtypes
    fwd, bwd = kernels.forward(2.0, 0.5, 0.5, True), kernels.backward(2.0, 0.5, 0.5, True)
    assert isinstance(fwd, ascend._SparseKernelForward) and isinstance(bwd, ascend._SparseKernelBackward)
    assert (fwd.temperature, fwd.ratio, fwd.beta, fwd.tail) == (2.0, 0.5, 0.5, True)
    # no rows (known when compiling), or more ids than the kernels hold: the composite kernels inside the Cells
    fb = ascend._sparse_fallback_fn
    assert fb((0, 5, 10), (0, 5, 3)) and fb((4, 10), (4, ascend.SPARSE_MAX_IDS + 1))
    assert not fb((4, 10), (4, ascend.SPARSE_MAX_IDS)) and not fb((-1, 10), (-1, 3)) and not fb((None, 10), (None, 3))


def test_sparse_ops_detected_in_an_installed_package(clean_env, tmp_path):
    """An older package (no sparse operators) leaves 'sparse_distillation' to another backend, with the reason."""
    from ms_kldiv import backends
    old = fake_vendor(str(tmp_path), name="old", ops_in_json=ALL_OPS[:4])
    clean_env.setenv("ASCEND_CUSTOM_OPP_PATH", old)
    ascend._find_custom_opp.cache_clear()
    assert not ascend.sparse_ops_installed() and ascend.distill_ops_installed()
    reason = backends.get("aot", "Ascend").unavailable_reason("Ascend", "sparse_distillation")
    assert "SparseDistillCustom" in reason and "rebuild" in reason
    assert backends.get("aot", "Ascend").unavailable_reason("Ascend", "distillation") is None
    new = fake_vendor(str(tmp_path), name="new", ops_in_json=ALL_OPS)
    clean_env.setenv("ASCEND_CUSTOM_OPP_PATH", new)
    ascend._find_custom_opp.cache_clear()
    assert ascend.sparse_ops_installed()
    assert backends.get("aot", "Ascend").unavailable_reason("Ascend", "sparse_distillation") is None
    assert isinstance(backends.get("aot", "Ascend").sparse_kernels("Ascend"), ascend.AscendCSparseKernels)


class SimulatedSparseKernels:
    """The AscendCSparseKernels contract, computed by op_kernel/sparse_distill_custom*.cpp on the CPU stand-in."""

    dtypes = (ms.float16, ms.bfloat16, ms.float32)
    _NAMES = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}

    def __init__(self, cores=3):
        self.cores = cores
        self.calls = []

    def _sim(self, np_dtype):
        return sparse_sim.simulator(self._NAMES[np.dtype(np_dtype)])

    def forward(self, temperature, ratio, beta, tail):
        def kernel(s, ids, values):
            self.calls.append("forward")
            return self._sim(s.dtype).forward(s, ids, values, temperature, ratio, beta, tail, cores=self.cores)

        return _ascend_common.Bound(ops.Custom(kernel, out_shape=lambda s, i, v: list(s[:-1]) + [8],
                                               out_dtype=lambda s, i, v: ms.float32, func_type="pyfunc"))

    def backward(self, temperature, ratio, beta, tail):
        def kernel(s, ids, values, stats, dloss):
            self.calls.append("backward")
            ds = self._sim(s.dtype).backward(s, ids, values, stats, dloss, temperature, ratio, beta, tail,
                                             cores=self.cores)
            return np.asarray(ds, s.dtype)

        return _ascend_common.Bound(ops.Custom(kernel, out_shape=lambda s, *_: s, out_dtype=lambda s, *_: s,
                                               func_type="pyfunc"))


class _LossAndGrad(nn.Cell):
    def __init__(self, mode, temperature, teacher_temperature, beta):
        super().__init__()
        self.mode, self.temperature, self.teacher_temperature, self.beta = mode, temperature, teacher_temperature, beta
        self.grad = ops.GradOperation()(_Loss(mode, temperature, teacher_temperature, beta))
        self.loss = _Loss(mode, temperature, teacher_temperature, beta)

    def construct(self, s, ids, values, labels):
        return self.loss(s, ids, values, labels), self.grad(s, ids, values, labels)


class _Loss(nn.Cell):
    def __init__(self, mode, temperature, teacher_temperature, beta):
        super().__init__()
        self.mode, self.temperature, self.teacher_temperature, self.beta = mode, temperature, teacher_temperature, beta

    def construct(self, s, ids, values, labels):
        return ms_kldiv.sparse_distillation_loss(s, ids, values, mode=self.mode, temperature=self.temperature,
                                                 teacher_temperature=self.teacher_temperature, beta=self.beta,
                                                 labels=labels, backend="aot")


@needs_compiler
@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_sparse_loss_takes_the_ascendc_kernels(clean_env, tmp_path, monkeypatch, mode):
    """On Ascend with the stored-teacher operators installed, ``sparse_distillation_loss(backend='aot')`` runs the
    AscendC kernels: with the device target read as 'Ascend', an installed package faked and the kernels run on the
    AscendC stand-in, the value and the student's gradient equal the float64 definition (ignored rows included),
    and the stand-in's kernels are the ones that ran."""
    from ms_kldiv import backends
    from conftest import graph_mode
    sparse_mod = sys.modules["ms_kldiv.sparse_distillation"]

    vendor = fake_vendor(tmp_path, ops_in_json=ALL_OPS)
    clean_env.setenv("ASCEND_CUSTOM_OPP_PATH", vendor)
    simulated = SimulatedSparseKernels()
    monkeypatch.setattr(ascend.AscendAotBackend, "sparse_kernels", lambda self, device: simulated)
    monkeypatch.setattr(backends, "device_target", lambda: "Ascend")
    monkeypatch.setattr(sparse_mod, "_device_target_const", ms.ops.constexpr(lambda: "Ascend"))
    backends._kernels.cache_clear()
    sparse_mod._rows_op.cache_clear()
    try:
        rows = {r["name"]: r for r in backends.backend_info("Ascend", op="sparse_distillation")}
        assert rows["aot"]["available"] and rows["aot"]["auto"], rows
        s_np, ids_np, vals_np = _teacher(6, 700, 12, seed=12)
        ids_np[2, 4:] = -1
        labels_np = np.array([1, -100, 3, 4, 5, -100], np.int32)
        s_np[1] = np.nan  # an ignored row: never read
        for mode_, beta, temperature, t0 in (("tail", 0.5, 2.0, 1.0), ("renormalize", 0.0, 1.0, 1.0)):
            cell = _LossAndGrad(mode_, temperature, t0, beta)
            args = (ms.Tensor(s_np), ms.Tensor(ids_np), ms.Tensor(vals_np), ms.Tensor(labels_np))
            if mode == "graph":
                with graph_mode():
                    loss, ds = cell(*args)
            else:
                loss, ds = cell(*args)
            want = ref.sparse_distillation_loss(s_np, ids_np, vals_np, mode_, temperature, t0, beta,
                                                labels=labels_np)
            np.testing.assert_allclose(to_numpy(loss), want, rtol=1e-5, err_msg=f"{mode_} value")
            keep = labels_np != -100
            g = keep / keep.sum()
            eds = sparse_sim.reference_grads_f64(np.where(keep[:, None], s_np, 0), np.where(keep[:, None], ids_np, -1),
                                                 vals_np, mode_, temperature, t0, beta, g)
            eds = np.where(keep[:, None], eds, 0.0)
            got = to_numpy(ds)
            np.testing.assert_allclose(got, eds, rtol=1e-4, atol=1e-7, err_msg=f"{mode_} d_student")
            assert (got[~keep] == 0).all()
        assert "forward" in simulated.calls and "backward" in simulated.calls, simulated.calls
    finally:
        backends._kernels.cache_clear()
        sparse_mod._rows_op.cache_clear()


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_sparse_kernels_route_what_they_do_not_take(mode):
    """AscendCSparseKernels (the real Cells): no rows, or more ids a row than the kernels hold, run the composite
    kernels inside the Cells, decided when compiling (the AscendC primitive is never reached, so this runs on CPU);
    their forward and backward agree with the float64 definition."""
    from conftest import graph_mode
    kernels = ascend.AscendCSparseKernels()
    fwd, bwd = kernels.forward(1.0, 1.0, 0.5, True), kernels.backward(1.0, 1.0, 0.5, True)
    k = ascend.SPARSE_MAX_IDS + 1
    s, ids, vals = _teacher(2, k + 50, k, seed=13)
    g = np.array([1.0, 0.5], np.float32)
    empty = (np.zeros((0, 9), np.float32), np.zeros((0, 2), np.int32), np.zeros((0, 2), np.float32))

    def run():
        stats = fwd(ms.Tensor(s), ms.Tensor(ids), ms.Tensor(vals))
        ds = bwd(ms.Tensor(s), ms.Tensor(ids), ms.Tensor(vals), stats, ms.Tensor(g))
        stats0 = fwd(*[ms.Tensor(a) for a in empty])
        return to_numpy(stats), to_numpy(ds), tuple(stats0.shape)

    if mode == "graph":
        with graph_mode():
            stats, ds, shape0 = run()
    else:
        stats, ds, shape0 = run()
    assert shape0 == (0, 8)
    np.testing.assert_allclose(stats[:, 0], ref.sparse_distillation_rows(s, ids, vals, "tail", 1.0, 1.0, 0.5),
                               rtol=1e-5)
    want = sparse_sim.reference_grads_f64(s, ids, vals, "tail", 1.0, 1.0, 0.5, g)
    np.testing.assert_allclose(ds, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())  # composite float32
