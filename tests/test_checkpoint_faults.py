"""Faults around a checkpoint write, with real processes: a full disk, Ctrl-C, SIGTERM, two writers.

A full disk is a small tmpfs mounted in a private mount namespace (``unshare -rm``, no root needed); the
training child fills it after a first checkpoint, and reports what is on disk (the namespace and its files
end with it). Signals are real signals sent to a training child.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest

import kfit
from kfit.checkpoint import CheckpointLockedError, read_checkpoint_info

SCRIPT = Path(__file__).parent / "scripts" / "fault_train.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("fault_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env() -> dict:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")


class Child:
    """A training child whose JSON lines are collected on a thread."""

    def __init__(self, args: list[str], prefix: list[str] | None = None):
        self.process = subprocess.Popen((prefix or []) + [sys.executable, str(SCRIPT)] + args, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=_env())
        self.events: list[dict] = []
        self.stderr = ""
        self._changed = threading.Condition()
        self._threads = [threading.Thread(target=self._out, daemon=True), threading.Thread(target=self._err, daemon=True)]
        for thread in self._threads:
            thread.start()

    def _out(self) -> None:
        for line in self.process.stdout:
            if line.startswith("{"):
                with self._changed:
                    self.events.append(json.loads(line))
                    self._changed.notify_all()
        with self._changed:
            self.events.append({"event": "eof"})
            self._changed.notify_all()

    def _err(self) -> None:
        self.stderr = self.process.stderr.read()

    def wait_for(self, test, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for event in self.events:
                    if test(event):
                        return event
                    if event["event"] == "eof":
                        raise AssertionError(f"the child ended first: {self.finish()} {self.stderr[-3000:]}")
                left = deadline - time.monotonic()
                assert left > 0, "the child did not get there in time"
                self._changed.wait(left)

    def finish(self, timeout: float = 180) -> int:
        code = self.process.wait(timeout=timeout)
        for thread in self._threads:
            thread.join(timeout=10)
        return code


def run(mode: str, directory, options: dict, prefix: list[str] | None = None) -> tuple[int, list[dict], str]:
    child = Child([mode, str(directory), json.dumps(options)], prefix)
    code = child.finish()
    return code, child.events, child.stderr


# -- a full disk ---------------------------------------------------------------------------------------
def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.slow
def test_disk_full_during_sync_async_and_save_checkpoint_writes(tmp_path):
    """A 512 KB tmpfs in a private mount namespace; the child fills it after a first checkpoint."""
    if not _unshare_works():
        pytest.fail("`unshare -rm` does not work here: the full-disk tests need unprivileged user namespaces")
    disk = tmp_path / "disk"
    disk.mkdir()
    train = {"checkpoint": {"frequency": 40}, "fill_disk_at": 50, "epochs": 2}
    scenarios = {
        "sync": dict(train, checkpoint={"frequency": 40, "async_write": False}),
        "async": train,
        "warn": dict(train, checkpoint={"frequency": 40, "on_write_error": "warn"}),
        "save_checkpoint": {"save_checkpoint": True},
    }
    command = f'mount -t tmpfs -o size=512k tmpfs "{disk}" && exec "$0" "$@"'
    code, events, stderr = run("disk_full", disk, scenarios, prefix=["unshare", "-rm", "sh", "-c", command])
    assert code == 0, stderr[-3000:]  # no segfault: every scenario caught its error and reported
    reports = {e["name"]: e for e in events if e["event"] == "report"}
    assert reports.keys() == scenarios.keys(), (events, stderr[-3000:])
    steps = [e["samples"] for e in events if e["event"] == "step"]
    first = min(s for s in steps if s >= 40)  # the first checkpoint: the first step past 40 samples
    for name in ("sync", "async", "save_checkpoint"):
        report = reports[name]
        assert report["error"] == "CheckpointWriteError" and report["cause"] == "OSError", report
        assert f"Cannot write the checkpoint '{disk}/{name}/run.ckpt': No space left on device" in report["message"]
        # The previous checkpoint is still the newest, intact; no temporary file is left, the lock is released.
        assert report["samples"] == (10 if name == "save_checkpoint" else first), report
        assert report["files"] == ["run.ckpt"], report
    warned = reports["warn"]
    assert warned["error"] is None and warned["samples"] == first and warned["files"] == ["run.ckpt"]
    assert "Training goes on (on_write_error='warn')" in stderr
    done = [e for e in events if e["event"] == "done"]  # trained to the end; every write after the first failed
    assert len(done) == 1 and done[0]["failed_writes"] == done[0]["saves"] - 1 >= 1, done


# -- signals -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_ctrl_c_during_an_async_write_lets_it_finish(tmp_path):
    options = {"checkpoint": {"frequency": 30}, "slow_write": 1.5, "epochs": 3}
    child = Child(["train", str(tmp_path), json.dumps(options)])
    child.wait_for(lambda e: e["event"] == "writing" and e["n"] == 2)
    # The step whose write this is reports itself after the write has begun (the writer sleeps 1.5 s): wait for
    # that line too, or a loaded machine can deliver Ctrl-C before the child has printed it.
    child.wait_for(lambda e: e["event"] == "step" and e["samples"] >= 60)
    child.process.send_signal(signal.SIGINT)
    code = child.finish()
    steps = [e["samples"] for e in child.events if e["event"] == "step"]
    assert code != 0 and "KeyboardInterrupt" in child.stderr, child.stderr[-3000:]
    assert "finishing the checkpoint being written" in child.stderr
    # The write in flight when Ctrl-C came (the second one, at the first step past 60 samples) completed.
    second = min(s for s in steps if s >= 60)
    assert read_checkpoint_info(tmp_path / "run.ckpt").samples == second
    assert sorted(os.listdir(tmp_path)) == ["run.ckpt"]  # no temporary file, the lock released


@pytest.mark.slow
def test_ctrl_c_lost_inside_other_code_is_raised_again_at_the_next_step(tmp_path):
    """Python raises KeyboardInterrupt in whatever frame the main thread is in, and compiled code that checks for
    signals can clear it (NumPy converting a JAX array did, in CI). Here a callback swallows it instead; training
    must still stop, before the next step trains or anything more is saved."""
    options = {"checkpoint": {"frequency": 30}, "swallow_ctrl_c_at": 40, "epochs": 3}
    child = Child(["train", str(tmp_path), json.dumps(options)])
    child.wait_for(lambda e: e["event"] == "sleeping")
    child.process.send_signal(signal.SIGINT)
    code = child.finish()
    assert code != 0 and "KeyboardInterrupt: Ctrl-C during training" in child.stderr, child.stderr[-3000:]
    assert any(e["event"] == "swallowed" for e in child.events), child.events
    steps = [e["samples"] for e in child.events if e["event"] == "step"]
    swallowed_at = min(s for s in steps if s >= 40)
    assert steps[-1] == swallowed_at  # no step trained after Ctrl-C
    assert read_checkpoint_info(tmp_path / "run.ckpt").samples < swallowed_at  # nothing saved after it
    assert sorted(os.listdir(tmp_path)) == ["run.ckpt"]


@pytest.mark.slow
@pytest.mark.parametrize("sigint", ["ignore", "own"])
def test_a_program_that_ignores_or_handles_ctrl_c_itself_keeps_its_choice(tmp_path, sigint):
    """A job that ignores SIGINT (started with ``&`` from a script, as CI runners and nohup'd jobs are) or handles it
    itself keeps doing so while a Checkpoint trains: kfit's handler neither turns that Ctrl-C into a stop nor raises
    one at the next step; training runs to its end."""
    options = {"checkpoint": {"frequency": 30}, "step_sleep": 0.1, "epochs": 3, "sigint": sigint}
    child = Child(["train", str(tmp_path), json.dumps(options)])
    child.wait_for(lambda e: e["event"] == "step" and e["samples"] >= 60)
    child.process.send_signal(signal.SIGINT)
    if sigint == "own":
        handled = child.wait_for(lambda e: e["event"] == "own_handler")
        child.wait_for(lambda e: e["event"] == "step" and child.events.index(e) > child.events.index(handled))
        # Training went on: the run still holds its checkpoint path (no second writer may take it).
        with pytest.raises(CheckpointLockedError, match=f"pid {child.process.pid}"):
            _fit(tmp_path / "run.ckpt")
    code = child.finish()
    assert code == 0 and "KeyboardInterrupt" not in child.stderr, child.stderr[-3000:]
    steps = [e["samples"] for e in child.events if e["event"] == "step"]
    assert steps[-1] == 3 * 96 and any(e["event"] == "done" for e in child.events)
    assert any(e["event"] == "own_handler" for e in child.events) == (sigint == "own")
    info = read_checkpoint_info(tmp_path / "run.ckpt")  # still checkpointing after the signal, to the run's end
    assert (info.samples, info.status) == (3 * 96, "complete")


@pytest.mark.slow
def test_sigterm_with_save_on_preemption_saves_and_resumes_bit_identically(tmp_path):
    reference, preempted = tmp_path / "reference", tmp_path / "preempted"
    reference.mkdir()
    preempted.mkdir()
    checkpoint = {"epochs": 100, "save_on_preemption": True}  # no periodic save: only the preemption's
    script = _load_script()  # the run that is never interrupted: the same script, in this process
    model = script.train(str(reference), {"checkpoint": checkpoint})
    np.savez(reference / "result.npz", **{f"v{i}": keras.ops.convert_to_numpy(v.value)
                                          for i, v in enumerate(model.variables + model.optimizer.variables)})

    child = Child(["train", str(preempted), json.dumps({"checkpoint": checkpoint, "step_sleep": 0.05})])
    child.wait_for(lambda e: e["event"] == "step" and e["samples"] >= 150)
    child.process.send_signal(signal.SIGTERM)
    code = child.finish()
    assert code == -signal.SIGTERM, (code, child.stderr[-3000:])  # it ends as SIGTERM ends a process
    assert "saved the checkpoint" in child.stderr
    last = [e["samples"] for e in child.events if e["event"] == "step"][-1]
    saved = read_checkpoint_info(preempted / "run.ckpt").samples
    # No work lost: the state after the last step trained (the step that was running when SIGTERM came may
    # have ended after the last one reported).
    assert 150 <= last <= saved <= last + 16 < 6 * 96
    assert sorted(os.listdir(preempted)) == ["run.ckpt"]

    code, events, stderr = run("train", preempted, {"checkpoint": checkpoint})  # resumes from it
    assert code == 0, stderr[-3000:]
    first = next(e["samples"] for e in events if e["event"] == "step")
    assert saved < first <= saved + 16  # went on from the preemption's checkpoint
    expected, got = np.load(reference / "result.npz"), np.load(preempted / "result.npz")
    assert sorted(expected.files) == sorted(got.files)
    for name in expected.files:
        assert np.array_equal(expected[name], got[name]), name


def test_a_programs_own_handler_that_stops_the_run_frees_the_path(tmp_path):
    """A handler of the program's own that ends training (it raises) ends the run as Ctrl-C does: the error
    reaches the caller, the program's handler is back in place, and the next run takes the path at once."""

    def stop(signum, frame):
        raise RuntimeError("stopped by the program's handler")

    raiser = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: signal.raise_signal(signal.SIGINT) if batch == 1 else None)
    previous = signal.signal(signal.SIGINT, stop)
    try:
        with pytest.raises(RuntimeError, match="stopped by the program's handler"):
            _fit(tmp_path / "run.ckpt", extra=[raiser])
        assert signal.getsignal(signal.SIGINT) is stop
        _fit(tmp_path / "run.ckpt")  # the path is free
    finally:
        signal.signal(signal.SIGINT, previous)
    assert read_checkpoint_info(tmp_path / "run.ckpt").status == "complete"


# -- two writers ---------------------------------------------------------------------------------------
def _fit(path, extra=(), **checkpoint):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((16, 3), "float32"), np.ones((16, 1), "float32")
    callbacks = [kfit.callbacks.Checkpoint(path, **checkpoint), *extra]
    return kfit.fit(model, x, y, minibatch_size=8, epochs=2, callbacks=callbacks, verbose=0), model


def test_two_checkpoint_callbacks_on_one_path_are_refused(tmp_path):
    path = tmp_path / "run.ckpt"
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((16, 3), "float32"), np.ones((16, 1), "float32")
    first = kfit.callbacks.Checkpoint(path, keep=3, name="keep3")
    second = kfit.callbacks.Checkpoint(path, keep=1, name="keep1")
    with pytest.raises(CheckpointLockedError, match=r"run.ckpt' is in use by kfit Checkpoint callback 'keep3' in this process"):
        kfit.fit(model, x, y, minibatch_size=8, epochs=1, callbacks=[first, second], verbose=0)
    # That run ended with the error: the next one on the path takes the path over, and releases it at its end.
    _fit(path)
    assert sorted(os.listdir(tmp_path)) == ["run.ckpt"]
    assert not first._lock.held


@pytest.mark.parametrize("loop", ["kfit.fit", "model.fit"])
def test_a_run_ended_by_an_exception_leaves_the_path_to_the_next_run_on_a_new_model(tmp_path, loop):
    """A user's callback raises (Keras tells the other callbacks nothing); the cell is run again, building a new model:
    the new run takes the path and resumes from what the failed one saved. kfit.fit puts the signal handlers back
    as the error leaves it; under plain model.fit they go back when the next run takes the path over."""
    path = tmp_path / "run.ckpt"
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)

    class Fails(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:  # (after the checkpoint at sample 8)
                raise RuntimeError("the user's callback failed")

    def train(extra=()):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        x, y = np.ones((16, 3), "float32"), np.ones((16, 1), "float32")
        checkpoint = kfit.callbacks.Checkpoint(path, frequency=8)
        if loop == "kfit.fit":
            kfit.fit(model, x, y, minibatch_size=4, epochs=2, callbacks=[checkpoint, *extra], verbose=0)
        else:
            model.fit(x, y, batch_size=4, epochs=2, verbose=0,
                      callbacks=[kfit.callbacks.SampleClock(4, 16), checkpoint, *extra])
        return checkpoint

    with pytest.raises(RuntimeError, match="the user's callback failed"):
        train([Fails()])
    if loop == "kfit.fit":
        assert not failed_lock_held(tmp_path)
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (model.fit's note that its resume starts at an epoch's beginning)
        retry = train()
    assert retry.restored_from is not None and retry.restored_from.samples == 8
    assert read_checkpoint_info(path).status == "complete" and read_checkpoint_info(path).samples == 32
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    assert not failed_lock_held(tmp_path)


def failed_lock_held(directory) -> bool:
    """Whether a lock file of a checkpoint path is left in ``directory`` (a holder removes it when it lets go)."""
    return any(name.endswith(".lock") for name in os.listdir(directory))


@pytest.mark.slow
def test_a_second_process_on_one_path_is_refused_naming_the_holder(tmp_path):
    options = {"checkpoint": {"frequency": 30}, "step_sleep": 0.2, "epochs": 50}
    child = Child(["train", str(tmp_path), json.dumps(options)])
    try:
        child.wait_for(lambda e: e["event"] == "step")
        pid = child.process.pid
        with pytest.raises(CheckpointLockedError, match=rf"in use by another process: kfit Checkpoint callback "
                                                        rf"'checkpoint' of pid {pid} on host"):
            _fit(tmp_path / "run.ckpt")
        with pytest.raises(CheckpointLockedError, match=f"pid {pid}"):
            kfit.save_checkpoint(tmp_path / "run.ckpt", _fit(tmp_path / "other.ckpt")[1])
        assert child.process.poll() is None  # the holder trains on, undisturbed
    finally:
        child.process.kill()
        child.finish()
    # The holder died: its lock went with it (the stale lock file is taken over). Whether the holder wrote a
    # checkpoint before it was killed depends on the machine's speed, and its optimizer is not this one's:
    # start over instead of resuming, so that the outcome does not depend on timing.
    _fit(tmp_path / "run.ckpt", restore=False)
    assert read_checkpoint_info(tmp_path / "run.ckpt").samples == 32


# -- the log writers and `kfit plot` on a full disk ----------------------------------------------------
def _event_records(data: bytes) -> list[bytes]:
    """The events of a TensorBoard event file, each record's two CRCs checked; a torn or damaged record fails."""
    from kfit.callbacks._tensorboard import _masked_crc32c

    records, at = [], 0
    while at < len(data):
        header = data[at:at + 8]
        assert len(header) == 8 and data[at + 8:at + 12] == _masked_crc32c(header).to_bytes(4, "little"), at
        length = int.from_bytes(header, "little")
        event = data[at + 12:at + 12 + length]
        assert len(event) == length and data[at + 12 + length:at + 16 + length] == _masked_crc32c(event).to_bytes(4, "little"), at
        records.append(event)
        at += 16 + length
    return records


def _varint_at(data: bytes, at: int) -> int:
    value, shift = 0, 0
    while True:
        value |= (data[at] & 0x7F) << shift
        if data[at] < 0x80:
            return value
        at, shift = at + 1, shift + 7


@pytest.mark.slow
def test_log_writers_and_plot_on_a_full_disk_fail_naming_the_file_and_keep_it_whole(tmp_path):
    """CSVHistory, ProgressPrinter(log_to_file=...) and TensorBoardProgressWriter, each in a 256 KB tmpfs that fills
    at sample 200 of 1200 (its Checkpoint on another disk): training stops with an OSError (ENOSPC) naming the file;
    the file keeps whole rows, lines and records only; the run resumed on the emptied disk ends with the
    uninterrupted run's CSV rows. ``kfit plot`` on the full disk names the picture and leaves the one there before."""
    if not _unshare_works():
        pytest.fail("`unshare -rm` does not work here: the full-disk tests need unprivileged user namespaces")
    disk = tmp_path / "disk"
    disk.mkdir()
    scenarios = {"csv": "csv", "progress": "progress", "tensorboard": "tensorboard", "plot": "plot",
                 "read_only": "csv_read_only"}
    command = f'mount -t tmpfs -o size=256k tmpfs "{disk}" && exec "$0" "$@"'
    code, events, stderr = run("logs_disk_full", disk, scenarios, prefix=["unshare", "-rm", "sh", "-c", command])
    assert code == 0, stderr[-3000:]
    failed = {e["name"]: e for e in events if e["event"] == "failed"}
    resumed = {e["name"]: e for e in events if e["event"] == "resumed"}
    assert failed.keys() == {"csv", "progress", "tensorboard", "read_only"}, (events, stderr[-3000:])
    assert resumed.keys() == {"csv", "progress", "tensorboard"}, (events, stderr[-3000:])
    files = {name: {path: bytes.fromhex(data) for path, data in e["files"].items()} for name, e in failed.items()}
    after = {name: {path: bytes.fromhex(data) for path, data in e["files"].items()} for name, e in resumed.items()}
    what = {"csv": "the CSV history", "progress": "the progress log", "tensorboard": "the TensorBoard event file"}
    for name, event in resumed.items():
        event = failed[name]
        (path,) = files[name]
        assert event["errno"] == 28, event  # ENOSPC, as an OSError
        assert f"Cannot write {what[name]} '{disk}/{name}/{path}': No space left on device" in event["message"], event
        assert 200 <= event["samples"] < 1200, event  # the last good checkpoint, from which the run resumes
        assert resumed[name]["error"] is None and resumed[name]["samples"] == 1200, resumed[name]

    # The CSV: whole rows when training stopped; after the resume every epoch's row once, as in one run.
    text = files["csv"]["logs/history.csv"].decode()
    assert text.endswith("\n") and all(line.count(",") == text.count(",", 0, text.index("\n"))
                                       for line in text.splitlines()), text[-500:]
    rows = [line.split(",") for line in after["csv"]["logs/history.csv"].decode().splitlines()]
    assert [int(row[2]) for row in rows[1:]] == list(range(8, 1201, 8))
    # The progress log: whole lines only, before and after the resume.
    for lines in (files["progress"]["logs/progress.txt"], after["progress"]["logs/progress.txt"]):
        assert lines.endswith(b"\n") and all(line.startswith((b"Minibatch", b"Finished Epoch[")) for line in lines.splitlines())
    # TensorBoard: every record whole (TensorBoard stops reading a file at a torn one); the resumed run's own file.
    (stopped,) = files["tensorboard"]
    assert len(_event_records(files["tensorboard"][stopped])) > 10
    assert after["tensorboard"][stopped] == files["tensorboard"][stopped]
    (new,) = set(after["tensorboard"]) - {stopped}
    records = _event_records(after["tensorboard"][new])
    assert len(records) > 10
    # It starts at the restored checkpoint's reading (TensorBoard drops the stopped file's points from there on).
    restart = records[1]
    assert restart[9] == 0x10 and restart.endswith(b"\x3a\x02\x08\x01"), restart  # step, then SessionLog START
    assert _varint_at(restart, 10) == failed["tensorboard"]["samples"]

    # A folder made read-only (a read-only mount over it): the same, with the cause.
    read_only = failed["read_only"]
    # The row of the epoch ending at sample 200 fails: that epoch's checkpoint is not written, the one before it stays.
    assert read_only["errno"] == 30 and read_only["samples"] == 192, read_only
    assert (f"Cannot write the CSV history '{disk}/read_only/logs/history.csv': Read-only file system. The rows already "
            "in it are whole. Make its file system writable") in read_only["message"]
    assert files["read_only"]["logs/history.csv"].endswith(b"\n")

    (plot,) = [e for e in events if e["event"] == "plot"]
    redrawn, new_picture = plot["errors"]
    assert redrawn[2] == new_picture[2] == 28 and redrawn[3] == f"{disk}/plot/curves.png", plot["errors"]
    assert f"Cannot write the picture '{disk}/plot/new.png': No space left on device" in new_picture[1]
    assert plot["files"] == ["curves.png", "filler", "filler2", "history.csv"]  # no cut new.png, no temporary file
    assert bytes.fromhex(plot["picture"]).startswith(b"\x89PNG") and bytes.fromhex(plot["picture"]).endswith(b"IEND\xaeB`\x82")


def test_a_log_folder_removed_during_the_run_is_made_again(tmp_path):
    """``rm -rf`` of the log folders between epochs: training goes on, the CSV starts again with its header, the
    progress log goes on in a new file, and TensorBoard's points go to a new event file, with a warning."""
    import shutil

    logs, tb = tmp_path / "logs", tmp_path / "tb"

    class Remove(kfit.callbacks.KfitCallback):
        def on_epoch_end(self, epoch, logs_=None):
            if epoch == 1:
                shutil.rmtree(logs)
                shutil.rmtree(tb)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((16, 3), "float32"), np.ones((16, 1), "float32")
    callbacks = [kfit.callbacks.CSVHistory(logs / "history.csv"), Remove(name="remove"),
                 kfit.callbacks.ProgressPrinter(log_to_file=logs / "progress.txt"),
                 kfit.callbacks.TensorBoardProgressWriter(tb, freq=1)]
    with pytest.warns(UserWarning, match="was removed while the run wrote it"):
        history = kfit.fit(model, x, y, minibatch_size=8, epochs=4, callbacks=callbacks, verbose=0)
    assert len(history.history["loss"]) == 4
    rows = (logs / "history.csv").read_text().splitlines()
    assert rows[0].startswith("kind,epoch,samples") and [row.split(",")[2] for row in rows[1:]] == ["48", "64"]
    assert (logs / "progress.txt").read_text().splitlines()[-1].startswith("Finished Epoch[4]")
    (events,) = os.listdir(tb)
    assert len(_event_records((tb / events).read_bytes())) > 4


def test_a_checkpoint_folder_removed_during_the_run_is_named_as_missing(tmp_path):
    """``rm -rf`` of the Checkpoint's folder mid-run: the failed save says the folder no longer exists, not that the
    previous checkpoint there is untouched (it is gone); a save into a folder that exists and fails still says so."""
    import shutil

    folder = tmp_path / "run"

    class Remove(kfit.callbacks.KfitCallback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                shutil.rmtree(folder)

    def train(callbacks):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        x, y = np.ones((16, 3), "float32"), np.ones((16, 1), "float32")
        kfit.fit(model, x, y, minibatch_size=8, epochs=3, callbacks=callbacks, verbose=0)
        return model

    with pytest.raises(kfit.checkpoint.CheckpointWriteError,
                       match=r"does not exist \(removed during the run\?\).*no checkpoint is left there"):
        # (synchronous writes: rmtree must not race the background write of the epoch before, renaming its file)
        train([kfit.callbacks.Checkpoint(folder / "a.ckpt", epochs=1, async_write=False), Remove(name="remove")])
    os.makedirs(folder)
    model = train([])
    os.chmod(folder, 0o500)
    try:
        if os.access(folder, os.W_OK):
            return  # (root writes anywhere: the read-only case cannot be made here)
        with pytest.raises(kfit.checkpoint.CheckpointWriteError, match="is writable and has free space; the previous"):
            kfit.save_checkpoint(folder / "a.ckpt", model, clock=kfit.Clock(samples=16, minibatches=2))
    finally:
        os.chmod(folder, 0o700)
