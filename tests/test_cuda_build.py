"""The CUDA library compiles with nvcc and exports exactly the ABI of custom_ops/common/kldiv_abi.h,
distill_abi.h and sparse_abi.h, within every kernel's resource limits on every architecture it is built for.

No GPU is needed, and no second build: the library under test is the one this package uses (the install's, or the one
``ensure_library`` compiles once into the cache), and its build wrote ptxas's report beside it
(``_build.RESOURCE_REPORT``). Its dynamic symbol table is checked against the ABI, the report against every kernel's
register, spill and shared-memory limits for each SASS architecture of the build. Running the kernels is tests/gpu/'s
job (on the CUDA-on-CPU stand-in without a GPU). Skips only when nvcc is absent.
"""
import os
import re
import shutil
import subprocess

import pytest

from ms_kldiv import _build

from conftest import distill_abi_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "custom_ops")
NVCC = _build._nvcc() if hasattr(_build, "_nvcc") else shutil.which("nvcc")
pytestmark = pytest.mark.skipif(not NVCC, reason="nvcc not found (set NVCC or CUDA_HOME)")
# The prefixes of the library's exported names (kldiv_abi.h, distill_abi.h, sparse_abi.h).
ABI_PREFIXES = ("KLDiv", "Distill", "Sparse")


def abi_symbols():
    """The exported names the ABI header defines, from its X-macro (so a new variant needs no edit here)."""
    with open(os.path.join(SRC, "common", "kldiv_abi.h"), encoding="utf-8") as f:
        text = f.read()
    variants = re.findall(r"X\((\w+),\s*(\w+),\s*\d+,\s*(?:true|false)\)", text)
    assert len(variants) == 8, variants
    names = {"KLDivLibInfo"}
    for red, space in variants:
        for kind in ("Fwd", "Bwd", "BwdInput", "BwdTarget"):
            fn = f"KLDiv{kind}{red}{space}"
            names |= {fn, fn + "InferShape"}
    with open(os.path.join(SRC, "common", "distill_abi.h"), encoding="utf-8") as f:
        distill = distill_abi_kernels(f.read())
    assert len(distill) == 7, distill  # forward, three backwards, two vocabulary-parallel pieces, the hard term
    with open(os.path.join(SRC, "common", "sparse_abi.h"), encoding="utf-8") as f:
        sparse = set(re.findall(r"^//\s+(Sparse\w+)\s+nparam", f.read(), flags=re.M))
    assert sparse == {"SparseFwd", "SparseBwd"}, sparse
    kernels = distill | sparse
    return names | kernels | {n + "InferShape" for n in kernels}


@pytest.fixture(scope="module")
def cuda_lib():
    """The library this package loads on a GPU (built by the install; else compiled once into the cache)."""
    return _build.ensure_library("GPU")


@pytest.fixture(scope="module")
def report(cuda_lib):
    """What nvcc printed while building ``cuda_lib`` (ptxas -v's report included)."""
    path = cuda_lib + _build.RESOURCE_REPORT
    assert os.path.isfile(path), f"no build report beside {cuda_lib} (a library built without ms_kldiv._build?)"
    with open(path, encoding="utf-8") as f:
        return f.read()


def dynamic_symbols(lib, defined=True):
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("nm not found")
    flag = "--defined-only" if defined else "--undefined-only"
    out = subprocess.run([nm, "-D", flag, lib], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_exports_exactly_the_abi(cuda_lib):
    exported = {s for s in dynamic_symbols(cuda_lib) if s.startswith(ABI_PREFIXES)}
    expected = abi_symbols()
    assert exported == expected, (f"missing: {sorted(expected - exported)}; "
                                  f"unexpected: {sorted(exported - expected)}")


def test_nothing_else_leaks(cuda_lib):
    """-fvisibility=hidden: only the ABI is exported (none of our kernels, templates or cudart). libstdc++'s
    own inline instantiations (std::vector for the InferShape returns) keep the default visibility its
    headers give them; they are weak and harmless."""
    exported = dynamic_symbols(cuda_lib)
    std = ("_ZNSt", "_ZSt", "_ZNKSt")
    leaked = sorted(s for s in exported if not s.startswith(ABI_PREFIXES) and not s.startswith(std)
                    and s not in ("_init", "_fini", "_edata", "_end", "__bss_start"))
    assert not leaked, leaked[:20]


def test_runtime_is_static(cuda_lib):
    """cudart is linked statically (nvcc's default): the library needs only the driver at run time, not the
    toolkit's libcudart.so of the build machine."""
    undefined = dynamic_symbols(cuda_lib, defined=False)
    assert not any(s.startswith("cudaMalloc") or s.startswith("cudaLaunch") for s in undefined), \
        sorted(s for s in undefined if s.startswith("cuda"))[:10]


def test_build_arch_list_is_supported_by_this_nvcc():
    """Every -gencode in the real build must be accepted by the nvcc found here (CUDA 13 dropped sm_70)."""
    help_text = subprocess.run([NVCC, "--list-gpu-arch"], capture_output=True, text=True).stdout
    supported = set(re.findall(r"compute_(\d+)", help_text))
    if not supported:
        pytest.skip("this nvcc cannot list its architectures")
    wanted = set(re.findall(r"arch=compute_(\d+)", " ".join(_build.nvcc_arch_flags(NVCC))))
    assert wanted <= supported, f"nvcc here lacks compute_{sorted(wanted - supported)}; supported: {sorted(supported)}"


# ------------------------------------------------------------------------------- resources per architecture
MAX_REGS = 255
MAX_STATIC_SMEM = 48 * 1024


def _kernel_families():
    """The __global__ function names in custom_ops/gpu/*.cu."""
    names = set()
    for f in os.listdir(os.path.join(SRC, "gpu")):
        if f.endswith(".cu"):
            with open(os.path.join(SRC, "gpu", f), encoding="utf-8") as fh:
                names |= set(re.findall(r"__global__\s+void\s+(\w+)", fh.read()))
    return names


def _parse_ptxas(log):
    """{"sm_XX": {mangled kernel: {regs, spill_stores, spill_loads, stack, smem}}} from ``ptxas -v`` output. Each
    kernel's lines must follow its "Compiling entry function" line (an interleaved report fails, not misattributes)."""
    out, cur, waiting = {}, None, False
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)' for '(sm_\d+)'", line)
        if m:
            assert not waiting, f"no 'Used ... registers' line for the kernel before: {line}"
            usage = {"regs": 0, "spill_stores": 0, "spill_loads": 0, "stack": 0, "smem": 0}
            cur, waiting = out.setdefault(m.group(2), {}).setdefault(m.group(1), usage), True
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur["stack"], cur["spill_stores"], cur["spill_loads"] = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            assert waiting, f"a second 'Used ... registers' line for one kernel: {line}"
            cur["regs"], waiting = int(m.group(1)), False
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(s.group(1)) if s else 0
    assert not waiting, "the report ends inside a kernel's entry"
    return out


def _built_archs():
    """The SASS architectures of the build (``code=sm_XX``; the PTX target goes through no ptxas)."""
    return set(re.findall(r"code=sm_(\d+)", " ".join(_build.nvcc_arch_flags(NVCC))))


def test_build_is_clean(report):
    # nvcc and host-compiler warnings are errors-in-waiting for other toolkits (ptxas -v's lines are "info").
    assert "warning" not in report.lower(), report[-4000:]


def test_resource_usage_within_limits(report):
    """Registers, spills, stack and static shared memory of every kernel for every architecture built (ptxas -v;
    shown with -s): no spills, at most 255 registers and 48 KiB of static shared memory; every architecture holds
    every kernel family and the same kernels."""
    usage_by_arch = _parse_ptxas(report)
    assert set(usage_by_arch) == {f"sm_{a}" for a in _built_archs()}, sorted(usage_by_arch)
    families = _kernel_families()
    for arch, usage in sorted(usage_by_arch.items()):
        for fam in families:
            assert any(fam in k for k in usage), f"{arch}: no instance of kernel {fam}"
        worst = max(usage.items(), key=lambda kv: kv[1]["regs"])
        print(f"\n{arch}: {len(usage)} kernels, max {worst[1]['regs']} registers ({worst[0]}), "
              f"max smem {max(u['smem'] for u in usage.values())} B, "
              f"max stack {max(u['stack'] for u in usage.values())} B")
        bad = {k: u for k, u in usage.items() if u["regs"] > MAX_REGS or u["spill_stores"] or u["spill_loads"]
               or u["smem"] > MAX_STATIC_SMEM}
        assert not bad, f"{arch}: kernels over limits or spilling: {bad}"
    assert len({frozenset(u) for u in usage_by_arch.values()}) == 1, "architectures compile different kernel sets"


def test_distillation_on_gpu_routes_to_this_library(cuda_lib, monkeypatch):
    """On device 'GPU', the registry gives 'auto' distillation the fused kernels of libkldiv_cuda.so (GPU Custom ops
    on the library's Distill* symbols) and 'composite' the closed forms; only building the ops is possible here (no
    GPU to launch them)."""
    from ms_kldiv import backends, distillation
    from ms_kldiv.backends import aot, composite, distill
    monkeypatch.setattr(aot._build, "ensure_library", lambda device, **_: cuda_lib if device == "GPU" else None)
    aot_backend = backends.get("aot", "GPU")
    monkeypatch.setattr(aot_backend, "_libs", {})
    backends._kernels.cache_clear()
    distillation._fused_rows.cache_clear()
    try:
        name, kernels = backends.get_distill_kernels("auto", "GPU")
        assert name == "aot" and isinstance(kernels, distill.AotDistillKernels)
        assert (kernels.lib_path, kernels.target) == (cuda_lib, "GPU")
        _, rows = distillation._fused_rows("auto", "GPU", 2.0, 0.5, False)
        names = [c.op.func for _, c in rows.cells_and_names() if isinstance(c, distill._AotKernel)]
        assert sorted(n.rsplit(":", 1)[1] for n in names) == ["DistillBwd", "DistillFwd"]
        assert all(n.rsplit(":", 1)[0] == cuda_lib for n in names)
        assert isinstance(backends.get_distill_kernels("composite", "GPU")[1], composite.CompositeDistillKernels)
    finally:
        backends._kernels.cache_clear()
        distillation._fused_rows.cache_clear()
