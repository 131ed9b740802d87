"""The training clock: samples seen, counted globally, and what follows from it.

Every schedule and trigger in kfit reads one clock: the number of samples consumed by training steps,
summed over all workers (CNTK's ``total_number_of_samples_seen``). Minibatches and epochs are derived
units: an epoch is ``epoch_size`` samples, decoupled from sweeps over the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CLOCK_ATTRIBUTE = "_kfit_clock"


def _check_count(name: str, value: Any, *, allow_none: bool = False, positive: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < (1 if positive else 0):
        kind = "a positive integer" if positive else "a non-negative integer"
        if allow_none:
            kind += " or None"
        raise ValueError(f"Invalid value for argument `{name}`: expected {kind}. Received: {name}={value!r}")


@dataclass
class Clock:
    """The sample clock of one training run.

    Attributes:
        samples: samples consumed by training steps so far, over all workers.
        minibatches: training steps taken so far.
        epoch_size: samples per epoch, or None while unknown.
        minibatch_size: the global size of the minibatch being trained (set before each step).

    Example:
        >>> clock = Clock(epoch_size=100)
        >>> clock.advance(64); clock.advance(36)
        >>> clock.samples, clock.minibatches, clock.epoch
        (100, 2, 1)
    """

    samples: int = 0
    minibatches: int = 0
    epoch_size: int | None = None
    minibatch_size: int | None = None
    #: Under plain ``model.fit`` an object that sets the minibatch size and advances the clock from
    #: the Keras batch hooks (see :class:`kfit.callbacks.SampleClock`); None under ``kfit.fit``.
    driver: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_count("samples", self.samples)
        _check_count("minibatches", self.minibatches)
        _check_count("epoch_size", self.epoch_size, allow_none=True, positive=True)

    @property
    def epoch(self) -> int:
        """Index of the epoch the next sample belongs to (0 before training)."""
        if not self.epoch_size:
            return 0
        return self.samples // self.epoch_size

    @property
    def samples_in_epoch(self) -> int:
        """Samples already consumed in the current epoch."""
        if not self.epoch_size:
            return self.samples
        return self.samples - self.epoch * self.epoch_size

    def epoch_end(self, epoch: int | None = None) -> int | None:
        """The sample count at which ``epoch`` (default: the current one) ends."""
        if not self.epoch_size:
            return None
        return ((self.epoch if epoch is None else epoch) + 1) * self.epoch_size

    def advance(self, samples: int) -> None:
        """Counts one training step of ``samples`` global samples."""
        _check_count("samples", samples, positive=True)
        self.samples += samples
        self.minibatches += 1

    def get_state(self) -> dict[str, Any]:
        """The clock as plain data (saved in checkpoints)."""
        return {
            "samples": self.samples,
            "minibatches": self.minibatches,
            "epoch_size": self.epoch_size,
            "minibatch_size": self.minibatch_size,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores the clock from :meth:`get_state`'s output."""
        missing = {"samples", "minibatches"} - set(state)
        if missing:
            raise ValueError(f"Clock state is missing {sorted(missing)}. Received: {state!r}")
        _check_count("samples", state["samples"])
        _check_count("minibatches", state["minibatches"])
        self.samples = int(state["samples"])
        self.minibatches = int(state["minibatches"])
        if state.get("epoch_size") is not None:
            self.epoch_size = int(state["epoch_size"])
        self.minibatch_size = state.get("minibatch_size")


def attach_clock(model: Any, clock: Clock) -> Clock:
    """Makes ``clock`` the clock that kfit's callbacks on ``model`` read."""
    object.__setattr__(model, CLOCK_ATTRIBUTE, clock)
    return clock


def get_clock(model: Any) -> Clock | None:
    """The clock attached to ``model`` by :func:`kfit.fit` or :class:`kfit.callbacks.SampleClock`."""
    return getattr(model, CLOCK_ATTRIBUTE, None)
