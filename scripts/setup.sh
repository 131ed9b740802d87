#!/usr/bin/env bash
# Creates .venv with kfit and its three backends (CPU builds), idempotently.
#   KFIT_WITH_HOROVOD=1 also builds Horovod (scripts/install_horovod.sh; about 5 minutes the first time).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
stamp=.venv/.kfit-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  python -m pip install -q --upgrade pip
  # torch==2.13.0 is the CPU build; an unpinned torch would pull a multi-GB CUDA build.
  python -m pip install -q -e ".[all]"
  touch "$stamp"
fi
if [ "${KFIT_WITH_HOROVOD:-0}" = "1" ]; then
  bash scripts/install_horovod.sh
fi
