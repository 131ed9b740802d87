"""Throughput of ``kfit.fit`` against plain ``model.fit`` on sources that batch by themselves, side by side.

A Python generator (read on across epochs with ``steps_per_epoch``), a ``tf.data`` pipeline (the same way) and one of
unknown cardinality (a filter; each epoch one pass, whose end Keras's loop finds by one more call), on the small MLP of
``benchmarks/overhead.py`` at minibatch 64 (where per-step costs weigh most). kfit trains on them through Keras's own
adapter for the source, read one batch ahead so that its clock knows each step's size (``kfit.data._source``). The
sides take turns (the order alternates each round), one ``fit`` call of ``--steps`` steps each per round after an
untimed call that compiles; printed: the median wall time per side and the ratio of kfit's throughput to model.fit's
(also of the fastest rounds: a busy machine's stalls hit single rounds).

Run:  python benchmarks/sources.py  [--rounds 5] [--steps 600] [--backends tensorflow,jax,torch]
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


def measure(backend: str, rounds: int, steps: int) -> None:
    import tensorflow as tf

    import kfit

    x, y, make_model = small_mlp_task(BATCH * 64)

    def generator():
        while True:
            for start in range(0, len(x), BATCH):
                yield x[start:start + BATCH], y[start:start + BATCH]

    sources = {
        "generator": lambda: (generator(), {"steps_per_epoch": steps // 2}),
        "tf.data": lambda: (tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat(), {"steps_per_epoch": steps // 2}),
        # A pass of steps // 2 batches whose length tf.data does not know (a filter): each epoch reads it to its end.
        "tf.data of unknown cardinality": lambda: (tf.data.Dataset.from_tensor_slices((x, y)).repeat().take(
            BATCH * (steps // 2)).filter(lambda *_: True).batch(BATCH), {}),
    }
    for name, make in sources.items():
        times: dict[str, list[float]] = {"model.fit": [], "kfit.fit(seed=0)": []}
        for round_ in range(rounds + 1):
            sides = list(times) if round_ % 2 == 0 else list(reversed(times))
            for side in sides:
                model = make_model()
                data, options = make()
                fit = model.fit if side == "model.fit" else (lambda *a, m=model, **k: kfit.fit(m, *a, seed=0, **k))
                begin = time.perf_counter()
                fit(data, epochs=2, verbose=0, **options)
                if round_:  # (the first round compiles)
                    times[side].append(time.perf_counter() - begin)
        reference, ours = (statistics.median(times[side]) for side in times)
        fastest = [min(times[side]) for side in times]
        print(f"SOURCE {backend} {name}: model.fit {reference:.2f}s kfit.fit {ours:.2f}s for {steps} steps (medians); "
              f"throughput ratio {reference / ours:.2f} (of the fastest rounds: {fastest[0] / fastest[1]:.2f})",
              flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    if args.backend:
        measure(args.backend, args.rounds, args.steps)
        return 0
    return run_per_backend(__file__, ["--rounds", str(args.rounds), "--steps", str(args.steps)],
                           args.backends.split(","))


if __name__ == "__main__":
    sys.exit(main())
