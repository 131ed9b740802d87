#!/usr/bin/env bash
# Data-parallel checks on a GPU machine: two processes, each engine, each backend it serves. Not part of CI
# (the CI machine has no GPU); run it when a GPU machine is at hand:
#
#   bash scripts/setup.sh                                   # the venv (CPU builds), then, for the GPUs:
#   .venv/bin/pip install --force-reinstall torch 'jax[cuda12]'     # CUDA builds of torch and JAX
#   HOROVOD_GPU_OPERATIONS=NCCL bash scripts/install_horovod.sh     # Horovod with NCCL (optional)
#   bash scripts/gpu_check.sh
#
# The native engine (torch.distributed) puts each worker on cuda:LOCAL_RANK and reduces the gradients with
# NCCL (the host operations with Gloo): NCCL cannot run two ranks on one GPU, so this needs two GPUs. It runs
# the native engine's tests (identical workers equal to one process, resume on another worker count, a killed
# worker) under torch and JAX, and, when Horovod is installed, Horovod's under TensorFlow, torch and JAX.
# Equality with one process is checked to 1e-6, as on CPU: GPU kernels that are not deterministic may need
# TF_DETERMINISTIC_OPS=1 / CUBLAS_WORKSPACE_CONFIG=:4096:8 (set below).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "gpu_check.sh: no nvidia-smi: not a GPU machine" >&2; exit 2; }
nvidia-smi -L
gpus=$(nvidia-smi -L | grep -c '^GPU')
if [ "$gpus" -lt 2 ]; then
  echo "gpu_check.sh: needs 2 GPUs (NCCL runs one rank per GPU); found $gpus" >&2
  exit 2
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export TF_DETERMINISTIC_OPS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
status=0
summary=()
run() {  # run NAME BACKEND PYTEST_ARGS...
  local name=$1 backend=$2
  shift 2
  if KERAS_BACKEND=$backend timeout 1200 python -m pytest -q -p no:cacheprovider "$@"; then
    summary+=("$name $backend: passed")
  else
    summary+=("$name $backend: FAILED")
    status=1
  fi
}
python -c "import torch; assert torch.cuda.is_available(), 'torch has no CUDA: install a CUDA build'"
for backend in torch jax; do
  run native "$backend" tests/test_engines.py tests/test_sharded_evaluation.py -k "native or identical or resumes or killed"
done
if python -c "import horovod.torch" 2>/dev/null; then
  for backend in tensorflow torch jax; do
    run horovod "$backend" tests/test_distributed.py -k "identical or resumes or killed"
  done
else
  summary+=("horovod: not installed (HOROVOD_GPU_OPERATIONS=NCCL bash scripts/install_horovod.sh)")
fi
printf '%s\n' "${summary[@]}"
exit $status
