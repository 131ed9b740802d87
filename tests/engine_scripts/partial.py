"""One worker trains the run of ``common.RESUME`` to half its samples, with checkpoints (tests/test_engines.py).

    python tests/engine_scripts/partial.py CHECKPOINT

The run stops at ``max_samples / 2`` (a checkpoint every ``frequency`` samples, the last one there);
``resume.py`` then resumes it on two workers.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "horovod_scripts"))

import common  # noqa: E402  (sets one thread per worker before the backend loads)

import kfit  # noqa: E402

assert kfit.distributed.size() == 1, "partial.py runs as one worker, without a launcher"
r = common.RESUME
x, y = common.data(r["num_samples"], seed=4)
net = common.resume_model()
checkpoint = kfit.callbacks.Checkpoint(sys.argv[1], frequency=r["frequency"], restore=True, async_write=False)
kfit.fit(net, x, y, minibatch_size=r["minibatch_size"], max_samples=r["frequency"] * (r["max_samples"] // r["frequency"] // 2),
         seed=r["seed"], verbose=0, callbacks=[checkpoint])
print(kfit.get_clock(net).samples, flush=True)
