"""The kernel build: ms_kldiv._build compiles the CPU library with the exported ABI, vectorized log/exp,
stamps and caches it, never writes into the working directory, and setup.py's hook loads it without
importing MindSpore."""
import ctypes
import os
import re
import subprocess
import sys

import pytest

from ms_kldiv import _build

import _libs
import _procs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAVE_CXX = _build._cxx() is not None
needs_cxx = pytest.mark.skipif(not HAVE_CXX, reason="no C++ compiler on this machine")

VARIANTS = [f"{r}{s}" for s in ("Prob", "Log") for r in ("None", "Sum", "Mean", "Batchmean")]


@pytest.fixture(scope="module")
def built_lib():
    if not HAVE_CXX:
        pytest.skip("no C++ compiler on this machine")
    return _libs.library("CPU")


@needs_cxx
def test_library_exports_the_abi(built_lib):
    lib = ctypes.CDLL(built_lib)
    for v in VARIANTS:
        for kind in ("Fwd", "Bwd"):
            getattr(lib, f"KLDiv{kind}{v}")
            getattr(lib, f"KLDiv{kind}{v}InferShape")
    info = lib.KLDivLibInfo
    info.restype = ctypes.c_char_p
    assert info().decode().startswith("libkldiv_cpu abi=1")


@needs_cxx
def test_library_is_stamped_and_found(built_lib):
    with open(built_lib + ".stamp", encoding="utf-8") as f:
        sources, fingerprint = f.read().split("\n")[:2]
    assert sources == _build.source_hash("CPU")
    size, sha = fingerprint.split()
    assert int(size) == os.path.getsize(built_lib) and len(sha) == 64
    assert _build.find_library("CPU") == built_lib


def _damaged_copy(built_lib, folder, how):
    """A copy of the library and its stamp in ``folder``, damaged as an interrupted copy or a bad disk leaves it."""
    os.makedirs(folder, exist_ok=True)
    lib = os.path.join(folder, os.path.basename(built_lib))
    with open(built_lib, "rb") as f:
        data = bytearray(f.read())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "corrupt":  # same size, a few bytes changed in the middle
        data[len(data) // 2: len(data) // 2 + 16] = bytes(16)
    with open(lib, "wb") as f:
        f.write(data)
    with open(built_lib + ".stamp", "rb") as src, open(lib + ".stamp", "wb") as dst:
        dst.write(src.read())
    return lib


@needs_cxx
@pytest.mark.parametrize("how", ["truncated", "corrupt", "intact"])
def test_stamp_check_rejects_a_damaged_library(built_lib, tmp_path, how):
    lib = _damaged_copy(built_lib, str(tmp_path), how)
    assert _build._stamp_ok(lib, _build.source_hash("CPU")) == (how == "intact")
    assert not _build._stamp_ok(lib, "another-source-hash")
    # a stamp from before fingerprints (sources only) falls back to the structural check, which a truncated copy fails
    with open(lib + ".stamp", "w", encoding="utf-8") as f:
        f.write(_build.source_hash("CPU"))
    assert _build._stamp_ok(lib, _build.source_hash("CPU")) == (how != "truncated")
    assert _build.elf_intact(built_lib) and _build.elf_intact(lib) == (how != "truncated")


@needs_cxx
@pytest.mark.parametrize("how", ["truncated", "corrupt"])
def test_damaged_library_falls_back_without_crashing(built_lib, tmp_path, how):
    """A damaged library where MS_KLDIV_LIB_DIR points (used to be a bus error at the first kl_div call): never
    loaded, 'auto' falls back to composite with one warning, the values are right. In a child process, so a crash
    fails this test, not the suite."""
    from test_aot_kernel import FALLBACK, _python
    _damaged_copy(built_lib, str(tmp_path / "lib"), how)
    work = tmp_path / "cwd"
    work.mkdir()
    proc = _python(FALLBACK, {"MS_KLDIV_CACHE": str(tmp_path / "cache"), "MS_KLDIV_LIB_DIR": str(tmp_path / "lib")},
                   str(work))
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "damaged" in proc.stdout
    assert os.listdir(work) == []


REBUILD = _procs.LOAD_BUILD + r"""
import os
src = _build.source_hash("CPU")
cached = os.path.join(os.environ["MS_KLDIV_CACHE"], "lib", src, _build.LIB_NAMES["CPU"])
good = os.environ["GOOD_LIB"]
os.makedirs(os.path.dirname(cached), exist_ok=True)
data = open(good, "rb").read()
open(cached, "wb").write(data[: len(data) // 3])          # what an interrupted write leaves
# the good library's stamp, naming these sources (the compiler is part of them): only the library is damaged
fingerprint = open(good + ".stamp").read().split("\n")[1]
open(cached + ".stamp", "w").write(f"{src}\n{fingerprint}\n")
installed = _build._candidates
_build._candidates = lambda device, expected: installed(device, expected)[-1:]   # the cache only, not an installed copy
logs = []
path = _build.ensure_library("CPU", log=logs.append)
assert path == cached and _build._stamp_ok(path, src), path
assert any("does not match its build stamp" in m for m in logs), logs
assert _build.library_info(path).startswith("libkldiv_cpu abi=1")
print("OK")
"""


@needs_cxx
@pytest.mark.slow
def test_damaged_cached_library_is_rebuilt(built_lib, tmp_path):
    # What is under test is the cache (the stamp check, the rebuild in place, its new stamp), not the compiler: a
    # stand-in "links" by copying the session's library (a real build: the install's, or _libs.library's).
    from test_aot_kernel import _python
    env = {"MS_KLDIV_CACHE": str(tmp_path / "cache"), "GOOD_LIB": built_lib,
           "MS_KLDIV_SOURCE_DIR": os.path.join(REPO, "custom_ops"), "FAKE_CXX_SECONDS": "0",
           **_libs.stand_in_compiler(tmp_path, built_lib)}
    proc = _python(REBUILD, env, str(tmp_path), timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    with open(env["FAKE_CXX_LOG"], encoding="utf-8") as f:
        assert sum(ln.startswith("link-end") for ln in f) == 1  # rebuilt, once


@needs_cxx
@pytest.mark.skipif(os.uname().machine not in ("x86_64", "AMD64"), reason="libmvec check is x86-64 specific")
def test_log_exp_loops_use_libmvec(built_lib):
    """The vector variants of logf/expf are linked in: the pointwise loops really vectorized."""
    syms = subprocess.run(["nm", "-D", built_lib], capture_output=True, text=True).stdout
    if "KLDIV_NO_LIBMVEC" in syms or "_ZGV" not in syms:
        pytest.fail("no libmvec vector math symbols in the library: the log/exp loops did not vectorize")
    for sym in ("_ZGVdN8v_logf", "_ZGVdN8v_expf", "_ZGVbN4v_logf", "_ZGVeN16v_logf", "_ZGVeN16v_expf"):
        assert sym in syms, sym


@needs_cxx
@pytest.mark.parametrize("unit", ["isa_avx2.cc", "isa_avx512.cc"])
def test_simd_units_vectorize_the_kernels(built_lib, unit):
    """The build's -fopt-info-vec-optimized report (kept beside the library) shows vectorized loops of
    kldiv_kernels.inc in the AVX2 and AVX-512 translation units."""
    if "clang" in (_build._compiler_id("CPU") or "").lower():
        pytest.skip("clang writes no -fopt-info report")
    with open(built_lib + _build.VECTOR_REPORT, encoding="utf-8") as f:
        units = dict(re.findall(r"^== (\S+) ==\n(.*?)(?=^== |\Z)", f.read(), flags=re.M | re.S))
    assert set(units) == {os.path.basename(p) for p in _build._sources(_build.source_dir(), "CPU")}, sorted(units)
    vec = [ln for ln in units[unit].splitlines() if "kldiv_kernels.inc" in ln and "loop vectorized" in ln]
    assert len(vec) > 50, units[unit][-2000:]


@needs_cxx
def test_read_bandwidth_tool_reads_every_element_once(built_lib, tmp_path):
    """benchmarks/cpu/read_bandwidth.cc (how fast this machine can read what a fused forward reads, the number no
    forward can beat) reads every element of both arrays exactly once in every configuration it times: 3 sizes x 2 page
    kinds x (the thread counts below all CPUs + all CPUs without and with two prefetch distances)."""
    isa = _build.library_isa(built_lib)
    if isa not in ("avx2", "avx512"):
        pytest.skip(f"this CPU does not run the library's AVX2 code (isa={isa})")
    exe = tmp_path / "read_bandwidth"
    tool = os.path.join(REPO, "benchmarks", "cpu", "read_bandwidth.cc")
    proc = subprocess.run([_build._cxx(), "-O3", "-std=c++17", "-mavx2", "-mfma", "-pthread", "-I",
                           os.path.join(REPO, "custom_ops", "cpu"), "-o", str(exe), tool],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = _procs.run([str(exe), "--check"], 120, cwd=tmp_path)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and not any("MISMATCH" in ln for ln in lines), proc.stdout
    cpus = min(os.cpu_count() or 1, 64)
    configs = len([t for t in (1 << k for k in range(7)) if t < cpus]) + 3
    assert sum(ln.endswith(" ok") for ln in lines) == 6 * configs, lines


@needs_cxx
def test_install_reuses_the_cached_library(tmp_path, monkeypatch):
    """setup.py's build() compiles into the per-user cache (keyed by the source hash) and copies from it: a second
    install of the same sources (a new venv, CI's wheel next to its install) compiles nothing; a library whose stamp
    does not match (damaged, other sources) is compiled again."""
    monkeypatch.setenv("MS_KLDIV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MS_KLDIV_SKIP_CUDA", "1")
    compiled = []

    def fake_build_one(device, out_dir, src=None):  # a "library" with a valid stamp, in no time
        os.makedirs(out_dir, exist_ok=True)
        lib = os.path.join(out_dir, _build.LIB_NAMES[device])
        with open(lib, "wb") as f:
            f.write(b"library %d" % len(compiled))
        with open(lib + ".stamp", "w") as f:
            f.write(f"{_build.source_hash(device, src)}\n{_build._fingerprint(lib)}\n")
        with open(lib + _build.RESOURCE_REPORT, "w") as f:  # a build's report travels with its library
            f.write("report %d" % len(compiled))
        compiled.append(out_dir)
        return lib

    monkeypatch.setattr(_build, "build_one", fake_build_one)
    first = _build.build(str(tmp_path / "a"), log=lambda m: None)[0]
    second = _build.build(str(tmp_path / "b"), log=lambda m: None)[0]
    assert len(compiled) == 1 and compiled[0].startswith(str(tmp_path / "cache"))
    with open(first, "rb") as f, open(second, "rb") as g:
        assert f.read() == g.read() == b"library 0"
    with open(second + _build.RESOURCE_REPORT) as f:
        assert f.read() == "report 0"
    assert _build._stamp_ok(second, _build.source_hash("CPU"))
    with open(os.path.join(compiled[0], _build.LIB_NAMES["CPU"]), "ab") as f:
        f.write(b"damage")
    third = _build.build(str(tmp_path / "c"), log=lambda m: None)[0]
    assert len(compiled) == 2 and _build._stamp_ok(third, _build.source_hash("CPU"))
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "c", "cache"]


# A source tree of the library's layout, small enough to compile in a second: 'front' reads the diagnostics macro
# through its header, 'plain' does not.
TINY_TREE = {
    "common/kldiv_abi.h": "#pragma once\n",
    "cpu/front.h": "#pragma once\n#ifdef KLDIV_DIAGNOSTICS\n#define FRONT_DIAG 1\n"
                   "#else\n#define FRONT_DIAG 0\n#endif\n",
    "cpu/front.cc": '#include "front.h"\nextern "C" __attribute__((visibility("default"))) int FrontDiag() '
                    '{ return FRONT_DIAG; }\n',
    "cpu/plain.h": "#pragma once\n#define PLAIN_VALUE 7\n",
    "cpu/plain.cc": '#include "plain.h"\nextern "C" __attribute__((visibility("default"))) int PlainValue() '
                    '{ return PLAIN_VALUE; }\n',
}


@needs_cxx
def test_units_are_compiled_once_and_the_diagnostics_build_shares_them(tmp_path, monkeypatch):
    """Compiled units are kept in the per-user cache, keyed by their command, text and the headers: a second build
    of the same sources compiles nothing and gives the same library and report; the diagnostics build compiles only
    the units that read its macro (here through a header), with the macro, and takes the others' objects; a damaged
    object is compiled again; a changed header compiles every unit again."""
    src = tmp_path / "src"
    for rel, text in TINY_TREE.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    monkeypatch.setenv("MS_KLDIV_CACHE", str(tmp_path / "cache"))
    compiled = []
    run_parallel = _build._run_parallel

    def recording(cmds, cwd):
        compiled.append({(cmd[cmd.index("-c") + 1], _build._DIAG_FLAGS[0] in cmd) for cmd in cmds})
        return run_parallel(cmds, cwd)
    monkeypatch.setattr(_build, "_run_parallel", recording)

    def build(name, flags=()):
        out = tmp_path / name
        out.mkdir()
        lib = str(out / "lib.so")
        _build._build_cpu(str(src), lib, str(out), flags)
        with open(lib + _build.VECTOR_REPORT, encoding="utf-8") as f:
            report = f.read()
        dll = ctypes.CDLL(lib)
        return dll.FrontDiag(), dll.PlainValue(), report

    first = build("first")
    assert compiled == [{("cpu/front.cc", False), ("cpu/plain.cc", False)}] and first[:2] == (0, 7)
    assert build("again") == first and compiled[1:] == []
    diag = build("diag", _build._DIAG_FLAGS)
    assert compiled[1:] == [{("cpu/front.cc", True)}] and diag[:2] == (1, 7)
    # damaged cached objects are not their fingerprints': compiled again, not linked
    for obj in (tmp_path / "cache" / "obj").glob("*.o"):
        with open(obj, "r+b") as f:
            f.write(b"\0" * 64)
    assert build("repaired") == first and compiled[2:] == [{("cpu/front.cc", False), ("cpu/plain.cc", False)}]
    (src / "cpu/plain.h").write_text("#pragma once\n#define PLAIN_VALUE 8\n")
    assert build("changed")[:2] == (0, 8) and compiled[3:] == [{("cpu/front.cc", False), ("cpu/plain.cc", False)}]
    assert sorted(os.listdir(tmp_path)) == ["again", "cache", "changed", "diag", "first", "repaired", "src"]


def test_only_the_front_end_units_read_the_diagnostics_macro():
    """The diagnostics library differs from the product in these units alone; the ISA units (most of a build) are
    the product's objects. A unit that starts to read the macro (itself or through a header) is compiled twice."""
    src = os.path.join(REPO, "custom_ops")
    dirs = [os.path.join(src, "common"), os.path.join(src, "cpu")]
    readers = {os.path.basename(cc) for cc in _build._sources(src, "CPU")
               if _build._mentions(cc, _build._DIAG_MACRO, dirs)}
    assert readers == {"kldiv_cpu.cc", "kldiv_diagnostics.cc"}


@needs_cxx
def test_object_cache_keeps_the_recently_used(tmp_path):
    cache = tmp_path / "obj"
    cache.mkdir()
    for i in range(4):
        (cache / f"{i}.o").write_bytes(b"x" * 1000)
        (cache / f"{i}.o.txt").write_text("report")
        os.utime(cache / f"{i}.o", (1000 + i, 1000 + i))
    os.utime(cache / "0.o", (5000, 5000))  # used last
    _build._prune_objects(str(cache), keep_bytes=2000)
    assert sorted(os.listdir(cache)) == ["0.o", "0.o.txt", "3.o", "3.o.txt"]


@needs_cxx
def test_build_into_a_folder(tmp_path, monkeypatch):
    """``python -m ms_kldiv._build --out DIR``: the library, its stamp (matching these sources) and its vectorization
    report in DIR, nothing else in the working directory, and it loads. (It goes through the per-user cache, as an
    install does: the session's install already compiled these sources, so this copies; the reuse rule is tested
    above.)"""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert _build.main(["--out", str(out), "--no-cuda"]) == 0
    path = str(out / _build.LIB_NAMES["CPU"])
    assert _build._stamp_ok(path, _build.source_hash("CPU"))
    assert sorted(os.listdir(tmp_path)) == ["out"] and sorted(os.listdir(out)) == [
        "libkldiv_cpu.so", "libkldiv_cpu.so.stamp", "libkldiv_cpu.so" + _build.VECTOR_REPORT]
    ctypes.CDLL(path).KLDivFwdSumProb


def test_missing_compiler_is_a_build_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("MS_KLDIV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_build, "find_library", lambda device: None)  # as if nothing was built
    monkeypatch.setenv("MS_KLDIV_SOURCE_DIR", os.path.join(REPO, "custom_ops"))
    with pytest.raises(_build.BuildError, match="compiler"):
        _build.ensure_library("CPU")


def test_cuda_skip_switch(monkeypatch):
    monkeypatch.setenv("MS_KLDIV_SKIP_CUDA", "1")
    assert "MS_KLDIV_SKIP_CUDA" in _build.cuda_skipped_reason()



def test_cuda_arch_flags_follow_the_toolkit(monkeypatch):
    """sm_70, 75, 80, 90 SASS plus compute_90 PTX, cut to what the nvcc at hand supports (CUDA 13 has no sm_70);
    sm_86 / sm_89 run sm_80's SASS, so they are not compiled separately."""
    _build.nvcc_supported_archs.cache_clear()
    monkeypatch.setattr(_build, "nvcc_supported_archs", lambda nvcc: None)
    flags = _build.nvcc_arch_flags("nvcc")
    assert all(f"-gencode=arch=compute_{a},code=sm_{a}" in flags for a in _build.CUDA_ARCHS)
    assert flags[-1] == "-gencode=arch=compute_90,code=compute_90"
    assert not any(f"code=sm_{a}" in " ".join(flags) for a in ("86", "89"))
    monkeypatch.setattr(_build, "nvcc_supported_archs", lambda nvcc: frozenset({"75", "80", "86", "89", "90", "100"}))
    flags = _build.nvcc_arch_flags("nvcc")
    assert "-gencode=arch=compute_70,code=sm_70" not in flags
    assert "-gencode=arch=compute_75,code=sm_75" in flags and flags[-1].endswith("code=compute_90")


def test_setup_hook_loads_build_without_mindspore():
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('b', {os.path.join(REPO, 'ms_kldiv', '_build.py')!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "assert m.source_dir() and callable(m.build)\n"
            "assert 'mindspore' not in sys.modules, 'setup must not import mindspore'\n"
            "print('OK')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-2000:]
    with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as f:
        text = f.read()
    assert "cmdclass" in text and "spec_from_file_location" in text


def test_log_table_header_is_what_fit_logf_prints():
    """custom_ops/cpu/kldiv_logf_table.h (the inline log's constants, shared by the AVX2 and AVX-512 units) holds the
    tables and polynomial that tools/fit_logf.py derives: the tables exactly."""
    import re
    tool = os.path.join(REPO, "tools", "fit_logf.py")
    proc = _procs.run([sys.executable, tool], 600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = dict(ln.split(" = ", 1) for ln in proc.stdout.splitlines() if " = " in ln)
    with open(os.path.join(REPO, "custom_ops", "cpu", "kldiv_logf_table.h"), encoding="utf-8") as f:
        header = f.read()

    def floats(text):
        return [float(v) for v in re.findall(r"(-?\d+\.\d+(?:e-?\d+)?)f", text)]

    def array(name):
        return floats(re.search(name + r"\[8\] = \{(.*?)\};", header, re.S).group(1))

    assert array("kInvC") == floats(printed["inv_c"])
    assert array("kLogT") == floats(printed["log_t"])
    assert floats(re.search(r"kLn2Over8 = ([^;]*);", header).group(1)) == floats(printed["L8"])
    # Q comes from an iterative least-squares fit whose last bits vary with the NumPy/LAPACK build (c3 moved by 1.2e-6
    # relative between NumPy 1.26 and 2.x): the header's coefficients must be that fit, up to this spread.
    for i in range(4):
        got = floats(re.search(rf"kC{i} = ([^,;]*)[,;]", header).group(1))[0]
        assert abs(got - floats(printed[f"c{i}"])[0]) <= 1e-5 * abs(got), i


def test_shipped_sources_are_only_what_the_package_compiles(tmp_path):
    """The wheel carries the kernel sources (ms_kldiv/_csrc) so an installed copy can rebuild for its machine; they are
    the sources and headers the build compiles, nothing from studies or benchmarks."""
    _build.copy_sources(str(tmp_path))
    files = [os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs]
    assert files
    assert {os.path.splitext(f)[1] for f in files} <= {".h", ".cc", ".inc", ".cu", ".cuh"}, files
    assert not [f for f in files if "tools" in f.split(os.sep) or "bench" in f], files
    src = _build.source_dir()
    compiled = {os.path.relpath(p, src) for dev in ("CPU", "GPU") for p in _build._sources(src, dev) + _build._headers(src, dev)}
    assert set(files) == compiled, set(files) ^ compiled
