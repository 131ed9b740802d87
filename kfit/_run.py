"""One training run: what its loop and its callbacks share. It belongs to the run, never to the user's model.

A :class:`Run` is made by the loop that starts it (:func:`kfit.fit`), or, under plain ``model.fit``, by the
first kfit callback Keras hands the model to; every kfit callback of that ``model.fit`` call joins it. The run
is dropped when it ends: nothing of it is set on the model, and the next run on the same model starts fresh
(a callback reused in a second ``model.fit`` joins the new run, never the old one).

Example:
    >>> import kfit
    >>> from kfit._run import Run, current_run, end, start
    >>> model = object.__new__(type("Model", (), {}))
    >>> run = start(Run(model, clock=kfit.Clock(epoch_size=10)))
    >>> current_run(model) is run, vars(model)
    (True, {})
    >>> end(run); current_run(model) is None
    True
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from kfit.clock import Clock

_CURRENT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its run in progress
_LAST_CLOCK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> the clock of its last run
# optimizer -> its scalar variables as the code set them for its last run, and as that run left them
_LAST_HYPERPARAMETERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class RunLoop:
    """What the loop that drives a run does for its callbacks, where loops differ. This base is :func:`kfit.fit`'s
    loop: it restores checkpoints itself, as a step of the loop (``kfit.training._fit._RunControl``), and its
    checkpoints resume exactly, also in the middle of an epoch. Plain ``model.fit``'s is
    ``kfit.callbacks._model_fit.ModelFitLoop``: no callback asks which loop drives it.
    """

    #: Checkpoints of this loop resume exactly, also mid-epoch, with the epoch's metric state (``kfit_fit`` in them).
    exact_resume = True

    def member_began(self, run: Run, callback: Any) -> None:
        """``callback``'s ``on_train_begin`` ran."""

    def member_ended(self, run: Run, callback: Any) -> None:
        """``callback``'s ``on_train_end`` ran."""

    def epoch_begins(self, run: Run) -> None:
        """An epoch begins (told by every kfit callback whose ``on_epoch_begin`` runs). kfit.fit's History keeps
        its restored epochs: nothing to put back."""

    def member_epoch_ended(self, run: Run, callback: Any) -> None:
        """``callback``'s ``on_epoch_end`` ran."""

    def after_epoch_end(self, run: Run, action: Any) -> None:
        """Calls ``action()`` once every kfit callback of the run has ended the epoch. kfit.fit calls its callbacks in
        their ``order`` (a checkpoint's last): now."""
        action()

    def prepare_restore(self, run: Run, restore: Any) -> int | None:
        """Adjusts a planned restore (``kfit.checkpoint._state.Restore``) before it is applied; returns the epoch the
        loop must start from when the loop cannot resume where the clock stands (else None)."""
        return None

    def prepare_load(self, run: Run, restore: Any) -> None:
        """Adjusts a planned restore of ``kfit.load_checkpoint`` into the run, from a callback between two epochs.
        kfit.fit's loop goes on where the restored clock stands, also inside an epoch: nothing to adjust."""

    def finished_epoch(self, run: Run, params: dict | None, restored_epoch: int | None) -> int | None:
        """The epoch to start from when a restored run had finished and trains nothing (None: the loop stops it)."""
        return None

    def bound_reached(self, run: Run, params: dict | None, epochs_done: int) -> str | None:
        """The bound of the run its clock has reached (``"reached epochs=4"``), or None while training is left."""
        reached = run.bound_reached() if run.clock is not None else None
        if reached is not None or (run.clock is not None and run.clock.epoch_size):
            return reached
        return epochs_reached(run, params, epochs_done)  # (a source's epoch length is not known yet)

    def end_reached(self, run: Run, params: dict | None, restored_epoch: int | None) -> str | None:
        """Whether the bound of the run (its epochs, ``max_samples``) lies at or before a restored clock."""
        return self.bound_reached(run, params, 0)


def epochs_reached(run: Run, params: dict | None, epochs_done: int | None) -> str | None:
    """``"reached epochs=E"`` once ``epochs_done`` reaches the epochs of ``model.fit``'s ``params`` (or of the run)."""
    epochs = (params or {}).get("epochs")
    if epochs is None:
        epochs = run.epochs
    if epochs is not None and epochs_done is not None and epochs_done >= epochs:
        return f"reached epochs={epochs}"
    return None


@dataclass(eq=False)
class Run:
    """The parts of one training run: those a checkpoint saves and restores, and those its loop drives.

    Attributes:
        model: the model being trained.
        clock: the sample clock (None under plain ``model.fit`` without a ``SampleClock``).
        stream: the training data stream (None under plain ``model.fit`` and on a source that batches itself).
        callbacks: every callback of the run, in calling order (under plain ``model.fit``: its kfit callbacks).
        history: the run's ``keras.callbacks.History``.
        loop: what the loop driving the run does for its callbacks (:class:`RunLoop`): :func:`kfit.fit`'s, or plain
            ``model.fit``'s, set when the first kfit callback joins the run.
        epochs, max_samples: the bounds of the run (None when not given).
        driver: sets ``clock.minibatch_size`` before each step and counts the step after (:class:`StepDriver`).
        resumed_mid_epoch: set by a restore: the epoch's training-metric state was restored and continues.
        batch_offset: under :func:`kfit.fit`, the steps of the current epoch that ran before this ``model.fit`` call
            (nonzero in the epoch a run resumes in its middle): Keras numbers the steps of a call from 0, and kfit's
            callback list adds it, so that every callback sees the batch numbers of the uninterrupted run.
        initial_epoch_set: a restore told ``model.fit`` the epoch to start from (undone when the run ends).
        restored_history_epochs: under plain ``model.fit``, the epochs of a restored history, for Keras's
            ``History``, which forgets them when training begins (set by ``ModelFitLoop.prepare_restore``, put
            back when the first epoch begins).
        renamed_keys: set by a restore: the log keys of the checkpointed model -> this model's, where Keras numbered
            its outputs or metrics anew (the model built again in one process); None: the same names.
        manual: a clock attached by hand (:func:`kfit.clock.attach_clock`): callbacks driven outside any loop.
        compile_ahead: under :func:`kfit.fit` on JAX, what compiles the train step for the coming minibatch sizes
            (``kfit.training._compile_ahead``).
    """

    model: Any
    clock: Clock | None = None
    stream: Any = None
    callbacks: list = field(default_factory=list)
    history: Any = None
    loop: RunLoop | None = None
    epochs: int | None = None
    max_samples: int | None = None
    driver: Any = None
    resumed_mid_epoch: bool = False
    batch_offset: int = 0
    initial_epoch_set: bool = False
    restored_history_epochs: list | None = None
    renamed_keys: Any = None
    manual: bool = False
    compile_ahead: Any = None
    #: Training has begun (``on_train_begin``): a callback handed the model again belongs to a new run.
    begun: bool = False
    #: kfit itself set ``model.stop_training`` at ``max_samples`` (on a source that batches by itself), no callback
    #: before it (see ``kfit.checkpoint._run_status.status``).
    stopped_at_bound: bool = False
    #: Data-parallel :func:`kfit.fit`, or plain ``model.fit`` on several workers with
    #: ``kfit.distributed.AgreedStopCallback``: the workers agree after every step and at every epoch end whether to
    #: stop and whether a worker was preempted (that callback); a callback that stops the process on SIGTERM acts
    #: when they have agreed, not alone.
    agreed_stops: bool = False
    #: Plain ``model.fit`` with ``kfit.distributed.AgreedStopCallback``: the kfit callbacks listed before it (Keras
    #: hands it the model after them), whose stops and SIGTERMs it agrees on; None without it.
    listed_before_agreement: list | None = None
    #: Data-parallel :func:`kfit.fit`: the epoch logs every callback reads are averaged over the workers already
    #: (``kfit.training._fit._AverageMetrics``).
    logs_averaged: bool = False
    #: Data-parallel :func:`kfit.fit`: every worker has the same checkpoints (agreed as training begins), so a checkpoint
    #: taken at a step they all save at holds every worker's training-metric state (``Checkpoint.on_step_end``).
    gathers_worker_metrics: bool = False
    #: The optimizer's scalar variables (``learning_rate``, ...) as the code set them, before a restore (recorded in
    #: each checkpoint: a resume under other values in code is warned about; see :func:`hyperparameters_set_in_code`).
    hyperparameters_in_code: dict | None = None
    #: :func:`kfit.fit` after a restore inside an epoch (a resume, or :func:`kfit.load_checkpoint` from a callback):
    #: ``(variable, value)`` pairs put back as the next epoch begins, after Keras has reset the metrics and the
    #: callbacks' ``on_epoch_begin`` have run (the epoch's metric state; for a resume, the optimizer's scalars too).
    restored_values: list = field(default_factory=list)

    @property
    def kfit_fit(self) -> bool:
        """True when the run's loop resumes checkpoints exactly (:func:`kfit.fit`'s)."""
        return self.loop is not None and self.loop.exact_resume

    def flush(self) -> None:
        """Counts the step in progress on the clock (once), if it has not been counted yet."""
        if self.driver is not None and self.clock is not None:
            self.driver.flush(self.clock)

    def bound_reached(self) -> str | None:
        """The bound of this run its clock has reached (``"reached max_samples=400"``), or None."""
        clock = self.clock
        if clock is None:
            return None
        if self.max_samples is not None and clock.samples >= self.max_samples:
            if self.epochs is None or not clock.epoch_size or self.max_samples <= self.epochs * clock.epoch_size:
                return f"reached max_samples={self.max_samples}"
        if clock.epoch_size and self.epochs is not None and clock.samples >= self.epochs * clock.epoch_size:
            return f"reached epochs={self.epochs}"
        return None

    def members(self) -> list:
        """The run's kfit callbacks."""
        return [c for c in self.callbacks if hasattr(c, "on_step_begin")]

    def set_values_again(self) -> None:
        """Has the run's schedules set their optimizer values again before the next step.

        A schedule writes its value only where it differs from the one it wrote last, and the variable may now hold
        another (a restore, or on JAX the epoch's sync after a step that did not run). Nothing per step."""
        for callback in self.members():
            reapply = getattr(callback, "_reapply", None)
            if reapply is not None:
                reapply()

    def member_began(self, callback: Any) -> None:
        """``callback``'s ``on_train_begin`` ran (told to the run's loop)."""
        if self.loop is not None:
            self.loop.member_began(self, callback)

    def member_ended(self, callback: Any) -> None:
        """``callback``'s ``on_train_end`` ran (told to the run's loop)."""
        if self.loop is not None:
            self.loop.member_ended(self, callback)

    def member_epoch_ended(self, callback: Any) -> None:
        """``callback``'s ``on_epoch_end`` ran (told to the run's loop)."""
        if self.loop is not None:
            self.loop.member_epoch_ended(self, callback)

    def after_epoch_end(self, action: Any) -> None:
        """Calls ``action()`` once every kfit callback of the run has ended the current epoch.

        A checkpoint's save must hold what the others did at the epoch's end, whatever their order in
        ``model.fit``'s list. Called from a kfit callback's own ``on_epoch_end``."""
        if self.loop is None:
            action()
        else:
            self.loop.after_epoch_end(self, action)

    def epoch_begins(self) -> None:
        """An epoch begins (told to the run's loop)."""
        if self.loop is not None:
            self.loop.epoch_begins(self)


def start(run: Run) -> Run:
    """Makes ``run`` the run in progress on ``run.model`` (a run still registered there is dropped)."""
    _CURRENT[run.model] = run
    return run


def end(run: Run) -> None:
    """Drops ``run``: the model is free for the next run. Its clock stays readable by :func:`last_clock`. Each kfit
    callback with a ``_run_ended()`` is told (after an exception, the only word it gets that training is over)."""
    if _CURRENT.get(run.model) is run:
        del _CURRENT[run.model]
    for callback in run.members():
        ended = getattr(callback, "_run_ended", None)
        if ended is not None:
            ended()
    if run.driver is not None:
        run.flush()
        run.driver = None
    if run.clock is not None:
        _LAST_CLOCK[run.model] = run.clock
    optimizer = getattr(run.model, "optimizer", None)
    if run.hyperparameters_in_code is not None and optimizer is not None:  # (read by the run's restore step)
        from kfit.checkpoint._state import hyperparameters

        record_hyperparameters(run, hyperparameters(optimizer.variables))


def record_hyperparameters(run: Run, left: dict) -> None:
    """Records, for the next run on the optimizer of ``run`` (:func:`hyperparameters_set_in_code`), what ``run`` had
    in code and the values ``left`` it leaves (None: any value, of a variable the run sets before every step). The
    run's restore step records what it starts from, :func:`end` what it left: a ``model.fit`` that raised tells no
    callback, and what its restore step recorded stands."""
    optimizer = getattr(run.model, "optimizer", None)
    if optimizer is not None:
        _LAST_HYPERPARAMETERS[optimizer] = (run.hyperparameters_in_code, left)


def record_moved_values(run: Run) -> None:
    """As an epoch begins under plain ``model.fit``: a value of the optimizer that moved since the run's record
    (Keras's ``LearningRateScheduler`` or ``ReduceLROnPlateau``, a callback of the user's, a mid-run load) is recorded
    as any value, as one the run sets before every step: Keras tells no callback of a fit that raised, and a rerun
    would read the value the run left as assigned in code. (One moved in the epoch that raised, after this record,
    is not seen: a ``LearningRateScheduler`` listed after kfit's callbacks, in the first epoch it changes the rate.)"""
    optimizer = getattr(run.model, "optimizer", None)
    last = _LAST_HYPERPARAMETERS.get(optimizer) if optimizer is not None else None
    if last is None or last[0] is not run.hyperparameters_in_code or run.hyperparameters_in_code is None:
        return  # (no restore step yet, or another run's record)
    from kfit.checkpoint._state import hyperparameters

    now, left = hyperparameters(optimizer.variables), last[1]
    moved = [name for name, value in left.items() if value is not None and now.get(name) != value]
    if moved:
        record_hyperparameters(run, left | dict.fromkeys(moved))


def hyperparameters_set_in_code(optimizer: Any, now: dict) -> dict:
    """The scalar variables of ``optimizer`` (``learning_rate``, ...) as the code set them, given their values ``now``
    as a run begins: a value the optimizer's last run left (moved by a schedule, the clock or a restore) is the one
    that run had in code, so that a second run on the same model records what a first one does; a value assigned
    since is the code's. After a ``model.fit`` that raised, what it left is known as far as its restore step knew:
    the values it started from, and any value of one it set before every step."""
    try:
        last = _LAST_HYPERPARAMETERS.get(optimizer)
    except TypeError:  # (None, or not weak-referenceable: never trained)
        last = None
    if last is None:
        return now
    in_code, left = last
    return {name: in_code[name] if name in in_code and name in left and left[name] in (None, value) else value
            for name, value in now.items()}


def current_run(model: Any) -> Run | None:
    """The run in progress on ``model``, or None."""
    try:
        return _CURRENT.get(model)
    except TypeError:  # not weak-referenceable: never trained
        return None


def last_clock(model: Any) -> Clock | None:
    """The clock of the run in progress on ``model`` (a step that has run counted, also when read before kfit's
    callbacks in a hook), else of its last run, else None."""
    run = current_run(model)
    if run is not None:
        if getattr(run.driver, "ran", False):
            run.flush()
        return run.clock
    try:
        return _LAST_CLOCK.get(model)
    except TypeError:
        return None


def join(model: Any, callback: Any) -> Run:
    """The run ``callback`` belongs to when Keras hands it ``model`` (``set_model``).

    The run in progress on ``model`` if training has not begun yet (the callbacks of one ``model.fit`` call are
    handed the model one after the other before it begins), or a run attached by hand; otherwise a new run of
    plain ``model.fit``, which the other callbacks of the same call join.
    """
    run = current_run(model)
    if run is None or (run.begun and not run.manual):
        run = start(Run(model))
    if not any(c is callback for c in run.callbacks):
        run.callbacks.append(callback)
    return run


class StepDriver:
    """Sets the clock before each of ``model.fit``'s steps and counts the step after: once per step, whichever
    kfit callback reaches the hook first (so the order of the callbacks does not matter).

    Subclasses say what a step trains: :meth:`sizes` (the global minibatch sizes of the steps that Keras's
    step ``batch`` runs, more than one with ``steps_per_execution``) and, when a size is only known once the
    step has run, :meth:`count` (or, on a path that runs every step, :meth:`batch_begin` itself: ``FitDriver``).
    """

    #: Minibatch sizes come from kfit's plan (a minibatch-size schedule works).
    plans_sizes = False

    def __init__(self, model: Any):
        self.model = model
        self.pending: list[int] | None = None
        self.pending_batch: int | None = None
        self.applied: int | None = None

    def sizes(self, clock: Clock, batch: int) -> list[int] | None:
        """The sizes of what step ``batch`` trains: None when the epoch's data has ended (no step runs), ``[]``
        when the step runs but its size is not known yet."""
        raise NotImplementedError

    def count(self, clock: Clock, sizes: list[int]) -> None:
        """Counts a finished step (or the steps of one call, ``steps_per_execution``) on the clock."""
        start = (clock.samples, clock.minibatches)
        for size in sizes:
            clock.advance(size)
        if len(sizes) > 1:
            clock.counted_from = start

    def batch_begin(self, clock: Clock, batch: int) -> bool:
        """Plans step ``batch``; False when there is no such step (Keras asks for one more step before it finds
        that the epoch's data has ended). A kfit callback that finds ``pending_batch == batch`` need not call it:
        another one already planned the step."""
        pending = self.pending
        if pending is not None:
            if self.pending_batch == batch:
                return True
            self.pending = self.pending_batch = None  # the previous step finished, no batch-end hook counted it:
            self.count(clock, pending)  # flush() inlined (every step under plain model.fit)
        sizes = self.sizes(clock, batch)
        if not sizes:
            return sizes is not None
        clock.minibatch_size = sizes[0]
        if sizes[0] != self.applied:
            apply_minibatch_size(self.model, sizes[0])
            self.applied = sizes[0]
        self.pending, self.pending_batch = sizes, batch
        return True

    def batch_end(self, clock: Clock) -> None:
        self.flush(clock)

    def flush(self, clock: Clock) -> None:
        """Counts the step in progress, once."""
        if self.pending is None:
            return
        sizes, self.pending, self.pending_batch = self.pending, None, None
        self.count(clock, sizes)


def apply_minibatch_size(model: Any, size: int) -> None:
    """Tells an optimizer that keeps a ``minibatch_size`` variable (kfit's MomentumSGD, CNTK's Adam) the samples of
    its next update: ``size`` times Keras's ``gradient_accumulation_steps`` (an update averages that many
    minibatches), as the schedules count them."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return
    from kfit import _backend
    from kfit.optimizers._hyperparameters import gradient_accumulation_steps, minibatch_size_variable

    variable = minibatch_size_variable(optimizer)
    if variable is not None:
        _backend.set_variable(model, variable, float(size * gradient_accumulation_steps(optimizer)))
