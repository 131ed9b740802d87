"""The `Schedule` base class, its configuration, and the forms a user writes: scalars, lists, pairs, callables.

A schedule is a pure function of the training clock: the number of samples seen `S` (or, for a list given
without `epoch_size`, the number of minibatches seen). It keeps no state, so the same clock reading always
gives the same value, before and after a resume.
"""

from __future__ import annotations

import bisect
import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from kfit import _checks
from kfit.interval import FULL_DATA_SWEEP

if TYPE_CHECKING:
    from kfit.schedules._units import HyperparameterSchedule

# Every class that `from_config` may build, by its `config_type`. Nothing else is ever constructed.
_REGISTRY: dict[str, type] = {}


def _register(cls: type) -> type:
    """Class decorator: make `cls` buildable by `from_config` under `cls.config_type`."""
    _REGISTRY[cls.config_type] = cls
    return cls


# ---------------------------------------------------------------------------------------------------------
# Argument checks shared by the schedule modules.


def _invalid(name: str, expected: str, value: Any, detail: str = "") -> ValueError:
    message = f"Invalid value for argument `{name}`: expected {expected}. Received: {name}={value!r}"
    return ValueError(message + (f" ({detail})" if detail else ""))


_is_int = _checks.is_integer
_is_real = _checks.is_real


def _number(value: Any) -> int | float:
    """`value` as a plain Python int or float (JSON-serializable), keeping ints as ints."""
    return int(value) if _is_int(value) else float(value)


def _check_finite(name: str, value: Any) -> int | float:
    if not _is_real(value) or not math.isfinite(value):
        raise _invalid(name, "a finite number", value)
    return _number(value)


def _check_positive_int(name: str, value: Any) -> int:
    return _checks.count(name, value, low=1)


def _check_epoch_size(epoch_size: Any) -> int | None:
    if epoch_size is FULL_DATA_SWEEP:
        raise ValueError(
            "Invalid value for argument `epoch_size`: FULL_DATA_SWEEP (one sweep of the data as the unit) cannot be "
            "known when a kfit schedule is built: kfit's schedules are functions of the sample clock, fixed before "
            "they meet the data. Give the number of samples in one sweep of the training data, "
            "epoch_size=len(x_train) (all workers' samples under data-parallel training). Received: "
            "epoch_size=FULL_DATA_SWEEP"
        )
    return _checks.count("epoch_size", epoch_size, low=1, allow_none=True)


def _check_boundaries(name: str, boundaries: Any) -> tuple[int, ...]:
    if isinstance(boundaries, np.ndarray):
        boundaries = boundaries.tolist()
    if not isinstance(boundaries, (list, tuple)):
        raise _invalid(name, "a list of strictly increasing positive integers (sample counts)", boundaries)
    previous = 0
    for b in boundaries:
        if not _is_int(b) or b <= previous:
            raise _invalid(
                name, "a list of strictly increasing positive integers (sample counts)", list(boundaries)
            )
        previous = b
    return tuple(int(b) for b in boundaries)


def _check_clock(samples: Any, minibatches: Any) -> None:
    if not _is_real(samples) or not samples >= 0:
        raise _invalid("samples", "a non-negative sample count", samples)
    if not _is_real(minibatches) or not minibatches >= 0:
        raise _invalid("minibatches", "a non-negative minibatch count", minibatches)


def _to_config(value: Any) -> Any:
    if isinstance(value, Schedule):
        return value.get_config()
    if isinstance(value, (list, tuple)):
        return [_to_config(v) for v in value]
    return value


def _freeze(value: Any) -> Any:
    """A hashable image of a parameter value, for `__eq__` and `__hash__`."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


@functools.cache
def _argument_names(cls: type) -> tuple[str, ...]:
    return tuple(inspect.signature(cls).parameters)


# ---------------------------------------------------------------------------------------------------------


class Schedule:
    """A pure function of the training clock: `value = schedule(samples, minibatches)`.

    Subclasses implement `_value` and keep each constructor argument in the attribute of its name (or
    override `_params`); configuration, equality, hashing and `repr` follow from `_params`. A schedule never keeps state: it is safe to call it at any
    clock reading, in any order, any number of times.

    Attributes:
        per_minibatch: False (the default): the value is a function of the sample count `S`. True: it is
            indexed by the minibatch count (CNTK's rule for a list given without `epoch_size`).

    Example:
        >>> from kfit.schedules import as_schedule
        >>> s = as_schedule([0.1, 0.01], epoch_size=100)
        >>> s(99), s(100)
        (0.1, 0.01)
    """

    config_type: ClassVar[str] = ""
    per_minibatch: bool = False

    def __call__(self, samples: int, minibatches: int = 0) -> float:
        """Returns the value at a clock reading.

        Args:
            samples: samples seen so far, `S >= 0`.
            minibatches: minibatches seen so far; read instead of `samples` when `per_minibatch`.

        Returns:
            The value, as a float.

        Raises:
            ValueError: if a clock count is negative or not a number.
        """
        _check_clock(samples, minibatches)
        return self._value(samples, minibatches)

    def _value(self, samples: int, minibatches: int) -> float:
        raise NotImplementedError

    def holds_until(self, samples: int, minibatches: int = 0) -> tuple[float, float]:
        """How far the value at a clock reading holds: it is the same at every later reading with fewer
        samples and fewer minibatches than the returned pair (``math.inf``: no bound).

        Lets a caller that reads the schedule at every step skip the readings that cannot change it. The
        default, one sample and one minibatch on, claims nothing beyond the reading itself.

        Example:
            >>> from kfit.schedules import as_schedule
            >>> as_schedule([0.1, 0.01], epoch_size=100).holds_until(40)
            (100, inf)
        """
        return samples + 1, minibatches + 1

    def _params(self) -> dict[str, Any]:
        """The constructor arguments that rebuild this schedule (schedules among them left as objects): by
        default the attributes named as the constructor's arguments, a tuple as a list."""
        values = {name: getattr(self, name) for name in _argument_names(type(self))}
        return {name: list(v) if isinstance(v, tuple) else v for name, v in values.items()}

    def _attained_values(self) -> tuple[float, ...]:
        """Values this schedule certainly takes, its value at the start first; empty when unknown.

        Unit schedules check these at construction (a negative learning rate in a list is refused before
        training starts); every value is checked again when it is read.
        """
        return ()

    @classmethod
    def _from_params(cls, params: dict[str, Any]) -> Schedule:
        return cls(**params)

    def get_config(self) -> dict[str, Any]:
        """Returns a JSON-serializable description; `kfit.schedules.from_config` rebuilds an equal schedule.

        Returns:
            A dict with a `"type"` key naming the schedule and one key per constructor argument.

        Raises:
            TypeError: if the schedule is, or contains, a schedule built from a Python callable.
        """
        return {"type": self.config_type, **{k: _to_config(v) for k, v in self._params().items()}}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return _freeze(self._params()) == _freeze(other._params())  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, _freeze(self._params())))


@_register
class Constant(Schedule):
    """The same value at every clock reading; built by `as_schedule(value)` or `constant(value)`.

    Args:
        value: a finite number.

    Raises:
        ValueError: if `value` is not a finite number.
    """

    config_type = "constant"

    def __init__(self, value: float) -> None:
        self.value = _check_finite("value", value)

    def _value(self, samples: int, minibatches: int) -> float:
        return float(self.value)

    def holds_until(self, samples: int, minibatches: int = 0) -> tuple[float, float]:
        return math.inf, math.inf

    def _attained_values(self) -> tuple[float, ...]:
        return (float(self.value),)


@_register
class PiecewiseConstant(Schedule):
    """`values[k]` for a clock reading in `[boundaries[k-1], boundaries[k])`, the last value forever.

    The clock is the sample count, or the minibatch count when `per_minibatch` is True. Built by
    `piecewise_constant` and by `as_schedule` from lists and `(count, value)` pairs.

    Args:
        boundaries: strictly increasing positive integers.
        values: finite numbers, one more than `boundaries`.
        per_minibatch: whether the boundaries count minibatches instead of samples.

    Raises:
        ValueError: if an argument is invalid or the lengths do not match.
    """

    config_type = "piecewise_constant"

    def __init__(
        self, boundaries: Sequence[int], values: Sequence[float], per_minibatch: bool = False
    ) -> None:
        self.boundaries = _check_boundaries("boundaries", boundaries)
        self.values = _check_values("values", values)
        if len(self.values) != len(self.boundaries) + 1:
            raise ValueError(
                "Invalid value for argument `values`: expected one more value than boundaries. Received: "
                f"len(values)={len(self.values)}, len(boundaries)={len(self.boundaries)}"
            )
        if not isinstance(per_minibatch, bool):
            raise _invalid("per_minibatch", "a bool", per_minibatch)
        self.per_minibatch = per_minibatch

    def _value(self, samples: int, minibatches: int) -> float:
        clock = minibatches if self.per_minibatch else samples
        return float(self.values[bisect.bisect_right(self.boundaries, clock)])

    def holds_until(self, samples: int, minibatches: int = 0) -> tuple[float, float]:
        clock = minibatches if self.per_minibatch else samples
        k = bisect.bisect_right(self.boundaries, clock)
        until = self.boundaries[k] if k < len(self.boundaries) else math.inf
        return (math.inf, until) if self.per_minibatch else (until, math.inf)

    def _attained_values(self) -> tuple[float, ...]:
        return tuple(float(v) for v in self.values)


class FromCallable(Schedule):
    """A schedule computed by a user's function `S -> value`; built by `as_schedule(fn)`.

    The function must be pure. Its values are checked when read (they cannot be known before): a value that
    is not a finite number raises `ValueError` naming the schedule. It cannot be serialized.

    Args:
        fn: a callable taking the sample count and returning a number.
        name: the name used in error messages.
    """

    config_type = "callable"

    def __init__(self, fn: Callable[[int], float], name: str = "values") -> None:
        if not callable(fn):
            raise TypeError(f"Invalid value for argument `fn`: expected a callable. Received: fn={fn!r}")
        self.fn = fn
        self.name = name

    def _value(self, samples: int, minibatches: int) -> float:
        value = self.fn(samples)
        if not _is_real(value) or not math.isfinite(value):
            raise ValueError(
                f"The schedule `{self.name}` ({self.fn!r}) returned an invalid value at samples={samples}: "
                f"expected a finite number. Received: {value!r}"
            )
        return float(value)

    def get_config(self) -> dict[str, Any]:
        """Always raises: a Python function cannot be described as data.

        Raises:
            TypeError: always.
        """
        raise TypeError(
            f"a schedule built from a Python callable cannot be serialized; schedule `{self.name}` wraps "
            f"{self.fn!r}. Build it from kfit.schedules shapes (piecewise_constant, linear_warmup, "
            "cosine_decay, join, ...) to save its configuration, or rebuild it in code when restoring."
        )


def _check_values(name: str, values: Any) -> tuple[int | float, ...]:
    if isinstance(values, np.ndarray):
        values = values.tolist()
    if not isinstance(values, (list, tuple)) or not values:
        raise _invalid(name, "a non-empty list of finite numbers", values)
    for i, v in enumerate(values):
        if not _is_real(v) or not math.isfinite(v):
            raise _invalid(name, "a non-empty list of finite numbers", values, f"entry {i} is {v!r}")
    return tuple(_number(v) for v in values)


def piecewise_constant(boundaries: Sequence[int], values: Sequence[float]) -> PiecewiseConstant:
    """A step function of the sample count.

    `value(S) = values[k]` for `boundaries[k-1] <= S < boundaries[k]` (with `boundaries[-1] = 0` and
    `boundaries[len] = inf`): `values[0]` before the first boundary, the last value forever after the last.

    Args:
        boundaries: strictly increasing positive sample counts.
        values: finite numbers, `len(values) == len(boundaries) + 1`.

    Returns:
        The schedule.

    Raises:
        ValueError: if the boundaries are not strictly increasing positive integers, a value is not finite,
            or the lengths do not match.

    Example:
        >>> s = piecewise_constant([1000, 3000], [0.1, 0.01, 0.001])
        >>> s(999), s(1000), s(2999), s(3000), s(10**9)
        (0.1, 0.01, 0.01, 0.001, 0.001)
    """
    return PiecewiseConstant(boundaries, values)


def as_schedule(values: Any, epoch_size: int | None = None, *, name: str = "values") -> Schedule:
    """Turns any accepted form of a schedule into a `Schedule`.

    The forms:

    - a finite number: that value at every clock reading;
    - a `Schedule`: returned as is;
    - a list `[v0, v1, ...]` with `epoch_size` (samples): `v_i` holds for `S` in
      `[i * epoch_size, (i + 1) * epoch_size)`, the last value forever;
    - a list of `(count, value)` pairs: `value` holds for `count` units of `epoch_size`, the last value
      forever (its count is not read: CNTK writes `(0, value)` there); pairs and plain values may not be mixed;
    - with `epoch_size=None` a list counts minibatches instead (`per_minibatch=True`): entry `i` is the value
      for minibatch `i` (a pair's count is a number of minibatches);
    - any other callable `S -> value`: wrapped (its values are checked when read).

    `epoch_size` is used by the list forms only; it is checked, and ignored by the other forms.

    Args:
        values: the schedule, in one of the forms above.
        epoch_size: the number of samples one list entry (or one unit of a pair's count) spans, or None.
        name: the argument name used in error messages.

    Returns:
        The schedule.

    Raises:
        ValueError: if a list is empty, a value is not finite, a pair is malformed or has a count that is
            not a positive integer (0 is accepted in the last pair), pairs and values are mixed, or `epoch_size`
            is not a positive integer.
        TypeError: if `values` is none of the forms above.

    Example:
        >>> s = as_schedule([0.001] * 2 + [0.0005], epoch_size=100)
        >>> s(0), s(199), s(200), s(10**6)
        (0.001, 0.001, 0.0005, 0.0005)
        >>> s = as_schedule([(2, 0.1), (1, 0.01)], epoch_size=100)
        >>> s(199), s(200)
        (0.1, 0.01)
        >>> s = as_schedule([0.5, 0.25])  # per minibatch
        >>> s(0, minibatches=0), s(5000, minibatches=1), s.per_minibatch
        (0.5, 0.25, True)
    """
    epoch_size = _check_epoch_size(epoch_size)
    if isinstance(values, Schedule):
        return values
    if _is_real(values):
        if not math.isfinite(values):
            raise _invalid(name, "a finite number", values)
        return Constant(values)
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise _invalid(name, "a one-dimensional list of values", values)
        values = values.tolist()
    if isinstance(values, (list, tuple)):
        return _from_list(values, epoch_size, name)
    if callable(values):
        return FromCallable(values, name=name)
    raise TypeError(
        f"Invalid value for argument `{name}`: expected a number, a list of numbers, a list of "
        f"(count, value) pairs, a callable or a kfit.schedules.Schedule. Received: {name}={values!r}"
    )


def _from_list(entries: list | tuple, epoch_size: int | None, name: str) -> PiecewiseConstant:
    if not entries:
        raise _invalid(name, "a non-empty list", entries)
    is_pair = [isinstance(e, (list, tuple)) for e in entries]
    if any(is_pair) and not all(is_pair):
        raise _invalid(name, "either plain values or (count, value) pairs, not both", entries)
    counts: list[int] = []
    values: list[int | float] = []
    for i, entry in enumerate(entries):
        if is_pair[i]:
            if len(entry) != 2:
                raise _invalid(name, "(count, value) pairs", entries, f"entry {i} is {entry!r}")
            count, value = entry
            # The last pair's count is never read (its value holds forever): CNTK writes 0 there.
            last = i == len(entries) - 1
            if not _is_int(count) or count < 0 or (count == 0 and not last):
                raise _invalid(
                    name,
                    "(count, value) pairs with a positive integer count (0 only in the last pair)",
                    entries,
                    f"entry {i} is {entry!r}",
                )
        else:
            count, value = 1, entry
        if not _is_real(value) or not math.isfinite(value):
            raise _invalid(name, "finite values", entries, f"entry {i} holds {value!r}")
        counts.append(int(count))
        values.append(_number(value))

    unit = 1 if epoch_size is None else epoch_size
    boundaries: list[int] = []
    merged: list[int | float] = [values[0]]
    end = 0
    for count, value in zip(counts[:-1], values[1:], strict=True):
        end += count * unit
        if value != merged[-1]:  # equal neighbours make one piece
            boundaries.append(end)
            merged.append(value)
    return PiecewiseConstant(boundaries, merged, per_minibatch=epoch_size is None)


def from_config(config: Mapping[str, Any]) -> Schedule | HyperparameterSchedule:
    """Rebuilds a schedule from `get_config()`'s output.

    Dispatches on `config["type"]` to the known schedule classes only: nothing is evaluated or unpickled.

    Args:
        config: a dict made by `get_config()` (possibly through JSON).

    Returns:
        A schedule equal to the one that made `config`.

    Raises:
        TypeError: if `config` is not a mapping.
        ValueError: if the type is unknown, a key is missing or unexpected, or a value is invalid.

    Example:
        >>> from kfit.schedules import cosine_decay
        >>> s = cosine_decay(0.1, decay_samples=1000)
        >>> from_config(s.get_config()) == s
        True
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"Invalid value for argument `config`: expected a dict. Received: config={config!r}")
    type_name = config.get("type")
    cls = _REGISTRY.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        raise ValueError(
            f"Invalid value for argument `config`: unknown schedule type {type_name!r}; expected one of "
            f"{sorted(_REGISTRY)}. Received: config={dict(config)!r}"
        )
    params = {k: v for k, v in config.items() if k != "type"}
    try:
        inspect.signature(cls).bind(**params)
    except TypeError as error:
        raise ValueError(
            f"Invalid value for argument `config`: the keys do not fit a {type_name!r} schedule ({error}). "
            f"Received: config={dict(config)!r}"
        ) from None
    return cls._from_params(params)
