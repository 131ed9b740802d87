"""The base of kfit's callbacks: access to the sample clock, and a state that checkpoints keep."""

from __future__ import annotations

from typing import Any

import keras

from kfit import _run
from kfit.callbacks._model_fit import ModelFitLoop
from kfit.clock import Clock

NO_CLOCK_MESSAGE = (
    "{name} needs kfit's sample clock, and this run has none. Train with "
    "kfit.fit(model, ...), or, under plain model.fit, add kfit.callbacks.SampleClock(batch_size=B, "
    "num_samples=len(x)) to the callbacks (it tells kfit how many samples each step consumes)."
)


def _flushing(hook: Any) -> Any:
    """Wraps an epoch/train hook so that the clock has counted the last step (a step is counted at its batch
    end only when some callback makes Keras dispatch batch ends synchronously); marks the run begun, and
    tells the run's loop when the callback has begun (``on_train_begin``), an epoch begins (``on_epoch_begin``),
    the callback has ended an epoch (``on_epoch_end``) and the callback has ended (``on_train_end``)."""

    name = getattr(hook, "__name__", "hook")
    # The hooks whose end the run is told once, by the outermost call (a subclass's hook calls its base's):
    # the flag that marks a call in progress, and the run's method to tell.
    flag, tell = {"on_train_begin": ("_kfit_beginning", "member_began"),
                  "on_epoch_end": ("_kfit_ending_epoch", "member_epoch_ended")}.get(name, (None, None))

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        run = getattr(self, "_run", None)
        if run is None:
            return hook(self, *args, **kwargs)
        if name == "on_epoch_end" and getattr(run.driver, "epoch_ends", None) is not None:
            run.driver.epoch_ends(run)  # (a step Keras began past the end of data of unknown length)
        run.flush()
        run.begun = True
        if flag is not None:
            outermost = not getattr(self, flag, False)
            setattr(self, flag, True)
            try:
                result = hook(self, *args, **kwargs)
            finally:
                if outermost:
                    setattr(self, flag, False)
            if outermost:
                getattr(run, tell)(self)
            return result
        if name == "on_epoch_begin":
            run.epoch_begins()
        try:
            return hook(self, *args, **kwargs)
        finally:
            if name == "on_train_end":
                run.member_ended(self)

    wrapper._kfit_flushes = True
    wrapper.__name__ = name
    wrapper.__doc__ = getattr(hook, "__doc__", None)
    wrapper.__wrapped__ = hook
    return wrapper


def _no_batch_end(self: Any, batch: int, logs: dict | None = None) -> None:
    """The batch-end hook of a kfit callback that acts at no step end: Keras's default, without its second call at
    every step (to ``on_batch_end``, made only where a subclass has one). Marked as Keras marks its defaults, so
    that Keras keeps dispatching batch ends asynchronously."""
    if self._legacy_batch_end:
        self.on_batch_end(batch, logs=logs)


_no_batch_end._is_default = True


class KfitCallback(keras.callbacks.Callback):
    """A Keras callback that follows kfit's sample clock and has a state.

    Subclasses implement :meth:`on_step_begin` / :meth:`on_step_end` (called around every training
    step, with the clock already set: ``clock.minibatch_size`` is the size of the step's minibatch;
    at ``on_step_end`` the clock has counted it) and, when they hold state that a resumed run needs,
    :meth:`get_state` / :meth:`set_state` returning plain data (JSON values and NumPy arrays).

    Args:
        name: the key under which a checkpoint keeps this callback's state. Defaults to the callback's
            role (``default_name``); give two callbacks of one class different names.
    """

    default_name = "callback"
    _steps_begin = False  # whether on_step_begin does anything (set by set_model: every step reads it)
    _legacy_batch_begin = _legacy_batch_end = False  # whether a subclass has on_batch_begin / on_batch_end
    #: True when the callback needs kfit.fit's data stream (it cannot work under plain model.fit).
    needs_stream = False
    #: kfit.fit calls callbacks in increasing ``order`` (stable): cross-validation (-10) before the
    #: controllers that read it (0), the epoch summaries (90) and checkpoints (100) last, so that a
    #: checkpoint holds what every other callback did in the same step.
    order = 0

    def __init__(self, name: str | None = None):
        super().__init__()
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"Invalid value for argument `name`: expected a non-empty string. Received: name={name!r}")
        self.name = name or self.default_name

    # -- the run and its clock --------------------------------------------------------------------
    @property
    def training_run(self) -> _run.Run:
        """The run this callback is part of (joined when Keras hands it the model)."""
        run = getattr(self, "_run", None)
        if run is None:
            raise RuntimeError(f"{type(self).__name__} is not part of a training run yet: give it to kfit.fit's or "
                               "model.fit's callbacks.")
        return run

    @property
    def clock(self) -> Clock:
        """The clock of the run this callback is part of."""
        clock = getattr(getattr(self, "_run", None), "clock", None)
        if clock is None:
            raise RuntimeError(NO_CLOCK_MESSAGE.format(name=type(self).__name__))
        return clock

    def set_model(self, model: Any) -> None:
        super().set_model(model)
        self._run = _run.join(model, self)
        self._steps_begin = getattr(self.on_step_begin, "__func__", None) is not KfitCallback.on_step_begin
        if self._run.loop is None:  # no kfit loop drives this run: plain model.fit's
            self._run.loop = ModelFitLoop()

    def peers(self) -> list:
        """The kfit callbacks of the current run (this one included), in calling order."""
        return [c for c in self.training_run.callbacks if isinstance(c, KfitCallback)]

    def publish(self, hook: str, *args: Any) -> None:
        """Calls ``hook(*args)`` on every kfit callback of the run (e.g. ``on_cross_validation_end``)."""
        for peer in self.peers():
            getattr(peer, hook)(*args)

    @property
    def training_model(self) -> Any:
        """The model, without forcing a state sync on JAX (use ``self.model`` to read weights)."""
        return self._model

    # -- hooks -----------------------------------------------------------------------------------
    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        # Every step, on every kfit callback: no property lookups or calls that can be avoided on this path.
        run = self._run
        driver = run.driver
        if driver is not None and driver.pending_batch != batch and driver.batch_begin(run.clock or self.clock, batch) is False:
            if self._legacy_batch_begin:
                self.on_batch_begin(batch, logs=logs)
            return  # the epoch's data ended: Keras finds no step to run
        if self._steps_begin:
            self.on_step_begin(run.clock or self.clock)
        if self._legacy_batch_begin:
            self.on_batch_begin(batch, logs=logs)

    on_train_batch_end = _no_batch_end

    def _dispatch_step_end(self, batch: int, logs: dict | None = None) -> None:
        run = self._run
        clock, driver = run.clock or self.clock, run.driver
        if driver is not None:
            driver.batch_end(clock)
        self.on_step_end(clock, logs)
        if self._legacy_batch_end:
            self.on_batch_end(batch, logs=logs)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Only callbacks that act after each step get a batch-end hook: Keras calls batch-end hooks
        # synchronously, converting the logs (a device sync on every step), when any callback has one.
        super().__init_subclass__(**kwargs)
        if "on_step_end" in cls.__dict__ and "on_train_batch_end" not in cls.__dict__:
            cls.on_train_batch_end = KfitCallback._dispatch_step_end
        # Keras's legacy aliases: its on_train_batch_begin/end call on_batch_begin/end; kfit's do where a subclass has them.
        cls._legacy_batch_begin = cls.on_batch_begin is not keras.callbacks.Callback.on_batch_begin
        cls._legacy_batch_end = cls.on_batch_end is not keras.callbacks.Callback.on_batch_end
        # Under plain model.fit the clock counts a finished step at the next hook that reads it.
        for hook in ("on_train_begin", "on_epoch_begin", "on_epoch_end", "on_train_end"):
            if hook in cls.__dict__ and not getattr(cls.__dict__[hook], "_kfit_flushes", False):
                setattr(cls, hook, _flushing(cls.__dict__[hook]))

    @_flushing
    def on_train_begin(self, logs: dict | None = None) -> None:
        pass

    @_flushing
    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        pass

    @_flushing
    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        pass

    @_flushing
    def on_train_end(self, logs: dict | None = None) -> None:
        pass

    def on_step_begin(self, clock: Clock) -> None:
        """Called before each training step."""

    def on_step_end(self, clock: Clock, logs: dict | None) -> None:
        """Called after each training step (``logs`` may hold backend tensors: convert lazily)."""

    def on_cross_validation_end(self, index: int, logs: dict) -> None:
        """Called on every kfit callback after each cross-validation (``logs``: ``val_*`` results,
        ``val_average_error``, ``val_samples``, ``val_minibatches``, ``val_index``; floats)."""

    def on_hyperparameter_change(self, name: str, value: float, scheduled: float, unit: str) -> None:
        """Called when a schedule changes a hyperparameter: ``name`` ("lr", "momentum"), the value the
        optimizer now uses per minibatch, the scheduled value in its own ``unit`` ("per_sample", ...)."""

    def on_final_test_end(self, logs: dict) -> None:
        """Called on every kfit callback after the final test evaluation (``test_*`` results). (Keras's own
        ``on_test_end(logs)`` ends every ``model.evaluate``, validation included.)"""

    # -- state -----------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """What a resumed run needs to continue exactly (plain data)."""
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores :meth:`get_state`'s output."""

    def restore_note(self, state: dict[str, Any], file: str) -> str | None:
        """A note for the user when ``state`` is restored from the checkpoint ``file`` (None: nothing to say).

        Shown once, with the resume's other notes: say, that this callback is configured otherwise than the one that
        saved ``state``."""
        return None
