"""Installs ms_kldiv. Compiling the custom kernels is hooked into build_py (see ms_kldiv/_build.py)."""
from setuptools import find_packages, setup

setup(
    name="ms_kldiv",
    version="0.1.0",
    description="Correct, fast Kullback-Leibler divergence loss for MindSpore (Ascend, GPU, CPU)",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["ms_kldiv", "ms_kldiv.*"]),
    include_package_data=True,
    install_requires=[
        "mindspore>=2.10,<2.11",  # tested with 2.10.0
        "numpy<2",  # MindSpore 2.10 is built against NumPy 1.x
        "decorator",  # MindSpore's AKG (hybrid kernels) imports it without declaring it
    ],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6"],
        "bench": ["matplotlib"],
    },
)
