"""What kfit costs on top of ``model.fit``: throughput ratios, measured side by side in one process.

For each backend (each in its own process) and minibatch sizes 64 and 256, on a small MLP:

* ``callbacks``: plain ``model.fit`` against the same ``model.fit`` with kfit's ``SampleClock``,
  ``LearningRateSchedule`` (per sample) and ``MomentumSchedule`` (time constant) — target: at most 3% slower;
* ``kfit.fit``: ``model.fit`` against ``kfit.fit`` on the same fixed-size work through kfit's own
  loop (stream, prefetch, clock) — target: at most 3% slower.

Runs alternate (A, B, A, B, ...) and the median epoch time of each is compared, so drift of the
machine hits both sides alike. Run:  python benchmarks/overhead.py  [--repeats 7] [--backends jax]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import BACKENDS, run_per_backend, setup_threads  # noqa: E402


def measure(backend: str, repeats: int, samples: int) -> None:
    import keras
    import numpy as np

    import kfit

    setup_threads()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 32)).astype("float32")
    y = (x[:, :10].argmax(axis=1)).astype("int64")

    def make_model() -> keras.Model:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer=kfit.optimizers.MomentumSGD(0.01), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    def schedule_callbacks(batch: int) -> list:
        return [kfit.callbacks.SampleClock(batch_size=batch, num_samples=samples),
                kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample([1e-4, 5e-5], epoch_size=samples)),
                kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant([0, 1024], epoch_size=samples))]

    print(f"{'comparison':<34}{'batch':>6}{'A (s/epoch)':>13}{'B (s/epoch)':>13}{'B/A throughput':>16}")
    for batch in (64, 256):
        runs = {
            "model.fit": lambda m, b=batch: m.fit(x, y, batch_size=b, epochs=1, verbose=0),
            "model.fit + kfit schedule callbacks": lambda m, b=batch: m.fit(x, y, batch_size=b, epochs=1, verbose=0,
                                                                            callbacks=schedule_callbacks(b)),
            "kfit.fit (stream loop)": lambda m, b=batch: kfit.fit(m, x, y, minibatch_size=b, epochs=1, seed=0, verbose=0),
        }
        models = {name: make_model() for name in runs}
        for name, run in runs.items():  # compile and warm up
            run(models[name])
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(repeats):
            for name, run in runs.items():
                start = time.perf_counter()
                run(models[name])
                times[name].append(time.perf_counter() - start)
        base = statistics.median(times["model.fit"])
        for name in list(runs)[1:]:
            t = statistics.median(times[name])
            print(f"{name:<34}{batch:>6}{base:>13.4f}{t:>13.4f}{base / t:>16.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--samples", type=int, default=16384)
    args = parser.parse_args()
    if args.backend:
        measure(args.backend, args.repeats, args.samples)
        return 0
    print("B/A throughput: 1.00 = as fast as plain model.fit; the target is >= 0.97.")
    return run_per_backend(__file__, ["--repeats", str(args.repeats), "--samples", str(args.samples)],
                           args.backends.split(","))


if __name__ == "__main__":
    sys.exit(main())
