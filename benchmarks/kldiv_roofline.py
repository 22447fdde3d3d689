"""Roofline study of the CPU kernel: rows that read the same bytes as a fused forward (the streaming read on the
library's threads, a NumPy read), the kernel alone through ctypes, MindSpore's ms.jit launch floor, and every MindSpore
call paired with the read and split by the library's own clock into before / kernel / after.

    python benchmarks/kldiv_roofline.py [python -m ms_kldiv.bench options]   # e.g. --sizes 4M,32M --modes fwd

It runs the library built with -DKLDIV_DIAGNOSTICS (libkldiv_cpu_diag.so: the production library exports the ABI
alone and reads no clock), which it hands MindSpore through MS_KLDIV_LIB_DIR, so the MindSpore rows and the study rows
run the very same kernels. docs/cpu_aot.md explains what these rows showed.
"""
import atexit
import functools
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ms_kldiv.bench import rows  # noqa: E402
from ms_kldiv.bench.harness import add_row  # noqa: E402


_LOADED = []  # the diagnostics build's path as the aot backend loads it (see use_diagnostics_library)


def _cpu_library():
    """The CPU library built with diagnostics (KLDivStreamRead, KLDivTakeLastSpan), built once if needed; the very
    file the aot backend loads once use_diagnostics_library ran (one copy: one set of the library's globals)."""
    if _LOADED:
        return _LOADED[0]
    from ms_kldiv import _build
    return _build.ensure_library(_build.DIAGNOSTICS, log=print)


@functools.lru_cache(maxsize=1)
def _library_span():
    """``KLDivTakeLastSpan`` of the CPU library as (start, end) in ``time.perf_counter`` seconds, or None once taken;
    None instead of a function where perf_counter is not the library's clock (CLOCK_MONOTONIC) or the library is
    missing. The harness then splits the aot rows' paired calls into before / kernel / after."""
    import ctypes
    if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
        return None
    try:
        take = ctypes.CDLL(_cpu_library()).KLDivTakeLastSpan
    except (RuntimeError, OSError, AttributeError):
        return None
    take.restype = ctypes.c_int
    take.argtypes = [ctypes.c_void_p]
    buf = (ctypes.c_int64 * 2)()

    def span():
        return (buf[0] * 1e-9, buf[1] * 1e-9) if take(buf) else None
    return span


def roofline_factory(n, dtype, reduction, mode):
    """Time to read the bytes a fused forward must read, with the library's own threads (float32 only)."""
    if mode != "fwd" or dtype != "float32":
        return None
    import ctypes
    fn = ctypes.CDLL(_cpu_library()).KLDivStreamRead
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    x, t = rows._tensor_memory(n, "float32")
    return lambda: fn(x.ctypes.data, t.ctypes.data, n)


def kernel_factory(n, dtype, reduction, mode):
    """The aot forward kernel alone: the exported symbol called through ctypes on the MindSpore rows' buffers, as
    the PyNative host call does, without MindSpore's call around it. With the roofline it splits the aot rows'
    time into what the kernel takes and what MindSpore's call adds."""
    if mode != "fwd" or dtype == "bfloat16":  # (bfloat16: no NumPy dtype to hand the kernel its own buffers)
        return None
    from ms_kldiv.backends.aot import HostCall, symbol
    call = HostCall(None, _cpu_library(), symbol("Fwd", reduction, False), reduction)
    x, t = rows._tensor_memory(n, dtype)
    return rows._with_span(lambda: call.run(x, t))


def numpy_read_factory(n, dtype, reduction, mode):
    """Single-threaded NumPy sum over the same bytes, a second reading of the roofline."""
    if mode != "fwd":
        return None
    x, t = rows._tensor_memory(n, dtype)
    return lambda: (x.sum(), t.sum())


def _add(a, b):
    return a + b


@functools.lru_cache(maxsize=1)
def _jit_add():
    import numpy as np
    ms = rows._ms()
    a, b = ms.Tensor(np.ones(4, np.float32)), ms.Tensor(np.ones(4, np.float32))
    f = ms.jit(_add)
    return lambda: rows._sync(f(a, b))


def jit_floor_factory(n, dtype, reduction, mode):
    """MindSpore's launch floor: an ms.jit call of ``a + b`` on 4 elements, synchronized like the other rows.

    Right after the streaming read its time is what any ms.jit call pays there, whatever it computes: MindSpore's
    threads went to sleep while the read ran and are woken one after the other (on this VM the 4-element call took
    0.18-0.32 ms back to back and 1.2-1.9 ms after 7 ms of sleep). Paired with the read, it is the part of the ms.jit
    row's ratio that no kernel can take away (docs/cpu_aot.md, "The ms.jit launch floor")."""
    return _jit_add() if mode == "fwd" else None


#: The study's rows: key -> (label, factory).
STUDY_ROWS = {"aot_kernel": ("ms_kldiv aot kernel alone (ctypes)", kernel_factory),
              "roofline": ("stream read (C++, same threads)", roofline_factory),
              "numpy_read": ("stream read (numpy sum, 1 thread)", numpy_read_factory),
              "jit_floor": ("ms.jit launch floor (a + b, 4 elements)", jit_floor_factory)}
#: What the study pairs with what unless --paired-ref is given.
PAIRED = ["--paired-ref", "roofline", "--paired-rows", "aot_kernel,aot,aot_jit,jit_floor"]
DESCRIPTION = ("Roofline study of the CPU kernel: the main benchmark's rows with the library built with diagnostics, "
               "beside the streaming read of the same bytes, the kernel alone and MindSpore's ms.jit launch floor, "
               "every call paired with the read and split into before / kernel / after.")
EPILOG = (f"study rows: {', '.join(STUDY_ROWS)}. Without --paired-ref the study runs with {' '.join(PAIRED)}. "
          "docs/cpu_aot.md explains what these rows showed.")


def register_study_rows():
    for key, (label, factory) in STUDY_ROWS.items():
        add_row(key, label, factory)
    rows.kernel_span = _library_span()


def use_diagnostics_library():
    """Copy the diagnostics build where MS_KLDIV_LIB_DIR makes the aot backend load it (as libkldiv_cpu.so), in a
    temporary folder removed when this process exits."""
    from ms_kldiv import _build
    lib = _cpu_library()
    folder = tempfile.mkdtemp(prefix="ms_kldiv_study_")
    atexit.register(shutil.rmtree, folder, True)
    for suffix in ("", ".stamp"):
        shutil.copyfile(lib + suffix, os.path.join(folder, _build.LIB_NAMES["CPU"] + suffix))
    os.environ["MS_KLDIV_LIB_DIR"] = folder
    _LOADED[:] = [os.path.join(folder, _build.LIB_NAMES["CPU"])]
    return folder


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--paired-ref" or a.startswith("--paired-ref=") for a in argv):
        argv += PAIRED
    from ms_kldiv.bench import __main__ as cli
    # the arguments first: --help, or a bad value, must not wait for the diagnostics library's build
    ap = cli.parser(prog="python benchmarks/kldiv_roofline.py", description=DESCRIPTION, epilog=EPILOG,
                    row_keys=cli.ROW_KEYS + list(STUDY_ROWS))
    args = ap.parse_args(argv)
    use_diagnostics_library()
    cli.EXTRA_ROWS.append(register_study_rows)
    return cli.run(args, ap)


if __name__ == "__main__":
    sys.exit(main())
