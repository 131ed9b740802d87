"""What a full-state checkpoint costs: save time, training stall, and resume time.

For models of about 1 MB, 50 MB and 400 MB of variables (weights plus MomentumSGD's momentum buffers, eight
Dense layers), in one process per backend:

* ``save``: ``kfit.save_checkpoint`` against a bare h5py write of the same arrays (``create_dataset`` per
  array, flushed and fsynced, as a checkpoint must be) -- target: at most 1.5x. A checkpoint always writes a
  new file (the old one must survive until the new one is complete), so the bare write is timed both into a
  new file (``bare new``) and over an existing one (``bare over``, which on some file systems is faster).
  The checkpoint adds reading the variables, a CRC-32 of every array (computed while h5py writes), the
  metadata, a verification of the new file, and the atomic rename that frees the old file.
* ``stall``: how long a training step is held up by a checkpoint inside ``kfit.fit`` (the time spent in
  the Checkpoint's batch-end hook), synchronous and with ``async_write``, against the time it takes to copy
  the variables to (already allocated) host memory, timed right after each checkpoint -- target for
  ``async_write``: at most that copy + 10% (``async/copy`` is the median of the paired ratios).
  The first checkpoint of a run, which allocates the host buffers, is left out. Checkpoints are 5 sync-save
  times (at least a second) apart. A stall counts the checkpoint's own work; ``waited`` is the total time
  the training thread waited for a previous background write to finish (zero when the disk keeps up with
  the checkpoint frequency).
* ``resume``: the time from ``kfit.fit`` to its first training step when it restores a checkpoint taken at
  sample 10^3 and at sample 10^7 of a long stream -- target: the same (the stream seeks, it never replays).

Save and bare-write times are the best of alternating repeats (other load on the machine only adds time);
stalls and resume times are medians. Run:  python benchmarks/checkpoint.py  [--sizes 1,50,400]
[--repeats 5] [--backends tensorflow,jax,torch]  (default: the backend of KERAS_BACKEND, else tensorflow;
each backend runs in its own process).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import BACKENDS, run_per_backend, setup_threads  # noqa: E402

MB = 1 << 20
LAYERS = 8
BATCH = 8


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _model(total_mb: float):
    """Eight Dense(h) layers whose weights and momentum buffers hold about ``total_mb`` MB."""
    import keras

    import kfit

    params = total_mb * MB / 4 / 2  # float32; half weights, half momentum
    width = max(int((params / LAYERS) ** 0.5), 8)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((width,))] + [keras.layers.Dense(width) for _ in range(LAYERS)])
    model.compile(optimizer=kfit.optimizers.MomentumSGD(learning_rate=1e-4, momentum=0.9), loss="mse")
    return model, width


def _variables(model) -> list:
    return list(model.variables) + list(model.optimizer.variables) + list(model.metrics_variables)


def _bare_write(path: str, arrays: list) -> float:
    """``create_dataset`` per array, flushed and fsynced: a durable h5py write and nothing more."""
    import h5py

    start = time.perf_counter()
    with h5py.File(path, "w") as f:
        for i, array in enumerate(arrays):
            f.create_dataset(str(i), data=array)
    _fsync(path)
    return time.perf_counter() - start


def _copy_to_host(model, buffers: dict) -> float:
    from kfit.checkpoint._state import host_view

    start = time.perf_counter()
    for i, variable in enumerate(_variables(model)):
        view = host_view(variable.value)
        if i not in buffers:
            buffers[i] = np.empty_like(view)
        np.copyto(buffers[i], view)
    return time.perf_counter() - start


def _train(model, width: int, steps: int, callbacks: list) -> float:
    import kfit

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, width)).astype("float32")
    y = rng.normal(size=(64, width)).astype("float32")
    start = time.perf_counter()
    kfit.fit(model, x, y, minibatch_size=BATCH, epoch_size=10**6, max_samples=steps * BATCH, callbacks=callbacks, verbose=0)
    return time.perf_counter() - start


def _stalls(model, width: int, directory: str, async_write: bool, every: int) -> tuple[list, list, float]:
    """Trains with a checkpoint every ``every`` steps. Returns the stall of each checkpoint taken at a step,
    less any time spent waiting for the previous background write (the first checkpoint, which allocates
    the host buffers, and the final one are left out), the time of a bare copy of the variables to host
    memory right after each, and the total time spent waiting."""
    import keras

    import kfit

    class TimedCheckpoint(kfit.callbacks.Checkpoint):
        def on_train_batch_end(self, batch, logs=None):
            if logs and "loss" in logs:  # let the step finish first (JAX dispatches it asynchronously)
                keras.ops.convert_to_numpy(logs["loss"])
            saves, start, waited = self.saves, time.perf_counter(), sum(waits)
            super().on_train_batch_end(batch, logs)
            if self.saves != saves:
                stalls.append(time.perf_counter() - start - (sum(waits) - waited))
                # The copy alone, right after, into buffers of its own: the machine's load hits both alike.
                copies.append(_copy_to_host(self._model, copy_buffers))

    stalls: list[float] = []
    copies: list[float] = []
    copy_buffers: dict = {}
    waits: list[float] = []
    path = os.path.join(directory, f"stall_{async_write}.ckpt")
    checkpoint = TimedCheckpoint(path, frequency=every * BATCH, async_write=async_write, restore=False)
    wait = checkpoint._writer.wait

    def timed_wait():
        start = time.perf_counter()
        wait()
        waits.append(time.perf_counter() - start)

    checkpoint._writer.wait = timed_wait
    _train(model, width, 4 * every + every // 2, [checkpoint])
    return stalls[1:-1], copies[1:-1], sum(waits)


def measure_sizes(sizes: list[float], repeats: int, directory: str) -> None:
    import kfit
    from kfit.checkpoint._state import host_view

    print(f"{'variables':>10} {'bare over':>10} {'bare new':>9} {'save':>8} {'save/new':>9} {'save/over':>10} "
          f"{'copy':>8} {'stall sync':>11} {'stall async':>12} {'async/copy':>11} {'waited':>9}", flush=True)
    for size in sizes:
        model, width = _model(size)
        x = np.zeros((BATCH, width), "float32")
        model.fit(x, x, batch_size=BATCH, epochs=1, verbose=0)  # builds the optimizer's slots
        arrays = [host_view(v.value) for v in _variables(model)]
        total = sum(a.nbytes for a in arrays) / MB
        over, new, save = [], [], []
        path = os.path.join(directory, "save.ckpt")
        for i in range(repeats if total < 200 else max(repeats - 2, 1)):  # fewer of the slow ones
            over.append(_bare_write(os.path.join(directory, "bare.h5"), arrays))
            new_file = os.path.join(directory, f"bare_{i}.h5")
            new.append(_bare_write(new_file, arrays))
            os.remove(new_file)
            start = time.perf_counter()
            kfit.save_checkpoint(path, model)
            save.append(time.perf_counter() - start)
        del arrays
        # Checkpoints far enough apart for a background write to finish before the next one (as in real runs).
        step = _train(model, width, 20, []) / 20
        every = int(min(max(10, max(5 * min(save), 1.0) / step), 5000))
        stalls_sync, _, _ = _stalls(model, width, directory, async_write=False, every=every)
        stalls_async, copies, waited = _stalls(model, width, directory, async_write=True, every=every)
        o, n, s = min(over), min(new), min(save)  # best of N: other load on the machine only adds time
        sync, asyn, copy = statistics.median(stalls_sync), statistics.median(stalls_async), statistics.median(copies)
        ratio = statistics.median(a / c for a, c in zip(stalls_async, copies, strict=True))
        print(f"{total:>7.0f} MB {o:>9.3f}s {n:>8.3f}s {s:>7.3f}s {s / n:>8.2f}x {s / o:>9.2f}x "
              f"{copy:>7.3f}s {sync:>10.3f}s {asyn:>11.3f}s {ratio:>10.2f}x {waited:>8.3f}s", flush=True)
        for file in os.listdir(directory):
            os.remove(os.path.join(directory, file))
        del model


def measure_resume(repeats: int, directory: str) -> None:
    """Time from kfit.fit to the first step, resuming at sample 10^3 and 10^7 of a 10^4-sample stream."""
    import keras

    import kfit

    rng = np.random.default_rng(0)
    n, width = 10_000, 64
    x = rng.normal(size=(n, width)).astype("float32")
    y = rng.normal(size=(n, 1)).astype("float32")

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((width,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
        m.compile(optimizer=kfit.optimizers.MomentumSGD(learning_rate=1e-3, momentum=0.9), loss="mse")
        return m

    class FirstStep(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if self.at is None:
                self.at = time.perf_counter()

    paths = {}
    for samples in (10**3, 10**7):
        m = model()
        m.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, verbose=0)
        clock = kfit.Clock(samples=samples, minibatches=samples // 32, epoch_size=n, minibatch_size=32)
        stream = kfit.data.SampleStream(x, y, seed=3)
        stream.position = samples
        paths[samples] = os.path.join(directory, f"resume_{samples}.ckpt")
        kfit.save_checkpoint(paths[samples], m, clock=clock, stream=stream)

    def time_to_first_step(samples: int) -> float:
        first = FirstStep()
        first.at = None
        checkpoint = kfit.callbacks.Checkpoint(paths[samples], restore=True, frequency=10**9, async_write=False)
        shutil.copy(paths[samples] + ".orig", paths[samples])
        m = model()
        start = time.perf_counter()
        kfit.fit(m, x, y, minibatch_size=32, epoch_size=n, max_samples=samples + 4 * 32, seed=3,
                 callbacks=[checkpoint, first], verbose=0)
        assert checkpoint.restored_from.samples == samples
        return first.at - start

    for samples in paths:
        shutil.copy(paths[samples], paths[samples] + ".orig")
        time_to_first_step(samples)  # compiles
    times: dict[int, list[float]] = {10**3: [], 10**7: []}
    for _ in range(repeats):
        for samples in times:
            times[samples].append(time_to_first_step(samples))
    early, late = statistics.median(times[10**3]), statistics.median(times[10**7])
    print(f"\nresume (kfit.fit to its first step): at sample 10^3 {early:.3f}s, at sample 10^7 {late:.3f}s "
          f"(10^7 / 10^3 = {late / early:.2f}x)", flush=True)


def run(sizes: list[float], repeats: int) -> None:
    import keras

    setup_threads()
    print(f"backend {keras.backend.backend()}: {repeats} repeats (save: best of; stall, copy, resume: median)", flush=True)
    directory = tempfile.mkdtemp(prefix="kfit-checkpoint-bench-")
    try:
        measure_sizes(sizes, repeats, directory)
        measure_resume(repeats, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,50,400", help="MB of variables, comma-separated (default 1,50,400)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backends", default=None, help=f"comma-separated, from {', '.join(BACKENDS)}")
    parser.add_argument("--backend", default=None, help=argparse.SUPPRESS)  # set by run_per_backend
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    if args.backend is None:
        backends = args.backends.split(",") if args.backends else [os.environ.get("KERAS_BACKEND", "tensorflow")]
        forwarded = ["--sizes", args.sizes, "--repeats", str(args.repeats)]
        return run_per_backend(os.path.abspath(__file__), forwarded, backends)
    run(sizes, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
