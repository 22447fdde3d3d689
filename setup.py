"""Installs ms_kldiv. Compiling the custom kernels is hooked into build_py (see ms_kldiv/_build.py)."""
import importlib.util
import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_build():
    # By file path: importing the ms_kldiv package would import MindSpore, which setup must not need.
    spec = importlib.util.spec_from_file_location("_ms_kldiv_build", os.path.join(HERE, "ms_kldiv", "_build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildPyWithKernels(build_py):
    """build_py that also compiles libkldiv_cpu.so (and libkldiv_cuda.so when nvcc is here) into ms_kldiv/_lib
    and ships the kernel sources as ms_kldiv/_csrc, so an installed copy can rebuild for its own machine.
    With ``pip install -e .`` the libraries go into the source tree's ms_kldiv/_lib."""

    def run(self):
        super().run()
        b = _load_build()
        editable = getattr(self, "editable_mode", False)
        pkg_dir = os.path.join(HERE, "ms_kldiv") if editable else os.path.join(self.build_lib, "ms_kldiv")
        if not editable:
            b.copy_sources(os.path.join(pkg_dir, "_csrc"))
        try:
            b.build(os.path.join(pkg_dir, "_lib"), cuda=None, log=lambda m: self.announce(m, level=2))
        except b.BuildError as e:
            # Not fatal: at run time 'auto' falls back to 'composite' (and says why) or compiles later.
            self.warn(f"ms_kldiv: kernel library not built ({str(e).splitlines()[0]})")


setup(
    name="ms_kldiv",
    version="0.1.0",
    description="Correct, fast Kullback-Leibler divergence loss for MindSpore (Ascend, GPU, CPU)",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["ms_kldiv", "ms_kldiv.*"]),
    include_package_data=True,
    cmdclass={"build_py": BuildPyWithKernels},
    install_requires=[
        "mindspore>=2.7,<2.11",  # tested: 2.7.2, 2.8.0, 2.9.0, 2.10.0 (ms_kldiv/_compat.py)
        "numpy<2",  # MindSpore 2.10 is built against NumPy 1.x
        "decorator",  # MindSpore's AKG (hybrid kernels) imports it without declaring it
    ],
    extras_require={
        "test": ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6", "ml_dtypes<0.5"],  # ml_dtypes: the CUDA stand-in's bf16 check; later releases need NumPy 2
        "bench": ["matplotlib"],
    },
)
