"""What a new minibatch size costs on TensorFlow with ``jit_compile=True``, with and without compiling ahead.

One trace of kfit's TensorFlow step serves every minibatch size, but XLA compiles it for each new shape when that
shape's first step runs. kfit compiles the coming sizes ahead on a background thread
(``kfit.training._compile_ahead``, ``kfit._backend.xla_step_warmer``). Here the same run (the small MLP of
``benchmarks/overhead.py``, a schedule 32 -> 64 -> 128 -> 256 -> 512 -> 1024, one size per epoch of 16,384 samples)
trains with ``KFIT_COMPILE_AHEAD=1`` and ``=0``, the two sides taking turns, in one process (each side a new
model, so every shape compiles again). Printed per side: the wall time of the run, and the stall: the time of the
first step of each new size beyond the median step of that size, summed over the sizes after the first (the
first size compiles on training's first step either way). Ratios ahead / not ahead.

Run:  python benchmarks/xla_compile_ahead.py  [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import small_mlp_task  # noqa: E402

SIZES = [32, 64, 128, 256, 512, 1024]
EPOCH = 16384


def run(task: tuple, ahead: bool) -> tuple[float, float]:
    import keras

    import kfit

    os.environ["KFIT_COMPILE_AHEAD"] = "1" if ahead else "0"
    x, y, make_model = task
    model = make_model()
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy", jit_compile=True)

    class StepTimes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times: list[tuple[int, float]] = []

        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append((kfit.get_clock(self.model).samples, time.perf_counter() - self.start))

    steps = StepTimes()
    schedule = kfit.schedules.minibatch_size(SIZES, epoch_size=EPOCH)
    start = time.perf_counter()
    kfit.fit(model, x, y, minibatch_size=schedule, epoch_size=EPOCH, epochs=len(SIZES), seed=0, verbose=0,
             callbacks=[steps])
    wall = time.perf_counter() - start
    stall = 0.0
    for epoch in range(1, len(SIZES)):
        times = [t for samples, t in steps.times if epoch * EPOCH < samples <= (epoch + 1) * EPOCH]
        stall += times[0] - statistics.median(times[1:-1])  # (the last step: the epoch's remainder, if any)
    return wall, stall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ["KERAS_BACKEND"] = "tensorflow"
    task = small_mlp_task(EPOCH)
    run(task, True)  # the runtime's start-up, billed to neither side
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for round_ in range(args.rounds):
        for ahead in ((True, False) if round_ % 2 == 0 else (False, True)):
            results[ahead].append(run(task, ahead))
    for ahead in (False, True):
        walls, stalls = zip(*results[ahead])
        print(f"compile ahead {'on ' if ahead else 'off'}: run {statistics.median(walls):6.2f} s, "
              f"stall at new sizes {statistics.median(stalls):5.2f} s  (rounds: "
              + ", ".join(f"{w:.2f}/{s:.2f}" for w, s in results[ahead]) + ")")
    on = [statistics.median(v) for v in zip(*results[True])]
    off = [statistics.median(v) for v in zip(*results[False])]
    print(f"ratio on/off: run {on[0] / off[0]:.3f}, stall {on[1] / off[1]:.3f}")


if __name__ == "__main__":
    main()
