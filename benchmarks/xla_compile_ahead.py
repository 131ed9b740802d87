"""What a new minibatch size costs on TensorFlow with ``jit_compile=True``, with and without compiling ahead.

One trace of kfit's TensorFlow step serves every minibatch size, but XLA compiles it for each new shape when that
shape's first step runs. kfit compiles the coming sizes ahead on a background thread
(``kfit.training._compile_ahead``, ``kfit._backend.xla_step_warmer``). Here the same run (the small MLP of
``benchmarks/overhead.py``, a schedule 32 -> 64 -> 128 -> 256 -> 512 -> 1024, one size per epoch of 65,536 samples, ``--epoch-size``)
trains with ``KFIT_COMPILE_AHEAD=1`` and ``=0``, the two sides taking turns, in one process (each side a new
model, so every shape compiles again). Printed per side: the wall time of the run, and the stall: the time of the
first step of each new size beyond the median step of that size, summed over the sizes after the first (the
first size compiles on training's first step either way). Ratios ahead / not ahead. A control run keeps one size
(256) throughout: the same sum over its epochs' first steps, what the epochs' beginnings cost with no new shape.

The compiles ahead run one at a time (about 0.5 s each on this machine): a size reached before its compile ends
waits for the rest of it (``--epoch-size 16384``: the sizes from 256 on last less than a compile).

Run:  python benchmarks/xla_compile_ahead.py  [--rounds 3] [--epoch-size 65536]
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


def run(task: tuple, ahead: bool, epoch: int, sizes: list[int] = SIZES) -> tuple[float, float]:
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
    schedule = kfit.schedules.minibatch_size(sizes, epoch_size=epoch)
    start = time.perf_counter()
    kfit.fit(model, x, y, minibatch_size=schedule, epoch_size=epoch, epochs=len(sizes), seed=0, verbose=0,
             callbacks=[steps])
    wall = time.perf_counter() - start
    stall = 0.0
    for index in range(1, len(sizes)):
        times = [t for samples, t in steps.times if index * epoch < samples <= (index + 1) * epoch]
        stall += times[0] - statistics.median(times[1:-1])  # (the last step: the epoch's remainder, if any)
    return wall, stall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epoch-size", type=int, default=65536,
                        help="samples per size (each compile ahead takes about 0.5 s here: at 16384 the sizes from "
                             "256 on last less than that, and training reaches them before their compile ends)")
    args = parser.parse_args()
    os.environ["KERAS_BACKEND"] = "tensorflow"
    task = small_mlp_task(args.epoch_size)
    run(task, True, args.epoch_size)  # the runtime's start-up, billed to neither side
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for round_ in range(args.rounds):
        for ahead in ((True, False) if round_ % 2 == 0 else (False, True)):
            results[ahead].append(run(task, ahead, args.epoch_size))
    for ahead in (False, True):
        walls, stalls = zip(*results[ahead])
        print(f"compile ahead {'on ' if ahead else 'off'}: run {statistics.median(walls):6.2f} s, "
              f"stall at new sizes {statistics.median(stalls):5.2f} s  (rounds: "
              + ", ".join(f"{w:.2f}/{s:.2f}" for w, s in results[ahead]) + ")")
    # The control: the same epochs at one size (256) throughout, whose first steps compile nothing: what an epoch's
    # first step costs beyond a median step when no new shape comes.
    control = [run(task, True, args.epoch_size, [256] * len(SIZES))[1] for _ in range(args.rounds)]
    print(f"control, one size throughout: first steps of the epochs beyond a median step {statistics.median(control):5.2f} s"
          f"  (rounds: {', '.join(f'{c:.2f}' for c in control)})")
    on = [statistics.median(v) for v in zip(*results[True])]
    off = [statistics.median(v) for v in zip(*results[False])]
    print(f"ratio on/off: run {on[0] / off[0]:.3f}, stall {on[1] / off[1]:.3f}")


if __name__ == "__main__":
    main()
