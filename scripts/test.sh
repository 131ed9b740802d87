#!/usr/bin/env bash
# The test suite: ruff, then per Keras backend (TensorFlow, JAX, PyTorch) pytest (doctests included) and
# Keras's own trainer and callback tests routed through kfit (scripts/keras_suite.sh, its CI subset; about 2, 1.2
# and 2.5 minutes on 2 cores); then kfit's core tests on the oldest Keras that pyproject.toml allows
# (scripts/test_oldest_keras.sh). KFIT_KERAS_SUITE=0 / KFIT_OLDEST_KERAS=0 leave those tiers out.
# pytest runs its test files on KFIT_TEST_WORKERS processes (pytest-xdist, default 2: the machine's cores; every
# test process runs its backend on one thread; 1 runs them in this process, one after the other). Each backend's
# pytest ends with its 15 slowest tests (--durations), where the CI log shows what its time went to.
# On a fresh machine it first installs everything (scripts/setup.sh, Horovod included).
#   bash scripts/test.sh                 # all three backends
#   KFIT_BACKENDS=jax KFIT_KERAS_SUITE=0 KFIT_OLDEST_KERAS=0 bash scripts/test.sh -k stream  # one backend, a subset
set -euo pipefail
cd "$(dirname "$0")/.."
KFIT_WITH_HOROVOD=${KFIT_WITH_HOROVOD:-1} bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
ruff check kfit tests examples benchmarks
status=0
summary=()
for backend in ${KFIT_BACKENDS:-tensorflow jax torch}; do
  echo "=== KERAS_BACKEND=$backend ==="
  workers=${KFIT_TEST_WORKERS:-2}
  parallel=()
  [ "$workers" = "1" ] || parallel=(-n "$workers" --dist loadfile)
  if KERAS_BACKEND=$backend python -m pytest -q -p no:cacheprovider --durations=15 "${parallel[@]}" "$@" \
     && { [ "${KFIT_KERAS_SUITE:-1}" != "1" ] || bash scripts/keras_suite.sh "$backend"; }; then
    summary+=("$backend: passed")
  else
    summary+=("$backend: FAILED")
    status=1
  fi
done
if [ "${KFIT_OLDEST_KERAS:-1}" = "1" ]; then
  bash scripts/test_oldest_keras.sh || { summary+=("oldest Keras: FAILED"); status=1; }
fi
printf '%s\n' "${summary[@]}"
exit $status
