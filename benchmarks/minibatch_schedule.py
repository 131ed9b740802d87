"""Time to a fixed validation accuracy: a growing minibatch-size schedule against a fixed small minibatch.

CNTK's MNIST sample grows the minibatch from 256 to 4096 samples during training with a per-sample
learning rate and momentum as a time constant, so that every minibatch size means the same update per
sample; it reports end-of-training epochs about 3x faster at 4096 than at 256. Here, on the digits data
that ships with scikit-learn (1,500 training samples, 297 for validation), the same MLP
(64 -> 128 -> 128 -> 10) with the same per-sample learning rate and momentum time constant is trained
twice in one process: once with a fixed minibatch of 16, once with sizes 16, 32, 64, 128, 256 for one
epoch each, then 512. An epoch is 10 sweeps of the data (15,000 samples). The learning rate per sample
is low enough that each side trains for at least 30 seconds; as the backends differ in speed per step it
is set per backend (``LR``; the same for both sides of a backend, so the ratio compares like with like).

What is timed is what a user pays: each side starts from a fresh model (same initial weights), the clock
starts just before its ``kfit.fit`` call and stops at the end of the epoch after which the validation
accuracy first reaches the target. Inside that span everything counts: kfit.fit's set-up (the
optimizer's variables included; the layers are built with the model, before the clock), tracing and
compiling the train step for every new minibatch shape (each size of the schedule and each epoch-end
remainder), kfit's and Keras's per-epoch work. Only the validation itself (one
``predict_on_batch`` per epoch end, its first compile included) is taken off the clock. Before the two
sides, a throw-away model of another shape trains one step, so the backend's one-time start-up (XLA or
TensorFlow runtime initialisation) is billed to neither side.

On JAX a third side trains the schedule with ``pad_remainders=True``: the minibatch that ends each epoch (15,000
is no multiple of 16, 32, ..., 512) is padded to its scheduled size, so it compiles no step of its own. (On TensorFlow
and PyTorch nothing is padded, and that side would repeat the second.)

Target (issue #10): the schedule gets there in at most half the time of the fixed minibatch.

Run:  python benchmarks/minibatch_schedule.py  [--target 0.95] [--lr 1e-5] [--backends jax]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import BACKENDS, run_per_backend, setup_threads  # noqa: E402

MIN_SECONDS = 30.0
SIZES = [16, 32, 64, 128, 256, 512]
SWEEPS_PER_EPOCH = 10
#: Learning rate per sample, per backend: low enough that the schedule side (the faster one) trains >= 30 s on a 2-core machine.
LR = {"jax": 1.5e-6, "tensorflow": 2e-6, "torch": 4.5e-6}


def measure(target: float, lr: float, max_seconds: float, sides: list[str]) -> None:
    import keras
    import numpy as np
    from sklearn.datasets import load_digits

    import kfit

    setup_threads()
    print(f"keras {keras.__version__}, backend {keras.backend.backend()}, kfit from {os.path.dirname(kfit.__file__)}",
          flush=True)
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    x_train, y_train, x_val, y_val = x[:1500], y[:1500], x[1500:], y[1500:]
    n = len(x_train)

    class TimeToTarget(keras.callbacks.Callback):
        """Stops training once the validation accuracy reaches the target; validation is off the clock."""

        def __init__(self, start: float):
            super().__init__()
            self.start = start
            self.excluded = 0.0
            self.reached_at = None
            self.last_accuracy = float("nan")
            self.epochs = 0

        def on_epoch_end(self, epoch, logs=None):
            now = time.perf_counter()
            trained = now - self.start - self.excluded
            self.epochs = epoch + 1
            logits = keras.ops.convert_to_numpy(self.model.predict_on_batch(x_val))
            self.last_accuracy = float((logits.argmax(axis=1) == y_val).mean())
            if self.last_accuracy >= target:
                self.reached_at = (epoch + 1, trained)
                self.model.stop_training = True
            elif trained > max_seconds:
                self.model.stop_training = True
            self.excluded += time.perf_counter() - now

    def make_model(width: int = 128) -> keras.Model:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(width, activation="relu"),
                                  keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer=kfit.optimizers.MomentumSGD(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    def schedules() -> list:
        return [kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(lr)),
                kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant(256))]

    # The backend's one-time start-up, on a model of another width: billed to neither side.
    kfit.fit(make_model(8), x_train[:16], y_train[:16], minibatch_size=16, epochs=1, seed=0, verbose=0)

    epoch_size = SWEEPS_PER_EPOCH * n
    lr = lr or LR[keras.backend.backend()]

    def run(sizes, pad: bool = False) -> TimeToTarget:
        model = make_model()
        timer = TimeToTarget(time.perf_counter())  # the clock starts here: model build and compiles count
        kfit.fit(model, x_train, y_train, minibatch_size=sizes, epoch_size=epoch_size, epochs=100_000, seed=0, verbose=0,
                 callbacks=schedules() + [timer], pad_remainders=pad)
        return timer

    results = {}
    if "fixed" in sides:
        results["fixed minibatch 16"] = run(16)
    if "growing" in sides:
        results["schedule 16 -> 512"] = run(kfit.schedules.minibatch_size(SIZES, epoch_size=epoch_size))
    if "padded" in sides and keras.backend.backend() == "jax":
        results["schedule, padded"] = run(kfit.schedules.minibatch_size(SIZES, epoch_size=epoch_size), pad=True)
    print(f"\ntarget validation accuracy {target:.2f} on digits ({n} training samples, epochs of {epoch_size}), learning rate {lr:g} per sample, "
          f"momentum time constant 256; clock includes kfit.fit's set-up and every compile")
    for name, timer in results.items():
        if timer.reached_at is None:
            print(f"{name:<20} did not reach the target in {timer.epochs} epochs (last {timer.last_accuracy:.3f})")
        else:
            epochs, seconds = timer.reached_at
            short = f"  (shorter than {MIN_SECONDS:.0f} s: lower --lr)" if seconds < MIN_SECONDS else ""
            print(f"{name:<20} {epochs:>4} epochs {epochs * epoch_size:>9} samples {seconds:8.2f} s{short}")
    fixed, growing = results.get("fixed minibatch 16"), results.get("schedule 16 -> 512")
    if fixed and growing and fixed.reached_at and growing.reached_at:
        ratio = growing.reached_at[1] / fixed.reached_at[1]
        print(f"time ratio schedule/fixed: {ratio:.3f} (target <= 0.5: {'ok' if ratio <= 0.5 else 'MISSED'})")
        print(f"RATIO {keras.backend.backend()} fixed={fixed.reached_at[1]:.2f}s/{fixed.reached_at[0]}ep "
              f"growing={growing.reached_at[1]:.2f}s/{growing.reached_at[0]}ep ratio={ratio:.3f}", flush=True)
    padded = results.get("schedule, padded")
    if fixed and padded and fixed.reached_at and padded.reached_at:
        print(f"RATIO {keras.backend.backend()} padded={padded.reached_at[1]:.2f}s/{padded.reached_at[0]}ep "
              f"ratio={padded.reached_at[1] / fixed.reached_at[1]:.3f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--lr", type=float, default=0.0, help="learning rate per sample (default: LR[backend])")
    parser.add_argument("--max-seconds", type=float, default=1200.0, help="give up on a side after this much training")
    parser.add_argument("--sides", default="fixed,growing,padded", help=argparse.SUPPRESS)
    args = parser.parse_args()
    options = ["--target", str(args.target), "--lr", str(args.lr), "--max-seconds", str(args.max_seconds),
               "--sides", args.sides]
    if args.backend:
        measure(args.target, args.lr, args.max_seconds, args.sides.split(","))
        return 0
    return run_per_backend(__file__, options, args.backends.split(","))


if __name__ == "__main__":
    sys.exit(main())
