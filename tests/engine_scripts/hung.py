"""Two workers whose rank 1 stops (SIGSTOP) in the middle of training, alive but silent (tests/test_engines.py).

    RANK=r WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... KFIT_COLLECTIVE_TIMEOUT=3 python hung.py OUT_DIR

After its third step rank 1 writes the time to OUT_DIR/stopped_at and stops itself. Rank 0's next
collective must fail after ``KFIT_COLLECTIVE_TIMEOUT`` seconds instead of waiting for ever.
"""

from __future__ import annotations

import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "horovod_scripts"))

import common  # noqa: E402  (sets one thread per worker before the backend loads)
import keras  # noqa: E402

import kfit  # noqa: E402

OUT = sys.argv[1]


class StopRankOne(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if kfit.distributed.rank() == 1 and self.steps == 3:
            with open(os.path.join(OUT, "stopped_at"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)


x, y = common.data(60, seed=6)
net = common.fit_model(init_seed=0)
kfit.fit(net, x, y, minibatch_size=10, epochs=20, seed=1, verbose=0, callbacks=[StopRankOne()])
print("finished without hanging", flush=True)
