"""The loss menu in the AscendC distillation operators (custom_ops/ascend/op_kernel/distill_custom*.cpp): the
divergences besides the 'kl' family (TVD, skew KL, skew reverse KL, symmetric KL) and the logits' transform (soft
cap, logit scale), run on the CPU stand-in of AscendC (tests/ascend/distill_sim.py) against the float64 reference
ms_kldiv.reference.distillation_pointwise; the gradients against a float64 closed form
(distill_sim.reference_variant_grads_f64), itself checked against central differences of the reference here.
The Python wiring (ms_kldiv.distillation_loss on a faked Ascend device) is in test_ascend_distill.py.
"""
import numpy as np
import pytest

from ms_kldiv import reference as ref

from _ascend_common import distill_sim, needs_compiler

pytestmark = needs_compiler

V = distill_sim.Variant
VARIANTS = {
    "tvd": (0.0, V("tvd", 0.0, 0.0, 1.0)),
    "skew_kl_0.1": (0.0, V("skew_kl", 0.1, 0.0, 1.0)),
    "skew_kl_0.6": (0.0, V("skew_kl", 0.6, 0.0, 1.0)),
    "skew_rkl_0.1": (0.0, V("skew_rkl", 0.1, 0.0, 1.0)),
    "symmetric_0.3": (0.0, V("symmetric_kl", 0.3, 0.0, 1.0)),
    "tvd_cap3_scale0.5": (0.0, V("tvd", 0.0, 3.0, 0.5)),
    "jsd_cap3_scale0.5": (0.5, V("kl", 0.0, 3.0, 0.5)),
    "fkl_scale2": (0.0, V("kl", 0.0, 0.0, 2.0)),
    "skew_rkl_cap3_scale0.5": (1.0, V("skew_rkl", 0.1, 3.0, 0.5)),
}
_SIMS = {}


def _sim(dtype):
    if dtype not in _SIMS:
        _SIMS[dtype] = distill_sim.DistillKernelSimulator(dtype)
    return _SIMS[dtype]


def _pointwise(s, t, temperature, beta, v):
    return ref.distillation_pointwise(s, t, temperature, beta, v.divergence, v.alpha, v.softcap, v.logit_scale)


def _transformed(z, v):
    return ref.transformed(z, v.softcap, v.logit_scale)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_menu_gradient_reference_is_the_derivative(name):
    """The float64 closed form of both gradients against central differences of the float64 loss."""
    beta, v = VARIANTS[name]
    rng = np.random.default_rng(3)
    s, t = rng.standard_normal((3, 6)) * 2, rng.standard_normal((3, 6)) * 2
    g = rng.uniform(0.5, 1.5, 3)
    ds, dt = distill_sim.reference_variant_grads_f64(s, t, 1.5, beta, v, g)

    def loss(s_, t_):
        return float((_pointwise(s_, t_, 1.5, beta, v).sum(-1) * g).sum())

    for arr, got in ((s, ds), (t, dt)):
        fd = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            old = arr[i]
            arr[i] = old + 1e-6
            hi = loss(s, t)
            arr[i] = old - 1e-6
            lo = loss(s, t)
            arr[i] = old
            fd[i] = (hi - lo) / 2e-6
        np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8, err_msg=name)


def _mag(s, t, temperature, v):
    """Per-element size of what the kernel adds up (|log p| weighted by both probabilities, of the transformed
    logits): the float32 cancellation scale."""
    ls = distill_sim.log_softmax_f64(_transformed(s, v), temperature)
    lt = distill_sim.log_softmax_f64(_transformed(t, v), temperature)
    with np.errstate(all="ignore"):
        size = np.abs(np.where(np.isfinite(ls), ls, 0.0)) + np.abs(np.where(np.isfinite(lt), lt, 0.0)) + 1.0
    return (np.exp(ls) + np.exp(lt)) * size


def _check(sim, s, t, temperature, beta, v, g, cores, what, loss_rtol=4e-6, grad_rtol=4e-6):
    sq, tq = distill_sim.quantize(s, sim.dtype), distill_sim.quantize(t, sim.dtype)
    stats = sim.forward(sq, tq, temperature, beta, cores=cores, variant=v)
    exp_loss = _pointwise(sq, tq, temperature, beta, v).sum(-1)
    mag = _mag(sq, tq, temperature, v)
    loss = stats[:, 0].astype(np.float64)
    assert np.isfinite(exp_loss).all() and np.isfinite(loss).all(), (what, loss)
    err = np.abs(loss - exp_loss)
    row_mag = temperature ** 2 * mag.sum(-1)
    assert (err <= loss_rtol * row_mag).all(), (what, err.max(), (err / row_mag).max())

    ds, dt = sim.backward(sq, tq, stats, g, temperature, beta, teacher_grad=True, cores=cores, variant=v)
    eds, edt = distill_sim.reference_variant_grads_f64(sq, tq, temperature, beta, v, g)
    gmag = np.abs(g.astype(np.float64))[:, None] * temperature * mag * max(v.logit_scale, 1.0)
    tol_io = {"float32": 0.0, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[sim.dtype]
    floor = 2.0 ** -24 if sim.dtype == "float16" else 1e-36
    live = g != 0
    for got, exp, name in ((ds, eds, "d_student"), (dt, edt, "d_teacher")):
        e, gv = exp[live], got[live].astype(np.float64)
        bad = ~(np.abs(gv - e) <= grad_rtol * gmag[live] + tol_io * np.abs(e) + floor)
        assert not bad.any(), (what, name, int(bad.sum()), gv[bad][:3], e[bad][:3])
        assert (got[~live] == 0).all(), (what, name, "rows with g = 0 must be exact zeros")
    return stats, ds, dt


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_menu_kernels_against_float64(dtype, name):
    """Every divergence / transform, each IO dtype: rows of several tiles (a ragged last one), -inf vocabulary
    padding shared by both models (and a whole tile of it), a row with dloss == 0 (exact zeros), rows not a multiple
    of the cores."""
    beta, v = VARIANTS[name]
    sim = _sim(dtype)
    kind = sim.kind_of(beta, v)
    io = 4 if dtype == "float32" else 2
    tile = sim.plan(4, 1 << 20, io, distill_sim.FORWARD, kind, softcap=v.softcap > 0)["tile_length"]
    vocab = 2 * tile + 77
    rng = np.random.default_rng(len(name) + io)
    s = (rng.standard_normal((6, vocab)) * 3).astype(np.float32)
    t = (rng.standard_normal((6, vocab)) * 3 + 0.5).astype(np.float32)
    s[0, ::5] = t[0, ::5] = -np.inf            # shared padding
    s[1, :tile] = t[1, :tile] = -np.inf        # a whole first tile of it: the running shifts start at 0
    s[3, -50:] = t[3, -50:] = -np.inf          # padding at the end, in the ragged last tile
    g = np.array([1.0, 0.7, 1.3, 0.9, 0.0, 1.1], np.float32)  # row 4 ignored
    _check(sim, s, t, 2.0, beta, v, g, cores=4, what=f"{dtype} {name}")


@pytest.mark.parametrize("beta, divergence", [(0.0, "kl"), (0.5, "kl"), (0.0, "tvd")])
def test_menu_softcap_keeps_padding_masked(beta, divergence):
    """Soft cap 3 with -inf vocabulary padding in both models (scattered, a whole last tile and more, a whole first
    tile): the cap keeps -inf at -inf (custom_ops/common/distill_math.h transform_apply), so the padded classes
    contribute exactly 0 (the loss is the float64 reference's, and that of the rows without those columns) and get
    exact 0 gradients. The old kernels mapped -inf to the finite -cap: mass for classes that have none."""
    sim = _sim("float32")
    v = V(divergence, 0.0, 3.0, 1.0)
    kind = sim.kind_of(beta, v)
    tile = sim.plan(4, 1 << 20, 4, distill_sim.FORWARD, kind, softcap=True)["tile_length"]
    vocab = 2 * tile + 77
    rng = np.random.default_rng(21)
    s = (rng.standard_normal((4, vocab)) * 3).astype(np.float32)
    t = (rng.standard_normal((4, vocab)) * 3 + 0.5).astype(np.float32)
    pad = np.zeros((4, vocab), bool)
    pad[0, ::7] = True                    # scattered
    pad[1, -(tile + 77):] = True          # the ragged last tile and the end of the one before
    pad[2, :tile] = True                  # a whole first tile: the running shifts start at 0
    s[pad] = t[pad] = -np.inf
    temperature, g = 2.0, np.array([1.0, 0.7, 1.3, 0.9], np.float32)

    stats = sim.forward(s, t, temperature, beta, cores=3, variant=v)
    loss = stats[:, 0].astype(np.float64)
    pointwise = _pointwise(s, t, temperature, beta, v)
    assert (pointwise[pad] == 0).all()
    exp = pointwise.sum(-1)
    np.testing.assert_allclose(loss, exp, rtol=2e-6, atol=1e-7, err_msg=str(v))
    for r in range(4):  # the row without its padded columns: the same loss
        keep = ~pad[r]
        alone = sim.forward(s[r:r + 1, keep], t[r:r + 1, keep], temperature, beta, cores=1, variant=v)
        np.testing.assert_allclose(stats[r, 0], alone[0, 0], rtol=2e-6, atol=1e-7, err_msg=f"{v} row {r}")
    # what -inf -> -cap would have given (padding as a very negative finite logit): far off
    old = _pointwise(np.where(pad, -1e30, s), np.where(pad, -1e30, t), temperature, beta, v).sum(-1)
    assert (np.abs(old[:3] - exp[:3]) > 1e-3 * np.abs(exp[:3]) + 1e-4).all(), (old, exp)

    ds, dt = sim.backward(s, t, stats, g, temperature, beta, teacher_grad=True, cores=3, variant=v)
    assert (ds[pad] == 0).all() and (dt[pad] == 0).all(), str(v)
    eds, edt = distill_sim.reference_variant_grads_f64(s, t, temperature, beta, v, g)
    assert (eds[pad] == 0).all() and (edt[pad] == 0).all()
    scale = max(np.abs(eds).max(), np.abs(edt).max())
    np.testing.assert_allclose(ds, eds, rtol=1e-4, atol=1e-5 * scale, err_msg=f"{v} d_student")
    np.testing.assert_allclose(dt, edt, rtol=1e-4, atol=1e-5 * scale, err_msg=f"{v} d_teacher")


@pytest.mark.parametrize("name", ["tvd", "skew_kl_0.1", "skew_rkl_0.1", "symmetric_0.3", "jsd_cap3_scale0.5",
                                  "tvd_cap3_scale0.5"])
def test_menu_row_without_distribution_is_marked(name):
    """A row whose student has no distribution (every logit -inf, a NaN, a +inf): the kernel's loss is NaN or its
    student log-normalizer (stats column 1, which ms_kldiv.backends.distill.row_loss adds 0 x) is not finite, so
    the loss the API returns is NaN, as the reference's; the other rows keep their losses. Under a soft cap a +inf
    logit is the cap (the old transform gave NaN there)."""
    beta, v = VARIANTS[name]
    sim = _sim("float32")
    rng = np.random.default_rng(31)
    s = (rng.standard_normal((4, 300)) * 3).astype(np.float32)
    t = (rng.standard_normal((4, 300)) * 3).astype(np.float32)
    s[0], t[0] = -np.inf, -np.inf
    s[1, 7] = np.nan
    s[2, :] = -np.inf
    s[2, 5] = np.inf
    stats = sim.forward(s, t, 2.0, beta, cores=3, variant=v)
    with np.errstate(invalid="ignore"):
        marked = stats[:, 0] + 0.0 * stats[:, 1]
    exp = _pointwise(s, t, 2.0, beta, v).sum(-1)
    # a soft cap maps +inf to the finite cap: that row (2) has a distribution, as in the reference
    no_distribution = [0, 1] if v.softcap > 0 else [0, 1, 2]
    assert np.isnan(exp[no_distribution]).all() and np.isnan(marked[no_distribution]).all(), (name, stats[:3, :2])
    finite = [r for r in range(4) if r not in no_distribution]
    np.testing.assert_allclose(marked[finite], exp[finite], rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("divergence", ["skew_kl", "skew_rkl"])
def test_menu_skew_with_alpha_zero(divergence):
    """alpha = 0 (the mixture is the other model alone): a class only the weighted model keeps gives +inf, as in
    the reference; where the other model's log-probability is -150 (its probability underflows float32) the row loss
    and both gradients are the reference's."""
    v = V(divergence, 0.0, 0.0, 1.0)
    sim = _sim("float32")
    kept = np.tile(np.array([[0.0, 1.0, 2.0, 3.0], [0.5, 0.1, -1.0, 2.0]], np.float32), (1, 75))
    other = kept.copy()
    other[0, 3] = -np.inf
    other[1, 3] = -300.0
    s, t = (other, kept) if divergence == "skew_kl" else (kept, other)
    stats = sim.forward(s, t, 2.0, 0.0, cores=2, variant=v)
    expected = _pointwise(s, t, 2.0, 0.0, v).sum(-1)
    assert stats[0, 0] == np.inf == expected[0]
    np.testing.assert_allclose(stats[1, 0], expected[1], rtol=2e-6)
    g = np.array([0.0, 0.8], np.float32)  # the +inf row's gradient is not defined
    ds, dt = sim.backward(s, t, stats, g, 2.0, 0.0, teacher_grad=True, cores=2, variant=v)
    eds, edt = distill_sim.reference_variant_grads_f64(s[1:], t[1:], 2.0, 0.0, v, g[1:])
    np.testing.assert_allclose(ds[1:], eds, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(dt[1:], edt, rtol=2e-5, atol=1e-6)


def test_menu_large_logits_small_temperature():
    """|z| ~ 1e3 and T = 0.25 without a cap (scale 2): no overflow, finite stats; with a cap of 3 every logit is
    within 3, however large."""
    sim = _sim("float32")
    rng = np.random.default_rng(5)
    s = (rng.standard_normal((3, 1000)) * 1e3).astype(np.float32)
    t = (s + rng.standard_normal((3, 1000)) * 5).astype(np.float32)
    g = np.ones(3, np.float32)
    for beta, v in ((0.0, V("tvd", 0.0, 0.0, 2.0)), (0.0, V("symmetric_kl", 0.3, 0.0, 1.0)),
                    (0.0, V("skew_kl", 0.1, 3.0, 1.0)), (0.5, V("kl", 0.0, 3.0, 1.0))):
        stats, ds, dt = _check(sim, s, t, 0.25, beta, v, g, cores=2, what=f"large {v}", loss_rtol=2e-5,
                               grad_rtol=2e-5)
        assert np.isfinite(stats[:, :5]).all() and np.isfinite(ds).all() and np.isfinite(dt).all()


def test_menu_frozen_teacher_and_core_count():
    """teacher_grad=False: d_student is the same bits (a skew KL's student is its Q side, a skew reverse KL's its P
    side); the split over cores changes nothing, bit for bit."""
    sim = _sim("float32")
    rng = np.random.default_rng(4)
    s = rng.standard_normal((7, 3000)).astype(np.float32) * 2
    t = rng.standard_normal((7, 3000)).astype(np.float32) * 2
    g = np.linspace(0.5, 1.5, 7).astype(np.float32)
    for beta, v in ((0.0, V("tvd", 0.0, 3.0, 0.5)), (0.0, V("skew_kl", 0.1, 0.0, 1.0)),
                    (0.0, V("skew_rkl", 0.1, 0.0, 2.0)), (0.0, V("symmetric_kl", 0.3, 0.0, 1.0))):
        stats = sim.forward(s, t, 2.0, beta, cores=1, variant=v)
        for cores in (3, 7):
            np.testing.assert_array_equal(sim.forward(s, t, 2.0, beta, cores=cores, variant=v), stats)
        ds_both, _ = sim.backward(s, t, stats, g, 2.0, beta, teacher_grad=True, cores=3, variant=v)
        ds_only, dt = sim.backward(s, t, stats, g, 2.0, beta, teacher_grad=False, cores=3, variant=v)
        assert dt is None
        np.testing.assert_array_equal(ds_only, ds_both, err_msg=str(v))


def test_menu_ub_footprint_matches_the_plan():
    """What the kernels allocate on the stand-in is what the tiling budgeted for the two-pass kinds and the soft
    cap's slope tiles (one per gradient the backward writes), below the API's reserve."""
    sim = _sim("float32")
    rng = np.random.default_rng(1)
    s, t = (rng.standard_normal((2, 1 << 15)).astype(np.float32) for _ in range(2))
    api = sim.const["api_ub_reserve_bytes"]
    for v in (V("tvd", 0.0, 0.0, 1.0), V("skew_rkl", 0.1, 3.0, 1.0), V("kl", 0.0, 3.0, 0.5)):
        kind = sim.kind_of(0.0, v)
        cap = v.softcap > 0
        stats = sim.forward(s, t, 1.0, 0.0, cores=2, variant=v)
        for op, teacher in ((distill_sim.FORWARD, None), (distill_sim.BACKWARD_BOTH, True),
                            (distill_sim.BACKWARD_STUDENT, False)):
            if teacher is None:
                sim.forward(s, t, 1.0, 0.0, cores=2, variant=v)
            else:
                sim.backward(s, t, stats, np.ones(2, np.float32), 1.0, 0.0, teacher, cores=2, variant=v)
            plan = sim.plan(2, 1 << 15, 4, op, kind, softcap=cap)
            tile = plan["tile_length"]
            queues = {distill_sim.FORWARD: 2, distill_sim.BACKWARD_STUDENT: 3, distill_sim.BACKWARD_BOTH: 4}[op]
            work = (5 if kind >= distill_sim.JSD else 4) + (0 if not cap or teacher is None else 2 if teacher else 1)
            want = sim.const["buffer_num"] * queues * 4 * tile + work * 4 * tile + tile // 8
            want += (tile // 32 + 64) * 4 + 64 * 4 + 32 if op == distill_sim.FORWARD else 64
            assert sim.max_ub_used() == want, (v, op)
            assert want <= plan["ub_bytes_used"] <= distill_sim.ASCEND910B_UB - api
    # the cap's slopes cost the backward UB, not the forward
    kind = distill_sim.TVD
    assert sim.plan(1, 1 << 20, 4, distill_sim.FORWARD, kind, softcap=True) == \
        sim.plan(1, 1 << 20, 4, distill_sim.FORWARD, kind)
    assert sim.plan(1, 1 << 20, 4, distill_sim.BACKWARD_BOTH, kind, softcap=True)["tile_length"] < \
        sim.plan(1, 1 << 20, 4, distill_sim.BACKWARD_BOTH, kind)["tile_length"]


def test_menu_attributes_out_of_range_are_refused():
    """The tiling refuses what the Python layer never sends: an unknown divergence code, a skew alpha of 1, a
    negative soft cap, a logit scale of 0."""
    sim = _sim("float32")
    s = np.zeros((2, 8), np.float32)
    for v in (V("tvd", 0.0, -1.0, 1.0), V("skew_kl", 1.0, 0.0, 1.0), V("kl", 0.0, 0.0, 0.0)):
        with pytest.raises(RuntimeError, match="tiling refused"):
            sim.forward(s, s, 1.0, 0.0, cores=1, variant=v)
    hyper = sim._hyper(1.0, 0.0, None)
    hyper[2] = 5  # no such divergence
    out = np.empty(16, np.float32)
    assert sim.lib.distill_sim_forward(sim._ptr(s.reshape(-1)), sim._ptr(s.reshape(-1)), sim._ptr(out), 2, 8,
                                       sim._ptr(hyper), 1, distill_sim.ASCEND910B_UB) == 1


def test_menu_plans_fit_below_the_api_reserve():
    """Every kind, op, IO size and UB size, with and without the soft cap: aligned tiles whose buffers stay below the
    API's reserved top of the UB."""
    sim = _sim("float32")
    api = sim.const["api_ub_reserve_bytes"]
    for ub in (192 * 1024, 256 * 1024, 64 * 1024):
        for kind in range(distill_sim.SYMMETRIC + 1):
            for op in (distill_sim.FORWARD, distill_sim.BACKWARD_STUDENT, distill_sim.BACKWARD_BOTH):
                for io in (2, 4):
                    for cap in (False, True):
                        plan = sim.plan(8, 1 << 20, io, op, kind, ub=ub, softcap=cap)
                        tile = plan["tile_length"]
                        assert tile % sim.const["tile_align"] == 0 and 0 < tile <= sim.const["max_tile"]
                        assert plan["ub_bytes_used"] <= ub - api, (ub, kind, op, io, cap)
    assert sim.plan(1, 100, 4, distill_sim.FORWARD, distill_sim.SYMMETRIC + 1) is None  # no such kind
