"""Training runs for the fault tests (tests/test_checkpoint_faults.py): a full disk, signals, two writers.

    python tests/scripts/fault_train.py MODE DIRECTORY [OPTIONS_JSON]

Modes:
  train      kfit.fit with a Checkpoint at DIRECTORY/run.ckpt; prints {"event": "step", "samples": S} after
             each step, and on completion writes the final variables to DIRECTORY/result.npz. Options:
             checkpoint (Checkpoint arguments), step_sleep (seconds per step), slow_write (seconds each
             checkpoint write waits before it writes, after printing {"event": "writing", "n": n}),
             fill_disk_at (samples: fill the disk once the clock passes it), epochs, swallow_ctrl_c_at
             (samples: at the first step past it, print {"event": "sleeping"} and sleep in a callback that
             swallows KeyboardInterrupt, as some compiled code does, printing {"event": "swallowed"}), sigint
             ("ignore": the process ignores SIGINT, as a job started with `&` from a script does; "own": a
             handler of the program's own, which prints {"event": "own_handler"} and lets training go on).
             Otherwise SIGINT has Python's own handler, whatever the test runner's disposition was.
  logs_disk_full  OPTIONS_JSON maps scenario names to a log writer ("csv", "progress", "tensorboard"), "plot" or
             "csv_read_only" (the CSV's folder made read-only at sample 200 instead; not resumed):
             each kfit.fit with that writer in DIRECTORY/<name> (its Checkpoint beside DIRECTORY) meets the disk
             filled at sample 200, reports {"event": "failed"}, then resumes on the emptied disk ({"event":
             "resumed"}); "plot" draws a picture, fills the disk, draws it again and a new one ({"event": "plot"}).
  disk_full  OPTIONS_JSON maps scenario names to train options (or {"save_checkpoint": true}: save, fill
             the disk, save again); each runs in DIRECTORY/<name>, catches the CheckpointError, empties the
             disk again and prints a JSON report of what is on disk.
"""

import json
import os
import signal
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kfit  # noqa: E402
from kfit.checkpoint import _format  # noqa: E402

if keras.backend.backend() == "torch":
    import torch

    torch.set_num_threads(1)


def say(**event) -> None:
    """One JSON line, written whole by one ``os.write`` (atomic on a pipe up to 4 KB), with no lock: the checkpoint
    writer's thread says things too, and Checkpoint's SIGINT handler, which may run in the main thread in the middle of
    this function, waits for that thread (a lock held here by the main thread deadlocked the two: CI, 8ff8348)."""
    line = (json.dumps(event) + "\n").encode()
    os.write(sys.stdout.fileno(), line)


def fill(directory: str) -> None:
    """Fills the file system of ``directory`` to the last byte."""
    fd = os.open(os.path.join(directory, "filler"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(fd, b"\0" * 1024)
    except OSError:
        pass
    finally:
        os.close(fd)


class Steps(kfit.callbacks.KfitCallback):
    order = 150  # after the Checkpoint

    def __init__(self, directory: str, sleep: float, fill_at: int | None, checkpoint, swallow_at: int | None = None):
        super().__init__(name="steps")
        self.directory, self.sleep, self.fill_at, self.checkpoint = directory, sleep, fill_at, checkpoint
        self.swallow_at = swallow_at

    def on_step_end(self, clock, logs):
        say(event="step", samples=clock.samples)
        if self.fill_at is not None and clock.samples >= self.fill_at:
            self.checkpoint.wait()  # the write before is complete: the next one meets the full disk
            fill(self.directory)
            self.fill_at = None
        if self.swallow_at is not None and clock.samples >= self.swallow_at:
            self.swallow_at = None
            try:
                say(event="sleeping")
                time.sleep(60)
            except KeyboardInterrupt:
                say(event="swallowed")
        if self.sleep:
            time.sleep(self.sleep)


def slow_writes(seconds: float) -> None:
    real, count = _format._write_sealed, [0]

    def write(temp, image):
        count[0] += 1
        say(event="writing", n=count[0])
        time.sleep(seconds)
        return real(temp, image)

    _format._write_sealed = write


def model_and_data():
    keras.utils.set_random_seed(1234)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 8)).astype("float32")
    y = (x[:, :2] @ rng.normal(size=(2, 2))).astype("float32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="tanh"),
                              keras.layers.Dropout(0.2, seed=3), keras.layers.Dense(2)])
    model.compile(optimizer=kfit.optimizers.MomentumSGD(learning_rate=0.01, momentum=0.9), loss="mse")
    return model, x, y


def train(directory: str, options: dict):
    if options.get("slow_write"):
        slow_writes(options["slow_write"])
    model, x, y = model_and_data()
    sigint = options.get("sigint")
    if sigint == "ignore":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    elif sigint == "own":
        signal.signal(signal.SIGINT, lambda signum, frame: say(event="own_handler"))
    else:  # a child of a runner started in the background inherits SIGINT ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
    checkpoint = kfit.callbacks.Checkpoint(os.path.join(directory, "run.ckpt"), **options.get("checkpoint", {}))
    steps = Steps(directory, options.get("step_sleep", 0.0), options.get("fill_disk_at"), checkpoint,
                  options.get("swallow_ctrl_c_at"))
    kfit.fit(model, x, y, minibatch_size=[8, 8, 16], epoch_size=96, epochs=options.get("epochs", 6), seed=3,
             callbacks=[checkpoint, steps], verbose=0)
    say(event="done", saves=checkpoint.saves, failed_writes=checkpoint.failed_writes)
    return model


def report(name: str, directory: str, error: BaseException | None) -> None:
    path = os.path.join(directory, "run.ckpt")
    try:
        samples = kfit.checkpoint.read_checkpoint_info(path).samples
    except kfit.checkpoint.CheckpointError as failure:
        samples = f"unreadable: {failure}"
    say(event="report", name=name, error=None if error is None else type(error).__name__, message=str(error or ""),
        cause=type(getattr(error, "cause", None)).__name__, samples=samples, files=sorted(os.listdir(directory)))


def disk_full(name: str, directory: str, options: dict) -> None:
    """One scenario on the (nearly empty) disk: writes, the disk fills up, what happens is reported."""
    os.mkdir(directory)
    error = None
    try:
        if options.get("save_checkpoint"):
            model, x, _ = model_and_data()
            model(x[:1])
            path = os.path.join(directory, "run.ckpt")
            kfit.save_checkpoint(path, model, clock=kfit.Clock(samples=10, minibatches=1))
            fill(directory)
            kfit.save_checkpoint(path, model, clock=kfit.Clock(samples=20, minibatches=2))
        else:
            train(directory, options)
    except kfit.checkpoint.CheckpointError as failure:
        error = failure
    os.remove(os.path.join(directory, "filler"))
    report(name, directory, error)


def fill_last_byte(directory: str) -> None:
    """Fills the file system of ``directory`` to the last byte (a file's last page may still hold a few bytes more)."""
    fill(directory)
    fd = os.open(os.path.join(directory, "filler2"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(fd, b"\0")
    except OSError:
        pass
    finally:
        os.close(fd)


class FillAt(kfit.callbacks.KfitCallback):
    """Fills the disk of ``directory`` once the clock passes ``samples``; or, ``read_only``, makes its folder
    ``logs`` read-only (a read-only bind mount over it: the namespace's root may write anything else)."""

    def __init__(self, directory: str, samples: int, read_only: bool = False):
        super().__init__(name="fill")
        self.directory, self.samples, self.read_only = directory, samples, read_only

    def on_step_end(self, clock, logs):
        if self.samples is not None and clock.samples >= self.samples:
            self.samples = None
            if self.read_only:
                logs = os.path.join(self.directory, "logs")
                subprocess.run(["mount", "--bind", logs, logs], check=True)
                subprocess.run(["mount", "-o", "remount,bind,ro", logs], check=True)
            else:
                fill_last_byte(self.directory)


def log_writers(directory: str, checkpoint_path: str, writer: str, fill_at: int | None, read_only: bool = False):
    """kfit.fit with one log writer in ``directory`` and a Checkpoint at ``checkpoint_path``, filling the disk of
    ``directory`` once the clock passes ``fill_at``: the run's CSV rows or the error that ended it."""
    model, x, y = model_and_data()
    callbacks = [kfit.callbacks.Checkpoint(checkpoint_path, frequency="1ep")]
    if writer in ("csv", "csv_read_only"):
        callbacks.append(kfit.callbacks.CSVHistory(os.path.join(directory, "logs", "history.csv")))
    elif writer == "progress":
        callbacks.append(kfit.callbacks.ProgressPrinter(freq=1, log_to_file=os.path.join(directory, "logs", "progress.txt")))
    else:
        callbacks.append(kfit.callbacks.TensorBoardProgressWriter(os.path.join(directory, "tb"), freq=1))
    if fill_at is not None:
        callbacks.append(FillAt(directory, fill_at, read_only))
    try:
        kfit.fit(model, x, y, minibatch_size=8, epoch_size=8, epochs=150, seed=3, callbacks=callbacks, verbose=0)
    except OSError as error:
        return error
    return None


def contents(directory: str) -> dict:
    """Every file under ``directory`` but the fillers: relative path -> its bytes in hex (the disk ends with the child)."""
    found = {}
    for root, _, names in os.walk(directory):
        for name in names:
            if not name.startswith("filler"):
                path = os.path.join(root, name)
                found[os.path.relpath(path, directory)] = open(path, "rb").read().hex()
    return found


def logs_disk_full(directory: str, options: dict) -> None:
    """Each scenario (name: the writer, "csv", "progress" or "tensorboard"; or "plot") on the nearly empty disk:
    the disk fills during training, the error is reported; the disk is emptied and the run resumed."""
    for name, writer in options.items():
        where = os.path.join(directory, name)
        os.mkdir(where)
        checkpoint = os.path.join(directory, "..", f"{name}.ckpt")  # (not on the full disk: the run resumes from it)
        if writer == "plot":
            from kfit.plotting import plot_history

            history = os.path.join(where, "history.csv")
            with open(history, "w") as f:
                f.write("kind,epoch,samples,minibatches,loss\nepoch,1,16,2,1.0\nepoch,2,32,4,0.5\n")
            plot_history(history, os.path.join(where, "curves.png"))
            fill_last_byte(where)
            errors = []
            for picture in ("curves.png", "new.png"):
                try:
                    plot_history(history, os.path.join(where, picture))
                except OSError as error:
                    errors.append([type(error).__name__, str(error), error.errno, error.filename])
            say(event="plot", name=name, errors=errors, files=sorted(os.listdir(where)),
                picture=open(os.path.join(where, "curves.png"), "rb").read().hex())
            os.remove(os.path.join(where, "filler"))
            os.remove(os.path.join(where, "filler2"))
            continue
        if writer == "csv_read_only":  # the folder made read-only instead: then nothing more
            error = log_writers(where, checkpoint, writer, fill_at=200, read_only=True)
            say(event="failed", name=name, error=type(error).__name__, message=str(error), errno=getattr(error, "errno", None),
                samples=kfit.checkpoint.read_checkpoint_info(checkpoint).samples, files=contents(where))
            continue
        error = log_writers(where, checkpoint, writer, fill_at=200)
        say(event="failed", name=name, error=type(error).__name__, message=str(error), errno=getattr(error, "errno", None),
            samples=kfit.checkpoint.read_checkpoint_info(checkpoint).samples, files=contents(where))
        os.remove(os.path.join(where, "filler"))
        os.remove(os.path.join(where, "filler2"))
        error = log_writers(where, checkpoint, writer, fill_at=None)  # resumed, on a disk with room again
        say(event="resumed", name=name, error=None if error is None else str(error),
            samples=kfit.checkpoint.read_checkpoint_info(checkpoint).samples, files=contents(where))


def main(mode: str, directory: str, options: dict) -> None:
    if mode == "train":
        model = train(directory, options)
        arrays = {f"v{i}": keras.ops.convert_to_numpy(v.value) for i, v in enumerate(model.variables + model.optimizer.variables)}
        np.savez(os.path.join(directory, "result.npz"), **arrays)
    elif mode == "logs_disk_full":
        logs_disk_full(directory, options)
    elif mode == "disk_full":
        for name, scenario in options.items():
            disk_full(name, os.path.join(directory, name), scenario)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]) if len(sys.argv) > 3 else {})
    sys.stdout.flush()
    os._exit(0)  # skip the backends' slow teardown (the files are written)
