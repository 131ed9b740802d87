"""Damage a small checkpoint at every byte, load each damaged copy in a subprocess, and count what happens.

A restart with ``Checkpoint(restore=True)`` must never crash, hang or load damaged data, and must fall back
to the intact older checkpoint whenever the newest one is damaged. For each damage (one byte XORed with a
mask, or the file truncated) a worker process writes the damaged file beside an intact older one and
restores as the callback does (``kfit.checkpoint._format.read_newest_intact``). Many loads share one worker;
a watchdog kills a worker that stops answering (a hang) and a worker that dies (a crash) is restarted after
the damage it was loading. Run:

    python benchmarks/checkpoint_damage.py                   # every byte XOR 0x01 and 0xff; every 3rd length
    python benchmarks/checkpoint_damage.py --masks 0x10 --truncate-step 1

It prints one line of counts per kind of damage. ``tests/test_checkpoint_damage.py`` runs the same sweep
on every byte of the metadata and a few hundred random bytes of array data, on every CI run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

BAD = ("crash", "hang", "damaged-load", "no-fallback", "error")


# -- the checkpoints -----------------------------------------------------------------------------------
def make_checkpoints(directory: str) -> tuple[str, str]:
    """A small model (Dense 4-8-1, MomentumSGD, a clock) saved twice: (newest, older)."""
    import keras

    import kfit

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=kfit.optimizers.MomentumSGD(learning_rate=0.01, momentum=0.9), loss="mse")
    model(np.zeros((1, 4), "float32"))
    model.optimizer.build(model.trainable_variables)
    older, newest = os.path.join(directory, "older.ckpt"), os.path.join(directory, "newest.ckpt")
    kfit.save_checkpoint(older, model, clock=kfit.Clock(samples=100, minibatches=10, epoch_size=100))
    for v in model.trainable_variables:
        v.assign(v + 1.0)
    kfit.save_checkpoint(newest, model, clock=kfit.Clock(samples=200, minibatches=20, epoch_size=100))
    return newest, older


def data_ranges(path: str) -> list[tuple[int, int]]:
    """Where the arrays' raw data lie in the file: ``[(start, end), ...]`` (everything else is metadata)."""
    import h5py

    ranges = []
    with h5py.File(path, "r") as f:
        def visit(name, item):
            if isinstance(item, h5py.Dataset) and item.id.get_storage_size():
                start = item.id.get_offset()
                ranges.append((start, start + item.id.get_storage_size()))
        f.visititems(visit)
    return sorted(ranges)


def split_offsets(path: str) -> tuple[list[int], list[int]]:
    """(metadata offsets, array-data offsets) of every byte of ``path``."""
    size = os.path.getsize(path)
    in_data = np.zeros(size, bool)
    for start, end in data_ranges(path):
        in_data[start:end] = True
    return [int(i) for i in np.flatnonzero(~in_data)], [int(i) for i in np.flatnonzero(in_data)]


# -- the sweep -----------------------------------------------------------------------------------------
def _worker_env() -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def _forward(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def sweep(newest: str, older: str, damages: list, timeout: float = 20.0, verbose: bool = False) -> dict:
    """Loads every damage in worker processes. Returns ``{"counts": Counter, "bad": [(damage, outcome, error)]}``."""
    counts: collections.Counter = collections.Counter()
    bad = []
    with tempfile.TemporaryDirectory() as work:
        files = os.path.join(work, "files")
        os.mkdir(files)
        job = {"original": newest, "older": older, "work": files, "damages": damages, "start": 0}
        job_file = os.path.join(work, "job.json")
        while job["start"] < len(damages):
            with open(job_file, "w") as f:
                json.dump(job, f)
            process = subprocess.Popen([sys.executable, __file__, "--worker", job_file], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, env=_worker_env())
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=_forward, args=(process.stdout, lines), daemon=True).start()
            threading.Thread(target=process.stderr.read, daemon=True).start()
            current, started = None, False
            while True:
                try:  # the first line waits for the worker's imports too
                    line = lines.get(timeout=timeout if started else max(timeout, 120))
                except queue.Empty:
                    process.kill()
                    process.wait()
                    outcome = "hang"
                    break
                if line is None:
                    process.wait()
                    outcome = "crash" if current is not None else None
                    break
                started = True
                event = json.loads(line)
                if "begin" in event:
                    current = event["begin"]
                    continue
                counts[event["outcome"]] += 1
                if event["outcome"] in BAD:
                    bad.append((damages[event["i"]], event["outcome"], event["error"]))
                current = None
                if verbose and event["i"] % 5000 == 0:
                    print(f"  {event['i']} of {len(damages)}", file=sys.stderr)
            if outcome is None and current is None:
                if process.returncode != 0:
                    raise RuntimeError(f"the damage worker failed before loading anything (exit {process.returncode})")
                break
            failed = current if current is not None else job["start"]
            counts[outcome] += 1
            bad.append((damages[failed], outcome, f"worker exit status {process.returncode}"))
            job["start"] = failed + 1
    return {"counts": counts, "bad": bad}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--masks", default="0x01,0xff", help="XOR masks, comma-separated")
    parser.add_argument("--truncate-step", type=int, default=3, help="truncate at every n-th length")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    directory = tempfile.mkdtemp()
    try:
        newest, older = make_checkpoints(directory)
        size = os.path.getsize(newest)
        metadata, data = split_offsets(newest)
        print(f"checkpoint: {size} bytes ({len(metadata)} of metadata, {len(data)} of array data); "
              f"backend {os.environ.get('KERAS_BACKEND', 'tensorflow')}")
        masks = [int(m, 0) for m in args.masks.split(",")]
        kinds = {f"flip ^{m:#04x}": [["flip", o, m] for o in range(size)] for m in masks}
        kinds["truncate"] = [["truncate", n, 0] for n in range(0, size, args.truncate_step)]
        for kind, damages in kinds.items():
            start = time.perf_counter()
            result = sweep(newest, older, damages, verbose=True)
            counts = result["counts"]
            print(f"{kind:<11} {len(damages):>6} loads: " + ", ".join(f"{k} {counts[k]}" for k in
                  ("fallback", "intact") + BAD) + f"  ({time.perf_counter() - start:.0f} s)")
            for damage, outcome, error in result["bad"][:10]:
                print(f"    {outcome}: {damage} {error}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- the worker ----------------------------------------------------------------------------------------
def _same(a: tuple, b: tuple) -> bool:
    (meta_a, arrays_a), (meta_b, arrays_b) = a, b
    return meta_a == meta_b and arrays_a.keys() == arrays_b.keys() and all(
        arrays_a[k].dtype == arrays_b[k].dtype and np.array_equal(arrays_a[k], arrays_b[k]) for k in arrays_a)


def worker(job_file: str) -> None:
    """Writes each damaged copy beside an intact older file and restores as Checkpoint(restore=True) does.

    Prints ``{"begin": i}`` before and ``{"i": i, "outcome": ..., "error": ...}`` after each load. Outcomes:
    "fallback" (the intact older file was restored), "intact" (the damaged copy loaded with exactly the
    original content), "damaged-load" (other content), "no-fallback" (an error although an intact older
    file exists), "error" (an exception that is not a CheckpointError).
    """
    from kfit.checkpoint import _format

    with open(job_file) as f:
        job = json.load(f)
    with open(job["original"], "rb") as f:
        original = f.read()
    expected_newest = _format.read_file(job["original"])
    expected_older = _format.read_file(job["older"])
    path = os.path.join(job["work"], "run.ckpt")
    shutil.copyfile(job["older"], path + ".1")
    for i in range(job["start"], len(job["damages"])):
        kind, offset, mask = job["damages"][i]
        data = bytearray(original)
        if kind == "flip":
            data[offset] ^= mask
        else:
            del data[offset:]
        with open(path, "wb") as f:
            f.write(data)
        print(json.dumps({"begin": i}), flush=True)
        error = None
        try:
            file, meta, arrays, damaged = _format.read_newest_intact(path)
            if file == path:
                outcome = "intact" if _same((meta, arrays), expected_newest) else "damaged-load"
            else:
                outcome = "fallback" if damaged and _same((meta, arrays), expected_older) else "damaged-load"
        except _format.CheckpointError as failure:
            outcome, error = "no-fallback", f"{type(failure).__name__}: {failure}"
        except Exception as failure:  # noqa: BLE001  (counted as a failure by the parent)
            outcome, error = "error", f"{type(failure).__name__}: {failure}"
        print(json.dumps({"i": i, "outcome": outcome, "error": error}), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
