"""The base of kfit's callbacks: access to the sample clock, and a state that checkpoints keep."""

from __future__ import annotations

from typing import Any

import keras

from kfit.clock import Clock, get_clock

NO_CLOCK_MESSAGE = (
    "{name} needs kfit's sample clock, and none is attached to the model. Train with "
    "kfit.fit(model, ...), or, under plain model.fit, add kfit.callbacks.SampleClock(batch_size=B, "
    "num_samples=len(x)) to the callbacks (it tells kfit how many samples each step consumes)."
)


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
    #: True when the callback needs kfit.fit's data stream (it cannot work under plain model.fit).
    needs_stream = False

    def __init__(self, name: str | None = None):
        super().__init__()
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"Invalid value for argument `name`: expected a non-empty string. Received: name={name!r}")
        self.name = name or self.default_name

    # -- the clock -------------------------------------------------------------------------------
    @property
    def clock(self) -> Clock:
        """The clock of the run this callback is part of."""
        model = getattr(self, "_model", None)
        clock = get_clock(model) if model is not None else None
        if clock is None:
            raise RuntimeError(NO_CLOCK_MESSAGE.format(name=type(self).__name__))
        return clock

    @property
    def training_model(self) -> Any:
        """The model, without forcing a state sync on JAX (use ``self.model`` to read weights)."""
        return self._model

    # -- hooks -----------------------------------------------------------------------------------
    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        clock = self.clock
        if clock.driver is not None:
            clock.driver.batch_begin(clock)
        self.on_step_begin(clock)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        clock = self.clock
        if clock.driver is not None:
            clock.driver.batch_end(clock)
        self.on_step_end(clock, logs)

    def on_step_begin(self, clock: Clock) -> None:
        """Called before each training step."""

    def on_step_end(self, clock: Clock, logs: dict | None) -> None:
        """Called after each training step (``logs`` may hold backend tensors: convert lazily)."""

    # -- state -----------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """What a resumed run needs to continue exactly (plain data)."""
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores :meth:`get_state`'s output."""
