"""The kernel libraries a test session uses: each variant is built once and shared by every test, process and child
process of the session (a kernel library takes minutes to compile on a small machine).

``library(device)`` is ``_build.ensure_library(device)``: the per-user cache it fills is keyed by
``_build.source_hash(device)`` (sources, headers, flags, compiler and variant: 'CPU', ``_build.DIAGNOSTICS``), a file
lock makes concurrent processes wait for one build instead of starting their own, and the 'aot' backend under test
loads its library from there anyway, so a separate session folder would only add a build. The ISA units need no
library of their own: one library holds them all and ``MS_KLDIV_ISA`` picks one at run time. A test calls
``library`` in the pytest process before it starts children that need the library, so that no build runs under a
child's timeout; the children then find it in the cache.

``stand_in_compiler(folder, lib)`` writes a stand-in for ``CXX`` that "compiles" empty objects and "links" by
copying ``lib`` after ``FAKE_CXX_SECONDS`` (default 3), logging link-start/link-end lines to ``FAKE_CXX_LOG``: for
tests of the cache's own behaviour (locks, atomic renames, rebuilds of damaged files), where what the compiler
makes is not under test. The compiler the real builds use is exercised by ``library`` and by the
install itself (setup.py's build).
"""
import functools
import os
import sys

from ms_kldiv import _build


@functools.lru_cache(maxsize=None)
def library(device="CPU"):
    """Path of the session's library for ``device`` ('CPU' or ``_build.DIAGNOSTICS``), built once if needed."""
    return _build.ensure_library(device)


STAND_IN_CXX = r"""#!{python}
import os, shutil, sys, time
args = sys.argv[1:]
if "--version" in args:
    print("fake-cxx 1.0 (ms_kldiv tests)")
    sys.exit(0)
out = args[args.index("-o") + 1]
if "-c" in args:
    open(out, "wb").close()
    sys.exit(0)
with open(os.environ["FAKE_CXX_LOG"], "a") as log:
    log.write(f"link-start {{os.getpid()}} {{time.time()}}\n")
time.sleep(float(os.environ.get("FAKE_CXX_SECONDS", "3")))
shutil.copyfile(os.environ["FAKE_CXX_LIB"], out)
with open(os.environ["FAKE_CXX_LOG"], "a") as log:
    log.write(f"link-end {{os.getpid()}} {{time.time()}}\n")
"""


def stand_in_compiler(folder, lib):
    """Write the stand-in compiler into ``folder``; the environment variables that select it (CXX, FAKE_CXX_LIB,
    FAKE_CXX_LOG)."""
    cxx = os.path.join(str(folder), "fake-cxx")
    with open(cxx, "w", encoding="utf-8") as f:
        f.write(STAND_IN_CXX.format(python=sys.executable))
    os.chmod(cxx, 0o755)
    return {"CXX": cxx, "FAKE_CXX_LIB": lib, "FAKE_CXX_LOG": os.path.join(str(folder), "cxx.log")}
