"""What an epoch boundary costs under ``kfit.fit`` against plain ``model.fit``, side by side in one process.

Per-epoch costs (a data iterator started, an epoch's plan read, callbacks' epoch hooks) weigh most where epochs
are short, and disappear in the noise of whole-epoch wall times on a shared machine. This script times the
parts of an epoch around its steps directly, from callback hooks that keep Keras's asynchronous batch-end
dispatch (begin hooks only): for each epoch but a call's first,

* ``before``: from the epoch's begin to its first step's begin (the adapter's epoch start, the iterator);
* ``first``: the first step, from its begin to the second's (it waits for the epoch's first minibatch);
* ``step``: the median of the other steps, begin to begin;
* ``after``: from the last step's begin to the epoch's end, less one median step (the epoch's end).

Five sides take turns (the order rotates each round), one ``fit`` call of ``--epochs`` epochs each per round, on
the small MLP of ``benchmarks/overhead.py`` at minibatch 256: ``model.fit`` and ``kfit.fit(seed=0)`` on the
arrays in memory; the same ``kfit.fit`` with ``KFIT_READ_AHEAD=0`` (each epoch starts its own reader: no
reading ahead across epochs); and ``kfit.fit`` on the same data in an h5py file (read by kfit's reader thread),
with and without reading ahead. Printed: the medians over all timed epochs, in milliseconds, and the
boundary's extra time (``before + first + after - step``) per side.

Run:  python benchmarks/epoch_boundary.py  [--rounds 4] [--epochs 6] [--samples 65536] [--backends tensorflow]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import BACKENDS, run_per_backend, small_mlp_task  # noqa: E402

BATCH = 256


def measure(backend: str, rounds: int, epochs: int, samples: int) -> None:
    import h5py
    import keras

    import kfit

    x, y, make_model = small_mlp_task(samples)

    class Timer(keras.callbacks.Callback):
        """Notes when each epoch and each step begins, and when each epoch ends."""

        def __init__(self) -> None:
            super().__init__()
            self.epochs: list[tuple[float, list[float], list[float]]] = []

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self.epochs.append((time.perf_counter(), [], []))

        def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
            self.epochs[-1][1].append(time.perf_counter())

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            self.epochs[-1][2].append(time.perf_counter())

    sides = {
        "model.fit": lambda m, cb: m.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, callbacks=[cb]),
        "kfit.fit(seed=0)": lambda m, cb: kfit.fit(m, x, y, minibatch_size=BATCH, epochs=epochs, seed=0, verbose=0,
                                                  callbacks=[cb]),
        "kfit, no read-ahead": lambda m, cb: without_read_ahead(
            lambda: kfit.fit(m, x, y, minibatch_size=BATCH, epochs=epochs, seed=0, verbose=0, callbacks=[cb])),
        "kfit, h5py": lambda m, cb: kfit.fit(m, h5["x"], h5["y"], minibatch_size=BATCH, epochs=epochs, seed=0,
                                            verbose=0, callbacks=[cb]),
        "kfit, h5py, no r-a": lambda m, cb: without_read_ahead(
            lambda: kfit.fit(m, h5["x"], h5["y"], minibatch_size=BATCH, epochs=epochs, seed=0, verbose=0,
                             callbacks=[cb])),
    }
    def without_read_ahead(run: Callable[[], Any]) -> Any:
        os.environ["KFIT_READ_AHEAD"] = "0"
        try:
            return run()
        finally:
            del os.environ["KFIT_READ_AHEAD"]

    folder = tempfile.mkdtemp()
    with h5py.File(os.path.join(folder, "train.h5"), "w") as f:
        f["x"], f["y"] = x, y
    h5 = h5py.File(os.path.join(folder, "train.h5"), "r")
    models = {name: make_model() for name in sides}
    for name, run in sides.items():  # compile and warm up
        run(models[name], Timer())
    parts: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in sides}
    for round_ in range(rounds):
        for name in list(sides)[round_ % len(sides):] + list(sides)[:round_ % len(sides)]:
            timer = Timer()
            sides[name](models[name], timer)
            for begin, steps, (end,) in timer.epochs[1:]:
                step = statistics.median(b - a for a, b in zip(steps[1:], steps[2:]))
                parts[name].append((steps[0] - begin, steps[1] - steps[0], step, end - steps[-1] - step))
    print(f"\nepoch boundaries, minibatch {BATCH}, {samples} samples per epoch; medians over "
          f"{rounds * (epochs - 1)} epochs per side, ms")
    print(f"{'side':<20}{'before':>9}{'first':>9}{'step':>9}{'after':>9}{'boundary extra':>16}")
    extras = {}
    for name, rows in parts.items():
        before, first, step, after = (statistics.median(r[i] for r in rows) * 1e3 for i in range(4))
        extras[name] = before + first + after - step
        print(f"{name:<20}{before:>9.1f}{first:>9.1f}{step:>9.2f}{after:>9.1f}{extras[name]:>16.1f}")
    reference, kfit_side = extras["model.fit"], extras["kfit.fit(seed=0)"]
    print(f"BOUNDARY {backend} model.fit={reference:.1f}ms kfit.fit={kfit_side:.1f}ms "
          f"difference={kfit_side - reference:+.1f}ms; read-ahead off {extras['kfit, no read-ahead']:.1f}ms; h5py "
          f"{extras['kfit, h5py']:.1f}ms, read-ahead off {extras['kfit, h5py, no r-a']:.1f}ms", flush=True)
    h5.close()
    shutil.rmtree(folder)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--samples", type=int, default=65536)
    args = parser.parse_args()
    if args.backend:
        measure(args.backend, args.rounds, args.epochs, args.samples)
        return 0
    return run_per_backend(__file__, ["--rounds", str(args.rounds), "--epochs", str(args.epochs),
                                      "--samples", str(args.samples)], args.backends.split(","))


if __name__ == "__main__":
    sys.exit(main())
