#!/usr/bin/env bash
# Build and install Horovod 0.28.1 with its TensorFlow and PyTorch plugins and Gloo, for Keras 3.
#
# Horovod 0.28.1 (its newest release) ships no wheel; pip builds it from the source release. Two edits
# make it build against TensorFlow 2.21 and torch 2.13:
#   * drop the line naming xla_mpi_ops.cc from horovod/tensorflow/CMakeLists.txt;
#   * set CMAKE_CXX_STANDARD 17 in CMakeLists.txt and horovod/torch/CMakeLists.txt.
# The built wheel is cached in $KFIT_WHEEL_CACHE (default ~/.cache/kfit/wheels), keyed by the
# TensorFlow, torch and Python versions, so a second run installs in seconds.
#
# GPUs: HOROVOD_GPU_OPERATIONS=NCCL builds the NCCL allreduce in (with CUDA builds of TensorFlow and torch and
# NCCL installed; HOROVOD_NCCL_HOME if NCCL is not where CUDA is); the cache key then says "nccl".
# Not tried here (no GPU); scripts/gpu_check.sh runs the data-parallel tests on a GPU machine.
#
# Usage:  bash scripts/install_horovod.sh        (in the environment that has tensorflow-cpu and torch)
#         HOROVOD_GPU_OPERATIONS=NCCL bash scripts/install_horovod.sh
set -euo pipefail

HOROVOD_VERSION=0.28.1
PYTHON=${PYTHON:-python}
cache_root=${KFIT_WHEEL_CACHE:-$HOME/.cache/kfit/wheels}

if ! "$PYTHON" -c "import tensorflow, torch" 2>/dev/null; then
  echo "install_horovod.sh: install tensorflow-cpu and torch first (pip install -e '.[tensorflow,torch]')" >&2
  exit 2
fi
if "$PYTHON" -c "import horovod.tensorflow, horovod.torch" 2>/dev/null \
   && [ "$("$PYTHON" -c 'import horovod; print(horovod.__version__)')" = "$HOROVOD_VERSION" ] \
   && { [ -z "${HOROVOD_GPU_OPERATIONS:-}" ] || "$PYTHON" -c "import horovod.torch as h; assert h.nccl_built()" 2>/dev/null; }; then
  echo "Horovod $HOROVOD_VERSION with TensorFlow and PyTorch plugins is already installed."
  exit 0
fi

key=$("$PYTHON" - <<'PY'
import sys, tensorflow as tf, torch
print(f"py{sys.version_info.major}{sys.version_info.minor}-tf{tf.__version__}-torch{torch.__version__}")
PY
)
gpu_ops=${HOROVOD_GPU_OPERATIONS:-}
cache="$cache_root/horovod-$HOROVOD_VERSION-$key${gpu_ops:+-$(echo "$gpu_ops" | tr '[:upper:]' '[:lower:]')}"
mkdir -p "$cache"
wheel=$(ls "$cache"/horovod-*.whl 2>/dev/null | head -1 || true)

if [ -z "$wheel" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "Building Horovod $HOROVOD_VERSION from source (about 5 minutes on 2 cores)..."
  "$PYTHON" -m pip download --no-deps --no-binary :all: --no-build-isolation -d "$work" "horovod==$HOROVOD_VERSION" >/dev/null
  tar -xzf "$work"/horovod-$HOROVOD_VERSION.tar.gz -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"
  sed -i '/xla_mpi_ops\.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
  for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
    sed -i -E 's/set\(CMAKE_CXX_STANDARD [0-9]+\)/set(CMAKE_CXX_STANDARD 17)/' "$f"
    grep -q 'CMAKE_CXX_STANDARD 17' "$f" || sed -i '1i set(CMAKE_CXX_STANDARD 17)' "$f"
  done
  # Horovod's bundled Gloo needs a CMake older than 4 (it declares cmake_minimum_required < 3.5).
  if ! command -v cmake >/dev/null || cmake --version | head -1 | grep -q ' 4\.'; then
    "$PYTHON" -m pip install -q 'cmake>=3.13,<4'
  fi
  export CMAKE_POLICY_VERSION_MINIMUM=3.5
  (cd "$src" && HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
      HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 MAKEFLAGS=${MAKEFLAGS:--j2} \
      "$PYTHON" -m pip wheel --no-deps --no-build-isolation --no-cache-dir -w "$cache" . )
  wheel=$(ls "$cache"/horovod-*.whl | head -1)
fi

"$PYTHON" -m pip install --no-deps "$wheel"
"$PYTHON" -m pip install -q cloudpickle psutil pyyaml packaging cffi
horovodrun --check-build
