"""A horovodrun job in which a callback stops one worker alone under plain model.fit (tests/test_horovod_stop.py).

    horovodrun --gloo -np 2 -H localhost:2 python tests/horovod_scripts/lone_stop.py OUT_DIR {step|epoch|bare}

First both workers stop after the same step (no AgreedStopCallback needed): model.fit returns on both and the job
goes on. Then rank 1 alone stops (model.fit validating after each epoch, as after a stop), after its third step (``step``) or as its second epoch ends (``epoch``), while
rank 0 trains on: the job must fail promptly with kfit's message naming AgreedStopCallback, on both workers. ``bare``:
rank 1 stops after its third step with no kfit callback listed (DistributedOptimizer alone), and its script ends.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (sets one thread per worker before the backend loads)
import keras  # noqa: E402

import kfit.distributed as hvd  # noqa: E402

OUT, WHEN = sys.argv[1], sys.argv[2]
hvd.init()
RANK = hvd.rank()


class Stop(keras.callbacks.Callback):
    """Stops the ranks ``ranks`` after their step ``step`` (counted from 1), or as their epoch ``epoch`` ends."""

    def __init__(self, ranks: tuple, step: int | None = None, epoch: int | None = None):
        super().__init__()
        self.ranks, self.step, self.epoch, self.steps = ranks, step, epoch, 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if RANK in self.ranks and self.steps == self.step:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        if RANK in self.ranks and epoch == self.epoch:
            self.model.stop_training = True


def train(stop: Stop, horovod_callbacks: bool = True) -> keras.Model:
    x, y = common.data(64, seed=1)
    mine = slice(RANK * 32, RANK * 32 + 32)
    net = common.model(init_seed=10)
    net.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.01)), loss="mse")
    net.fit(x[mine], y[mine], batch_size=8, epochs=4, shuffle=False, verbose=0, validation_data=(x[:8], y[:8]), callbacks=[
        *([hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()] if horovod_callbacks else []),
        stop])
    return net


together = train(Stop(ranks=(0, 1), step=3))
print(f"rank {RANK}: stopped together after {int(keras.ops.convert_to_numpy(together.optimizer.iterations))} steps",
      flush=True)
train(Stop(ranks=(1,), step=3) if WHEN in ("step", "bare") else Stop(ranks=(1,), epoch=1), horovod_callbacks=WHEN != "bare")
print(f"rank {RANK}: trained on after rank 1 stopped alone", flush=True)
