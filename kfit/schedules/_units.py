"""Schedules with a unit: learning rates, momenta and minibatch sizes, and what a minibatch of `B` samples uses.

The unit says how a value is turned into what the optimizer uses for one minibatch of `B` samples
(CNTK's units, for Keras losses, which are means over the minibatch):

=============  ===============  ===========================================================
kind           unit             `for_minibatch(..., B)`
=============  ===============  ===========================================================
learning_rate  per_sample       `lr_s * B`
learning_rate  per_minibatch    `lr * B / B_ref` with a reference size, else `lr`
momentum       time_constant    `exp(-B / tau)`; 0 when `tau == 0`
momentum       per_sample       `m_s ** B`
momentum       per_minibatch    `m ** (B / B_ref)` with a reference size, else `m`
minibatch_size samples          the value, an int (`B` is ignored)
=============  ===============  ===========================================================
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from kfit.schedules._schedule import (
    Schedule,
    _check_epoch_size,
    _invalid,
    _is_int,
    _is_real,
    _register,
    as_schedule,
    from_config,
)

_UNITS: dict[str, tuple[str, ...]] = {
    "learning_rate": ("per_sample", "per_minibatch"),
    "momentum": ("time_constant", "per_sample", "per_minibatch"),
    "minibatch_size": ("samples",),
}

# What each kind and unit accepts: (a test of a value, the words for an error message).
_LEARNING_RATE = (lambda v: v >= 0, "learning rates >= 0 (a learning rate cannot be negative)")
_MOMENTUM = (lambda v: 0 <= v < 1, "momenta in [0, 1)")
_RULES: dict[tuple[str, str], tuple[Any, str]] = {
    ("learning_rate", "per_sample"): _LEARNING_RATE,
    ("learning_rate", "per_minibatch"): _LEARNING_RATE,
    ("momentum", "time_constant"): (
        lambda v: v >= 0,
        "finite time constants >= 0 in samples (0 means no momentum; a time constant cannot be negative)",
    ),
    ("momentum", "per_sample"): _MOMENTUM,
    ("momentum", "per_minibatch"): _MOMENTUM,
    ("minibatch_size", "samples"): (
        lambda v: v > 0 and float(v).is_integer(),
        "positive integer minibatch sizes",
    ),
}


@_register
class HyperparameterSchedule:
    """A schedule with a unit: what it means for a minibatch of `B` samples.

    Build one with the factories (`learning_rate_per_sample`, `momentum_as_time_constant`, ...); see the
    module's table for the formulas. Values are checked when the schedule is built (every value it is known
    to take) and again whenever one is read.

    Args:
        kind: "learning_rate", "momentum" or "minibatch_size".
        unit: the unit of the values: for a learning rate "per_sample" or "per_minibatch"; for a momentum
            "time_constant", "per_sample" or "per_minibatch"; for a minibatch size "samples".
        schedule: the values, a `Schedule`.
        reference_minibatch_size: for a per-minibatch learning rate or momentum, the minibatch size the
            values were tuned for (None: use them as they are); None for the other units.

    Raises:
        ValueError: if the kind, unit or reference size is invalid, or a known value is out of range.
        TypeError: if `schedule` is not a `Schedule`.

    Example:
        >>> from kfit.schedules import learning_rate_per_sample
        >>> lr = learning_rate_per_sample([0.001, 0.0005], epoch_size=100)
        >>> lr[0], lr.value(100), lr.for_minibatch(100, 1, minibatch_size=64)
        (0.001, 0.0005, 0.032)
    """

    config_type: ClassVar[str] = "hyperparameter_schedule"

    def __init__(
        self, kind: str, unit: str, schedule: Schedule, reference_minibatch_size: int | None = None
    ) -> None:
        if kind not in _UNITS:
            raise _invalid("kind", f"one of {list(_UNITS)}", kind)
        if unit not in _UNITS[kind]:
            raise _invalid("unit", f"one of {list(_UNITS[kind])} for kind={kind!r}", unit)
        if not isinstance(schedule, Schedule):
            raise TypeError(
                "Invalid value for argument `schedule`: expected a kfit.schedules.Schedule (build it with "
                f"kfit.schedules.as_schedule). Received: schedule={schedule!r}"
            )
        if reference_minibatch_size is not None:
            if unit != "per_minibatch":
                raise _invalid(
                    "reference_minibatch_size",
                    f"None for kind={kind!r} and unit={unit!r}",
                    reference_minibatch_size,
                )
            if not _is_int(reference_minibatch_size) or reference_minibatch_size <= 0:
                raise _invalid(
                    "reference_minibatch_size", "a positive integer or None", reference_minibatch_size
                )
            reference_minibatch_size = int(reference_minibatch_size)
        self.kind = kind
        self.unit = unit
        self.schedule = schedule
        self.reference_minibatch_size = reference_minibatch_size
        _check_known_values(kind, unit, schedule, "schedule", schedule)

    def value(self, samples: int, minibatches: int = 0) -> float:
        """Returns the value in its own unit (the per-sample rate, the time constant, ...) at a clock reading.

        Args:
            samples: samples seen so far.
            minibatches: minibatches seen so far (read by schedules indexed by minibatch).

        Returns:
            The value: a float, or an int for a minibatch size.

        Raises:
            ValueError: if the clock is invalid or the schedule returns a value out of range.
        """
        value = self.schedule(samples, minibatches)
        test, expected = _RULES[self.kind, self.unit]
        if not (_is_real(value) and math.isfinite(value) and test(value)):
            raise ValueError(
                f"The {self.kind} schedule returned an invalid value at samples={samples}, "
                f"minibatches={minibatches}: expected {expected}. Received: {value!r} from {self.schedule!r}"
            )
        return int(value) if self.kind == "minibatch_size" else float(value)

    def __getitem__(self, count: int) -> float:
        """`value` at `count`, in the schedule's own clock unit (CNTK's `schedule[count]`).

        The count is samples, or minibatches for a list given without `epoch_size`.
        """
        return self.value(count, count)

    def for_minibatch(self, samples: int, minibatches: int, minibatch_size: int) -> float:
        """Returns what the optimizer uses for a minibatch of `B = minibatch_size` drawn at this clock reading.

        See the module's table for the formula of each unit.

        Args:
            samples: samples seen before this minibatch.
            minibatches: minibatches seen before this minibatch.
            minibatch_size: `B`, the number of samples in this minibatch (summed over workers).

        Returns:
            The value for this minibatch (an int for a minibatch size).

        Raises:
            ValueError: if `minibatch_size` is not a positive integer, or the value is out of range.

        Example:
            >>> from kfit.schedules import momentum_per_sample
            >>> momentum_per_sample(0.99).for_minibatch(0, 0, minibatch_size=2) == 0.99**2
            True
        """
        return self.convert(self.value(samples, minibatches), minibatch_size)

    def holds_until(self, samples: int, minibatches: int = 0) -> tuple[float, float]:
        """How far :meth:`value` at this reading holds (see :meth:`kfit.schedules.Schedule.holds_until`)."""
        return self.schedule.holds_until(samples, minibatches)

    def convert(self, value: float, minibatch_size: int) -> float:
        """What the optimizer uses for a minibatch of `B = minibatch_size` when the schedule's value is `value`
        (:meth:`for_minibatch` is `convert(value(samples, minibatches), minibatch_size)`).

        Example:
            >>> from kfit.schedules import learning_rate_per_sample
            >>> learning_rate_per_sample(0.001).convert(0.001, minibatch_size=64)
            0.064
        """
        if not _is_int(minibatch_size) or minibatch_size <= 0:
            raise _invalid("minibatch_size", "a positive integer", minibatch_size)
        b, ref = minibatch_size, self.reference_minibatch_size
        if self.kind == "minibatch_size":
            return value
        if self.kind == "learning_rate":
            if self.unit == "per_sample":
                return value * b
            return value if ref is None else value * b / ref
        if self.unit == "time_constant":
            return 0.0 if value == 0 else math.exp(-b / value)
        if self.unit == "per_sample":
            return value**b
        return value if ref is None else value ** (b / ref)

    def per_sample_momentum(self, samples: int, minibatches: int = 0) -> float:
        """Returns the momentum per sample: `exp(-1 / tau)` for a time constant (0 when `tau == 0`).

        For a per-sample momentum, the value itself; for a per-minibatch momentum with a reference size
        `B_ref`, `m ** (1 / B_ref)`.

        Args:
            samples: samples seen so far.
            minibatches: minibatches seen so far.

        Returns:
            The momentum per sample.

        Raises:
            ValueError: if this is not a momentum schedule, or a per-minibatch momentum without a reference
                size (its per-sample value depends on the minibatch size).

        Example:
            >>> from kfit.schedules import momentum_as_time_constant
            >>> momentum_as_time_constant(1024).per_sample_momentum(0)
            0.9990239141819757
        """
        if self.kind != "momentum":
            raise ValueError(
                f"per_sample_momentum is defined for momentum schedules only; this is a {self.kind} schedule"
            )
        value = self.value(samples, minibatches)
        if self.unit == "time_constant":
            return 0.0 if value == 0 else math.exp(-1.0 / value)
        if self.unit == "per_sample":
            return value
        if self.reference_minibatch_size is None:
            raise ValueError(
                "A momentum per minibatch without reference_minibatch_size has no per-sample value: it depends "
                "on the minibatch size. Use for_minibatch(samples, minibatches, minibatch_size) instead."
            )
        return value ** (1.0 / self.reference_minibatch_size)

    def with_schedule(self, values: Any, epoch_size: int | None = None) -> HyperparameterSchedule:
        """Returns a schedule of the same kind, unit and reference size with new values.

        The new schedule's clock starts where the caller's does: to restart it at the current sample count
        (CNTK's `reset_learning_rate`), the caller offsets the clock.

        Args:
            values: any form `as_schedule` accepts.
            epoch_size: samples per list entry, or None (a list is then per minibatch).

        Returns:
            The new schedule.

        Raises:
            ValueError: as the factories do.

        Example:
            >>> from kfit.schedules import learning_rate_per_sample
            >>> learning_rate_per_sample(0.001).with_schedule(0.0005)[0]
            0.0005
        """
        return _make(self.kind, self.unit, values, epoch_size, self.reference_minibatch_size)

    def get_config(self) -> dict[str, Any]:
        """Returns a JSON-serializable description; `kfit.schedules.from_config` rebuilds an equal one.

        Raises:
            TypeError: if the values come from a Python callable.
        """
        return {
            "type": self.config_type,
            "kind": self.kind,
            "unit": self.unit,
            "schedule": self.schedule.get_config(),
            "reference_minibatch_size": self.reference_minibatch_size,
        }

    @classmethod
    def _from_params(cls, params: dict[str, Any]) -> HyperparameterSchedule:
        params = dict(params)
        schedule = from_config(params.pop("schedule"))
        return cls(schedule=schedule, **params)  # type: ignore[arg-type]

    def _key(self) -> tuple[Any, ...]:
        return (self.kind, self.unit, self.schedule, self.reference_minibatch_size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HyperparameterSchedule):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        ref = (
            ""
            if self.reference_minibatch_size is None
            else f", reference_minibatch_size={self.reference_minibatch_size}"
        )
        return (
            f"HyperparameterSchedule(kind={self.kind!r}, unit={self.unit!r}, schedule={self.schedule!r}{ref})"
        )


def _check_known_values(kind: str, unit: str, schedule: Schedule, name: str, shown: Any) -> None:
    test, expected = _RULES[kind, unit]
    for v in schedule._attained_values():
        if not test(v):
            raise _invalid(name, expected, shown, f"it takes the value {v!r}")


def _make(
    kind: str, unit: str, values: Any, epoch_size: int | None, reference_minibatch_size: int | None = None
) -> HyperparameterSchedule:
    epoch_size = _check_epoch_size(epoch_size)
    schedule = as_schedule(values, epoch_size, name="values")
    _check_known_values(kind, unit, schedule, "values", values)
    return HyperparameterSchedule(kind, unit, schedule, reference_minibatch_size)


def learning_rate_per_sample(values: Any, epoch_size: int | None = None) -> HyperparameterSchedule:
    """A learning rate per sample `lr_s`: a minibatch of `B` samples uses `lr_s * B`.

    This reproduces CNTK, whose gradient is the sum over the minibatch: doubling `B` doubles the step, and
    each sample's contribution stays fixed.

    Args:
        values: the rates, in any form `as_schedule` accepts; non-negative.
        epoch_size: samples per list entry, or None (a list is then per minibatch).

    Returns:
        The schedule (kind "learning_rate", unit "per_sample").

    Raises:
        ValueError: if a rate is negative or not finite, or a list or `epoch_size` is invalid.

    Example:
        >>> lr = learning_rate_per_sample(0.001)
        >>> lr.for_minibatch(0, 0, minibatch_size=256)
        0.256
    """
    return _make("learning_rate", "per_sample", values, epoch_size)


def learning_rate_per_minibatch(
    values: Any, epoch_size: int | None = None, reference_minibatch_size: int | None = None
) -> HyperparameterSchedule:
    """A learning rate per minibatch: `lr * B / B_ref` with a reference size `B_ref`, else `lr` as is.

    Without a reference size this is the plain Keras meaning: the rate applies to the mean gradient whatever
    the minibatch size.

    Args:
        values: the rates, in any form `as_schedule` accepts; non-negative.
        epoch_size: samples per list entry, or None (a list is then per minibatch).
        reference_minibatch_size: the minibatch size the rates were tuned for, a positive integer or None.

    Returns:
        The schedule (kind "learning_rate", unit "per_minibatch").

    Raises:
        ValueError: if a rate is negative or not finite, or an argument is invalid.

    Example:
        >>> learning_rate_per_minibatch(0.1, reference_minibatch_size=32).for_minibatch(0, 0, 64)
        0.2
        >>> learning_rate_per_minibatch(0.1).for_minibatch(0, 0, 64)
        0.1
    """
    return _make("learning_rate", "per_minibatch", values, epoch_size, reference_minibatch_size)


def momentum_as_time_constant(values: Any, epoch_size: int | None = None) -> HyperparameterSchedule:
    """A momentum given as a time constant `tau` in samples: a minibatch of `B` uses `exp(-B / tau)`.

    A gradient's weight falls to `1/e` after `tau` samples, whatever the minibatch size; `tau = 0` means no
    momentum.

    Args:
        values: the time constants, in any form `as_schedule` accepts; finite and non-negative.
        epoch_size: samples per list entry, or None (a list is then per minibatch).

    Returns:
        The schedule (kind "momentum", unit "time_constant").

    Raises:
        ValueError: if a time constant is negative or not finite, or a list or `epoch_size` is invalid.

    Example:
        >>> m = momentum_as_time_constant(1024)
        >>> m.per_sample_momentum(0)
        0.9990239141819757
        >>> m.for_minibatch(0, 0, minibatch_size=1024) == math.exp(-1)
        True
    """
    return _make("momentum", "time_constant", values, epoch_size)


def momentum_per_sample(values: Any, epoch_size: int | None = None) -> HyperparameterSchedule:
    """A momentum per sample `m_s`: a minibatch of `B` samples uses `m_s ** B`.

    Args:
        values: the momenta, in any form `as_schedule` accepts; in `[0, 1)`.
        epoch_size: samples per list entry, or None (a list is then per minibatch).

    Returns:
        The schedule (kind "momentum", unit "per_sample").

    Raises:
        ValueError: if a momentum is outside `[0, 1)`, or a list or `epoch_size` is invalid.

    Example:
        >>> momentum_per_sample(0.5).for_minibatch(0, 0, minibatch_size=3)
        0.125
    """
    return _make("momentum", "per_sample", values, epoch_size)


def momentum_per_minibatch(
    values: Any, epoch_size: int | None = None, reference_minibatch_size: int | None = None
) -> HyperparameterSchedule:
    """A momentum per minibatch `m`, used as is; with a reference size `B_ref`, `m ** (B / B_ref)`.

    Args:
        values: the momenta, in any form `as_schedule` accepts; in `[0, 1)`.
        epoch_size: samples per list entry, or None (a list is then per minibatch).
        reference_minibatch_size: the minibatch size the momenta were tuned for (CNTK's
            `momentum_schedule(..., minibatch_size=...)`), a positive integer or None.

    Returns:
        The schedule (kind "momentum", unit "per_minibatch").

    Raises:
        ValueError: if a momentum is outside `[0, 1)`, or an argument is invalid.

    Example:
        >>> momentum_per_minibatch(0.9).for_minibatch(0, 0, minibatch_size=512)
        0.9
        >>> momentum_per_minibatch(0.25, reference_minibatch_size=2).for_minibatch(0, 0, 1)
        0.5
    """
    return _make("momentum", "per_minibatch", values, epoch_size, reference_minibatch_size)


def minibatch_size(values: Any, epoch_size: int | None = None) -> HyperparameterSchedule:
    """A minibatch-size schedule: the size of the next minibatch, read at the clock when it is drawn.

    `for_minibatch` and `value` return the size as an int.

    Args:
        values: the sizes, in any form `as_schedule` accepts; positive integers.
        epoch_size: samples per list entry, or None (a list is then per minibatch).

    Returns:
        The schedule (kind "minibatch_size", unit "samples").

    Raises:
        ValueError: if a size is not a positive integer, or a list or `epoch_size` is invalid.

    Example:
        >>> mb = minibatch_size([256, 512], epoch_size=60000)
        >>> mb[59999], mb[60000]
        (256, 512)
    """
    return _make("minibatch_size", "samples", values, epoch_size)
