"""Kernel libraries under faults, beyond tests/test_build.py (damaged libraries are rejected before loading and
rebuilt) and tests/test_aot_kernel.py (a missing library or compiler: 'auto' falls back with one warning):

* two processes using 'aot' at once with an empty cache both succeed, the library is built once, one copy is left;
* an unwritable cache directory (and, on top of it, an unwritable temp dir) never breaks ``import ms_kldiv``;
  the library goes to the temp dir, or 'auto' falls back to 'composite' with one warning;
* a build killed during the link, or between writing the library and renaming it into place, leaves no file under
  the library's name, and the next process builds a good one and clears what the killed one left.

Every case runs in child processes (a crash fails the test, not the suite). The compiler is a stand-in script
(``CXX``) that takes a few seconds to "link" and copies the library this suite built: the properties under test
(locking, atomic rename, fallbacks) are the cache's, and a stand-in makes the race window wide and the test fast.
"""
import os
import signal
import sys
import time

import pytest

from ms_kldiv import _build

import _libs
import _procs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = _build.LIB_NAMES["CPU"]
pytestmark = pytest.mark.skipif(_build._cxx() is None, reason="no C++ compiler to build the library the stand-in copies")

USE_AOT = r"""
import os, sys, tempfile, time, warnings
import numpy as np
tempfile.tempdir = os.environ["TMPDIR"]  # taken as given, writable or not (gettempdir would look elsewhere)
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import mindspore as ms
    import ms_kldiv
    from ms_kldiv import _build
    x = ms.Tensor(np.array([0.5, 0.5], np.float32)); t = ms.Tensor(np.array([0.0, 1.0], np.float32))
    print("START", time.time(), flush=True)
    backend = sys.argv[1]
    a = float(ms_kldiv.kl_div(x, t, "sum", backend=backend).asnumpy())
    b = float(ms_kldiv.kl_div(x, t, "sum", backend=backend).asnumpy())
assert abs(a - (-0.5)) < 1e-6 and a == b, (a, b)
print("WARNINGS", sum("aot" in str(w.message) for w in caught))
print("AUTO", ms_kldiv.backends.resolve("auto").name)
print("PATH", _build.find_library("CPU"))
print("OK")
"""


@pytest.fixture
def fake(tmp_path):
    """Environment for a child process: an empty cache, the stand-in compiler, a fresh temp dir, an empty cwd."""
    for d in ("cache", "tmp", "cwd"):
        (tmp_path / d).mkdir()
    env = _procs.with_repo_path(dict(os.environ, MS_KLDIV_CACHE=str(tmp_path / "cache"), TMPDIR=str(tmp_path / "tmp"),
                                     MS_KLDIV_SOURCE_DIR=os.path.join(REPO, "custom_ops"),
                                     **_libs.stand_in_compiler(tmp_path, _libs.library("CPU"))))
    env.pop("MS_KLDIV_LIB_DIR", None)
    env.pop("MS_KLDIV_NO_BUILD", None)
    return env


def _start(code, env, cwd, *args):
    return _procs.start([sys.executable, "-c", code, *args], env=env, cwd=cwd)


def _finish(proc, timeout=300):
    done = _procs.finish(proc, timeout, what="child")
    out, err = done.stdout, done.stderr
    assert done.returncode == 0 and "OK" in out, f"rc={done.returncode}\n{out[-2000:]}\n{err[-3000:]}"
    return dict(ln.split(" ", 1) for ln in out.splitlines() if " " in ln)


def _log(env):
    path = env["FAKE_CXX_LOG"]
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [ln.split() for ln in f.read().splitlines()]


def _lib_dirs(cache):
    root = os.path.join(cache, "lib")
    return [os.path.join(root, d) for d in os.listdir(root)] if os.path.isdir(root) else []


@pytest.mark.slow
def test_two_processes_first_use_at_once(fake, tmp_path):
    procs = [_start(USE_AOT, fake, str(tmp_path / "cwd"), "aot") for _ in range(2)]
    outs = [_finish(p) for p in procs]
    log = _log(fake)
    links = [ln for ln in log if ln[0] == "link-start"]
    assert len(links) == 1, f"built {len(links)} times: {log}"
    end = float(next(ln for ln in log if ln[0] == "link-end")[2])
    assert all(float(o["START"]) < end for o in outs), "the two processes did not overlap; the race was not tested"
    paths = {o["PATH"] for o in outs}
    assert len(paths) == 1 and os.path.isfile(paths.pop())
    [lib_dir] = _lib_dirs(fake["MS_KLDIV_CACHE"])
    assert sorted(os.listdir(lib_dir)) == [".lock", LIB, LIB + ".stamp", LIB + _build.VECTOR_REPORT]
    assert os.listdir(tmp_path / "cwd") == []


def _unwritable(path):
    """A cache location this process cannot create or write (chmod is no barrier for root: then a path below a
    regular file)."""
    if os.geteuid() == 0:
        blocker = path.parent / (path.name + "-file")
        blocker.write_text("not a directory")
        return str(blocker / "cache")
    path.mkdir()
    path.chmod(0o555)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("temp", ["writable", "unwritable"])
def test_unwritable_cache(fake, tmp_path, temp):
    env = dict(fake, MS_KLDIV_CACHE=_unwritable(tmp_path / "ro-cache"))
    if temp == "unwritable":
        env["TMPDIR"] = _unwritable(tmp_path / "ro-tmp")
    out = _finish(_start(USE_AOT, env, str(tmp_path / "cwd"), "auto"))
    if temp == "writable":  # the per-user temp dir takes the cache's place
        assert out["AUTO"] == "aot" and out["WARNINGS"] == "0", out
        assert out["PATH"].startswith(str(tmp_path / "tmp")), out
    else:  # nowhere to build: 'auto' falls back to composite, saying so once
        assert out["AUTO"] == "composite" and out["WARNINGS"] == "1", out
    assert os.listdir(tmp_path / "cwd") == []


KILL_BEFORE_RENAME = r"""
import os, signal
real_replace = os.replace
def replace(src, dst):
    if dst.endswith(".so"):       # the library is written under its temporary name: die before the rename
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)
os.replace = replace
""" + _procs.LOAD_BUILD + r"""
_build.ensure_library("CPU")
"""


@pytest.mark.slow
@pytest.mark.parametrize("when", ["during_link", "before_rename"])
def test_interrupted_build_leaves_no_partial_library(fake, tmp_path, when):
    cwd = str(tmp_path / "cwd")
    if when == "during_link":
        proc = _start(_procs.LOAD_BUILD + "_build.ensure_library('CPU')", dict(fake, FAKE_CXX_SECONDS="60"), cwd)
        deadline = time.time() + 120
        while not any(ln[0] == "link-start" for ln in _log(fake)):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)  # the build's process alone: its stand-in compiler goes on sleeping
    else:
        proc = _start(KILL_BEFORE_RENAME, dict(fake, FAKE_CXX_SECONDS="0"), cwd)
    killed = _procs.finish(proc, 120)  # (and then ends the orphaned stand-in with the rest of the group)
    assert killed.returncode == -signal.SIGKILL, killed.returncode
    for lib_dir in _lib_dirs(fake["MS_KLDIV_CACHE"]):
        assert LIB not in os.listdir(lib_dir), os.listdir(lib_dir)  # nothing under the library's name
    out = _finish(_start(USE_AOT, dict(fake, FAKE_CXX_SECONDS="0"), cwd, "aot"))
    [lib_dir] = _lib_dirs(fake["MS_KLDIV_CACHE"])
    assert out["PATH"] == os.path.join(lib_dir, LIB)
    # the killed build's staged files cleared
    assert sorted(os.listdir(lib_dir)) == [".lock", LIB, LIB + ".stamp", LIB + _build.VECTOR_REPORT]
    assert _build._stamp_ok(out["PATH"], None)
    assert os.listdir(cwd) == []
