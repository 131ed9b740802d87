"""The training clock: samples seen, counted globally, and what follows from it.

Every schedule and trigger in kfit reads one clock: the number of samples consumed by training steps,
summed over all workers (CNTK's ``total_number_of_samples_seen``). Minibatches and epochs are derived
units: an epoch is ``epoch_size`` samples, decoupled from sweeps over the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kfit import _checks


@dataclass
class Clock:
    """The sample clock of one training run.

    Attributes:
        samples: samples consumed by training steps so far, over all workers.
        minibatches: training steps taken so far.
        epoch_size: samples per epoch, or None while unknown.
        minibatch_size: the global size of the minibatch being trained (set before each step).
        epoch_start: ``(epoch, samples)``, the epoch in progress and the samples trained before it began, where
            epochs are not all ``epoch_size`` samples (Keras's epochs on a source read on across its passes with
            ``steps_per_epoch``, which end early where a pass ends: kept by ``kfit.fit`` as each epoch ends); None:
            every epoch is ``epoch_size`` samples.

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
    epoch_start: tuple[int, int] | None = None
    #: ``(samples, minibatches)`` before the steps the last count took together (Keras runs several per call of
    #: its train function with ``compile(steps_per_execution=N)``), so that :meth:`crossed` sees them all; None
    #: when one step was counted.
    counted_from: tuple[int, int] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        _checks.count("samples", self.samples)
        _checks.count("minibatches", self.minibatches)
        _checks.count("epoch_size", self.epoch_size, low=1, allow_none=True)
        self.epoch_start = self._checked_epoch_start(self.epoch_start, self.samples)

    @staticmethod
    def _checked_epoch_start(value: Any, samples: int) -> tuple[int, int] | None:
        if value is None:
            return None
        if (not isinstance(value, (list, tuple)) or len(value) != 2 or any(type(v) is not int or v < 0 for v in value)
                or value[1] > samples):
            raise ValueError("Invalid value for argument `epoch_start`: expected (epoch, samples before it), two "
                             f"integers >= 0, the samples at most the clock's {samples}. Received: epoch_start={value!r}")
        return int(value[0]), int(value[1])

    @property
    def epoch(self) -> int:
        """Index of the epoch the next sample belongs to (0 before training)."""
        if self.epoch_start is not None:
            return self.epoch_start[0]
        if not self.epoch_size:
            return 0
        return self.samples // self.epoch_size

    @property
    def samples_in_epoch(self) -> int:
        """Samples already consumed in the current epoch."""
        if self.epoch_start is not None:
            return self.samples - self.epoch_start[1]
        if not self.epoch_size:
            return self.samples
        return self.samples - self.epoch * self.epoch_size

    def epoch_end(self, epoch: int | None = None) -> int | None:
        """The sample count at which ``epoch`` (default: the current one) ends (None when not known: no
        ``epoch_size``, or epochs of several sizes, ``epoch_start``)."""
        if not self.epoch_size or self.epoch_start is not None:
            return None
        return ((self.epoch if epoch is None else epoch) + 1) * self.epoch_size

    def advance(self, samples: int) -> None:
        """Counts one training step of ``samples`` global samples."""
        if type(samples) is not int or samples < 1:  # checked without a call on the common path (every step)
            samples = _checks.count("samples", samples, low=1)
        self.samples += samples
        self.minibatches += 1
        self.counted_from = None

    def crossed(self, interval: Any) -> bool:
        """Whether the step just counted crossed a multiple of ``interval`` (a :class:`kfit.interval.Interval`,
        ``"2ep"``, ``"100mb"``, ``"5000sp"``, or an int of samples)."""
        from kfit.interval import Interval

        return Interval.parse(interval, "interval").crossed(self)

    def get_state(self) -> dict[str, Any]:
        """The clock as plain data (saved in checkpoints)."""
        return {
            "samples": self.samples,
            "minibatches": self.minibatches,
            "epoch_size": self.epoch_size,
            "minibatch_size": self.minibatch_size,
            "epoch_start": None if self.epoch_start is None else list(self.epoch_start),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores the clock from :meth:`get_state`'s output."""
        missing = {"samples", "minibatches"} - set(state)
        if missing:
            raise ValueError(f"Clock state is missing {sorted(missing)}. Received: {state!r}")
        samples = _checks.count("samples", state["samples"])
        self.samples, self.minibatches = samples, _checks.count("minibatches", state["minibatches"])
        if state.get("epoch_size") is not None:
            self.epoch_size = int(state["epoch_size"])
        self.minibatch_size = state.get("minibatch_size")
        self.epoch_start = self._checked_epoch_start(state.get("epoch_start"), self.samples)


def attach_clock(model: Any, clock: Clock) -> Clock:
    """Makes ``clock`` the clock that kfit's callbacks handed ``model`` read, until the next run on ``model``
    begins: for driving kfit callbacks by hand (a custom loop, a test). Nothing is set on the model.

    Example:
        >>> import kfit
        >>> # clock = kfit.clock.attach_clock(model, kfit.Clock(epoch_size=1000)); callback.set_model(model)
    """
    from kfit._run import Run, current_run, start

    run = current_run(model)
    if run is None or run.begun:
        run = start(Run(model))
    run.clock, run.manual = clock, True  # callbacks handed the model already (not training yet) read it too
    return clock


def get_clock(model: Any) -> Clock | None:
    """The clock of the run in progress on ``model`` (by :func:`kfit.fit`, or by plain ``model.fit`` with a
    :class:`kfit.callbacks.SampleClock`), else the clock its last run ended with; None if it has none.

    Example:
        >>> # history = kfit.fit(model, x, y, minibatch_size=32, max_samples=1000)
        >>> # kfit.get_clock(model).samples  -> 1000
    """
    from kfit._run import last_clock

    return last_clock(model)
