#!/usr/bin/env bash
# kfit's demo: CNTK's advanced MNIST sample (per-sample schedules, a growing minibatch, progress lines,
# TensorBoard, checkpoints, cross-validation that halves the learning rate and stops, a final test) on the
# digits data that ships with scikit-learn. On a fresh machine it first installs kfit into .venv.
#   bash scripts/demo.sh                       # KERAS_BACKEND=tensorflow by default
#   KERAS_BACKEND=jax bash scripts/demo.sh --fresh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
# Quiet TensorFlow's start-up notices (its oneDNN lines are printed whatever TF_CPP_MIN_LOG_LEVEL says).
export KERAS_BACKEND=${KERAS_BACKEND:-tensorflow} TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2} \
  TF_ENABLE_ONEDNN_OPTS=${TF_ENABLE_ONEDNN_OPTS:-0}
python examples/cntk_advanced_mnist.py --out "runs/mnist-$KERAS_BACKEND" "$@"
