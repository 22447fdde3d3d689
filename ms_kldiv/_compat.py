"""Everything that differs between the MindSpore releases ms_kldiv supports, in one place.

Supported: ``mindspore>=2.7,<2.11`` (setup.py says the same). The version is read from the installed
distribution's metadata, so an unsupported MindSpore is reported at ``import ms_kldiv`` with a clear message
instead of failing deep inside a kernel registration. ``MS_KLDIV_ALLOW_ANY_MINDSPORE=1`` turns the error into
a warning (for trying a release we have not tested).
"""
import os
import re
import warnings
from importlib import metadata

#: Oldest supported release and the first release not supported (``>=MIN, <END``).
MIN_VERSION = (2, 7)
END_VERSION = (2, 11)
#: Releases the CI runs the compatibility suite on (README lists them).
TESTED_VERSIONS = ("2.7.2", "2.8.0", "2.9.0", "2.10.0")


def parse_version(text):
    """``'2.7.1.post1'`` -> ``(2, 7, 1)``; ``'2.10.0rc1'`` -> ``(2, 10, 0)``; None when it has no leading number."""
    m = re.match(r"\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", text or "")
    if not m:
        return None
    return tuple(int(g or 0) for g in m.groups())


def installed_version():
    """The installed MindSpore's version string, or None when MindSpore is not installed."""
    for dist in ("mindspore", "mindspore-gpu", "mindspore-ascend"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def version_problem(text):
    """Why MindSpore ``text`` is unsupported, or None when it is in range."""
    if text is None:
        return "MindSpore is not installed (pip install 'mindspore>=2.7,<2.11')"
    v = parse_version(text)
    if v is None or not (MIN_VERSION <= v[:2] < END_VERSION):
        lo, hi = ".".join(map(str, MIN_VERSION)), ".".join(map(str, END_VERSION))
        return (f"ms_kldiv supports MindSpore >={lo},<{hi} (tested: {', '.join(TESTED_VERSIONS)}); "
                f"found MindSpore {text}. Install a supported release, or set MS_KLDIV_ALLOW_ANY_MINDSPORE=1 "
                "to try this one at your own risk")
    return None


def check_mindspore():
    """Raise ImportError (before MindSpore is imported by us) when the installed MindSpore is unsupported."""
    problem = version_problem(installed_version())
    if problem is None:
        return
    if os.environ.get("MS_KLDIV_ALLOW_ANY_MINDSPORE") == "1" and installed_version() is not None:
        warnings.warn(problem, RuntimeWarning, stacklevel=3)
        return
    raise ImportError(problem)


def is_graph_placeholder(value):
    """True when a ``constexpr`` received a variable tensor's stand-in, i.e. it runs while a graph is compiled.

    In PyNative a constexpr is a plain call and receives the Tensor itself. While a graph compiles, MindSpore
    2.9+ passes a placeholder Tensor marked ``created_empty_tensor`` (MindSpore's own constexpr helpers test the
    same flag); 2.7 and 2.8 pass ``None``.
    """
    return value is None or bool(getattr(value, "created_empty_tensor", False))


#: (major, minor, patch) of the installed MindSpore, (0, 0, 0) when unknown.
MS_VERSION = parse_version(installed_version() or "") or (0, 0, 0)

#: Whether PyNative takes a 0-d zero from a Cell's bprop as the gradient of an input cut from autodiff, whatever its
#: shape (2.8.0-2.10.0 do; 2.7.2 raises "grad tensor should be broadcast to expected shape"). Where it does, the
#: fused head's bprops return one instead of a zeros tensor of a weight's size (ms_kldiv/fused_linear.py).
BPROP_TAKES_0D_GRADIENTS = MS_VERSION >= (2, 8)

#: Cell flags by which mixed precision (``ms.amp.auto_mixed_precision``, ``Cell.to_float``) marks cells.
_MIXED_PRECISION_FLAGS = frozenset(("fp16", "fp32", "bf16"))


def without_mixed_precision(cell):
    """``cell``, marked to run without mixed precision's casts even inside a cell that has them (MindSpore's own
    mark for "not set"): in PyNative a flagged cell casts every float operand of every op it runs, the kernels'
    float64 hyper-parameters and float32 saved statistics included, which the kernels then refused ("DistillFwd is
    1"). The logits keep the dtype they arrive in."""
    from mindspore._c_expression import Cell_, MixedPrecisionType  # pylint: disable=import-outside-toplevel
    # (private API, in 2.7-2.10: what Cell.to_float sets, with the value that means none)
    cell.mixed_precision_type = MixedPrecisionType.NOTSET
    Cell_.set_mixed_precision_type(cell, MixedPrecisionType.NOTSET)
    return cell


def amp_flags_dropped(flags):
    """``flags`` without mixed precision's (``_MIXED_PRECISION_FLAGS``)."""
    return {key: value for key, value in flags.items() if key not in _MIXED_PRECISION_FLAGS}


def _unchanged_to_float(cell):
    """A ``to_float`` that leaves ``cell`` as it is (``sealed_from_mixed_precision``)."""
    def to_float(dst_type):  # pylint: disable=unused-argument
        return cell
    return to_float


def sealed_from_mixed_precision(cell):
    """``cell`` and every cell inside it with ``to_float`` made a no-op: ``ms.amp.auto_mixed_precision`` ('O2',
    'O3') calls ``to_float`` on every cell of a network, not only on its root, which flagged the fused head's inner
    cells (whose kernels then refused the float16 casts). They run under what the loss Cell itself sets (no
    mixed precision), which only it carries: a marked cell takes PyNative's longer call path."""
    for _, inner in cell.cells_and_names():
        object.__setattr__(inner, "to_float", _unchanged_to_float(inner))
    return cell


class FullPrecisionCell:
    """A mixin (before ``nn.Cell``) for the package's loss Cells, which mixed precision leaves alone (as MindSpore's
    own amp keeps losses in float32): ``ms.amp`` and ``to_float`` flag every cell of a network, and in a flagged
    cell every float operand of every op is cast, the kernels' float64 hyper-parameters and float32 saved
    statistics included, which the kernels refused ("DistillFwd is 1"). The logits keep the dtype they arrive in;
    the cells inside are sealed as they are attached."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        without_mixed_precision(self)
        sealed_from_mixed_precision(self)
        _opaque_to_rewrite(type(self))

    def __setattr__(self, name, value):
        if isinstance(value, _ms_cell()):
            sealed_from_mixed_precision(value)
        super().__setattr__(name, value)

    def to_float(self, dst_type):  # pylint: disable=unused-argument
        return self

    def add_flags(self, **flags):
        return super().add_flags(**amp_flags_dropped(flags))

    def add_flags_recursive(self, **flags):
        return super().add_flags_recursive(**amp_flags_dropped(flags))


def _opaque_to_rewrite(cls):
    """Makes ``mindspore.rewrite`` (which ``ms.amp`` 'O1' runs over a network) take ``cls`` as one node instead of
    parsing its construct into the user's network: it regenerated that code without the package's imports
    ("name '_check_args' is not defined") and could not read its cached helpers ("got _lru_cache_wrapper")."""
    try:
        from mindspore.rewrite.common import namespace  # pylint: disable=import-outside-toplevel
    except ImportError:  # (no rewrite: nothing parses the loss)
        return
    if cls not in namespace._subtree_black_list:  # pylint: disable=protected-access
        namespace._subtree_black_list.append(cls)  # pylint: disable=protected-access


def _ms_cell():
    from mindspore import nn  # pylint: disable=import-outside-toplevel
    return nn.Cell
