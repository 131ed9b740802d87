"""Plain ``model.fit``: what kfit's callbacks need when no kfit loop drives the run.

Under ``model.fit`` Keras runs the loop and kfit only has its callbacks. This module gives such a run what
:func:`kfit.fit`'s loop gives its own, so that no callback asks which loop drives it:

- :class:`ModelFitLoop`, the run's :class:`kfit._run.RunLoop`: restoring a checkpoint
  (:func:`kfit.checkpoint._restore.restore_run`) is a step it takes once every kfit callback of the run has begun
  (whatever their order in ``model.fit``'s list); it puts a restored clock at the start of its epoch
  (``model.fit`` cannot start in the middle of one), tells ``model.fit`` the epoch to start from, and gives
  Keras's ``History`` back the restored epochs it forgot when training began; the run ends when every kfit
  callback's ``on_train_end`` has run.
- :class:`FitDriver`, the clock's driver that :class:`kfit.callbacks.SampleClock` installs: a step is
  ``batch_size`` samples, the last of an epoch what is left of it.
"""

from __future__ import annotations

import math
from typing import Any

import keras

from kfit import _backend, _run
from kfit._run import RunLoop, StepDriver
from kfit.checkpoint import _restore
from kfit.clock import Clock
from kfit.distributed._notices import warn_job

MODEL_FIT_NOTE = (
    "Checkpoint under plain model.fit: the weights, optimizer, metrics, clock and callback states are "
    "restored, and training goes on from the start of epoch {epoch} (Keras's BackupAndRestore does the same). "
    "model.fit cannot start in the middle of an epoch and shuffles with its own random state, so the run is "
    "not bit-identical to one that was never interrupted. Train with kfit.fit(model, ...) for an exact "
    "resume, also in the middle of an epoch."
)


class ModelFitLoop(RunLoop):
    """The :class:`~kfit._run.RunLoop` of a run driven by plain ``model.fit`` (one per run)."""

    exact_resume = False

    def __init__(self) -> None:
        self._began: set[int] = set()  # ids of the kfit callbacks whose on_train_begin has run
        self._ended: set[int] = set()
        self._restored = False
        self._noted = False
        self._ended_epoch: set[int] = set()  # ids of the kfit callbacks whose on_epoch_end has run, this epoch
        self._epoch_begun = False  # an epoch has begun (its first kfit callback records the values moved since)
        self._after_epoch_end: list = []  # what waits for every kfit callback's on_epoch_end (a checkpoint's save)

    def member_began(self, run: _run.Run, callback: Any) -> None:
        self._began.add(id(callback))
        if self._restored or not all(id(c) in self._began for c in run.members()):
            return
        # Every kfit callback has reset itself for this run: the restore step (as kfit.fit's loop takes it).
        self._restored = True
        if run.history is None:  # the History Keras made for this model.fit call
            history = getattr(run.model, "history", None)
            run.history = history if isinstance(history, keras.callbacks.History) else None
        _restore.restore_run(run)

    def member_epoch_ended(self, run: _run.Run, callback: Any) -> None:
        self._ended_epoch.add(id(callback))
        if all(id(c) in self._ended_epoch for c in run.members()):
            self._run_after_epoch_end()

    def after_epoch_end(self, run: _run.Run, action: Any) -> None:
        # model.fit calls its callbacks in the user's order: a Checkpoint listed before CSVHistory, EarlyStopping...
        # would save before they have ended the epoch (a resumed run lost the epoch's CSV row).
        # Called from a kfit callback's on_epoch_end: its own end of the epoch, told next, may be the last one.
        self._after_epoch_end.append(action)
        if run.manual:
            self._run_after_epoch_end()

    def _run_after_epoch_end(self) -> None:
        actions, self._after_epoch_end = self._after_epoch_end, []
        for action in actions:
            action()

    def epoch_begins(self, run: _run.Run) -> None:
        first = bool(self._ended_epoch) or not self._epoch_begun  # (told by each kfit callback: the epoch's first)
        self._epoch_begun = True
        self._ended_epoch.clear()
        self._run_after_epoch_end()  # (none left: every kfit callback ends each epoch)
        self._give_history_its_epochs(run)
        self._forget_initial_epoch(run)  # model.fit has read it (right after on_train_begin)
        if first:
            _run.record_moved_values(run)  # (what a model.fit that raises leaves: it tells no callback)

    @staticmethod
    def _give_history_its_epochs(run: _run.Run) -> None:
        """Keras's ``History`` empties its epoch list in its ``on_train_begin``, which comes after every kfit
        callback's: the restored epochs go in when the first epoch begins, or as the run ends (a finished run trains
        none)."""
        if run.restored_history_epochs is not None:
            if run.history is not None and not run.history.epoch:
                run.history.epoch = list(run.restored_history_epochs)
            run.restored_history_epochs = None

    def member_ended(self, run: _run.Run, callback: Any) -> None:
        self._run_after_epoch_end()  # (none left: every kfit callback ends each epoch)
        self._give_history_its_epochs(run)
        self._forget_initial_epoch(run)  # (also when a restored finished run trained no epoch)
        self._ended.add(id(callback))
        if not run.manual and all(id(c) in self._ended for c in run.members()):
            _run.end(run)

    @staticmethod
    def _forget_initial_epoch(run: _run.Run) -> None:
        """The epoch a restore told ``model.fit`` to start from is for this call only, not the next."""
        if run.initial_epoch_set:
            _backend.set_initial_epoch(run.model, None)
            run.initial_epoch_set = False

    def prepare_restore(self, run: _run.Run, restore: Any) -> int | None:
        """``model.fit`` restarts an epoch from its first step: the restored clock is put at the epoch's start;
        returns that epoch. Keeps the restored history's epochs for Keras's ``History`` (:meth:`epoch_begins`)."""
        if restore.history is not None:
            run.restored_history_epochs = list(restore.history["epoch"])
        state = restore.clock_state
        epoch = None
        if state is not None and state.get("epoch_size"):
            epoch, _ = _to_epoch_start(run, state)
        elif restore.history is not None and restore.history["epoch"]:
            epoch = max(restore.history["epoch"]) + 1
        if not self._noted:
            self._noted = True
            warn_job(MODEL_FIT_NOTE.format(epoch=(epoch or 0) + 1), stacklevel=4)  # (from 1, as printed)
        return epoch or None

    def prepare_load(self, run: _run.Run, restore: Any) -> None:
        """``model.fit`` goes on with the next epoch from its first step: a clock restored inside an epoch is put at
        the epoch's start, as :meth:`prepare_restore` puts it (the epoch is then trained from there, as a resume of
        the same file trains it)."""
        state = restore.clock_state
        if state is None or not state.get("epoch_size"):
            return
        epoch, into = _to_epoch_start(run, state)
        if into:
            restore.notes.append(
                f"The checkpoint {restore.file!r} was written {into} samples into epoch {epoch + 1}: model.fit goes on "
                f"from the start of an epoch, so the clock is put at the start of epoch {epoch + 1} (sample "
                f"{state['samples']}) and model.fit's next epoch trains it from there with the checkpoint's weights, as a "
                "resume under model.fit does. Train with kfit.fit for a load that goes on inside the epoch.")

    def finished_epoch(self, run: _run.Run, params: dict | None, restored_epoch: int | None) -> int | None:
        # model.fit checks stop_training only after a step: a finished run starts at its last epoch instead.
        return (params or {}).get("epochs", restored_epoch)

    def bound_reached(self, run: _run.Run, params: dict | None, epochs_done: int) -> str | None:
        return _run.epochs_reached(run, params, epochs_done)  # model.fit's own epochs (a clock is optional)

    def end_reached(self, run: _run.Run, params: dict | None, restored_epoch: int | None) -> str | None:
        return _run.epochs_reached(run, params, restored_epoch) if (params or {}).get("epochs") is not None else None


def _to_epoch_start(run: _run.Run, state: dict) -> tuple[int, int]:
    """Puts a restored clock ``state`` (with an ``epoch_size``) at the start of its epoch; returns ``(epoch, samples it
    was into the epoch)``."""
    epoch, into = divmod(state["samples"], state["epoch_size"])
    if into:
        size = getattr(run.driver, "batch_size", None) or state.get("minibatch_size") or into
        state["samples"] -= into
        state["minibatches"] = max(state["minibatches"] - math.ceil(into / size), 0)
    return epoch, into


class FitDriver(StepDriver):
    """Plain ``model.fit``: every step is ``batch_size`` samples, the last of an epoch what is left of it."""

    def __init__(self, model: Any, batch_size: int, num_samples: int | None):
        super().__init__(model)
        self.batch_size = batch_size
        self.num_samples = num_samples
        self._full = [batch_size]  # the pending sizes of a full step (read, never changed)
        self.per_call = _backend.steps_per_execution(model)  # steps one hook of Keras's covers
        self.sleepers: list = []
        self.wake_at: tuple | None = None
        #: The clock at the start of the epoch, where Keras does not know the epoch's length and no ``num_samples``
        #: was given (one worker): :meth:`epoch_ends` checks the epoch's last step then (else None).
        self.epoch_start: int | None = None
        self.past_end = False  # Keras began a step past the end of the epoch's data (see batch_begin)
        #: ``num_samples`` where Keras does not know the epoch's length (see :meth:`batch_begin`), else None.
        self.unknown_length_epoch: int | None = None
        #: The step planned last has run (told by :meth:`step_ran`): a Keras callback that reads the clock before any
        #: kfit callback's hook has counted it finds it counted (``kfit.get_clock``), whatever the callbacks' order.
        self.ran = False
        #: The clock as the epoch in progress began (``SampleClock.on_epoch_begin``); None once it has ended
        #: (:meth:`epoch_ends`), or before the first.
        self.epoch_began: int | None = None

    def inside_epoch(self, clock: Clock) -> bool:
        """True between two steps of one epoch, where model.fit goes on with the epoch's next step: a step of the epoch
        has been counted and the epoch has not ended, unless that step ended an epoch of known length (the next step
        begins the next epoch). On data of unknown length every step may be the last: only the epoch's end tells."""
        began = self.epoch_began
        return began is not None and clock.samples != began and not (clock.epoch_size and clock.samples_in_epoch == 0)

    def step_ran(self) -> None:
        """Called when Keras's train function returns (``SampleClock`` wraps it)."""
        self.ran = True

    def sleep(self, callback: Any, size: int, samples_until: float, minibatches_until: float) -> None:
        """Turns ``callback``'s batch-begin hook off while the steps are of ``size`` and the clock is below
        ``samples_until`` and ``minibatches_until`` (a schedule whose value holds there, placed after the kfit callback
        that plans each step): Keras calls a no-op function in its place, cheaper than the hook's own test. At the
        first step outside, :meth:`batch_begin` turns every sleeper's hook back on before Keras calls it."""
        callback.on_train_batch_begin = _asleep
        self.sleepers.append(callback)
        wake_at = self.wake_at
        self.wake_at = (size, samples_until, minibatches_until) if wake_at is None else (
            size, min(wake_at[1], samples_until), min(wake_at[2], minibatches_until))

    def wake_sleepers(self) -> None:
        """Turns every sleeper's batch-begin hook back on."""
        for callback in self.sleepers:
            wake(callback)
        self.sleepers = []
        self.wake_at = None

    def batch_begin(self, clock: Clock, batch: int) -> bool:
        # StepDriver.batch_begin written out for one size per step, without calls: this runs at every step of
        # model.fit, right after Keras dispatched the step, where each call costs about twice its own time.
        pending, several = self.pending, self.per_call > 1
        if pending is not None:
            if self.pending_batch == batch:
                return True
            if several:
                self.pending = None
                self.count(clock, pending)
            else:
                clock.samples += pending[0]  # the previous step finished (one size: its own, counted once)
                clock.minibatches += 1
        if batch and self.unknown_length_epoch is not None and clock.samples % self.unknown_length_epoch == 0:
            # Data of unknown length (a generator, a filtered tf.data): Keras's JAX and TensorFlow loops begin one
            # more step after the epoch's last and find no data for it. The clock is at the epoch's end (the last
            # step counted here, or already at its batch end).
            self.pending, self.pending_batch = None, batch  # (planned: the next kfit callback asks no more)
            self.past_end = True
            return False
        if several:
            sizes = self._execution_sizes(clock)
            size = sizes[0]
        else:
            size, epoch_size = self.batch_size, clock.epoch_size
            if epoch_size and self.num_samples is not None:  # the epoch's last step: what is left of it
                left = epoch_size - clock.samples % epoch_size
                if left < size:
                    size = left
            sizes = self._full if size == self.batch_size else [size]
        clock.minibatch_size = size
        if size != self.applied:
            _run.apply_minibatch_size(self.model, size)
            self.applied = size
        self.pending, self.pending_batch, self.ran = sizes, batch, False
        wake_at = self.wake_at
        if wake_at is not None and (size != wake_at[0] or clock.samples >= wake_at[1] or clock.minibatches >= wake_at[2]):
            self.wake_sleepers()
        return True

    def epoch_ends(self, run: _run.Run) -> None:
        """Drops the step begun last when the epoch's data had ended before it (see :meth:`batch_begin`): on data of
        unknown length, without ``num_samples``, Keras's own count of the epoch's samples (its loss tracker, synced
        at the epoch's end) tells whether it ran. The schedules then apply their values again at the next step (on
        JAX, the epoch's sync put back the state of the last step that ran, without what was set for that one)."""
        start, clock = self.epoch_start, run.clock
        trained = None if start is None or self.num_samples is not None else _backend.samples_counted_by_keras(self.model)
        if trained is not None:
            # Every step before the pending one was a full one (only the last step of data is short): had the
            # pending step run, Keras would have counted more samples than the clock has without it.
            if self.pending is not None and clock.samples - start >= trained:
                self.pending = self.pending_batch = None
                self.past_end = True
            self.flush(clock)
            # With steps_per_execution=N the epoch's last call may have run fewer than the N steps counted for it:
            # the epoch held as many steps as Keras's count of its samples fills (each counted as batch_size).
            extra = (clock.samples - start) // self.batch_size - math.ceil(trained / self.batch_size)
            if extra > 0:
                clock.samples -= extra * self.batch_size
                clock.minibatches -= extra
        self.epoch_began = None
        if self.past_end:
            self.past_end = False
            run.set_values_again()

    def _execution_sizes(self, clock: Clock) -> list[int]:
        """``compile(steps_per_execution=N)``: the sizes of the up to ``N`` steps of the call that Keras's hook begins
        now, the last one of an epoch ending it; they all train at the rates set now (Keras cannot change a value
        between them)."""
        sizes, samples, epoch_size = [], clock.samples, clock.epoch_size
        for _ in range(self.per_call):
            size = self.batch_size
            if epoch_size and self.num_samples is not None:
                size = min(size, epoch_size - samples % epoch_size)
            sizes.append(size)
            samples += size
            if epoch_size and samples % epoch_size == 0:
                break
        return sizes


def _asleep(batch: int, logs: dict | None = None) -> None:
    """The batch-begin hook of a callback that :meth:`FitDriver.sleep` turned off."""


def wake(callback: Any) -> None:
    """Turns ``callback``'s batch-begin hook back on, if :meth:`FitDriver.sleep` turned it off."""
    if callback.__dict__.get("on_train_batch_begin") is _asleep:
        del callback.__dict__["on_train_batch_begin"]
