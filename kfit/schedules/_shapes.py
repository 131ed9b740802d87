"""The usual schedule shapes, in samples, and `join` to run one schedule after another.

Each factory validates its arguments and returns a `Schedule` whose `get_config` rebuilds it through
`kfit.schedules.from_config`. The formulas follow optax, with steps replaced by samples `S`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

from kfit.schedules._schedule import (
    Constant,
    Schedule,
    _check_boundaries,
    _check_finite,
    _check_positive_int,
    _invalid,
    _register,
    as_schedule,
    from_config,
)


def constant(value: float) -> Constant:
    """The same value at every sample count: `value(S) = value`.

    Args:
        value: a finite number.

    Returns:
        The schedule.

    Raises:
        ValueError: if `value` is not a finite number.

    Example:
        >>> constant(0.1)(12345)
        0.1
    """
    return Constant(value)


@_register
class LinearWarmup(Schedule):
    """Linear from `init_value` to `end_value` over `warmup_samples`, then `end_value`; see `linear_warmup`."""

    config_type = "linear_warmup"

    def __init__(self, init_value: float, end_value: float, warmup_samples: int) -> None:
        self.init_value = _check_finite("init_value", init_value)
        self.end_value = _check_finite("end_value", end_value)
        self.warmup_samples = _check_positive_int("warmup_samples", warmup_samples)

    def _value(self, samples: int, minibatches: int) -> float:
        if samples >= self.warmup_samples:
            return float(self.end_value)
        return self.init_value + (self.end_value - self.init_value) * samples / self.warmup_samples

    def _attained_values(self) -> tuple[float, ...]:
        return (float(self.init_value), float(self.end_value))


def linear_warmup(init_value: float, end_value: float, warmup_samples: int) -> LinearWarmup:
    """A linear ramp over the first `warmup_samples` samples, then a constant.

    `value(S) = init_value + (end_value - init_value) * S / warmup_samples` for `S < warmup_samples`,
    and `end_value` from `S = warmup_samples` on.

    Args:
        init_value: the value at `S = 0`.
        end_value: the value reached at `S = warmup_samples` and kept after.
        warmup_samples: the length of the ramp in samples, a positive integer.

    Returns:
        The schedule.

    Raises:
        ValueError: if a value is not finite or `warmup_samples` is not a positive integer.

    Example:
        >>> s = linear_warmup(0.0, 0.1, warmup_samples=1000)
        >>> s(0), s(500), s(1000), s(5000)
        (0.0, 0.05, 0.1, 0.1)
    """
    return LinearWarmup(init_value, end_value, warmup_samples)


@_register
class CosineDecay(Schedule):
    """Half a cosine from `init_value` down to `alpha * init_value`; see `cosine_decay`."""

    config_type = "cosine_decay"

    def __init__(self, init_value: float, decay_samples: int, alpha: float = 0.0) -> None:
        self.init_value = _check_finite("init_value", init_value)
        self.decay_samples = _check_positive_int("decay_samples", decay_samples)
        self.alpha = _check_finite("alpha", alpha)

    def _value(self, samples: int, minibatches: int) -> float:
        fraction = min(samples, self.decay_samples) / self.decay_samples
        cosine = 0.5 * (1.0 + math.cos(math.pi * fraction))
        return self.init_value * ((1.0 - self.alpha) * cosine + self.alpha)

    def _attained_values(self) -> tuple[float, ...]:
        return (self._value(0, 0), self._value(self.decay_samples, 0))


def cosine_decay(init_value: float, decay_samples: int, alpha: float = 0.0) -> CosineDecay:
    """Cosine decay over `decay_samples` samples (optax's `cosine_decay_schedule`).

    `value(S) = init_value * ((1 - alpha) * 0.5 * (1 + cos(pi * min(S, D) / D)) + alpha)` with
    `D = decay_samples`: `init_value` at `S = 0`, `alpha * init_value` from `S = D` on.

    Args:
        init_value: the value at `S = 0`.
        decay_samples: the length of the decay in samples, a positive integer.
        alpha: the final value as a fraction of `init_value`.

    Returns:
        The schedule.

    Raises:
        ValueError: if a value is not finite or `decay_samples` is not a positive integer.

    Example:
        >>> s = cosine_decay(0.1, decay_samples=1000)
        >>> s(0), round(s(500), 12), s(1000), s(2000)
        (0.1, 0.05, 0.0, 0.0)
    """
    return CosineDecay(init_value, decay_samples, alpha)


@_register
class ExponentialDecay(Schedule):
    """`init_value * decay_rate ** (S / decay_samples)`; see `exponential_decay`."""

    config_type = "exponential_decay"

    def __init__(
        self, init_value: float, decay_rate: float, decay_samples: int, staircase: bool = False
    ) -> None:
        self.init_value = _check_finite("init_value", init_value)
        self.decay_rate = _check_finite("decay_rate", decay_rate)
        if self.decay_rate <= 0:
            raise _invalid("decay_rate", "a positive number", decay_rate)
        self.decay_samples = _check_positive_int("decay_samples", decay_samples)
        if not isinstance(staircase, bool):
            raise _invalid("staircase", "a bool", staircase)
        self.staircase = staircase

    def _value(self, samples: int, minibatches: int) -> float:
        exponent = samples // self.decay_samples if self.staircase else samples / self.decay_samples
        return self.init_value * self.decay_rate**exponent

    def _attained_values(self) -> tuple[float, ...]:
        return (float(self.init_value),)


def exponential_decay(
    init_value: float, decay_rate: float, decay_samples: int, staircase: bool = False
) -> ExponentialDecay:
    """Exponential decay by `decay_rate` every `decay_samples` samples.

    `value(S) = init_value * decay_rate ** (S / decay_samples)`, with `floor(S / decay_samples)` as the
    exponent when `staircase` is True.

    Args:
        init_value: the value at `S = 0`.
        decay_rate: the factor applied every `decay_samples` samples, a positive number.
        decay_samples: a positive integer.
        staircase: whether to decay in steps instead of continuously.

    Returns:
        The schedule.

    Raises:
        ValueError: if a value is not finite, `decay_rate` is not positive, `decay_samples` is not a
            positive integer or `staircase` is not a bool.

    Example:
        >>> s = exponential_decay(1.0, decay_rate=0.5, decay_samples=100)
        >>> s(0), s(100), s(150) == 0.5 ** 1.5
        (1.0, 0.5, True)
        >>> exponential_decay(1.0, 0.5, 100, staircase=True)(199)
        0.5
    """
    return ExponentialDecay(init_value, decay_rate, decay_samples, staircase)


@_register
class StepDecay(Schedule):
    """`init_value * factor ** floor(S / step_samples)`; see `step_decay`."""

    config_type = "step_decay"

    def __init__(self, init_value: float, factor: float, step_samples: int) -> None:
        self.init_value = _check_finite("init_value", init_value)
        self.factor = _check_finite("factor", factor)
        if self.factor <= 0:
            raise _invalid("factor", "a positive number", factor)
        self.step_samples = _check_positive_int("step_samples", step_samples)

    def _value(self, samples: int, minibatches: int) -> float:
        return self.init_value * self.factor ** (samples // self.step_samples)

    def _attained_values(self) -> tuple[float, ...]:
        return (float(self.init_value),)


def step_decay(init_value: float, factor: float, step_samples: int) -> StepDecay:
    """Multiply by `factor` every `step_samples` samples.

    `value(S) = init_value * factor ** floor(S / step_samples)`.

    Args:
        init_value: the value for `S < step_samples`.
        factor: a positive number (below 1 to decay).
        step_samples: a positive integer.

    Returns:
        The schedule.

    Raises:
        ValueError: if a value is not finite, `factor` is not positive or `step_samples` is not a positive
            integer.

    Example:
        >>> s = step_decay(0.1, factor=0.5, step_samples=1000)
        >>> s(999), s(1000), s(2000)
        (0.1, 0.05, 0.025)
    """
    return StepDecay(init_value, factor, step_samples)


@_register
class Join(Schedule):
    """Schedules one after another at sample boundaries; see `join`."""

    config_type = "join"

    def __init__(self, schedules: Sequence[Any], boundaries: Sequence[int]) -> None:
        if not isinstance(schedules, (list, tuple)) or not schedules:
            raise _invalid("schedules", "a non-empty list of schedules", schedules)
        self.schedules = tuple(as_schedule(s, name=f"schedules[{k}]") for k, s in enumerate(schedules))
        for k, s in enumerate(self.schedules):
            if s.per_minibatch:
                raise _invalid(
                    "schedules",
                    "schedules of the sample count (a schedule indexed by minibatch cannot be joined at "
                    "sample boundaries; give its list an epoch_size)",
                    list(schedules),
                    f"schedules[{k}] is per minibatch",
                )
        self.boundaries = _check_boundaries("boundaries", boundaries)
        if len(self.schedules) != len(self.boundaries) + 1:
            raise ValueError(
                "Invalid value for argument `schedules`: expected one more schedule than boundaries. "
                f"Received: len(schedules)={len(self.schedules)}, len(boundaries)={len(self.boundaries)}"
            )

    def _value(self, samples: int, minibatches: int) -> float:
        k = bisect.bisect_right(self.boundaries, samples)
        start = self.boundaries[k - 1] if k else 0
        return self.schedules[k](samples - start, minibatches)

    def _attained_values(self) -> tuple[float, ...]:
        # Each piece starts at its own S = 0, but may end before reaching its later values.
        firsts = [s._attained_values()[:1] for s in self.schedules]
        return tuple(v for first in firsts for v in first)

    @classmethod
    def _from_params(cls, params: dict[str, Any]) -> Join:
        schedules = params["schedules"]
        if not isinstance(schedules, list):
            raise _invalid("schedules", "a list of schedule configs", schedules)
        return cls([from_config(c) for c in schedules], params["boundaries"])


def join(schedules: Sequence[Any], boundaries: Sequence[int]) -> Join:
    """Runs `schedules[k]` for `S` in `[boundaries[k-1], boundaries[k])`, each restarted at its boundary.

    `value(S) = schedules[k](S - boundaries[k-1])` (with `boundaries[-1] = 0`), as optax's
    `join_schedules`; unlike optax, the lengths and the boundaries are checked.

    Args:
        schedules: schedules of the sample count (any form `as_schedule` accepts that is not per minibatch),
            one more than `boundaries`.
        boundaries: strictly increasing positive sample counts.

    Returns:
        The schedule.

    Raises:
        ValueError: if the lengths do not match, the boundaries are not strictly increasing positive
            integers, or a schedule is indexed by minibatch.

    Example:
        >>> s = join([linear_warmup(0.0, 0.1, 100), constant(0.01)], boundaries=[100])
        >>> s(50), s(99), s(100), s(10**6)
        (0.05, 0.099, 0.01, 0.01)
    """
    return Join(schedules, boundaries)


def warmup_cosine(
    init_value: float, peak_value: float, warmup_samples: int, decay_samples: int, end_value: float = 0.0
) -> Join:
    """A linear warm-up to `peak_value`, then a cosine decay to `end_value` (optax's `warmup_cosine_decay`).

    `join([linear_warmup(init_value, peak_value, W), cosine_decay(peak_value, D - W, end_value /
    peak_value)], [W])` with `W = warmup_samples` and `D = decay_samples`, the total length including the
    warm-up: `init_value` at `S = 0`, `peak_value` at `S = W`, `end_value` from `S = D` on.

    Args:
        init_value: the value at `S = 0`.
        peak_value: the value at the end of the warm-up; nonzero unless `end_value` is 0.
        warmup_samples: the length of the warm-up, a positive integer.
        decay_samples: the total length of the schedule, warm-up included, greater than `warmup_samples`.
        end_value: the value from `S = decay_samples` on.

    Returns:
        The schedule (a `Join`).

    Raises:
        ValueError: if a value is not finite, a length is not a positive integer, `decay_samples <=
            warmup_samples`, or `peak_value` is 0 while `end_value` is not.

    Example:
        >>> s = warmup_cosine(0.0, 1.0, warmup_samples=100, decay_samples=1100)
        >>> s(0), s(50), s(100), round(s(600), 12), s(1100)
        (0.0, 0.5, 1.0, 0.5, 0.0)
    """
    warmup_samples = _check_positive_int("warmup_samples", warmup_samples)
    decay_samples = _check_positive_int("decay_samples", decay_samples)
    if decay_samples <= warmup_samples:
        raise ValueError(
            "Invalid value for argument `decay_samples`: expected a total length greater than "
            f"warmup_samples={warmup_samples}. Received: decay_samples={decay_samples}"
        )
    peak_value = _check_finite("peak_value", peak_value)
    end_value = _check_finite("end_value", end_value)
    if peak_value == 0 and end_value != 0:
        raise _invalid("peak_value", "a nonzero peak when end_value is nonzero", peak_value)
    alpha = end_value / peak_value if peak_value else 0.0
    warmup = linear_warmup(init_value, peak_value, warmup_samples)
    return join([warmup, cosine_decay(peak_value, decay_samples - warmup_samples, alpha)], [warmup_samples])
