"""``every N`` on the sample clock: one type for every interval in kfit, with its unit.

An :class:`Interval` is N samples (``"50000sp"``), N minibatches (``"100mb"``) or N epochs (``"2ep"``), as in
Composer's time strings. Callbacks that act "every N" (``Checkpoint(frequency=...)``,
``CrossValidation(frequency=...)``) take an Interval, its string, or a plain int (samples, the CNTK meaning), and
ask the clock whether the step it has just counted crossed one: ``clock.crossed(interval)``.
``ProgressPrinter(freq=...)`` takes an Interval or its string too (its int keeps CNTK's meaning: minibatches of an
epoch). The controllers' durations are written the same way: ``EarlyStopping(patience="3ep", min_duration="10ep")``,
``ReduceLROnPlateau(cooldown="5000sp")``.

Example:
    >>> from kfit import Clock
    >>> from kfit.interval import Interval
    >>> every = Interval.parse("96sp")
    >>> clock = Clock(epoch_size=100)
    >>> crossed = []
    >>> for _ in range(6):
    ...     clock.minibatch_size = 32; clock.advance(32); crossed.append(clock.crossed(every))
    >>> crossed  # the steps that end at 96 and 192
    [False, False, True, False, False, True]
    >>> Interval.parse("2ep"), Interval.parse(500), str(Interval.parse("10mb")), Interval("50000sp")
    (Interval(2, 'ep'), Interval(500, 'sp'), '10mb', Interval(50000, 'sp'))
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kfit import _checks

UNITS = {"sp": "samples", "mb": "minibatches", "ep": "epochs"}
_SPEC = re.compile(r"^\s*(\d+)\s*(sp|mb|ep)\s*$")


class _FullDataSweep:
    """The type of ``kfit.cntk.FULL_DATA_SWEEP`` (one instance), CNTK's "one sweep of the data"."""

    def __repr__(self) -> str:
        return "FULL_DATA_SWEEP"

    def __reduce__(self) -> str:
        return "FULL_DATA_SWEEP"


#: CNTK's ``cntk.io.FULL_DATA_SWEEP``, re-exported by :mod:`kfit.cntk` (defined here, below the callbacks that read it).
FULL_DATA_SWEEP = _FullDataSweep()


@dataclass(frozen=True)
class Interval:
    """Every ``value`` units of the clock: ``Interval(2, "ep")``, or from its string, ``Interval("2ep")``.

    Attributes:
        value: a positive integer (given as a string such as ``"2ep"``, the string's unit is the unit).
        unit: ``"sp"`` (samples, global over all workers), ``"mb"`` (minibatches, i.e. training steps) or ``"ep"``
            (epochs of ``epoch_size`` samples).
    """

    value: int
    unit: str = "sp"

    def __post_init__(self) -> None:
        if isinstance(self.value, str):  # Interval("50000sp"), as the callbacks take it
            parsed = Interval.parse(self.value, name="value")
            object.__setattr__(self, "value", parsed.value)
            object.__setattr__(self, "unit", parsed.unit)
        _checks.count("value", self.value, low=1)
        _checks.choice("unit", self.unit, tuple(UNITS))

    def __repr__(self) -> str:
        return f"Interval({self.value}, {self.unit!r})"

    def __str__(self) -> str:
        return f"{self.value}{self.unit}"

    @classmethod
    def parse(cls, spec: Any, name: str = "frequency", default_unit: str = "sp") -> Interval:
        """An Interval from an Interval, a string such as ``"2ep"``, or a positive int in ``default_unit``.

        CNTK 2.7's ``(count, DataUnit.sample)`` and ``(count, DataUnit.minibatch)`` (``kfit.cntk.DataUnit``) are
        taken as ``"{count}sp"`` and ``"{count}mb"``; ``(count, DataUnit.sweep)`` is refused, saying to give
        epochs.

        Raises:
            InvalidArgumentError: naming ``name`` and the value received.
        """
        if isinstance(spec, Interval):
            return spec
        if isinstance(spec, tuple) and len(spec) == 2:  # CNTK 2.7's (frequency, DataUnit.sample|minibatch|sweep)
            count, unit = spec
            unit = getattr(unit, "value", unit)
            if unit == "sweep" and _checks.is_integer(count) and count > 0:
                raise _checks.InvalidArgumentError(
                    f"Invalid value for argument `{name}`: CNTK's DataUnit.sweep counts sweeps of the data, which kfit "
                    f"does not count; its epoch is one sweep unless kfit.fit's epoch_size says otherwise: give "
                    f"{name}='{count}ep' (epochs). Received: {name}={spec!r}")
            if unit in ("sample", "minibatch") and _checks.is_integer(count) and count > 0:
                return cls(int(count), "sp" if unit == "sample" else "mb")
        if isinstance(spec, str):
            match = _SPEC.match(spec)
            if match and int(match.group(1)) > 0:
                return cls(int(match.group(1)), match.group(2))
        elif _checks.is_integer(spec) and spec > 0:
            return cls(int(spec), default_unit)
        raise _checks.InvalidArgumentError(
            f"Invalid value for argument `{name}`: expected a positive number of {UNITS[default_unit]}, or a string "
            f"such as '50000sp' (samples), '100mb' (minibatches) or '2ep' (epochs). Received: {name}={spec!r}")

    def crossed(self, clock: Any) -> bool:
        """Whether the step ``clock`` has just counted crossed a multiple of this interval.

        Samples: a multiple of ``value`` lies in ``(samples - minibatch_size, samples]``. Minibatches: the step's
        count is a multiple. Epochs: the step ended an epoch whose number is a multiple (never when the epoch size
        is unknown). When the clock counted several steps at once (``clock.counted_from``: Keras's
        ``steps_per_execution``), a multiple crossed by any of them counts.
        """
        span = getattr(clock, "counted_from", None)
        if self.unit == "sp":
            if span is None:
                size = clock.minibatch_size
                return bool(size) and (clock.samples - size) // self.value != clock.samples // self.value
            return span[0] // self.value != clock.samples // self.value
        if self.unit == "mb":
            start = span[1] if span is not None else clock.minibatches - 1
            return clock.minibatches > 0 and start // self.value != clock.minibatches // self.value
        return (bool(clock.epoch_size) and clock.samples > 0 and clock.samples_in_epoch == 0
                and clock.epoch % self.value == 0)


__all__ = ["Interval"]
