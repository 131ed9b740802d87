"""Full-state checkpoints on the sample clock (CNTK's ``CheckpointConfig``). This callback saves; the run's loop
restores, as a step of the loop (``kfit.checkpoint._restore``)."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from kfit import _backend, _checks, _run
from kfit.callbacks._base import KfitCallback
from kfit.checkpoint import CheckpointInfo, _format, _lock, _run_status, _signals, _state
from kfit.checkpoint._format import (
    CheckpointError,
    CheckpointWriteError,
)
from kfit.clock import Clock
from kfit.interval import Interval


class _BackgroundWriter:
    """Runs one write at a time on a (non-daemon) thread; a failed write's error is raised by :meth:`wait`.

    At exit (and on SIGINT / SIGTERM during training, see :class:`Checkpoint`) a write in flight is finished,
    never abandoned. The exit hook is registered when a writer is first used, not at import.
    """

    _all: weakref.WeakSet = weakref.WeakSet()
    _exit_hook = False

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        _BackgroundWriter._all.add(self)

    @property
    def busy(self) -> bool:
        """A write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, job: Callable[[], Any]) -> None:
        self.wait()
        if not _BackgroundWriter._exit_hook:
            _BackgroundWriter._exit_hook = True
            atexit.register(_BackgroundWriter.wait_all)
        self._thread = threading.Thread(target=self._run, args=(job,), name="kfit-checkpoint-writer")
        self._thread.start()

    def _run(self, job: Callable[[], Any]) -> None:
        try:
            job()
        except BaseException as error:  # raised on the training thread by wait()
            self._error = error

    def wait(self) -> None:
        """Waits for the write in flight. Interrupted (Ctrl-C), it keeps the thread, so a later wait finishes it."""
        thread = self._thread
        if thread is not None:
            thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    @classmethod
    def wait_all(cls) -> None:
        """At exit: let every pending write finish (a failed one is reported on stderr)."""
        for writer in list(cls._all):
            try:
                writer.wait()
            except BaseException as error:
                print(f"kfit: a checkpoint write failed: {error}", file=sys.stderr)




class Checkpoint(KfitCallback):
    """Saves the whole training state every ``frequency`` samples and resumes from it exactly.

    A checkpoint holds the model's variables (with seed-generator state), the optimizer's variables, the
    metric variables, the clock, the data stream's position and seed, the state of every callback that has
    ``get_state`` (kfit callbacks under their ``name``), the history and the global random states. With
    ``restore=True``, ``kfit.fit`` starts from the newest intact checkpoint: the next minibatch is the one the
    interrupted run would have drawn, and the run ends bit-identical to one that was never interrupted
    (same backend and machine), also when the checkpoint was taken mid-epoch or the minibatch size changes
    after it. A damaged newest file is reported with a warning and the previous intact one is used.

    Files: ``path`` holds the newest checkpoint; with ``preserve_all`` or ``keep > 1`` each is also kept as
    ``path.<samples>``. Each file is written beside the target, fsynced, verified and renamed over it, so a
    crash never leaves a half-written checkpoint under those names. Only the chief worker writes. With several
    workers, each keeps the training metrics of its own share: a checkpoint taken inside an epoch at a step every
    worker saves at (this frequency, ``max_samples``) holds every worker's metric state, and each worker of the
    resumed run gets its own back, so the epoch's logs are the uninterrupted run's. Resumed on another number of
    workers, rank 0 gets their sums and the others start at zero: a metric whose state is a sum over samples
    (the loss, means, accuracies) then counts every sample of the epoch, to float rounding.

    A checkpoint is taken when the clock crosses a multiple of ``frequency`` samples (when that step ends an
    epoch, at the epoch's end, after its history and validation), or every ``epochs`` epochs, and once at
    the end of training. With neither given, once per epoch. When training stops in the middle of an epoch
    (``max_samples``, ``stop_training``), the final checkpoint is the state after the last step, with the partial
    epoch in its history as ``model.fit`` records it, so that a rerun returns that history and a run resumed from
    it (say with a larger ``max_samples``) goes on as one that never stopped (a ``max_samples`` inside a minibatch
    cut that minibatch short: the run goes on from the shorter one it trained). With ``async_write`` the state is
    copied to host memory on the training thread and written on a background thread; the last write is finished
    before ``fit`` returns (and before the process exits, unless it is killed outright: after a SIGKILL or a power
    cut the write in flight is lost, and the newest checkpoint completed before it is restored).

    Every checkpoint records where the run stands: ``running``, ``complete`` (it reached ``epochs`` or
    ``max_samples``) or ``stopped`` and by what (early stopping and its monitor, a cross-validation callback
    that returned False, a plateau controller, another callback setting ``model.stop_training``); ``kfit
    inspect`` and ``kfit runs`` show it. A restore prints one line to stderr, ``kfit: resumed from FILE at
    sample N (...)``. Rerunning a finished run trains nothing: it restores the final state, prints why
    (``kfit: run already complete at sample N (stopped by EarlyStopping on val_loss); nothing to train...``)
    and ``fit`` returns the restored history. To go on instead: raise ``epochs`` or ``max_samples`` beyond
    the recorded end (a complete run continues to the new bound), or pass ``resume_finished=True`` (a
    stopped run continues; the stop marks of kfit's controllers are cleared, their counters kept). To start
    over: ``restore=False``, or delete the checkpoint files (a run that did not resume replaces, at its first save,
    the ``path.<samples>`` files an earlier run left, which would otherwise pass for newer states of it).

    Faults. A write that fails (a full disk, an I/O error, a read-only file system) raises a
    :class:`~kfit.checkpoint.CheckpointWriteError` naming the path and the cause (``on_write_error="warn"``:
    a warning, and training goes on); the previous checkpoint stays the newest intact one and no temporary
    file is left. During training, Ctrl-C (SIGINT) and SIGTERM first let a write in flight finish; with
    ``save_on_preemption`` a SIGTERM (how SLURM and Kubernetes preempt a job) saves the state at the end of
    the step being trained (at the epoch's end when that step ends an epoch), then ends the process as
    SIGTERM would have, so that a preempted run resumes bit-identically and loses no work. Under data-parallel
    ``kfit.fit``, or plain ``model.fit`` with ``kfit.distributed.AgreedStopCallback`` last in its list, a SIGTERM that
    reaches any worker is agreed on at the next step boundary (with the stops the workers agree on there): rank 0
    saves, prints one line, and every worker ends as SIGTERM would (under plain ``model.fit`` on several workers
    ``save_on_preemption`` without that callback after the ``Checkpoint`` is refused as training begins: a SIGTERM that
    reached a worker other than rank 0 alone would save nothing, and the workers it did not reach would fail in their
    next gradient allreduce). Signal handlers
    are installed when training begins (in the main thread only) and the previous ones put back when it ends;
    a signal the process ignores stays ignored, and a handler of the program's own is called in its turn: if
    it lets training go on, the run keeps its path and its guard. One writer per path: the callback holds ``path + ".lock"`` from the start of training to its end, and
    a second writer on the path (another callback, here or in another process) is refused naming the holder.

    Restoring is a step of the loop that drives the run (``kfit.checkpoint._restore``), taken once every kfit
    callback has begun; :attr:`restored_from` and :attr:`finished_before` say what it found.

    Under plain ``model.fit`` the run is saved and restored as far as it can be (add a
    :class:`SampleClock` for sample frequencies); model.fit then goes on from the start of the saved epoch,
    not bit-identically. The restore comes after every kfit callback's ``on_train_begin``, wherever the
    Checkpoint stands in model.fit's list. Exact resumption needs ``kfit.fit``.

    Args:
        path: the checkpoint file (its directory is created if needed). A symbolic link is resolved once: its
            target is written (with the lock and numbered files beside it), and the link stays.
        frequency: save every ``frequency`` samples (global), or at an interval string (``"2ep"``, ``"100mb"``,
            ``"50000sp"``, or a :class:`kfit.interval.Interval`).
        epochs: save every ``epochs`` epochs.
        preserve_all: keep every checkpoint (``path.<samples>``).
        keep: keep the newest ``keep`` checkpoints (``keep > 1`` names them by sample count).
        restore: at the start of training, resume from the newest intact checkpoint, if there is one.
        async_write: write files on a background thread (training stalls only for the copy to host memory).
        resume_finished: continue a run that a callback stopped (early stopping, cross-validation), instead
            of restoring its final state and training nothing.
        save_on_preemption: on SIGTERM, save at the next step boundary, then end the process (data-parallel:
            a SIGTERM on any worker saves and ends every worker; under plain ``model.fit``, it needs
            ``kfit.distributed.AgreedStopCallback`` last).
        on_write_error: ``"raise"`` (a failed write stops training with its error) or ``"warn"`` (warn and
            go on training; :attr:`failed_writes` counts them).
        name: the callback's name.
        filename: CNTK's name of ``path`` (``CheckpointConfig(filename=..., frequency=...)``), taken for it; give
            one of the two.

    Raises:
        TypeError: neither ``path`` nor ``filename``, or both.
        ValueError: an invalid argument, named with its value.

    Example:
        >>> import kfit
        >>> checkpoint = kfit.callbacks.Checkpoint("runs/model.ckpt", frequency=50_000, keep=3)
        >>> # kfit.fit(model, x, y, minibatch_size=64, callbacks=[checkpoint])  # resumes if stopped
    """

    default_name = "checkpoint"
    #: Its state is the file it writes: not saved inside checkpoints.
    writes_checkpoints = True
    needs_stream = True
    order = 100

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        frequency: int | str | Interval | None = None,
        epochs: int | None = None,
        preserve_all: bool = False,
        keep: int = 1,
        restore: bool = True,
        async_write: bool = True,
        resume_finished: bool = False,
        save_on_preemption: bool = False,
        on_write_error: str = "raise",
        name: str | None = None,
        *,
        filename: str | os.PathLike | None = None,
    ):
        super().__init__(name=name)
        if (path is None) == (filename is None):  # CNTK's CheckpointConfig(filename=..., frequency=...)
            raise TypeError(
                "Checkpoint needs its file once: give path=... (CNTK's `filename` is accepted as its name). Received: "
                + (f"path={path!r}, filename={filename!r}" if path is not None else "neither"))
        path = filename if path is None else path
        path = _checks.output_path("path", path, example="model.ckpt", parents=False)
        interval = None if frequency is None else Interval.parse(frequency)
        if isinstance(epochs, bool):  # CNTK's CheckpointConfig(filename, frequency, restore, preserve_all), positional
            raise ValueError(
                f"Invalid value for argument `epochs`: expected a positive integer or None. Received: epochs={epochs!r}. "
                "Checkpoint's third argument is `epochs`, not CNTK's `restore` (CheckpointConfig(filename, frequency, "
                "restore, preserve_all)): give restore=... and preserve_all=... by keyword.")
        _checks.count("epochs", epochs, low=1, allow_none=True)
        if frequency is not None and epochs is not None:
            raise ValueError(f"Give a checkpoint frequency either in samples or in epochs, not both. Received: frequency={frequency!r}, epochs={epochs!r}")
        from kfit.checkpoint import check_keep

        check_keep(keep, preserve_all)
        for argument, value in (("restore", restore), ("async_write", async_write),
                                ("resume_finished", resume_finished), ("save_on_preemption", save_on_preemption)):
            _checks.boolean(argument, value)
        _checks.choice("on_write_error", on_write_error, ("raise", "warn"))
        self.path = path
        if interval is not None and interval.unit == "ep":
            interval, epochs = None, interval.value
        #: When a step's end saves: an :class:`kfit.interval.Interval` of samples or minibatches (or None).
        self.interval = interval
        self.frequency = interval.value if interval is not None and interval.unit == "sp" else None
        self.epochs = 1 if interval is None and epochs is None else epochs
        self.preserve_all = preserve_all
        self.keep = keep
        self.restore = restore
        self.async_write = async_write
        self.resume_finished = resume_finished
        self.save_on_preemption = save_on_preemption
        self.on_write_error = on_write_error
        self._reset_run()
        self._writer = _BackgroundWriter()
        self._lock = _lock.PathLock(path, f"kfit Checkpoint callback {self.name!r}", active=self._holds_run,
                                    taken_over=self._run_ended)
        self._guard = _signals.SignalGuard(self._on_signal)
        self._training = False
        self._training_thread: int | None = None  # the thread whose fit this callback saves
        self._buffers: dict = {}
        self._raw_weights: list | None = None  # the trained weights, before model.fit swaps their EMA in
        self._undo_ema_hook: Any = lambda: None

    def _reset_run(self) -> None:
        """Sets what one run records to its value before the run (at construction and at every run's start)."""
        #: The checkpoint restored at the start of the last run (None when it started afresh).
        self.restored_from: CheckpointInfo | None = None
        #: True when the last run restored a finished run and trained nothing.
        self.finished_before = False
        #: Set by whoever stops training to checkpoint and exit (a signal handler): the run is then recorded as
        #: still running, so that a rerun resumes it.
        self.interrupted = False
        self._saved_status: str | None = None
        #: How many checkpoints the last run wrote (or started writing).
        self.saves = 0
        #: How many writes of the last run failed (with ``on_write_error="warn"``).
        self.failed_writes = 0
        self._replaced_earlier_run = False
        self._preempted: int | None = None  # the SIGTERM this worker received, until it is acted on
        self._preempt_at_epoch_end = False
        self._stopping = False  # saving for a preemption: a SIGTERM now waits for the save
        self._preempted_workers = 1  # data-parallel: how many workers the SIGTERM reached (agreed)
        self._lost_ctrl_c = False
        self._pending = False
        self._steps_unsaved = 0
        self._epochs_done = 0
        #: ``(arrays, meta)`` of the step where training stopped inside an epoch: the final checkpoint's state.
        self._stopped_step: tuple | None = None
        self._partial_keys: list[str] | None = None  # the keys the epoch training stopped in logged
        #: ``(samples, worker_metrics)`` of the last save this checkpoint's frequency made inside an epoch
        #: (data-parallel: a stop agreed at that step keeps that state instead of writing it again).
        self._frequency_save: tuple | None = None

    def _chief(self) -> bool:
        from kfit import distributed

        return distributed.is_chief()

    # -- training --------------------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        self._wait_writer()
        self._reset_run()
        if self.interval is not None:
            self.clock  # noqa: B018  (a step frequency needs the clock: raises a clear error without one)
        _state.stateful_callbacks(self.training_run.callbacks)  # two callbacks with one state key: refuse now
        self._check_preemption_is_agreed()
        try:
            if self._chief():
                self._check_writable()
                self._lock.acquire()  # one writer per path; then every other temporary file is stale
                _format.remove_stale_temporaries(self.path)
                self._raw_weights = None
                self._undo_ema_hook = _backend.before_ema_finalize(self._model.optimizer, self._keep_raw_weights)
        except BaseException:
            self.release()
            raise
        self._training = True
        self._training_thread = threading.get_ident()
        self._guard.install()

    def _check_preemption_is_agreed(self) -> None:
        """Plain ``model.fit`` on several workers: ``save_on_preemption`` needs the workers to agree on a SIGTERM that
        reaches one of them (``AgreedStopCallback`` after this callback); refused before any collective."""
        from kfit import distributed

        run = self.training_run
        if not self.save_on_preemption or run.kfit_fit or distributed.size() == 1:
            return
        if not any(c is self for c in run.listed_before_agreement or ()):
            raise ValueError(
                f"Checkpoint({self.path!r}, save_on_preemption=True) under plain model.fit on {distributed.size()} "
                "workers needs kfit.distributed.AgreedStopCallback() last in model.fit's callbacks (after this "
                "Checkpoint): without it a SIGTERM that reaches one worker ends that worker alone, saving nothing "
                "unless it is rank 0, and the others fail in their next gradient allreduce. Add it last, or train with "
                "kfit.fit, which agrees on a SIGTERM by itself."
            )

    def _holds_run(self) -> bool:
        """Training with this callback is under way: False after a run that ended with an exception, which Keras
        does not report to callbacks (kfit.fit has ended its run then; under plain model.fit, no fit of the model
        runs on the thread that trained)."""
        if not self._training or _run.current_run(self._model) is not self.training_run:
            return False
        return _backend.fit_in_progress(self._model, self._training_thread)

    def _check_writable(self) -> None:
        from kfit.checkpoint import make_directory

        make_directory(self.path)
        probe = f"{self.path}{_format.TEMP_INFIX}{os.getpid()}.probe"
        try:
            with open(probe, "wb") as f:
                f.write(b"kfit")
            os.remove(probe)
        except OSError as error:
            raise CheckpointError(
                f"Cannot write checkpoints to {self.path!r}: {error.strerror or error}. Give a path in a writable "
                "directory (checked before training starts, so no training is lost)."
            ) from error

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self._lost_ctrl_c:
            self._raise_swallowed_interrupt()
        if self.training_run.clock is not None:  # plain model.fit without a SampleClock: epochs only
            super().on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._lost_ctrl_c:
            self._raise_swallowed_interrupt()
        self._steps_unsaved += 1
        if self.training_run.clock is not None:
            self._dispatch_step_end(batch, logs)  # KfitCallback's batch-end hook: counts the step, on_step_end
        if self._preempted is not None and not self.training_run.agreed_stops:
            self._preempt_after_step()  # (data-parallel: once the workers agree, see _preemption_agreed)

    def _preempt_after_step(self) -> None:
        """A preemption to act on at this step's end: save and stop now, or after the epoch's end when the step
        ends an epoch (history, validation)."""
        if self._preempt_at_epoch_end:
            return
        clock = self.training_run.clock
        if clock is not None and clock.epoch_size and clock.samples_in_epoch == 0:
            self._preempt_at_epoch_end = True
        else:
            self._stop_for_preemption()

    def _preemption_requested(self) -> bool:
        """This worker received a SIGTERM to save and stop for (asked by the workers' agreement after each step)."""
        return self._preempted is not None

    def _preemption_agreed(self, workers: int, epoch: int | None = None, logs: dict | None = None) -> None:
        """Data-parallel runs: the workers agreed, at a step's end (or at the end of ``epoch``), that SIGTERM reached
        ``workers`` of them. Every worker saves (rank 0 writes) and ends, also those the signal did not reach: a
        preempted worker leaves, and the others cannot train on without it."""
        if not self.save_on_preemption or not self._holds_run():
            return
        self._preempted_workers = workers
        if epoch is None:
            self._preempt_after_step()
        elif not self._stopping:
            self._stop_for_preemption(epoch, logs)

    def on_step_end(self, clock: Clock, logs: dict | None) -> None:
        crossed = self.interval is not None and clock.crossed(self.interval)
        at_epoch_end = bool(clock.epoch_size) and clock.samples_in_epoch == 0
        worker_metrics = self._worker_metrics(clock, crossed and not at_epoch_end)
        if self._training_ends(clock) and clock.samples_in_epoch:
            # Training stops in the middle of an epoch (max_samples, stop_training): the final checkpoint is
            # this step's state, before the partial epoch is closed, so that a run resumed from it (say with
            # a larger max_samples) goes on exactly as one that never stopped. The partial epoch's history entry
            # is added when the epoch ends (see _save_stopped_step).
            self._save(keep_step=True, worker_metrics=worker_metrics)
            return
        if not crossed:
            return
        if at_epoch_end:
            self._pending = True  # save after the epoch's end (history, validation, epoch callbacks)
        else:
            self._save(worker_metrics=worker_metrics)
            self._frequency_save = (clock.samples, worker_metrics)

    def _worker_metrics(self, clock: Clock, saves_mid_epoch: bool) -> list | None:
        """Every worker's training-metric variables (``[rank][i]``), gathered on every worker at a step where all of
        them save inside an epoch (``saves_mid_epoch``: this checkpoint's frequency; or a bound of the run reached),
        so that a run resumed from it goes on with each worker's own metrics; None with one worker, or at any other
        step (a stop decided by some workers only: the checkpoint then holds rank 0's alone)."""
        if not self.training_run.gathers_worker_metrics:
            return None
        if not (saves_mid_epoch or (clock.samples_in_epoch and self._bound_reached(clock))):
            return None
        return self._gather_worker_metrics()

    def _gather_worker_metrics(self) -> list:
        """Every worker's training-metric variables (``[rank][i]``): a collective every worker calls at the same step."""
        from kfit.distributed import _state as collective

        model = self.training_model
        return collective.gather_arrays([_backend.read_variable(model, v) for v in model.metrics_variables],
                                        "kfit.checkpoint.metrics")

    def _training_ends(self, clock: Clock) -> bool:
        if self.training_run.agreed_stops:  # data-parallel: a callback's stop is saved once agreed (_stop_agreed)
            return self._bound_reached(clock)
        return bool(self._model.stop_training) or self._bound_reached(clock)

    def _stop_agreed(self) -> None:
        """Data-parallel runs: the workers agreed, at a step's end, to stop training (a callback's stop on any of
        them; called on every worker). Inside an epoch, this step's state is saved as at a stop with one worker (see
        :meth:`on_step_end`), with every worker's training metrics: a stop decided on rank 1 alone was saved as an
        epoch's end (a resumed History held the partial epoch twice), one on rank 0 with rank 0's metrics only (the
        resumed epoch's History left out the other workers' samples before the stop)."""
        clock = self.training_run.clock
        if not self._holds_run() or clock is None or not clock.samples_in_epoch or self._bound_reached(clock):
            return  # (the bound: saved at on_step_end, every worker's metrics gathered there)
        saved = self._frequency_save
        if saved is not None and saved[0] == clock.samples:  # written at this step by the frequency: kept, not again
            self._save(keep_step=True, worker_metrics=saved[1], write=False)
            return
        worker_metrics = self._gather_worker_metrics() if self.training_run.gathers_worker_metrics else None
        self._save(keep_step=True, worker_metrics=worker_metrics)

    def _bound_reached(self, clock: Clock) -> bool:
        run = self.training_run
        if not clock.epoch_size:  # a source whose epoch length is not known yet: only max_samples ends it here
            return run.max_samples is not None and clock.samples >= run.max_samples
        return run.bound_reached() is not None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._raise_swallowed_interrupt()
        self._epochs_done = epoch + 1
        # After every kfit callback's on_epoch_end (under plain model.fit they may come after this one in its list).
        self.training_run.after_epoch_end(lambda: self._end_epoch(epoch, logs))

    def _end_epoch(self, epoch: int, logs: dict | None) -> None:
        if self._preempted is not None and not self.training_run.agreed_stops:
            self._preempt_at_epoch_end = True  # (one worker: also a SIGTERM during the epoch's end, validation)
        preempted = self._preempt_at_epoch_end
        if self._stopped_step is not None:
            self._save_stopped_step(epoch, logs)  # the epoch that training stopped in ends
        elif self._pending or preempted or (self.epochs is not None and (epoch + 1) % self.epochs == 0):
            self._save(epoch, logs)
        self._pending = False
        if preempted:
            self._stop_for_preemption()

    def _keep_raw_weights(self) -> None:
        """Right before ``model.fit`` overwrites the trained weights with their moving averages (``use_ema=True``):
        a final checkpoint must hold the trained weights, from which a continued run goes on exactly."""
        self._raw_weights = [(v, _backend.to_numpy(v.value)) for v in self._model.trainable_weights]

    def on_train_end(self, logs: dict | None = None) -> None:
        try:
            self._raise_swallowed_interrupt()
            # The final checkpoint, unless the last one already holds this state (taken at the last epoch end,
            # or at the last step when training stopped mid-epoch) or nothing was trained after a restore.
            if self._steps_unsaved or (self.saves == 0 and self.restored_from is None):
                self._save_trained_weights()
            elif self.saves and self._saved_status != self._run_status()["status"]:
                # a callback stopped training after this one had saved the step: record the stop
                if self._stopped_step is not None:
                    self._save_stopped_step()
                else:
                    self._save_trained_weights()
            self._wait_writer()
        finally:
            self.release()

    def _save_trained_weights(self) -> None:
        """Saves with the trained weights where ``model.fit`` has just swapped their moving averages in (they are
        swapped back after): ``load_checkpoint`` of a finished run swaps them in again, as ``model.fit`` did."""
        raw, self._raw_weights = self._raw_weights, None
        if raw is None:
            self._save()
            return
        averages = [_backend.to_numpy(v.value) for v, _ in raw]
        for variable, value in raw:
            variable.assign(value)
        try:
            self._save()  # (collect() copies what a background write reads)
        finally:
            for (variable, _), value in zip(raw, averages):
                variable.assign(value)

    def wait(self) -> None:
        """Waits for the checkpoint being written in the background (raises its error, if it failed)."""
        self._wait_writer()

    def release(self) -> None:
        """Ends this callback's hold on its path: finishes a write in flight, puts the previous signal handlers
        back and releases the path's lock. Training does this when it ends; call it after a run that was
        interrupted by an exception (which Keras does not report to callbacks) to let another writer use the
        path at once (it is also released when this callback is garbage-collected)."""
        self._let_go(self._writer.wait)

    def _run_ended(self) -> None:
        """The run ended (told by its loop, also after an exception, which Keras does not report to callbacks): lets
        go of the path and puts the signal handlers back now, as on_train_end does (a failed write is printed: the
        run's own exception is the one to see)."""
        if self._training:
            self._let_go(self._wait_writer_quietly)

    def _let_go(self, wait: Callable[[], None]) -> None:
        """Ends the hold on the path: ``wait`` for the write in flight, then the signal handlers and the lock go back."""
        self._training = False
        self._undo_ema_hook()
        self._undo_ema_hook = lambda: None
        try:
            wait()
        finally:
            self._guard.uninstall()
            self._lock.release()

    def _wait_writer(self) -> None:
        """Waits for the write in flight; a failed write raises, or warns with ``on_write_error="warn"``."""
        try:
            self._writer.wait()
        except CheckpointWriteError as error:
            self._write_failed(error)

    def _write_failed(self, error: CheckpointWriteError) -> None:
        if self.on_write_error == "raise":
            self.release()  # training ends with this error, and Keras does not call on_train_end after one
            raise error
        self.failed_writes += 1
        warnings.warn(f"{error} Training goes on (on_write_error='warn').", stacklevel=3)

    # -- signals ---------------------------------------------------------------------------------
    def _on_signal(self, signum: int) -> bool:
        """In the main thread, on SIGINT or SIGTERM during training. True: handled at the next step boundary."""
        if signum == signal.SIGTERM and self._stopping:
            return True  # saving for a preemption, after which the process ends as SIGTERM ends it
        if not self._holds_run():
            return False
        if signum == signal.SIGTERM and self.save_on_preemption and self._preempted is None:
            self._preempted = signum
            if self._chief() and not self.training_run.agreed_stops:  # (data-parallel: rank 0 says it, once saved)
                print(f"kfit: SIGTERM received: saving the checkpoint {self.path!r} at the end of this step, then "
                      "stopping.", file=sys.stderr, flush=True)
            return True
        if self._guard.goes_to_program(signum):
            # The program's own handler decides whether training stops: the run keeps its path (and this guard)
            # unless the handler raises. A write in flight is finished first, in case it ends the process.
            self._wait_writer_quietly()
            try:
                self._guard.call_program_handler(signum)
            except BaseException:
                self._training = False
                self._lock.release()
                self._guard.uninstall()
                raise
            return True
        if self._writer.busy:
            print(f"kfit: finishing the checkpoint being written to {self.path!r} before stopping (press Ctrl-C "
                  "again to stop at once and leave it unfinished).", file=sys.stderr, flush=True)
        self._wait_writer_quietly()
        self._training = False
        self._lock.release()
        if signum == signal.SIGINT and self._guard.raises_keyboard_interrupt(signum):
            # Python's handler raises KeyboardInterrupt in whatever frame the main thread is in, and C code that
            # checks for signals may clear it (seen here in NumPy's conversion of a JAX array in Keras's batch
            # logs): training would then go on as if Ctrl-C had never come. If it does, the next callback hook
            # raises it again, before anything is saved.
            self._lost_ctrl_c = True
        return False

    def _wait_writer_quietly(self) -> None:
        """Waits for the write in flight, if any; a failure is printed (a signal handler cannot raise it)."""
        try:
            self._writer.wait()
        except CheckpointError as error:
            print(f"kfit: a checkpoint write failed: {error}", file=sys.stderr, flush=True)

    def _raise_swallowed_interrupt(self) -> None:
        """Raises the Ctrl-C the signal handler passed on, if it was lost (per step, callers check the flag first)."""
        if self._lost_ctrl_c:
            self._lost_ctrl_c = False
            raise KeyboardInterrupt("Ctrl-C during training (raised again at the next step boundary: the first "
                                    "KeyboardInterrupt was lost inside compiled code)")

    def _stop_for_preemption(self, epoch: int | None = None, logs: dict | None = None) -> None:
        """At a step (or epoch) boundary after SIGTERM: save this state, then end the process as SIGTERM would.

        Data-parallel: every worker comes here at the same boundary (agreed); rank 0 writes, and no worker ends
        before the write is done (one more collective), so that the launcher, seeing one worker end, cannot stop
        rank 0 in the middle of it."""
        signum, self._preempted = self._preempted, None
        self._preempt_at_epoch_end = False
        self._stopping = True
        failed_before = self.failed_writes
        failure: BaseException | None = None
        try:
            clock = self.training_run.clock
            worker_metrics = None  # (a save inside an epoch: each worker's metrics, as at a save at its frequency)
            if epoch is None and self.training_run.gathers_worker_metrics and clock is not None and clock.samples_in_epoch:
                worker_metrics = self._gather_worker_metrics()  # every worker is here, at the same step (agreed)
            if self._steps_unsaved:
                self._save(epoch, logs, worker_metrics=worker_metrics)
            self._wait_writer()
        except BaseException as error:  # raised once the other workers know (they must not wait for this one)
            failure = error
        finally:
            self._training = False
            self._lock.release()
        try:
            saved = failure is None and self.failed_writes == failed_before
            if self._chief():
                if saved:
                    print(f"kfit: saved the checkpoint {self.path!r} at sample {self._samples()}; "
                          f"{self._stopping_what()}.", file=sys.stderr, flush=True)
                elif failure is None:  # on_write_error="warn": the warning says why
                    print(f"kfit: could not save the checkpoint {self.path!r} at sample {self._samples()} (see the "
                          f"warning above; the previous checkpoint stays the newest); {self._stopping_what()}.",
                          file=sys.stderr, flush=True)
            sys.stdout.flush()
            if self.training_run.agreed_stops:
                from kfit import distributed

                distributed.any_true(failure is not None)  # every worker waits here for rank 0's write
            if failure is not None:
                raise failure
        finally:
            self._stopping = False
        self._guard.deliver(signum if signum is not None else signal.SIGTERM)

    def _stopping_what(self) -> str:
        if not self.training_run.agreed_stops:
            return "stopping (SIGTERM)"
        from kfit import distributed

        return f"stopping every worker (SIGTERM reached {self._preempted_workers} of {distributed.size()} workers)"

    def _samples(self) -> int | None:
        clock = self.training_run.clock
        return None if clock is None else clock.samples

    # -- saving ----------------------------------------------------------------------------------
    def _save(self, epoch: int | None = None, logs: dict | None = None, keep_step: bool = False,
              worker_metrics: list | None = None, write: bool = True) -> None:
        if not self._chief():
            return
        from kfit import distributed

        self._wait_writer()  # its buffers are reused; a failed write is raised (or warned about) here
        parts = self.training_run
        # collect() syncs the loop's state into the variables on JAX (as self.model does): at save time only.
        arrays, meta = _state.collect(parts, self._buffers if self.async_write else None, epoch, logs,
                                      workers=distributed.size(), worker_metrics=worker_metrics)
        if keep_step:
            self._stopped_step = ({name: np.array(array, copy=True) for name, array in arrays.items()}, meta)
        if write:
            self._write(arrays, meta)

    def _save_stopped_step(self, epoch: int | None = None, logs: dict | None = None) -> None:
        """Writes the state of the step where training stopped inside an epoch again, with the history as it is now
        (the partial epoch's entry, marked partial) and the run's status. A rerun that trains nothing returns that
        history, as model.fit did; a run continued from it drops the partial entry and trains on exactly."""
        if not self._chief():
            return
        self._wait_writer()
        arrays, meta = self._stopped_step
        arrays = {name: array for name, array in arrays.items() if not name.startswith("history/")}
        if logs:  # the keys the partial epoch logs (a later save, after the History has its entry, has no logs)
            self._partial_keys = sorted(logs)
        meta = dict(meta, history=_state.partial_history_state(self.training_run.history, arrays, epoch, logs,
                                                                self._partial_keys))
        self._write(arrays, meta)

    def _write(self, arrays: dict, meta: dict) -> None:
        meta["run"] = self._run_status()
        self._saved_status = meta["run"]["status"]
        samples = meta["summary"]["samples"]
        if samples is None:  # plain model.fit without a SampleClock: number by epochs
            samples = self._epochs_done
        path, keep, preserve_all = self.path, self.keep, self.preserve_all
        # A run that did not resume replaces what an earlier run left at the path (restore=False: start over).
        # (Until a first write succeeds: one that failed with on_write_error="warn" removed nothing.)
        starts_over = self.restored_from is None and not self._replaced_earlier_run

        def job() -> None:
            _format.write_checkpoint(path, arrays, meta, samples, keep=keep, preserve_all=preserve_all,
                                     starts_over=starts_over)
            if starts_over:
                self._replaced_earlier_run = True

        self.saves += 1
        self._steps_unsaved = 0
        if self.async_write:
            self._writer.submit(job)
            return
        try:
            job()
        except CheckpointWriteError as error:
            self._write_failed(error)

    def _run_status(self) -> dict:
        return _run_status.status(self.training_run, self.params, self._epochs_done, self.interrupted)

