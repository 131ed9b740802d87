#!/usr/bin/env bash
# Keras's own trainer and callback tests, from the installed Keras wheel, with keras.Model.fit routed through
# kfit.fit(model, ..., seed=0) (kfit's own training path): every test that passes under plain Keras must pass.
#   bash scripts/keras_suite.sh [BACKEND...]        # default: tensorflow jax torch
#   bash scripts/keras_suite.sh jax -- -k "early_stopping or terminate"      # extra pytest arguments after --
# Per backend: the tests run routed (keras_suite/kfit_routing.py), then under plain Keras: by default
# only the tests that did not pass routed (same verdict, half the time: CI); with KFIT_KERAS_SUITE_PLAIN=all,
# every test (to see the full plain/routed counts). A test that passes plainly and fails routed fails this
# script unless keras_suite/expected_failures.txt lists it for that backend. A test running longer
# than KFIT_KERAS_SUITE_TIMEOUT seconds (default 60) fails, unless it passes when run once more, routed, on its
# own (a test stalled by a busy machine; the log says which ran twice).
# One pytest run longer than KFIT_KERAS_SUITE_RUN_LIMIT seconds (default 1500) is killed and fails the backend:
# the per-test limit is a SIGALRM, which a main thread blocked outside Python does not see (seen on torch).
# KFIT_KERAS_SUITE_SUBSET=ci (the default, what scripts/test.sh and CI run) leaves out trainer_test.py's
# steps_per_execution step-count tests (test_steps_per_execution_steps_count_*, *_unrolled_steps_*: about a
# fifth of the time, compile-bound; they pass routed on TensorFlow and JAX), and on PyTorch the jit_compile=True
# tests (names ending in _jit: torch.compile, 20-60 s each on 2 cores, about 40% of that backend's time; the
# _eager and _non_jit variants of the same tests run); KFIT_KERAS_SUITE_SUBSET=full runs every test. A -k given
# after -- replaces the subset's. The routed and plain runs spread their tests over KFIT_TEST_WORKERS processes
# (pytest-xdist, test by test; default 2: the machine's cores), each on one CPU thread as in kfit's own tests;
# 1 runs them in one process. Results (JSON per run, with the first error line
# of each test) and logs go to $KFIT_KERAS_SUITE_OUT (default: a temporary folder).
set -euo pipefail
[ "${KFIT_KERAS_SUITE:-1}" = 0 ] && { echo "Keras suite skipped (KFIT_KERAS_SUITE=0)"; exit 0; }
cd "$(dirname "$0")/.."
suite="$(pwd)/keras_suite"
keras_dir=$(python -c "import os, keras; print(os.path.dirname(keras.__file__))" 2>/dev/null) || {
  echo "keras_suite.sh: \`python\` ($(command -v python || echo 'not on PATH')) cannot import keras. Activate the" \
       "environment that has kfit's test dependencies (e.g. \`. .venv/bin/activate\`) and run again." >&2
  exit 2
}
site=$(dirname "$keras_dir")
# Keras's tests that train through fit: every callback test (orbax_checkpoint_test.py needs the optional
# orbax package; it runs when orbax is installed) and the trainer tests.
files=()
for f in "$keras_dir"/src/callbacks/*_test.py "$keras_dir/src/trainers/trainer_test.py"; do
  if [ "$(basename "$f")" = orbax_checkpoint_test.py ] && ! python -c "import orbax.checkpoint" 2>/dev/null; then
    continue
  fi
  files+=("$f")
done
backends=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do backends+=("$1"); shift; done
[ $# -gt 0 ] && shift  # the --; what follows goes to pytest
[ ${#backends[@]} -gt 0 ] || backends=(tensorflow jax torch)
case "${KFIT_KERAS_SUITE_SUBSET:-ci}" in
  ci|full) ;;
  *) echo "KFIT_KERAS_SUITE_SUBSET must be ci or full" >&2; exit 2 ;;
esac
subset_for() {  # BACKEND: the -k of the CI subset (nothing for the full suite)
  [ "${KFIT_KERAS_SUITE_SUBSET:-ci}" = ci ] || return 0
  local k="not steps_per_execution_steps_count and not unrolled_steps"
  [ "$1" = torch ] && k="$k and not (jit and not non_jit)"
  printf '%s\n' -k "$k"
}
out=${KFIT_KERAS_SUITE_OUT:-$(mktemp -d)}
mkdir -p "$out"

workers=${KFIT_TEST_WORKERS:-2}
suite_pytest() {  # BACKEND MODE PYTEST-ARGS...: one pytest run; fails only if pytest itself failed
  local b=$1 mode=$2 rc=0 start=$SECONDS
  shift 2
  local flags=(-p conftest -p kfit_routing --kfit-results="$out/$b-$mode.json"
               --kfit-timeout="${KFIT_KERAS_SUITE_TIMEOUT:-60}")
  [ "$mode" != plain ] && flags+=(--kfit-route)  # "again": timed-out tests run routed once more
  # "again" runs alone, in one process: its tests timed out on a busy machine
  [ "$workers" != 1 ] && [ "$mode" != again ] && flags+=(-n "$workers" --dist load)
  # JAX: one persistent compilation cache for the backend's runs, as in tests/conftest.py (the tests' many small
  # models compile the same XLA programs; the size limit turns on the cache's file lock)
  local jax_cache=()
  [ "$b" = jax ] && jax_cache=(JAX_COMPILATION_CACHE_DIR="$out/jax-compilation-cache"
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
    JAX_COMPILATION_CACHE_MAX_SIZE=$((4 << 30)))
  echo "=== Keras suite, KERAS_BACKEND=$b, $mode ==="
  (cd "$out" && env "${jax_cache[@]}" KERAS_BACKEND="$b" TF_CPP_MIN_LOG_LEVEL=2 PYTHONPATH="$suite${PYTHONPATH:+:$PYTHONPATH}" \
    OMP_NUM_THREADS=1 TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 \
    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
    timeout -k 30 "${KFIT_KERAS_SUITE_RUN_LIMIT:-1500}" python -m pytest -q -c "$suite/pytest.ini" --rootdir="$site" "${flags[@]}" "$@" \
    >"$out/$b-$mode.log" 2>&1) || rc=$?
  echo "$(tail -n 1 "$out/$b-$mode.log")  ($mode: $((SECONDS - start)) s)"
  if [ "$rc" -gt 1 ] && [ "$rc" -ne 5 ]; then  # 1: some tests failed, 5: none selected; else pytest failed
    tail -n 30 "$out/$b-$mode.log"
    return 1
  fi
}

status=0
for b in "${backends[@]}"; do
  mapfile -t subset < <(subset_for "$b")
  suite_pytest "$b" routed "${subset[@]}" "$@" "${files[@]}" || { status=1; continue; }
  mapfile -t slow < <(python "$suite/compare.py" --timed-out "$out/$b-routed.json" "$site")
  if [ ${#slow[@]} -gt 0 ]; then
    suite_pytest "$b" again "${slow[@]}" || { status=1; continue; }
    python "$suite/compare.py" --merge "$out/$b-routed.json" "$out/$b-again.json"
  fi
  if [ "${KFIT_KERAS_SUITE_PLAIN:-failures}" = all ]; then
    suite_pytest "$b" plain "${subset[@]}" "$@" "${files[@]}" || { status=1; continue; }
  else
    mapfile -t again < <(python "$suite/compare.py" --not-passed "$out/$b-routed.json" "$site")
    if [ ${#again[@]} -gt 0 ]; then
      suite_pytest "$b" plain "${again[@]}" || { status=1; continue; }
    else
      echo "{}" >"$out/$b-plain.json"
    fi
  fi
  python "$suite/compare.py" "$b" "$out/$b-plain.json" "$out/$b-routed.json" "$suite/expected_failures.txt" || status=1
  rm -rf "$out/jax-compilation-cache"
done
exit $status
