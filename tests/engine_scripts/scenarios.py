"""The torchrun job of tests/test_engines.py: the Horovod scenarios, unchanged, under the native engine.

    torchrun --standalone --nproc_per_node 2 tests/engine_scripts/scenarios.py OUT_DIR [SCENARIO ...]

First records what the engine says about this worker (``OUT_DIR/engine.rank<r>.json``) and checks its host
collectives, then runs ``tests/horovod_scripts/scenarios.py`` as it is: the same user script under another
launcher, with no change.
"""

from __future__ import annotations

import os
import runpy
import sys

HOROVOD_SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "horovod_scripts")
sys.path.insert(0, HOROVOD_SCRIPTS)

import common  # noqa: E402  (sets one thread per worker before the backend loads)
import numpy as np  # noqa: E402

import kfit.distributed as hvd  # noqa: E402
from kfit.distributed import _select  # noqa: E402

OUT = sys.argv[1]
hvd.init()
engine = _select.current()
rank = hvd.rank()
summed = engine.host_sum([np.array([rank + 1], np.int32), np.full((2, 3), 0.5 * (rank + 1), np.float64)], "test.sum")
payload = b"rank zero's bytes" if rank == 0 else None
info = {
    "engine": hvd.engine(),
    "class": type(engine).__name__,
    "rank": rank,
    "size": hvd.size(),
    "local_rank": hvd.local_rank(),
    "local_size": hvd.local_size(),
    "is_chief": hvd.is_chief(),
    "sum_int": summed[0].tolist(),
    "sum_float": summed[1].tolist(),
    "sum_dtypes": [str(s.dtype) for s in summed],
    "bytes": engine.broadcast_bytes(payload, 0, "test.bytes").decode(),
    "any_true": [hvd.any_true(rank == 1), hvd.any_true(False)],
}
common.save(os.path.join(OUT, f"engine.rank{rank}"), {}, info)
runpy.run_path(os.path.join(HOROVOD_SCRIPTS, "scenarios.py"), run_name="__main__")
