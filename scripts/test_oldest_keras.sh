#!/usr/bin/env bash
# kfit's core tests (numerics, stream, checkpoint and resume, fidelity to model.fit) on the OLDEST Keras that
# pyproject.toml allows ("keras>=X" -> keras==X), on TensorFlow, JAX and PyTorch.
#   bash scripts/test_oldest_keras.sh                  # all three backends
#   KFIT_BACKENDS=jax bash scripts/test_oldest_keras.sh -k resume
# The venv is .venv-keras-oldest, created and filled once (like scripts/setup.sh; refilled when pyproject.toml
# changes). TensorFlow is the newest whose declared requirements accept that Keras: tensorflow-cpu 2.21
# requires keras>=3.12, so Keras 3.10 gets tensorflow-cpu 2.20. kfit is imported from this checkout (not
# installed into the venv).
set -euo pipefail
[ "${KFIT_OLDEST_KERAS:-1}" = 0 ] && { echo "Oldest-Keras tests skipped (KFIT_OLDEST_KERAS=0)"; exit 0; }
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
keras_min=$(sed -n 's/^ *"keras>=\([0-9.]*\)".*/\1/p' pyproject.toml | head -n 1)
[ -n "$keras_min" ] || { echo "no keras>=X in pyproject.toml" >&2; exit 1; }
venv=.venv-keras-oldest
if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv "$venv"
fi
stamp="$venv/.kfit-installed"
filled="$keras_min with pytest-xdist, pytest-timeout and grain"  # (what the stamp says was installed)
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$(cat "$stamp")" != "$filled" ]; then
  "$venv/bin/python" -m pip install -q --upgrade pip
  # torch==2.13.0 is the CPU build; an unpinned torch would pull a multi-GB CUDA build.
  "$venv/bin/python" -m pip install -q "keras==$keras_min" "tensorflow-cpu<2.21" "jax[cpu]" "torch==2.13.0" \
    h5py numpy pytest pytest-xdist pytest-timeout scikit-learn grain
  echo "$filled" >"$stamp"
fi
"$venv/bin/python" -c "import keras; print('Oldest Keras:', keras.__version__)"
# The core (what CI runs, 1.5 to 2.5 minutes per backend): numerics, the stream, kill-and-resume (arrays and a
# source), sources that batch themselves (tf.data, Grain, generators, DataLoaders: Keras's loop reads them ahead
# differently in every release), and the paths that lean on Keras's internals most: pad_remainders, compiling
# minibatch sizes ahead, the native engines (torchrun; their uneven-shares job, not the long run of every
# scenario: -m "not jobs"), evaluations inside fit (cross-validation) and the static batch dimension of kfit's tf.data.
# KFIT_OLDEST_KERAS_TESTS=all adds the rest of the fit, checkpoint, schedule-callback and fidelity tests, and the
# engines' scenario jobs (about 5 more).
core_files=(tests/test_optimizers.py tests/test_stream.py tests/test_checkpoint_resume.py tests/test_padding.py
            tests/test_engines.py tests/test_cross_validation.py tests/test_static_batch.py tests/test_sources.py)
compile_ahead=(test_a_minibatch_size_compiled_ahead_is_not_compiled_again_when_training_reaches_it
               test_a_minibatch_size_schedule_compiles_the_coming_sizes_ahead_and_trains_as_without
               test_a_model_compiled_again_trains_with_its_new_metrics_after_sizes_were_compiled_ahead
               test_a_size_compiled_ahead_and_a_size_traced_by_training_never_trace_at_once
               test_compiled_train_functions_are_bounded_by_distinct_shapes
               test_tensorflows_xla_does_not_compile_again_a_size_compiled_ahead_when_training_reaches_it)
selection=(-m "not jobs")
if [ "${KFIT_OLDEST_KERAS_TESTS:-core}" = all ]; then
  core_files+=(tests/test_fit.py tests/test_checkpoint.py tests/test_hyperparameter_callbacks.py tests/test_keras_fidelity.py)
  selection=()
else
  core_files+=("${compile_ahead[@]/#/tests/test_fit.py::}")
fi
core=()
for f in "${core_files[@]}"; do
  if [ -e "${f%%::*}" ]; then core+=("$f"); else echo "note: $f is not in this checkout; not run"; fi
done
# The test files run on KFIT_TEST_WORKERS processes, as in scripts/test.sh (default 2: the machine's cores).
workers=${KFIT_TEST_WORKERS:-2}
parallel=()
[ "$workers" = "1" ] || parallel=(-n "$workers" --dist loadfile)
status=0
summary=()
for backend in ${KFIT_BACKENDS:-tensorflow jax torch}; do
  echo "=== Keras $keras_min, KERAS_BACKEND=$backend ==="
  if KERAS_BACKEND=$backend PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}" \
      "$venv/bin/python" -m pytest -q -p no:cacheprovider --durations=10 "${parallel[@]}" "${selection[@]}" "${core[@]}" "$@"; then
    summary+=("keras $keras_min, $backend: passed")
  else
    summary+=("keras $keras_min, $backend: FAILED")
    status=1
  fi
done
printf '%s\n' "${summary[@]}"
exit $status
