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
