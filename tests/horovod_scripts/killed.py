"""A horovodrun job whose rank 1 is SIGKILLed in the middle of training (tests/test_distributed.py).

    horovodrun --gloo -np 2 -H localhost:2 python tests/horovod_scripts/killed.py OUT_DIR

kfit.fit trains with a checkpoint every 40 samples (written by rank 0 into OUT_DIR/resume/); after step
``RESUME["kill_step"]`` rank 1 writes the time to OUT_DIR/killed_at and kills itself with SIGKILL. The job
must then fail promptly; scenarios.py resumes it from the checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (sets one thread per worker before the backend loads)
import keras  # noqa: E402

import kfit  # noqa: E402
import kfit.distributed as hvd  # noqa: E402

OUT = sys.argv[1]
hvd.init()


class KillRankOne(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if hvd.rank() == 1 and self.steps == common.RESUME["kill_step"]:
            with open(os.path.join(OUT, "killed_at"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)


r = common.RESUME
x, y = common.data(r["num_samples"], seed=4)
net = common.resume_model()
callbacks: list = [KillRankOne()]
try:
    callbacks.append(
        kfit.callbacks.Checkpoint(os.path.join(OUT, "resume", "model.ckpt"), frequency=r["frequency"], restore=True,
                                  async_write=False)
    )
except (AttributeError, ImportError):
    pass  # the killed-worker check still runs; the resume check reports the missing Checkpoint
kfit.fit(net, x, y, minibatch_size=r["minibatch_size"], max_samples=r["max_samples"], seed=r["seed"], verbose=0,
         callbacks=callbacks)
print("finished without being killed", flush=True)
