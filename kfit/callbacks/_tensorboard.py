"""Scalars against the sample clock in TensorBoard event files, written without TensorFlow or TensorBoard.

An event file is a sequence of TFRecords (length, masked CRC-32C of the length, data, masked CRC-32C of
the data), each an ``Event`` protocol buffer. kfit writes the three kinds it needs by hand: the file
version, a ``SessionLog.START`` at the step a run starts from (TensorBoard then drops the points a
resumed run trains again), and ``Summary`` scalars (``simple_value``).
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time
import warnings
from typing import Any

from kfit import _checks, _files, distributed
from kfit.callbacks._base import KfitCallback
from kfit.callbacks._running_means import (
    IntervalMeans,
    ScheduledValues,
    begin_intervals,
    kfit_names,
    to_float,
    without_step_end,
)
from kfit.clock import Clock


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def _masked_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= 0xFFFFFFFFFFFFFFFF
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int, body: bytes) -> bytes:
    # Event: wall_time = 1 (double), step = 2 (int64), then file_version = 3, summary = 5 or session_log = 7.
    return b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step) + body


class EventFileWriter:
    """Appends scalar events to a new TensorBoard event file in ``log_dir``.

    Events are kept in memory and written at :meth:`flush` (and whenever 64 KB are waiting) whole or not at all
    (:class:`TensorBoardProgressWriter` flushes at each ``freq`` and each epoch end):
    a write that fails (a full disk, a read-only file system) cuts the file back to its last whole event and
    raises an ``OSError`` naming the file and the cause, so that TensorBoard never meets a torn record. A file
    removed while the run writes (its folder deleted) is started again, with a warning.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as log_dir:
        ...     writer = EventFileWriter(log_dir)
        ...     writer.scalar("loss", 0.5, step=64)
        ...     writer.close()
    """

    _FLUSH_AT = 1 << 16

    def __init__(self, log_dir: str | os.PathLike):
        self.log_dir = os.fspath(log_dir)
        # TensorBoard reads a folder's event files in name order: seconds then nanoseconds, both zero-padded,
        # so that a resumed run's file sorts after the file of the run it resumes, even within one second.
        now = time.time_ns()
        name = f"events.out.tfevents.{now // 10**9:010d}.{socket.gethostname()}.{os.getpid()}.{now % 10**9:09d}.kfit"
        self.path = os.path.join(self.log_dir, name)
        self._fd: int | None = None
        self._pending = bytearray()
        self._open()

    def _open(self) -> None:
        try:
            os.makedirs(self.log_dir, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as cause:
            raise self._failed(cause) from cause
        self._write(b"\x09" + struct.pack("<d", time.time()) + _field(3, b"brain.Event:2"))

    def _failed(self, cause: OSError) -> _files.WriteError:
        return _files.WriteError("the TensorBoard event file", self.path, cause,
                                 "The events already in it are whole.")

    def _write(self, event: bytes) -> None:
        header = struct.pack("<Q", len(event))
        self._pending += header + struct.pack("<I", _masked_crc32c(header)) + event + struct.pack("<I", _masked_crc32c(event))
        if len(self._pending) >= self._FLUSH_AT:
            self.flush()

    def scalar(self, tag: str, value: float, step: int) -> None:
        """Writes ``value`` under ``tag`` at ``step``."""
        summary_value = _field(1, tag.encode("utf-8")) + b"\x15" + struct.pack("<f", float(value))
        self._write(_event(time.time(), int(step), _field(5, _field(1, summary_value))))

    def session_start(self, step: int) -> None:
        """Marks a (re)start at ``step``: TensorBoard discards the points written before at this step or later."""
        self._write(_event(time.time(), int(step), _field(7, b"\x08\x01")))

    def flush(self) -> None:
        """Writes the events waiting, whole or not at all."""
        if self._fd is None or not self._pending:
            return
        if not os.path.exists(self.path):  # removed during the run (its folder deleted): start the file again
            warnings.warn(f"The TensorBoard event file {self.path!r} was removed while the run wrote it: the points it "
                          "held are lost; the run's next points go to a new file of that name.", stacklevel=2)
            pending, self._pending = self._pending, bytearray()
            os.close(self._fd)
            self._fd = None
            self._open()
            self._pending += pending
        pending, self._pending = bytes(self._pending), bytearray()
        _files.append_whole(self._fd, pending, self._failed)

    def close(self) -> None:
        if self._fd is None:
            return
        try:
            self.flush()
        finally:
            os.close(self._fd)
            self._fd = None


class TensorBoardProgressWriter(KfitCallback):
    """Writes the run's scalars to TensorBoard event files, with the sample clock as the step.

    Scalars: ``loss`` and each metric (and Keras's ``val_*``) at every epoch end, with ``lr`` (also when a
    Keras callback logs it as ``learning_rate``), ``momentum`` (the values per minibatch, as applied), ``minibatch_size`` and ``samples_per_second``;
    ``val_*`` results at every cross-validation and ``test_*`` results after the final test; ``lr`` and
    ``momentum`` also whenever a schedule changes them, and ``minibatch_size`` whenever it changes. With
    ``freq``, the means over each interval of ``freq`` minibatches as ``minibatch/loss``,
    ``minibatch/<metric>``. Every step is ``clock.samples``.

    Each run writes a new event file in ``log_dir`` that starts with a restart mark at the clock's value,
    so a resumed run replaces the points that it trains again, and those written at the restored reading after its
    checkpoint was taken (the partial epoch of a run stopped inside one); the points of that reading written before,
    which the checkpoint holds, are written again after the mark; after :func:`kfit.load_checkpoint` from a callback, the
    run's next points follow such a mark too, as a resume of that file's do. Needs neither TensorFlow nor TensorBoard
    to write; view with ``tensorboard --logdir LOG_DIR``. Only the chief worker writes.

    The first argument is ``log_dir``, as in ``keras.callbacks.TensorBoard``. CNTK's positional order
    ``TensorBoardProgressWriter(freq, log_dir)`` is recognised too (a number, then a path).

    Args:
        log_dir: the directory of the event files (created if missing).
        freq: also write minibatch-level scalars every ``freq`` minibatches (a positive integer), or None.
        name: the key of this callback's state in checkpoints.
        rank: CNTK's worker rank (``rank=kfit.distributed.rank()``), or None: only rank 0 writes event files, as
            in CNTK given a rank (kfit's writer does so whatever ``rank`` is).
        model: CNTK's model whose graph it drew: accepted and not used (kfit writes scalars only).

    CNTK's argument order is accepted too: ``TensorBoardProgressWriter(50, "logs")`` and the CNTK guide's
    ``TensorBoardProgressWriter(50, log_dir="logs", model=model)`` (``log_dir`` is given first or by
    keyword; the default is ``"."``).

    Raises:
        TypeError: an unknown keyword, or ``log_dir`` given twice.
        ValueError: if ``freq`` is not a positive integer or None, ``log_dir`` is not a path, or ``rank`` is
            not a non-negative integer or None.

    Example:
        >>> import kfit
        >>> writer = kfit.callbacks.TensorBoardProgressWriter("logs/run1", freq=10)
        >>> writer.log_dir, writer.freq
        ('logs/run1', 10)
        >>> kfit.callbacks.TensorBoardProgressWriter(10, "logs/run1").log_dir  # CNTK's order
        'logs/run1'
        >>> # kfit.fit(model, x, y, minibatch_size=64, callbacks=[writer])
    """

    default_name = "tensorboard_progress_writer"

    def __init__(
        self,
        log_dir: str | os.PathLike | None = None,
        /,
        freq: int | None = None,
        name: str | None = None,
        *,
        rank: int | None = None,
        model: Any = None,
        **keywords: Any,
    ):
        super().__init__(name=name)
        unknown = sorted(set(keywords) - {"log_dir"})
        if unknown:
            raise TypeError(f"TensorBoardProgressWriter.__init__() got an unexpected keyword argument {unknown[0]!r}")
        if "log_dir" in keywords:  # (log_dir is positional-only so that CNTK's (50, log_dir=...) reaches here)
            if log_dir is None:
                log_dir = keywords["log_dir"]
            elif _checks.is_integer(log_dir) and freq is None:
                log_dir, freq = keywords["log_dir"], log_dir  # CNTK's TensorBoardProgressWriter(freq, log_dir=...)
            else:
                raise TypeError(
                    f"TensorBoardProgressWriter got two values for `log_dir`: {log_dir!r} (first argument) and "
                    f"log_dir={keywords['log_dir']!r}. Give one.")
        if log_dir is None:
            log_dir = "."
        # CNTK's `rank` (the worker's): there, only rank 0 wrote event files, as kfit's writer always does.
        _checks.count("rank", rank, allow_none=True)
        # CNTK's `model` drew the model's graph; kfit writes scalars only: `model` is accepted and not used.
        if _checks.is_integer(log_dir) and isinstance(freq, (str, os.PathLike)):
            log_dir, freq = freq, log_dir  # CNTK's order: (freq, log_dir)
        freq = _checks.count("freq", freq, low=1, allow_none=True)  # minibatches
        if not isinstance(log_dir, (str, os.PathLike)):
            raise ValueError(
                f"Invalid value for argument `log_dir`: expected a path (the first argument, as in keras.callbacks.TensorBoard). "
                f"Received: log_dir={log_dir!r}" + (f". For a frequency write freq={log_dir!r}." if _checks.is_integer(log_dir) else "")
            )
        self.freq = freq
        self.log_dir = _checks.output_path("log_dir", log_dir, directory=True)
        self._writer: EventFileWriter | None = None
        self._started = False
        self._training = False
        self._intervals = IntervalMeans()
        self._scheduled = ScheduledValues()
        self._epoch_time = 0.0
        self._epoch_samples = 0
        self._points: tuple[int | None, list] = (None, [])  # the step of the last points written, and (tag, value)s
        self._restored_points: list | None = None  # those of the restored reading, when the checkpoint was taken
        # The log keys written (over the runs a checkpoint chains), and the tag of each key a resume renamed (a model
        # built again names its metrics anew, auc then auc_1): its points go on under the tag the run began with.
        self._keys: set[str] = set()
        self._tags: dict[str, str] = {}
        # (restored reading, the reading before): a load in the epoch in progress, which ends at the reading before
        self._ended_before_load: tuple[int, int] | None = None
        if freq is None:
            without_step_end(self)  # epoch scalars only: no per-step work, no per-step sync

    def write_value(self, tag: str, value: float, step: int) -> None:
        """Writes one scalar (on the chief only)."""
        if not distributed.is_chief():
            return
        if self._writer is None:
            self._writer = EventFileWriter(self.log_dir)
        self._writer.scalar(tag, value, step)
        if self._points[0] != step:
            self._points = (step, [])
        self._points[1].append((tag, float(value)))

    def _write_logs(self, logs: dict, step: int, skip: tuple = ()) -> None:
        for key, value in kfit_names(logs).items():
            number = to_float(value)
            if key not in skip and number is not None:
                self._keys.add(key)
                self.write_value(self._tags.get(key, key), number, step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    # -- hooks -----------------------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        self._close()  # each run writes its own file
        self._training = True
        self._started = False
        self._points, self._restored_points = (None, []), None
        self._keys, self._tags = set(), {}
        self._scheduled.reset()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        clock = self.clock
        self._ended_before_load = None  # (a load before this epoch began: it ends on the clock)
        self._mark_start(clock)
        begin_intervals(self, self._intervals, clock)
        self._epoch_time = time.perf_counter()
        self._epoch_samples = clock.samples

    def _mark_start(self, clock: Clock) -> None:
        # Here, not in on_train_begin: a checkpoint restores the clock after every on_train_begin.
        if not self._started and distributed.is_chief():
            self._started = True
            if self._writer is None:
                self._writer = EventFileWriter(self.log_dir)
            restored, self._restored_points = self._restored_points, None
            if restored is None or not clock.samples:
                # (A checkpoint that does not say which points its reading had: keep the points at that reading.)
                self._writer.session_start(clock.samples + 1 if clock.samples else 0)
                return
            self._writer.session_start(clock.samples)
            for tag, value in restored:  # the points of this reading that the checkpoint's state had
                self.write_value(tag, value, clock.samples)

    def on_step_begin(self, clock: Clock) -> None:
        self._mark_start(clock)
        if self._scheduled.observe_size(clock, self.training_run.max_samples):
            self.write_value("minibatch_size", clock.minibatch_size, clock.samples)

    def on_step_end(self, clock: Clock, logs: dict | None) -> None:
        if self.freq is None or not self._intervals.due(clock, self.freq) or not distributed.is_chief():
            return
        interval = self._intervals.interval(clock, logs)
        for key, value in interval.means.items():
            self._keys.add(key)
            self.write_value(f"minibatch/{self._tags.get(key, key)}", value, clock.samples)
        self.flush()  # (TensorBoard shows the minibatch-level points as they come)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        clock = self.clock
        seconds = time.perf_counter() - self._epoch_time
        scheduled = dict(self._scheduled.values)
        if self._scheduled.size is not None:
            scheduled["minibatch_size"] = self._scheduled.size
        loaded, self._ended_before_load = self._ended_before_load, None
        step = loaded[1] if loaded is not None and loaded[0] == clock.samples else clock.samples
        self._write_logs({**(logs or {}), **scheduled}, step)
        if seconds > 0:
            self.write_value("samples_per_second", (clock.samples - self._epoch_samples) / seconds, step)
        self.flush()

    def on_cross_validation_end(self, index: int, logs: dict) -> None:
        step = logs.get("samples")
        step = self.clock.samples if step is None else int(step)
        self._write_logs(logs, step, skip=("samples", "val_index", "val_samples", "val_minibatches"))
        self.flush()

    def on_final_test_end(self, logs: dict) -> None:
        self._write_logs(logs, self.clock.samples, skip=("test_samples", "test_minibatches"))
        if self._training:
            self.flush()
        else:  # the final test comes after on_train_end
            self._close()

    def on_hyperparameter_change(self, name: str, value: float, scheduled: float, unit: str) -> None:
        clock = self.clock
        if self._scheduled.observe(name, value, clock, self.training_run.max_samples):
            self.write_value(name, value, clock.samples)

    def on_train_end(self, logs: dict | None = None) -> None:
        # Flushed, not closed: a final test (kfit.callbacks.Test) reports after on_train_end.
        self._training = False
        self.flush()

    def _run_ended(self) -> None:
        """The run ended (told by its loop, also after an exception): the points waiting are written, so that the
        steps of an epoch a run ended in are kept as they were when events were written through a buffered file (a
        failed write is printed: the run's own exception is the one to see)."""
        if self._training:
            self._training = False
            try:
                self.flush()
            except OSError as error:
                print(f"kfit: {error}", file=sys.stderr, flush=True)

    def _clock_restored(self, samples: int, minibatches: int) -> None:
        """``kfit.load_checkpoint`` from a callback of the run moved the clock from ``samples`` and ``minibatches``: the
        epoch in progress is counted as trained (its baselines move with the clock), and the points go on as a resume
        of the same file writes them: after a restart mark at the restored reading."""
        clock = self.clock
        moved = clock.samples - samples
        self._epoch_samples += moved
        self._intervals.epoch_start_samples += moved
        self._intervals.epoch_start_minibatches += clock.minibatches - minibatches
        self._started = False
        if self._restored_points is None:  # (a file without the writer's state: a resume's writer starts afresh)
            self._scheduled.reset()
        # The epoch it ends was trained to the reading before: its points go there, as the run that wrote the points
        # a resume of the file goes on from (the restart mark at the restored reading hides them, as it hides those).
        self._ended_before_load = (clock.samples, samples)

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # -- state -----------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        clock = getattr(getattr(self, "_run", None), "clock", None)
        step, points = self._points
        at_clock = points if clock is not None and step == clock.samples else []
        if not self._started:  # restored (a resume, a load), the restart mark to come: the points restored with it
            at_clock = self._restored_points
        return {"intervals": self._intervals.get_state(),
                "points_at_clock": None if at_clock is None else [[tag, value] for tag, value in at_clock],
                "scheduled": self._scheduled.get_state(), "keys": sorted(self._keys), "tags": dict(self._tags)}

    def renamed_state(self, state: dict[str, Any], renamed: Any) -> dict[str, Any]:
        """``state`` with its running means under this model's log keys (a restore's ``renamed``), each renamed key
        written under the tag the run began with, so that TensorBoard shows one curve."""
        tags = dict(state.get("tags") or {})
        for key in state.get("keys") or []:
            if renamed(key) != key:
                tags[renamed(key)] = tags.pop(key, key)
        return dict(state, intervals=IntervalMeans.renamed_state(state.get("intervals"), renamed),
                    keys=[renamed(key) for key in state.get("keys") or []], tags=tags)

    def set_state(self, state: dict[str, Any]) -> None:
        self._intervals.set_state(state.get("intervals"))
        points = state.get("points_at_clock")
        self._restored_points = None if points is None else [(str(tag), float(value)) for tag, value in points]
        self._keys, self._tags = set(state.get("keys") or []), dict(state.get("tags") or {})
        scheduled = state.get("scheduled")
        if scheduled is not None:  # the values already written: a resumed run writes a point when one changes
            self._scheduled.set_state(scheduled)
