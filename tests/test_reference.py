"""The float64 reference's own derivatives agree with central differences of the function they differentiate
(the loss for the gradients, the gradients for the second derivatives), including masked lanes."""
import numpy as np
import pytest

from ms_kldiv import reference as ref


def _central(f, a, h=1e-6):
    return (f(a + h) - f(a - h)) / (2 * h)


@pytest.mark.parametrize("log_target", [False, True])
def test_derivatives_match_central_differences(log_target):
    rng = np.random.default_rng(7)
    x = rng.normal(size=64)
    t = rng.normal(size=64) if log_target else rng.uniform(0.05, 2.0, size=64)
    t[:4] = -np.inf if log_target else [0.0, -1.0, 0.0, -3.0]  # no mass: every derivative is 0
    px, pt = ref.pointwise_grads(x, t, log_target)
    live = ref.has_mass(t, log_target)
    np.testing.assert_allclose(px[live], _central(lambda a: ref.pointwise_loss(a, t, log_target), x)[live], rtol=1e-6)
    np.testing.assert_allclose(pt[live], _central(lambda a: ref.pointwise_loss(x, a, log_target), t)[live], rtol=1e-6)
    xt, tx, tt = ref.pointwise_second(x, t, log_target)
    np.testing.assert_allclose(xt[live], _central(lambda a: ref.pointwise_grads(x, a, log_target)[0], t)[live],
                               rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(tx[live], _central(lambda a: ref.pointwise_grads(a, t, log_target)[1], x)[live],
                               rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(tt[live], _central(lambda a: ref.pointwise_grads(x, a, log_target)[1], t)[live],
                               rtol=1e-5, atol=1e-8)
    for arr in (px, pt, xt, tx, tt):
        assert np.all(arr[~live] == 0)


def test_sum_to_undoes_broadcasting():
    g = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(ref.sum_to(g, (3, 1)), g.sum(axis=0).sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(ref.sum_to(g, ()), g.sum())
    np.testing.assert_array_equal(ref.sum_to(g, (2, 3, 4)), g)
