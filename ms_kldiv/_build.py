"""Builds and finds the AOT kernel libraries (``libkldiv_cpu.so``, ``libkldiv_cuda.so``).

Used three ways, and so it imports neither MindSpore nor the rest of this package (``setup.py`` loads it by
file path, before MindSpore may even be installed):

* ``setup.py``'s build hook calls :func:`build` so that ``pip install .`` / ``pip install -e .`` ship the
  compiled libraries in ``ms_kldiv/_lib`` (plus a copy of the sources in ``ms_kldiv/_csrc``);
* ``ms_kldiv.backends.aot`` calls :func:`ensure_library` at run time: it returns a library whose stamp
  matches the sources, or compiles one once into the per-user cache (under a file lock, so concurrent
  processes do not race), or raises :class:`BuildError` saying why (the registry then falls back);
* ``python -m ms_kldiv._build [--out DIR] [--cuda | --no-cuda]`` builds by hand.

Nothing is ever written into the current working directory.
"""
import concurrent.futures
import contextlib
import functools
import glob
import hashlib
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
#: The CPU library with the benchmark's and the pool tests' diagnostic exports (never shipped, built on demand).
DIAGNOSTICS = "CPU+diagnostics"
LIB_NAMES = {"CPU": "libkldiv_cpu.so", "GPU": "libkldiv_cuda.so", DIAGNOSTICS: "libkldiv_cpu_diag.so"}
_DIAG_MACRO = "KLDIV_DIAGNOSTICS"
_DIAG_FLAGS = ["-D" + _DIAG_MACRO]
ABI_SYMBOL = "KLDivLibInfo"

CXX_FLAGS = ["-O3", "-std=c++17", "-fPIC", "-fvisibility=hidden", "-DNDEBUG",
             # Vectorize log/exp through libmvec and let if-converted selects vectorize; inf/NaN semantics
             # stay IEEE (no -ffast-math / -ffinite-math-only: the zero-mass rule relies on -inf and NaN).
             "-fno-math-errno", "-fno-trapping-math", "-fopenmp-simd",
             # the loops the compiler vectorized, per unit: written beside the library (VECTOR_REPORT)
             "-fopt-info-vec-optimized"]
# Volta, Turing, Ampere and Hopper SASS plus compute_90 PTX (JIT-compiled by newer drivers). sm_86 and sm_89 GPUs
# run sm_80's SASS (a cubin runs on every later minor version of its major one), so they get no build of their own:
# each architecture is a whole compile of every kernel. Newer toolkits drop old targets (CUDA 13 has no sm_70), so
# the list is cut to what this nvcc supports (see nvcc_arch_flags).
CUDA_ARCHS = ("70", "75", "80", "90")
CUDA_PTX_ARCH = "90"
# The ABI is extern "C"; libstdc++'s templates (std::unique_lock, vector copies) carry default visibility despite
# -fvisibility=hidden and would otherwise be exported as weak C++ symbols. This linker script keeps them local.
CPU_EXPORT_MAP = "{ global: *; local: _Z*; };\n"
# ptxas -v: the registers, spills, stack and shared memory of every kernel for every architecture, written beside the
# library (RESOURCE_REPORT) so that tests/test_cuda_build.py checks the shipped build's limits without compiling again.
NVCC_FLAGS = ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
              "--expt-relaxed-constexpr", "-Xptxas", "-v"]
RESOURCE_REPORT = ".ptxas.txt"
# The CPU build's report: each unit's vectorized loops (-fopt-info-vec-optimized), under a "== <unit> ==" line.
VECTOR_REPORT = ".vec.txt"
# Files a build leaves beside its library (besides the stamp), copied with it from the cache.
_COMPANIONS = (RESOURCE_REPORT, VECTOR_REPORT)


@functools.lru_cache(maxsize=None)
def nvcc_supported_archs(nvcc):
    """The compute_XX numbers this nvcc accepts (None if it cannot say: then we try the whole list)."""
    try:
        out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    archs = {line.strip().split("_", 1)[1] for line in out.splitlines() if line.strip().startswith("compute_")}
    return frozenset(archs) or None


def nvcc_arch_flags(nvcc):
    supported = nvcc_supported_archs(nvcc)
    archs = [a for a in CUDA_ARCHS if supported is None or a in supported]
    if not archs:
        raise BuildError(f"{nvcc} supports none of the target architectures sm_{', sm_'.join(CUDA_ARCHS)}")
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    ptx = CUDA_PTX_ARCH if CUDA_PTX_ARCH in archs else archs[-1]
    return flags + [f"-gencode=arch=compute_{ptx},code=compute_{ptx}"]


class BuildError(RuntimeError):
    """The library cannot be found or built here; the message says why."""


def _load_env():
    spec = importlib.util.spec_from_file_location("_ms_kldiv_env", os.path.join(HERE, "_env.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------------------------- sources
def source_dir():
    """The ``custom_ops`` tree: the checkout's (source / editable installs) or the copy shipped in the package."""
    for cand in (os.environ.get("MS_KLDIV_SOURCE_DIR"), os.path.join(os.path.dirname(HERE), "custom_ops"),
                 os.path.join(HERE, "_csrc")):
        if cand and os.path.isfile(os.path.join(cand, "common", "kldiv_abi.h")):
            return cand
    return None


def _sources(src, device):
    if device != "GPU":
        return sorted(glob.glob(os.path.join(src, "cpu", "*.cc")))
    return sorted(glob.glob(os.path.join(src, "gpu", "*.cu")))


def _headers(src, device):
    sub = "gpu" if device == "GPU" else "cpu"
    pats = ("*.h", "*.inc", "*.cuh")
    return sorted(p for d in ("common", sub) for pat in pats for p in glob.glob(os.path.join(src, d, pat)))


def _file_flags(path):
    """Per-file flags from a ``// kldiv-cxxflags(ARCH): ...`` line (ARCH: 'any' or a machine name)."""
    with open(path, encoding="utf-8") as f:
        head = f.read(2000)
    m = re.search(r"//\s*kldiv-cxxflags\((\w+)\):(.*)", head)
    if not m:
        return []
    arch, flags = m.group(1), m.group(2).split()
    machine = platform.machine().lower()
    if arch == "any" or arch == machine or (arch == "x86_64" and machine in ("x86_64", "amd64")):
        return flags
    return []


def source_hash(device, src=None):
    """Hash of everything that determines the library: sources, headers, flags, compiler."""
    src = src or source_dir()
    h = hashlib.sha256()
    flags = {"CPU": CXX_FLAGS, DIAGNOSTICS: CXX_FLAGS + _DIAG_FLAGS}.get(device) or \
        NVCC_FLAGS + (nvcc_arch_flags(_nvcc()) if _nvcc() else [])
    h.update(repr((device, flags, _compiler_id(device))).encode())
    if device != "GPU":
        h.update(CPU_EXPORT_MAP.encode())
    _hash_files(h, _sources(src, device) + _headers(src, device), src)
    return h.hexdigest()[:16]


def _hash_files(h, paths, src):
    """Feed each file's name (relative to ``src``) and contents into the hash ``h``."""
    for p in paths:
        h.update(os.path.relpath(p, src).encode())
        with open(p, "rb") as f:
            h.update(f.read())


# --------------------------------------------------------------------------------------------- compilers
def _cxx():
    if os.environ.get("CXX"):
        return shutil.which(os.environ["CXX"])  # an explicit choice that does not exist means no compiler
    return shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def _nvcc():
    if os.environ.get("NVCC"):
        return shutil.which(os.environ["NVCC"])
    cand = shutil.which("nvcc")
    if not cand and os.environ.get("CUDA_HOME"):
        p = os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
        cand = p if os.path.exists(p) else None
    return cand


@functools.lru_cache(maxsize=None)
def _compiler_id(device):
    exe = _cxx() if device == "CPU" else _nvcc()
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
        return out.splitlines()[0] if out else exe
    except (OSError, subprocess.SubprocessError):
        return exe


def cuda_skipped_reason():
    if os.environ.get("MS_KLDIV_SKIP_CUDA", "") not in ("", "0"):
        return "MS_KLDIV_SKIP_CUDA is set"
    if not _nvcc():
        return "nvcc not found (set NVCC or CUDA_HOME)"
    src = source_dir()
    if not src or not _sources(src, "GPU"):
        return "no CUDA sources in custom_ops/gpu"
    return None


def _run(cmd, cwd):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    return proc


def _run_parallel(cmds, cwd):
    """One compiler process per translation unit, at most one per CPU (each ISA unit takes seconds); what each
    printed to stderr, in the order of ``cmds``."""
    jobs = max(1, min(len(cmds), os.cpu_count() or 1))
    pending, running, errors, printed = list(enumerate(cmds)), [], [], [""] * len(cmds)
    while pending or running:
        while pending and len(running) < jobs:
            i, cmd = pending.pop(0)
            running.append((i, subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                 text=True)))
        i, proc = running.pop(0)
        _, printed[i] = proc.communicate()
        if proc.returncode != 0:
            errors.append(f"command failed ({proc.returncode}): {' '.join(cmds[i])}\n{printed[i][-4000:]}")
    if errors:
        raise BuildError("\n".join(errors))
    return printed


# ------------------------------------------------------------------------------------------------ builds
def _cxx_flags():
    """CXX_FLAGS, less GCC's vectorization report where the compiler is clang (it has -Rpass instead)."""
    clang = "clang" in (_compiler_id("CPU") or "").lower()
    return [f for f in CXX_FLAGS if not (clang and f.startswith("-fopt-info"))]


_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def _mentions(path, word, include_dirs, seen=None):
    """Whether ``path`` or a local header it includes (``#include "..."``, transitively) contains ``word``."""
    seen = set() if seen is None else seen
    real = os.path.realpath(path)
    if real in seen:
        return False
    seen.add(real)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if word in text:
        return True
    for name in _LOCAL_INCLUDE.findall(text):
        found = next((c for c in (os.path.join(d, name) for d in (os.path.dirname(path), *include_dirs))
                      if os.path.isfile(c)), None)
        if found and _mentions(found, word, include_dirs, seen):
            return True
    return False


def _object_cache():
    """Where compiled units are kept (None: nowhere writable)."""
    try:
        return _load_env().cache_dir("obj")
    except OSError:
        return None


def _compile_units(cmds, units, src, tmp):
    """Compile each unit (``cmds[i]`` ends with ``-o <object>``), taking an object from the per-user cache when one
    was compiled from the same command, unit and headers: the diagnostics build differs from the product in two
    small units, and would otherwise compile the ISA units again. Returns (objects, what each compile printed)."""
    cache = _object_cache()
    digest = hashlib.sha256(repr(_compiler_id("CPU")).encode())
    _hash_files(digest, _headers(src, "CPU"), src)
    objs, printed, todo = [], [None] * len(cmds), []
    for i, (cmd, unit) in enumerate(zip(cmds, units)):
        h = digest.copy()
        h.update(repr(cmd[:-2]).encode())  # less the temporary object path
        with open(unit, "rb") as f:
            h.update(f.read())
        cached = os.path.join(cache, h.hexdigest()[:32] + ".o") if cache else None
        report = _cached_object_report(cached) if cached else None
        if report is not None:
            printed[i] = report
            with contextlib.suppress(OSError):
                os.utime(cached)  # recently used: _prune_objects keeps it
            objs.append(cached)
        else:
            objs.append(cmd[-1])
            todo.append((i, cached))
    for (i, cached), out in zip(todo, _run_parallel([cmds[i] for i, _ in todo], src) if todo else ()):
        printed[i] = out
        if cached:
            try:  # the object, then its fingerprint and report (what makes it count as cached)
                with open(cmds[i][-1], "rb") as f:
                    _write_atomically(cached, f.read())
                _write_atomically(cached + ".txt", f"{_fingerprint(cached)}\n{out}".encode())
            except OSError:  # a full or read-only cache only costs the next build its compile
                pass
    if cache and todo:
        _prune_objects(cache)
    return objs, printed


def _cached_object_report(path):
    """What compiling the cached object printed, if the object is there and is the one its fingerprint names (a
    damaged object would fail the link, and a failed link means 'no libmvec' to _build_cpu); else None."""
    try:
        with open(path + ".txt", encoding="utf-8") as f:
            fingerprint, _, report = f.read().partition("\n")
        return report if _fingerprint(path) == fingerprint else None
    except (OSError, UnicodeDecodeError):
        return None


def _prune_objects(cache, keep_bytes=256 << 20):
    """The least recently used objects go once the cache holds more than ``keep_bytes`` (one source version of the
    CPU library is ~8 MB of objects)."""
    entries = []
    for name in os.listdir(cache):
        if name.endswith(".o"):
            with contextlib.suppress(OSError):
                st = os.stat(os.path.join(cache, name))
                entries.append((st.st_mtime, st.st_size, name))
    total = sum(size for _, size, _ in entries)
    for _, size, name in sorted(entries):
        if total <= keep_bytes:
            break
        for path in (os.path.join(cache, name) + ".txt", os.path.join(cache, name)):  # the report first
            with contextlib.suppress(OSError):
                os.remove(path)
        total -= size


def _build_cpu(src, out_path, tmp, flags=()):
    """``flags`` (the diagnostics define) reach only the units whose text, or a local header they include, names
    the macro: for the others it changes nothing, and their objects are the product's (see _compile_units)."""
    cxx = _cxx()
    if not cxx:
        raise BuildError("no C++ compiler found (install g++ or set CXX)")
    # Relative paths, compiled in the source tree: an object and its report do not depend on where the tree is (a
    # pip build directory, the installed package's _csrc), so the cache serves both.
    include = ["-I", "common", "-I", "cpu"]
    units = _sources(src, "CPU")
    scoped = [flags if flags and _mentions(cc, _DIAG_MACRO, [os.path.join(src, "common"), os.path.join(src, "cpu")])
              else () for cc in units]

    def compile_and_link(extra):
        cmds = [[cxx, *_cxx_flags(), *unit_flags, *extra, *_file_flags(cc), *include, "-c",
                 os.path.relpath(cc, src), "-o", os.path.join(tmp, os.path.basename(cc) + ".o")]
                for cc, unit_flags in zip(units, scoped)]
        objs, printed = _compile_units(cmds, units, src, tmp)
        with open(out_path + VECTOR_REPORT, "w", encoding="utf-8") as f:
            f.writelines(f"== {os.path.basename(cc)} ==\n{out}" for cc, out in zip(units, printed))
        libs = ["-lm", "-pthread"] + (["-lmvec"] if "-DKLDIV_NO_LIBMVEC" not in extra else [])
        strict = []
        if sys.platform.startswith("linux"):
            export_map = os.path.join(tmp, "exports.map")
            with open(export_map, "w", encoding="utf-8") as f:
                f.write(CPU_EXPORT_MAP)
            strict = ["-Wl,--no-undefined", f"-Wl,--version-script={export_map}"]
        _run([cxx, "-shared", "-o", out_path, *objs, *libs, *strict], tmp)

    try:
        compile_and_link([])
    except BuildError:
        # No libmvec (musl, non-x86 glibc < 2.38, ...): the same kernels with scalar log/exp calls.
        compile_and_link(["-DKLDIV_NO_LIBMVEC"])


def _build_cuda(src, out_path, tmp):
    nvcc = _nvcc()
    if not nvcc:
        raise BuildError("nvcc not found")
    cus = _sources(src, "GPU")
    if not cus:
        raise BuildError("no CUDA sources in custom_ops/gpu")
    proc = _run([nvcc, *NVCC_FLAGS, *nvcc_arch_flags(nvcc), *_nvcc_threads(nvcc), "-I", os.path.join(src, "common"),
                 "-I", os.path.join(src, "gpu"), *cus, "-o", out_path], tmp)
    with open(out_path + RESOURCE_REPORT, "w", encoding="utf-8") as f:
        f.write(proc.stdout + proc.stderr)


@functools.lru_cache(maxsize=None)
def _nvcc_threads(nvcc):
    """``--threads 0`` (one thread per CPU for the architectures of a source) where this nvcc has it (11.5+): the
    same output, built in parallel. Not part of the source hash for that reason."""
    try:
        out = subprocess.run([nvcc, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return ("--threads", "0") if "--threads" in out else ()


def build_one(device, out_dir, src=None):
    """Compile the library for ``device`` into ``out_dir`` (atomically) with its stamp file; return its path."""
    src = src or source_dir()
    if not src:
        raise BuildError("the kernel sources (custom_ops/) are not available")
    os.makedirs(out_dir, exist_ok=True)
    name = LIB_NAMES[device]
    final = os.path.join(out_dir, name)
    with tempfile.TemporaryDirectory(prefix="ms_kldiv_build_") as tmp:
        tmp_lib = os.path.join(tmp, name)
        if device == "GPU":
            _build_cuda(src, tmp_lib, tmp)
        else:
            _build_cpu(src, tmp_lib, tmp, _DIAG_FLAGS if device == DIAGNOSTICS else ())
        # The stamp first (names the sources, the size and the hash of the library), then the library, each written
        # under a temporary name and renamed: an interrupted build or a full disk never leaves a partial file that
        # passes the check (a process that already loaded the old library keeps its mapping).
        _write_atomically(final + ".stamp", f"{source_hash(device, src)}\n{_fingerprint(tmp_lib)}\n".encode())
        for suffix in _COMPANIONS + ("",):
            if os.path.isfile(tmp_lib + suffix):
                with open(tmp_lib + suffix, "rb") as f:
                    _write_atomically(final + suffix, f.read())
    return final


def _write_atomically(path, data):
    staged = f"{path}.tmp{os.getpid()}"
    try:
        with open(staged, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staged, path)
    except OSError:  # a full disk: no partial copy left behind under the staged name
        with contextlib.suppress(OSError):
            os.remove(staged)
        raise


def _fingerprint(path):
    """'<size> <sha256>' of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return f"{os.path.getsize(path)} {h.hexdigest()}"


def build(out_dir, cuda=None, log=print):
    """What setup.py runs: the CPU library always, the CUDA one when nvcc is here (``cuda=None``: if possible)."""
    reason = cuda_skipped_reason()
    devices = ["CPU"]
    if cuda or (cuda is None and reason is None):
        if reason and cuda:
            raise BuildError(f"cannot build the CUDA library: {reason}")
        devices.append("GPU")
    elif reason:
        log(f"ms_kldiv: CUDA library skipped ({reason})")
    # Side by side: each build is mostly one compiler process at a time (the CPU library's largest unit, nvcc).
    with concurrent.futures.ThreadPoolExecutor(len(devices)) as pool:
        futures = [pool.submit(_build_or_reuse, device, out_dir, log) for device in devices]
        return [f.result() for f in futures]


def _build_or_reuse(device, out_dir, log):
    """build_one into ``out_dir``, by way of the per-user cache keyed by the source hash (sources, headers, flags,
    compiler): a second install of the same sources (a new venv, a wheel next to an install) copies the library
    instead of compiling it again, and a first one leaves it there for the next."""
    src = source_dir()
    name, expected = LIB_NAMES[device], source_hash(device, src)
    try:
        cache = _load_env().cache_dir("lib", expected)
    except OSError:  # no writable cache anywhere
        cache = None
    if cache is None:
        path = build_one(device, out_dir, src)
    else:
        with _file_lock(os.path.join(cache, ".lock")):
            cached = os.path.join(cache, name)
            if not (os.path.isfile(cached) and _stamp_ok(cached, expected)):
                build_one(device, cache, src)
            os.makedirs(out_dir, exist_ok=True)
            path = os.path.join(out_dir, name)
            for suffix in (".stamp", *_COMPANIONS, ""):  # the stamp first, as build_one writes them
                if suffix and not os.path.isfile(cached + suffix):
                    continue  # a companion this build does not make
                with open(cached + suffix, "rb") as f:
                    _write_atomically(path + suffix, f.read())
    log(f"ms_kldiv: built {path}")
    return path


def copy_sources(dest):
    """Ship the kernel sources inside the package so an installed copy can rebuild for its own machine."""
    src = source_dir()
    if not src:
        return
    for sub in ("common", "cpu", "gpu"):
        d = os.path.join(src, sub)
        if os.path.isdir(d):
            shutil.copytree(d, os.path.join(dest, sub), dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("*.o", "*.so", "__pycache__"))


# --------------------------------------------------------------------------------------------- run time
@contextlib.contextmanager
def _file_lock(path):
    import fcntl
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _stamp_ok(lib, expected):
    """The stamp names these sources (when known) and the library on disk is the one the stamp describes:
    a truncated or corrupt library is never handed to the loader (mapping one crashes the process)."""
    try:
        with open(lib + ".stamp", encoding="utf-8") as f:
            lines = f.read().split("\n")
    except OSError:
        return expected is None and elf_intact(lib)
    if expected is not None and lines[0].strip() != expected:
        return False
    fingerprint = lines[1].strip() if len(lines) > 1 else ""
    if not fingerprint:  # a stamp from before fingerprints: the structural check
        return elf_intact(lib)
    try:
        size = int(fingerprint.split()[0])
        return os.path.getsize(lib) == size and _fingerprint(lib) == fingerprint
    except (OSError, ValueError):
        return False


def elf_intact(path):
    """A structural check of an ELF shared library without loading it: the magic, and section and program header
    tables that end inside the file (a truncated copy fails it)."""
    import struct
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return False
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only
        return False
    order = "<" if head[5] == 1 else ">"
    e_phoff, e_shoff = struct.unpack_from(order + "QQ", head, 32)
    e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from(order + "HHHH", head, 54)
    return e_phoff + e_phentsize * e_phnum <= size and e_shoff + e_shentsize * e_shnum <= size


def _candidates(device, expected):
    """Where a library for ``device`` may be: the installed package's, then the per-user cache's."""
    name = LIB_NAMES[device]
    cands = [os.path.join(HERE, "_lib", name)] if device != DIAGNOSTICS else []
    if expected:
        try:
            cands.append(os.path.join(_load_env().cache_dir("lib", expected), name))
        except OSError:  # no writable cache anywhere: nothing can be cached there either
            pass
    return cands


def find_library(device):
    """Path of an up-to-date library for ``device`` (``'CPU'``/``'GPU'``) or None; never compiles."""
    name = LIB_NAMES[device]
    src = source_dir()
    expected = source_hash(device, src) if src else None
    override = os.environ.get("MS_KLDIV_LIB_DIR")
    if override:  # an explicit choice is taken whatever sources it was built from, if it is intact
        p = os.path.join(override, name)
        return p if os.path.isfile(p) and _stamp_ok(p, None) else None
    for p in _candidates(device, expected):
        if os.path.isfile(p) and _stamp_ok(p, expected):
            return p
    return None


def ensure_library(device, log=None):
    """An up-to-date library for ``device``, compiling it once into the per-user cache if needed."""
    if device not in LIB_NAMES:
        raise BuildError(f"no AOT library for device target {device!r}")
    found = find_library(device)
    if found:
        return found
    if os.environ.get("MS_KLDIV_LIB_DIR"):
        raise BuildError(f"{LIB_NAMES[device]} not found, or damaged, in "
                         f"MS_KLDIV_LIB_DIR={os.environ['MS_KLDIV_LIB_DIR']}")
    if os.environ.get("MS_KLDIV_NO_BUILD", "") not in ("", "0"):
        raise BuildError(f"{LIB_NAMES[device]} is not built and MS_KLDIV_NO_BUILD is set")
    src = source_dir()
    if not src:
        raise BuildError(f"{LIB_NAMES[device]} is not built and the kernel sources are not installed")
    if device != "GPU" and not _cxx():
        raise BuildError(f"{LIB_NAMES[device]} is not built and no C++ compiler was found (install g++ or set CXX)")
    if device == "GPU":
        reason = cuda_skipped_reason()
        if reason:
            raise BuildError(f"{LIB_NAMES[device]} is not built: {reason}")
    damaged = [p for p in _candidates(device, source_hash(device, src)) if os.path.isfile(p)]
    if damaged and log:
        log(f"ms_kldiv: {', '.join(damaged)} does not match its build stamp (damaged or stale); building a new one")
    out_dir = _load_env().cache_dir("lib", source_hash(device, src))
    with _file_lock(os.path.join(out_dir, ".lock")):
        found = find_library(device)  # another process may have finished while we waited
        if found:
            return found
        for staged in glob.glob(os.path.join(out_dir, LIB_NAMES[device] + "*.tmp*")):
            os.remove(staged)  # left by a build that was killed before its rename (builds here hold the lock)
        if log:
            log(f"ms_kldiv: compiling {LIB_NAMES[device]} once into {out_dir}")
        return build_one(device, out_dir, src)


def library_info(path):
    """A built library's own one-line description, e.g. 'libkldiv_cpu abi=1 isa=avx512 threads=2 steer=1 libmvec=1'."""
    import ctypes
    fn = getattr(ctypes.CDLL(path), ABI_SYMBOL)
    fn.restype = ctypes.c_char_p
    return fn().decode()


def library_isa(path):
    """The kernel unit the CPU library at ``path`` runs in this process: 'avx512', 'avx2' or 'baseline'."""
    m = re.search(r" isa=(\w+)", library_info(path))
    return m.group(1) if m else None


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="python -m ms_kldiv._build", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="output folder (default: the per-user cache, as at run time)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--cuda", dest="cuda", action="store_true", default=None, help="require the CUDA library")
    g.add_argument("--no-cuda", dest="cuda", action="store_false", help="CPU library only")
    args = ap.parse_args(argv)
    if args.out:
        build(os.path.abspath(args.out), cuda=args.cuda)
    else:
        print(ensure_library("CPU", log=print))
        if args.cuda or (args.cuda is None and cuda_skipped_reason() is None):
            print(ensure_library("GPU", log=print))
    return 0


if __name__ == "__main__":
    sys.exit(main())
