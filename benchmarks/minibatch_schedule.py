"""Time to a fixed validation accuracy: a growing minibatch-size schedule against a fixed small minibatch.

CNTK's MNIST sample grows the minibatch from 256 to 4096 samples during training with a per-sample
learning rate and momentum as a time constant, so that every minibatch size means the same update per
sample; it reports end-of-training epochs about 3x faster at 4096 than at 256. Here, on the digits data
that ships with scikit-learn, the same model and the same per-sample schedules are trained twice in one
process: once with a fixed minibatch of 16, once with sizes growing 16 -> 512. Each run stops when the
validation accuracy (measured at every epoch end, not timed) reaches the target. Target: the schedule
gets there in at most half the time.

Run:  python benchmarks/minibatch_schedule.py  [--target 0.95] [--backends jax]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import BACKENDS, run_per_backend, setup_threads  # noqa: E402


def measure(target: float, max_epochs: int) -> None:
    import keras
    import numpy as np
    from sklearn.datasets import load_digits

    import kfit

    setup_threads()
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    x_train, y_train, x_val, y_val = x[:1500], y[:1500], x[1500:], y[1500:]
    n = len(x_train)

    class TimeToTarget(keras.callbacks.Callback):
        """Times training only: validation at each epoch end is excluded from the clock."""

        def __init__(self):
            super().__init__()
            self.trained = 0.0
            self.reached_at = None
            self._start = 0.0

        def on_epoch_begin(self, epoch, logs=None):
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.trained += time.perf_counter() - self._start
            accuracy = self.model.evaluate(x_val, y_val, batch_size=512, verbose=0, return_dict=True)["accuracy"]
            self.last_accuracy = accuracy
            if accuracy >= target and self.reached_at is None:
                self.reached_at = (epoch + 1, self.trained)
                self.model.stop_training = True

    # One model, compiled once, reset before each run: both runs use already-compiled steps, so the
    # comparison measures training, not compilation.
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=kfit.optimizers.MomentumSGD(), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.optimizer.build(model.trainable_variables)
    initial = [keras.ops.convert_to_numpy(v) for v in model.variables + model.optimizer.variables]

    def run(sizes) -> TimeToTarget:
        for variable, value in zip(model.variables + model.optimizer.variables, initial):
            variable.assign(value)
        timer = TimeToTarget()
        kfit.fit(model, x_train, y_train, minibatch_size=sizes, epoch_size=n, epochs=max_epochs, seed=0, verbose=0,
                 callbacks=[kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(0.002)),
                            kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant(256)), timer])
        return timer

    # warm up the compiled steps of both runs' shapes
    run(kfit.schedules.minibatch_size([16, 32, 64, 128, 256, 512], epoch_size=n))
    fixed = run(16)
    growing = run(kfit.schedules.minibatch_size([16] * 2 + [32] * 2 + [64] * 2 + [128] * 2 + [256] * 2 + [512], epoch_size=n))
    print(f"target validation accuracy {target:.2f} on digits ({n} training samples)")
    for name, timer in (("fixed minibatch 16", fixed), ("schedule 16 -> 512", growing)):
        if timer.reached_at is None:
            print(f"{name:<22} did not reach the target in {max_epochs} epochs (last {timer.last_accuracy:.3f})")
        else:
            epochs, seconds = timer.reached_at
            print(f"{name:<22} {epochs:>3} epochs {seconds:8.3f} s of training")
    if fixed.reached_at and growing.reached_at:
        print(f"time ratio schedule/fixed: {growing.reached_at[1] / fixed.reached_at[1]:.3f} (target <= 0.5)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--max-epochs", type=int, default=60)
    args = parser.parse_args()
    if args.backend:
        measure(args.target, args.max_epochs)
        return 0
    return run_per_backend(__file__, ["--target", str(args.target), "--max-epochs", str(args.max_epochs)],
                           args.backends.split(","))


if __name__ == "__main__":
    sys.exit(main())
