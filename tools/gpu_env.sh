#!/usr/bin/env bash
# Set up a venv on a CUDA machine for ms_kldiv's GPU tests: MindSpore 2.10 with its GPU plugin, which links
# CUDA 11 libraries, plus torch for tests/gpu (which needs no MindSpore). NOT YET RUN ON A GPU: see docs/gpu.md.
#
#   bash tools/gpu_env.sh [VENV_DIR]        # default: .venv-gpu in the repository root
#   source VENV_DIR/gpu_env                 # every later shell: CUDA_HOME, NVCC, LD_LIBRARY_PATH
#
# Needs: an NVIDIA driver (libcuda.so.1), python3 >= 3.9 with venv, and a real nvcc (any CUDA >= 11.x; CUDA 13
# is fine) to build libkldiv_cuda.so, found as $NVCC, on PATH, or under /usr/local/cuda/bin.
#
# Why the stub: MindSpore picks its GPU plugin (CUDA 11.1 or 11.6 build) from `$CUDA_HOME/bin/nvcc
# --version`, and the CUDA 11 libraries come from pip wheels that carry no nvcc. So CUDA_HOME points at a
# stub whose nvcc only reports release 11.6 and whose lib64 holds links to the wheels' libraries; ms_kldiv
# builds its own kernels with the real nvcc through $NVCC, which takes precedence over CUDA_HOME.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${1:-$ROOT/.venv-gpu}
PY=${PYTHON:-python3}

REAL_NVCC=${NVCC:-$(command -v nvcc || true)}
[ -z "$REAL_NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && REAL_NVCC=/usr/local/cuda/bin/nvcc
if [ -z "$REAL_NVCC" ]; then
  echo "gpu_env: no nvcc found (set NVCC=/path/to/nvcc); libkldiv_cuda.so cannot be built without it" >&2
  exit 1
fi
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
  echo "gpu_env: warning: libcuda.so.1 (the NVIDIA driver) is not in the loader cache" >&2
fi

"$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip
# MindSpore 2.10 is built against NumPy 1.x. cuDNN must stay on 8.x (the plugin links libcudnn.so.8).
"$PIP" install -q "mindspore==2.10.*" "numpy<2" \
  "nvidia-cuda-runtime-cu11==11.8.89" "nvidia-cuda-nvrtc-cu11==11.8.89" "nvidia-cublas-cu11==11.11.3.6" \
  "nvidia-cudnn-cu11==8.9.6.50" "nvidia-curand-cu11==10.3.0.86" "nvidia-cufft-cu11==10.9.0.58" \
  "nvidia-cusolver-cu11==11.4.1.48" "nvidia-cusparse-cu11==11.7.5.86"
# torch with CUDA for tests/gpu (its own CUDA runtime; independent of MindSpore's CUDA 11).
"$PIP" install -q torch pytest hypothesis
"$PIP" install -q -e "$ROOT"

SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
STUB="$VENV/cuda11-stub"
mkdir -p "$STUB/bin" "$STUB/lib64"
cat >"$STUB/bin/nvcc" <<'EOF'
#!/bin/sh
# Stub for MindSpore's plugin selection only; it compiles nothing.
echo "nvcc: NVIDIA (R) Cuda compiler driver"
echo "Cuda compilation tools, release 11.6, V11.6.124"
EOF
chmod +x "$STUB/bin/nvcc"
LIBS=""
for d in "$SITE"/nvidia/*/lib; do
  [ -d "$d" ] || continue
  LIBS="${LIBS:+$LIBS:}$d"
  for f in "$d"/lib*.so*; do ln -sf "$f" "$STUB/lib64/"; done
done

cat >"$VENV/gpu_env" <<EOF
# source this file: MindSpore's GPU plugin sees CUDA 11 from pip wheels; ms_kldiv builds with the real nvcc.
export CUDA_HOME="$STUB"
export NVCC="$REAL_NVCC"
export LD_LIBRARY_PATH="$STUB/lib64:$LIBS\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PATH="$VENV/bin:\$PATH"
EOF

# shellcheck disable=SC1091
source "$VENV/gpu_env"
"$VENV/bin/python" - <<'EOF'
import ctypes
for lib in ("libcudart.so.11.0", "libcublas.so.11", "libcudnn.so.8", "libcurand.so.10", "libcufft.so.10",
            "libcusolver.so.11", "libcusparse.so.11"):
    ctypes.CDLL(lib)  # raises if a CUDA 11 library is still missing
print("gpu_env: CUDA 11 libraries load")
EOF
echo "gpu_env: done. Next: source $VENV/gpu_env, then see docs/gpu.md (tests/gpu, then the suite on GPU)."
