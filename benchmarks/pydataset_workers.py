"""Throughput of ``kfit.fit`` against plain ``model.fit`` on an I/O-bound ``keras.utils.PyDataset`` with ``workers=4``.

Each ``__getitem__`` sleeps ``--sleep-ms`` (5 ms: a file read, an image decoded) before it returns a batch of 64 rows
of the small MLP task of ``benchmarks/overhead.py``; 64 batches per epoch, 2 epochs per ``fit`` call. Under
``model.fit`` Keras's enqueuer fetches them on 4 threads; kfit's own loop (here for ``seed=0``) reads the dataset
itself and fetches them on 4 threads too (``kfit.data._items_ahead``). A third side, ``kfit.fit(seed=0)`` on the
same dataset with ``workers=1``, is what kfit did before it used the workers (one fetch at a time). The sides take
turns (the order rotates each round) after an untimed round that compiles; printed: the median wall time per side and
the ratio of each kfit side's throughput to model.fit's (also of the fastest rounds).

Run:  python benchmarks/pydataset_workers.py  [--rounds 5] [--sleep-ms 5] [--backends tensorflow,jax,torch]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import BACKENDS, run_per_backend, small_mlp_task  # noqa: E402

BATCH = 64
BATCHES = 64


def measure(backend: str, rounds: int, sleep_ms: float) -> None:
    import keras

    import kfit

    x, y, make_model = small_mlp_task(BATCH * BATCHES)

    class SlowDataset(keras.utils.PyDataset):
        def __len__(self):
            return BATCHES

        def __getitem__(self, index):
            time.sleep(sleep_ms / 1000)
            return x[index * BATCH:(index + 1) * BATCH], y[index * BATCH:(index + 1) * BATCH]

    sides = {
        "model.fit workers=4": lambda model: model.fit(SlowDataset(workers=4), epochs=2, verbose=0),
        "kfit.fit(seed=0) workers=4": lambda model: kfit.fit(model, SlowDataset(workers=4), epochs=2, seed=0, verbose=0),
        "kfit.fit(seed=0) workers=1": lambda model: kfit.fit(model, SlowDataset(workers=1), epochs=2, seed=0, verbose=0),
    }
    times: dict[str, list[float]] = {side: [] for side in sides}
    names = list(sides)
    for round_ in range(rounds + 1):
        for side in names[round_ % 3:] + names[:round_ % 3]:
            model = make_model()
            begin = time.perf_counter()
            sides[side](model)
            if round_:  # (the first round compiles)
                times[side].append(time.perf_counter() - begin)
    reference = statistics.median(times[names[0]])
    fastest = min(times[names[0]])
    print(f"PYDATASET {backend}: {2 * BATCHES} batches per call, {sleep_ms:g} ms per item; medians: "
          + ", ".join(f"{side} {statistics.median(times[side]):.2f}s" for side in names), flush=True)
    for side in names[1:]:
        print(f"PYDATASET {backend}: {side} throughput ratio to model.fit {reference / statistics.median(times[side]):.2f}"
              f" (of the fastest rounds: {fastest / min(times[side]):.2f})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sleep-ms", type=float, default=5.0)
    args = parser.parse_args()
    if args.backend:
        measure(args.backend, args.rounds, args.sleep_ms)
        return 0
    return run_per_backend(__file__, ["--rounds", str(args.rounds), "--sleep-ms", str(args.sleep_ms)],
                           args.backends.split(","))


if __name__ == "__main__":
    sys.exit(main())
