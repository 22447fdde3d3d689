"""_validation.on_host: the argument checks run in Python on each Tensor's static shape and dtype, once per graph
compile (never in the graph), once per call in PyNative; unknown dims reach them as unknown; their errors are the
same in both modes."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn

from ms_kldiv import _validation

SEEN = []


def _record(x, scale, name):
    SEEN.append((type(x).__name__, tuple(_validation.shape_of(x)), x.dtype, x.ndim, scale, name))
    if scale <= 0:
        raise ValueError(f"For '{name}', 'scale' must be positive, but got {scale}.")
    return x.dtype


_recorded = _validation.on_host(_record)


class _Scaled(nn.Cell):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def construct(self, x):
        dtype = _recorded(_validation.described(x), self.scale, "scaled")
        return ms.ops.cast(x, dtype) * 2.0


def _dims(shape):
    """None for a dim unknown at compile time (MindSpore gives None or -1 by release)."""
    return tuple(None if d is None or d < 0 else d for d in shape)


def test_graph_checks_once_per_compile_on_the_static_shape():
    SEEN.clear()
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        cell = _Scaled(1.5)
        cell.set_inputs(ms.Tensor(shape=[None, 3], dtype=ms.float32))
        for rows in (2, 5, 0):
            out = cell(ms.Tensor(np.ones((rows, 3), np.float32)))
            np.testing.assert_array_equal(out.asnumpy(), np.full((rows, 3), 2.0, np.float32))
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    # one check, at the compile, on the dims known then; nothing of it runs with each call
    assert len(SEEN) == 1, SEEN
    kind, shape, dtype, ndim, scale, name = SEEN[0]
    assert kind == "TensorMeta" and _dims(shape) == (None, 3) and dtype == ms.float32 and ndim == 2
    assert (scale, name) == (1.5, "scaled")


def test_pynative_checks_every_call_on_the_tensor():
    SEEN.clear()
    cell = _Scaled(1.5)
    for rows in (2, 5):
        cell(ms.Tensor(np.ones((rows, 3), np.float16)))
    assert [(s[1], s[2], s[3]) for s in SEEN] == [((2, 3), ms.float16, 2), ((5, 3), ms.float16, 2)]


def test_unknown_rank_has_no_ndim():
    meta = _validation.TensorMeta((-2,), ms.float32)
    assert meta.ndim is None and meta.shape == (-2,)
    assert _validation.is_tensor(meta) and not _validation.is_tensor((1, 2))


@pytest.mark.parametrize("graph", [False, True])
def test_errors_are_the_same_in_both_modes(graph):
    cell = _Scaled(-1.0)
    x = ms.Tensor(np.ones((2, 3), np.float32))
    if graph:
        ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with pytest.raises(ValueError, match="'scale' must be positive, but got -1.0"):
            cell(x)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
