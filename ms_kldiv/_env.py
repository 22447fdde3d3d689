"""Keep MindSpore's compiler, graph-dump and AKG files out of the user's working directory.

MindSpore writes ``rank_0/`` (failed graph compiles), ``custom_kernel_meta/``, ``akg_kernel_meta/`` and
``kernel_build_tmp.key`` into the current directory unless told otherwise. We point them at a per-user cache,
without overriding anything the user set.
"""
import os
import tempfile
import warnings


def cache_dir(*parts):
    base = os.environ.get("MS_KLDIV_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "ms_kldiv")
    path = os.path.join(base, *parts)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:  # read-only home: fall back to the temp dir
        path = os.path.join(tempfile.gettempdir(), f"ms_kldiv-{os.getuid()}", *parts)
        os.makedirs(path, exist_ok=True)
    return path


def keep_cwd_clean():
    try:
        os.environ.setdefault("MS_OM_PATH", cache_dir("om"))
        os.environ.setdefault("MS_COMPILER_CACHE_PATH", cache_dir("compiler") + os.sep)
    except OSError:  # neither the cache nor the temp dir is writable: MindSpore's defaults, but never a failed import
        pass


def _positive_int(value):
    return value.isdigit() and int(value) > 0


def _prefetch(value):
    return value.isdigit() and int(value) <= 1 << 20


def _switch(value):
    return value in ("0", "1")


#: The settings with a restricted value: (variable, valid?, what it takes, what the package does with another value).
SETTINGS = (
    ("MS_KLDIV_NUM_THREADS", _positive_int, "a positive int", "using the CPUs this process may use"),
    ("MS_KLDIV_PARALLEL_MIN", _positive_int, "a positive int", "using 65536"),
    ("MS_KLDIV_PREFETCH", _prefetch, "an int of bytes in [0, 1048576]", "using the CPU's default"),
    ("MS_KLDIV_ISA", lambda v: v in ("avx512", "avx2", "baseline"), "'avx512', 'avx2' or 'baseline'",
     "using the widest ISA this CPU runs"),
    ("MS_KLDIV_STEER_WORKERS", _switch, "0 or 1", "read as 1"),
    ("MS_KLDIV_HOST_CALL", _switch, "0 or 1", "read as 1"),
    ("MS_KLDIV_HEAD_KERNEL", _switch, "0 or 1", "read as 1"),
    ("MS_KLDIV_NO_BUILD", _switch, "0 or 1", "read as 1"),
    ("MS_KLDIV_SKIP_CUDA", _switch, "0 or 1", "read as 1"),
    ("MS_KLDIV_ALLOW_ANY_MINDSPORE", _switch, "0 or 1", "read as 0"),
)


def check_settings(environ=None):
    """Warn (once, at import) about a set variable of ``SETTINGS`` whose value the package cannot read: the kernels
    and the Python side would otherwise use their defaults without a word (``MS_KLDIV_ISA=AVX2`` did nothing)."""
    environ = os.environ if environ is None else environ
    bad = []
    for name, valid, accepted, instead in SETTINGS:
        value = environ.get(name, "")
        if value and not valid(value):
            bad.append(f"{name}={value!r} is not {accepted}: {instead}")
    if bad:
        warnings.warn("ms_kldiv: " + "; ".join(bad), RuntimeWarning, stacklevel=3)
    return bad
