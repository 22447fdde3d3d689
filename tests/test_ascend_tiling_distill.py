"""The fused distillation operators' kernels (custom_ops/ascend/op_kernel/distill_custom*.cpp) and their tiling plan
(op_kernel/distill_tiling_plan.h), run on the CPU: no Ascend device or CANN toolkit is needed.

The kernel sources are compiled against the AscendC stand-in (tests/ascend/distill_sim.py) and checked against the
float64 reference ms_kldiv.reference.distillation_pointwise; the plan is read from the C++ through the same library.
The KLDiv operators' tiling and kernels are in test_ascend_tiling_kldiv.py.
"""
import numpy as np
import pytest

from ms_kldiv import reference as ref

from _ascend_common import CORES, UBS, distill_sim, needs_compiler

pytestmark = needs_compiler

BETAS = (0.0, 0.5, 1.0)
TEMPS = (0.5, 1.0, 2.0)


@pytest.fixture(scope="module")
def dsim32():
    return distill_sim.DistillKernelSimulator("float32")


_log_softmax = distill_sim.log_softmax_f64
distill_grads_f64 = distill_sim.reference_grads_f64


def _distill_mag(student, teacher, temperature, beta):
    """Per-element size of what the kernel adds up for a row's loss and gradients (|log p| weighted by both
    probabilities, plus the log-mixture for JSD): the float32 cancellation scale. 0 where both have no mass."""
    ls, lt = _log_softmax(student, temperature), _log_softmax(teacher, temperature)
    ps, pt = np.exp(ls), np.exp(lt)
    with np.errstate(all="ignore"):
        size = np.abs(np.where(np.isfinite(ls), ls, 0.0)) + np.abs(np.where(np.isfinite(lt), lt, 0.0)) + 1.0
    return (ps + pt) * size


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_distill_gradient_reference_is_the_derivative(beta, temperature):
    """The float64 closed-form gradients used below against central differences of the float64 loss."""
    rng = np.random.default_rng(3)
    s, t = rng.standard_normal((3, 5)) * 2, rng.standard_normal((3, 5)) * 2
    g = rng.uniform(0.5, 1.5, 3)
    ds, dt = distill_grads_f64(s, t, temperature, beta, g)

    def loss(s_, t_):
        return float((ref.distillation_pointwise(s_, t_, temperature, beta).sum(-1) * g).sum())

    eps = 1e-6
    for arr, got in ((s, ds), (t, dt)):
        fd = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            old = arr[i]
            arr[i] = old + eps
            hi = loss(s, t)
            arr[i] = old - eps
            lo = loss(s, t)
            arr[i] = old
            fd[i] = (hi - lo) / (2 * eps)
        np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)


def _distill_inputs(rows, vocab, seed, scale=3.0):
    rng = np.random.default_rng(seed)
    s = (rng.standard_normal((rows, vocab)) * scale).astype(np.float32)
    t = (rng.standard_normal((rows, vocab)) * scale + 0.5).astype(np.float32)
    return s, t


def _check_distill(sim, s, t, temperature, beta, cores, g=None, grad_rtol=2e-6, loss_rtol=2e-6, what=""):
    """Runs forward + backward (both gradients) on the stand-in and compares with float64. Returns the stats."""
    rows = s.shape[0]
    sq, tq = distill_sim.quantize(s, sim.dtype), distill_sim.quantize(t, sim.dtype)
    stats = sim.forward(sq, tq, temperature, beta, cores=cores)
    assert stats.shape == (rows, 8)
    exp_loss = ref.distillation_pointwise(sq, tq, temperature, beta).sum(-1)
    mag = _distill_mag(sq, tq, temperature, beta)
    row_mag = temperature ** 2 * mag.sum(-1)
    loss = stats[:, 0].astype(np.float64)
    assert not np.isnan(loss).any(), what
    fin = np.isfinite(exp_loss)
    assert np.array_equal(loss[~fin], exp_loss[~fin]), what  # +inf exactly where the math says
    err = np.abs(loss[fin] - exp_loss[fin])
    assert (err <= loss_rtol * row_mag[fin]).all(), (what, err.max(), (err / row_mag[fin]).max())
    # The saved log-sum-exps of the scaled rows.
    for col, z in ((1, sq), (2, tq)):
        lse = np.log(np.exp(z.astype(np.float64) / temperature - (z.max(-1, keepdims=True) / temperature)).sum(-1)) \
            + z.max(-1) / temperature
        np.testing.assert_allclose(stats[:, col], lse, rtol=1e-6, atol=1e-6, err_msg=what)

    rng = np.random.default_rng(rows)
    g = rng.uniform(0.5, 1.5, rows).astype(np.float32) if g is None else np.asarray(g, np.float32)
    ds, dt = sim.backward(sq, tq, stats, g, temperature, beta, teacher_grad=True, cores=cores)
    eds, edt = distill_grads_f64(sq, tq, temperature, beta, g)
    gmag = np.abs(g.astype(np.float64))[:, None] * temperature * mag
    tol_io = {"float32": 0.0, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[sim.dtype]
    # Probabilities below float32's normal range (e^-87) underflow in the kernel: an absolute floor; float16's own
    # subnormal spacing for its outputs.
    floor = 2.0 ** -24 if sim.dtype == "float16" else 1e-36
    for got, exp, name in ((ds, eds, "d_student"), (dt, edt, "d_teacher")):
        rows_ok = fin & (g != 0)
        e, gv = exp[rows_ok], got[rows_ok].astype(np.float64)
        bad = ~(np.abs(gv - e) <= grad_rtol * gmag[rows_ok] + tol_io * np.abs(e) + floor)
        assert not bad.any(), (what, name, int(bad.sum()), gv[bad][:3], e[bad][:3])
        assert (got[g == 0] == 0).all(), (what, name, "rows with g = 0 must be exact zeros")
    return stats, ds, dt


def _tiles(sim, op, kind, io=4):
    """The plan's tile length for a long row (what a 152K row is cut into)."""
    return sim.plan(4, 1 << 20, io, op, kind)["tile_length"]


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("temperature", TEMPS)
def test_distill_kernel_float32_vocab_sizes(dsim32, beta, temperature):
    """V = 1, 7, forward tile - 1 and + 1, backward tile + 1 (ragged last tiles; V * 4 not a multiple of 32 B, so
    rows start inside 32 B blocks), rows not a multiple of the cores (7 rows on 3 cores, 41 on 40)."""
    kind = dsim32.kind_of_beta(beta)
    tf = _tiles(dsim32, distill_sim.FORWARD, kind)
    tb = _tiles(dsim32, distill_sim.BACKWARD_BOTH, kind)
    for vocab, rows, cores in ((1, 7, 3), (7, 41, 40), (tf - 1, 7, 3), (tf + 1, 5, 3), (tb + 1, 7, 40)):
        s, t = _distill_inputs(rows, vocab, seed=vocab + rows)
        _check_distill(dsim32, s, t, temperature, beta, cores, what=f"V={vocab} rows={rows} cores={cores}")


@pytest.mark.parametrize("beta", BETAS)
def test_distill_kernel_float32_qwen_vocab(dsim32, beta):
    """A 152,064-entry row (Qwen2's vocabulary): 27-55 tiles a row; 3 rows on 2 cores. Row 2's logits rise
    along the row, so both running maxima grow in every tile (every online rescale is exercised)."""
    s, t = _distill_inputs(3, 152064, seed=7)
    ramp = np.linspace(-30, 30, 152064, dtype=np.float32)
    s[2] += ramp
    t[2] += 1.1 * ramp
    for temperature in TEMPS:
        _check_distill(dsim32, s, t, temperature, beta, cores=2, what=f"152064 T={temperature}")


def test_distill_kernel_float32_largest_vocab(dsim32):
    """V = 262,144 (the largest the issue names): 47-74 tiles a row, ragged last tiles for most op/beta pairs."""
    s, t = _distill_inputs(2, 262144, seed=8)
    for beta in BETAS:
        _check_distill(dsim32, s, t, 1.0, beta, cores=2, what=f"262144 beta={beta}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("beta", BETAS)
def test_distill_kernel_half_inputs(dtype, beta):
    """float16/bfloat16 logits: float32 inside (the loss is float32 stats), gradients rounded once."""
    sim = distill_sim.DistillKernelSimulator(dtype)
    kind = sim.kind_of_beta(beta)
    tf = _tiles(sim, distill_sim.FORWARD, kind, io=2)
    for vocab, rows, cores in ((7, 9, 4), (tf + 1, 5, 3)):
        s, t = _distill_inputs(rows, vocab, seed=vocab)
        _check_distill(sim, s, t, 2.0, beta, cores, what=f"{dtype} V={vocab}")


@pytest.mark.parametrize("beta", BETAS)
def test_distill_kernel_masks(dsim32, beta):
    """-inf logits: shared by both (0), teacher-only, student-only (+inf where the weighting side has mass, exactly,
    never NaN), in one tile and across tiles; ignored rows (g = 0) give exact zero gradients."""
    kind = dsim32.kind_of_beta(beta)
    vocab = _tiles(dsim32, distill_sim.FORWARD, kind) * 2 + 77
    s, t = _distill_inputs(6, vocab, seed=11)
    s[0, ::5] = t[0, ::5] = -np.inf               # shared padding
    s[1, :vocab // 2] = t[1, :vocab // 2] = -np.inf  # a whole first tile masked in both: shifts start at 0
    t[2, 3::7] = -np.inf                          # teacher-only
    s[3, 5::11] = -np.inf                         # student-only
    s[4, -1] = -np.inf                            # student-only, in the last (ragged) tile
    t[5, 0] = -np.inf                             # teacher-only, first element
    g = np.array([1.0, 0.7, 1.3, 0.9, 1.1, 0.0], np.float32)  # row 5 ignored
    stats, ds, dt = _check_distill(dsim32, s, t, 1.5, beta, cores=4, g=g, what=f"masks beta={beta}")
    exp = ref.distillation_pointwise(s, t, 1.5, beta).sum(-1)
    inf_rows = {0.0: [3, 4], 1.0: [2, 5], 0.5: []}[beta]
    assert sorted(np.flatnonzero(np.isinf(stats[:, 0]))) == inf_rows
    assert sorted(np.flatnonzero(np.isinf(exp))) == inf_rows
    # In +inf rows, the gradient of the side whose formula stays finite: d/d(b) = T g (P_b - P_a).
    eds, edt = distill_grads_f64(s, t, 1.5, beta, g)
    for r in inf_rows:
        got, e = (ds[r], eds[r]) if beta == 0.0 else (dt[r], edt[r])
        if g[r]:
            np.testing.assert_allclose(got, e, rtol=1e-5, atol=1e-7)


def test_distill_kernel_large_logits_small_temperature(dsim32):
    """|z| ~ 1e4 and T = 0.05: no overflow, the KL terms are relative to the row maxima."""
    s, t = _distill_inputs(3, 1000, seed=5, scale=1.0)
    s = s * 1e4
    t = s + t * 10.0
    for beta in BETAS:
        stats = dsim32.forward(s, t, 0.05, beta, cores=2)
        assert np.isfinite(stats[:, :5]).all()
        _check_distill(dsim32, s, t, 0.05, beta, cores=2, loss_rtol=1e-5, grad_rtol=1e-5, what=f"large beta={beta}")


def test_distill_kernel_ignored_rows_never_read(dsim32):
    """g = 0 rows come back as exact zeros even when their stats are NaN (an ignored row's loss may be anything)."""
    s, t = _distill_inputs(4, 300, seed=2)
    for beta in BETAS:
        stats = dsim32.forward(s, t, 1.0, beta, cores=2)
        stats[1] = np.nan
        ds, dt = dsim32.backward(s, t, stats, np.array([1, 0, 1, 1], np.float32), 1.0, beta, cores=2)
        assert (ds[1] == 0).all() and (dt[1] == 0).all()
        assert np.isfinite(ds[[0, 2, 3]]).all() and np.isfinite(dt[[0, 2, 3]]).all()


def test_distill_kernel_frozen_teacher(dsim32):
    """teacher_grad=False: d_teacher is neither computed nor written; d_student is the same bits."""
    s, t = _distill_inputs(5, 9000, seed=4)
    for beta in BETAS:
        stats = dsim32.forward(s, t, 2.0, beta, cores=3)
        g = np.linspace(0.5, 1.5, 5).astype(np.float32)
        ds_both, _ = dsim32.backward(s, t, stats, g, 2.0, beta, teacher_grad=True, cores=3)
        ds_only, dt = dsim32.backward(s, t, stats, g, 2.0, beta, teacher_grad=False, cores=3)
        assert dt is None
        np.testing.assert_array_equal(ds_only, ds_both)


def test_distill_kernel_core_count_does_not_change_results(dsim32):
    """Rows are independent: the split over cores changes nothing, bit for bit."""
    s, t = _distill_inputs(13, 3000, seed=6)
    for beta in BETAS:
        a = dsim32.forward(s, t, 1.0, beta, cores=1)
        for cores in (2, 5, 13, 40):
            np.testing.assert_array_equal(dsim32.forward(s, t, 1.0, beta, cores=cores), a)


# -------------------------------------------------------------------------------------------- distill tiling
DISTILL_OPS = (distill_sim.FORWARD, distill_sim.BACKWARD_STUDENT, distill_sim.BACKWARD_BOTH)
DISTILL_KINDS = (distill_sim.FORWARD_KL, distill_sim.REVERSE_KL, distill_sim.JSD)


def _distill_bytes(sim, op, kind, io, tile):
    """The kernels' InitBuffer calls, listed: IO queues (double-buffered), float32 work tiles, the 1-bit mask,
    the forward's reduction work area, plus our fixed small buffers."""
    queues = {distill_sim.FORWARD: 2, distill_sim.BACKWARD_STUDENT: 3, distill_sim.BACKWARD_BOTH: 4}[op]
    work = 5 if kind == distill_sim.JSD else 4
    b = sim.const["buffer_num"] * queues * io * tile + work * 4 * tile + tile // 8
    if op == distill_sim.FORWARD:
        b += (tile // 32 + 64) * 4 + 64 * 4 + 32   # reduction work, scalar exchange, one stats row
    else:
        b += 32 + 32                               # one stats row, the row's gradient
    return b


@pytest.mark.parametrize("ub", UBS + (64 * 1024,))
def test_distill_tiles_fit_below_the_api_reserve(dsim32, ub):
    api = dsim32.const["api_ub_reserve_bytes"]
    assert api == 8192
    for op in DISTILL_OPS:
        for kind in DISTILL_KINDS:
            for io in (2, 4):
                plan = dsim32.plan(8, 1 << 20, io, op, kind, ub=ub)
                tile = plan["tile_length"]
                assert tile % dsim32.const["tile_align"] == 0 and 0 < tile <= dsim32.const["max_tile"]
                assert _distill_bytes(dsim32, op, kind, io, tile) <= plan["ub_bytes_used"] <= ub - api
                if tile < dsim32.const["max_tile"]:  # maximal: one more step would reach the reserve
                    bigger = tile + dsim32.const["tile_align"]
                    assert _distill_bytes(dsim32, op, kind, io, bigger) + dsim32.const["ub_reserve_bytes"] \
                        - (_distill_bytes(dsim32, op, kind, io, 0)) > ub - api
    # JSD needs one more work tile; a frozen teacher's backward one queue less; halves longer tiles.
    t = {(op, kind, io): dsim32.plan(1, 1 << 20, io, op, kind)["tile_length"]
         for op in DISTILL_OPS for kind in DISTILL_KINDS for io in (2, 4)}
    for io in (2, 4):
        assert t[(distill_sim.FORWARD, distill_sim.JSD, io)] < t[(distill_sim.FORWARD, distill_sim.FORWARD_KL, io)]
        assert t[(distill_sim.BACKWARD_STUDENT, distill_sim.FORWARD_KL, io)] \
            > t[(distill_sim.BACKWARD_BOTH, distill_sim.FORWARD_KL, io)]
    assert t[(distill_sim.FORWARD, distill_sim.FORWARD_KL, 2)] > t[(distill_sim.FORWARD, distill_sim.FORWARD_KL, 4)]
    assert dsim32.plan(1, 100, 4, distill_sim.FORWARD, distill_sim.FORWARD_KL, ub=api + 1024) is None


@pytest.mark.parametrize("rows", [0, 1, 7, 39, 40, 41, 1000, 12345])
@pytest.mark.parametrize("cores", CORES)
def test_distill_every_row_exactly_once(dsim32, rows, cores):
    plan = dsim32.plan(rows, 4096, 4, distill_sim.FORWARD, distill_sim.FORWARD_KL, cores=cores)
    assert plan["used_cores"] == max(1, min(rows, cores))
    pos = 0
    for core in range(plan["used_cores"]):
        start, length = dsim32.row_range(plan, core)
        assert start == pos and length in (rows // plan["used_cores"], rows // plan["used_cores"] + 1)
        pos += length
    assert pos == rows


@pytest.mark.parametrize("vocab", [1, 7, 255, 256, 257, 4095, 32000, 151936, 152064, 262144])
def test_distill_tile_counts(dsim32, vocab):
    """A row is covered by whole tiles plus one ragged tile; short rows get one tile no longer than needed."""
    for op in DISTILL_OPS:
        for kind in DISTILL_KINDS:
            for io in (2, 4):
                tile = dsim32.plan(3, vocab, io, op, kind)["tile_length"]
                full = _tiles(dsim32, op, kind, io)
                assert tile == min(full, -(-vocab // 256) * 256)
                n = dsim32.tile_count(vocab, tile)
                assert (n - 1) * tile < vocab <= n * tile
                last = vocab - (n - 1) * tile
                assert 0 < last <= dsim32.compute_count(last) <= tile
                assert dsim32.compute_count(last) % 64 == 0
    # 152,064 float32 entries: 608 KiB a row of each logit tensor, several times the whole UB.
    assert dsim32.tile_count(152064, _tiles(dsim32, distill_sim.FORWARD, distill_sim.FORWARD_KL)) > 20


def test_distill_kernel_ub_footprint_matches_the_plan(dsim32):
    """What the kernels' InitBuffer calls allocate on the stand-in is what the tiling budgeted, below the API's
    reserve (the stand-in also refuses any allocation reaching it)."""
    s, t = _distill_inputs(2, 1 << 16, seed=1)
    for beta in BETAS:
        kind = dsim32.kind_of_beta(beta)
        stats = dsim32.forward(s, t, 1.0, beta, cores=2)
        for op, run in ((distill_sim.FORWARD, lambda: dsim32.forward(s, t, 1.0, beta, cores=2)),
                        (distill_sim.BACKWARD_BOTH, lambda: dsim32.backward(s, t, stats, np.ones(2, np.float32), 1.0,
                                                                            beta, True, cores=2)),
                        (distill_sim.BACKWARD_STUDENT, lambda: dsim32.backward(s, t, stats, np.ones(2, np.float32),
                                                                               1.0, beta, False, cores=2))):
            run()
            plan = dsim32.plan(2, 1 << 16, 4, op, kind)
            used = dsim32.max_ub_used()
            assert _distill_bytes(dsim32, op, kind, 4, plan["tile_length"]) == used, (beta, op)
            assert used <= plan["ub_bytes_used"] <= distill_sim.ASCEND910B_UB - dsim32.const["api_ub_reserve_bytes"]
