"""Keep MindSpore's compiler, graph-dump and AKG files out of the user's working directory.

MindSpore writes ``rank_0/`` (failed graph compiles), ``custom_kernel_meta/``, ``akg_kernel_meta/`` and
``kernel_build_tmp.key`` into the current directory unless told otherwise. We point them at a per-user cache,
without overriding anything the user set.
"""
import os
import tempfile


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
