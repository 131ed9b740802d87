"""Argument checks and log conversion: one rule for every public entry point of kfit.

Each check names the argument and the value received, in Keras's words ("Invalid value for argument `x`:
expected ... Received: x=..."), and returns the value normalized (NumPy integers and floats become Python's, so
that they survive JSON). Booleans are never numbers here.

Example:
    >>> from kfit import _checks
    >>> _checks.count("epochs", 3, low=1)
    3
    >>> _checks.count("epochs", 0, low=1)
    Traceback (most recent call last):
    ...
    kfit._checks.InvalidArgumentError: Invalid value for argument `epochs`: expected a positive integer. Received: epochs=0
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any

import numpy as np


class InvalidArgumentError(ValueError, TypeError):
    """A bad argument: a ValueError (as Keras raises), and a TypeError when the type is what is wrong."""


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def _fail(name: str, expected: str, value: Any, allow_none: bool = False) -> InvalidArgumentError:
    expected += " or None" if allow_none else ""
    return InvalidArgumentError(f"Invalid value for argument `{name}`: expected {expected}. Received: {name}={value!r}")


def is_integer(value: Any) -> bool:
    """An int or NumPy integer, not a bool."""
    if type(value) is int:  # the common case, without the slower abstract-class check
        return True
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def is_real(value: Any) -> bool:
    """An int, float or NumPy number, not a bool."""
    if type(value) in (float, int):  # the common cases, without the slower abstract-class check
        return True
    return isinstance(value, numbers.Real) and not _is_bool(value)


def count(name: str, value: Any, *, low: int = 0, allow_none: bool = False) -> int | None:
    """``value`` as an int ``>= low`` (None passes when ``allow_none``)."""
    if value is None and allow_none:
        return None
    if not is_integer(value) or value < low:
        expected = {0: "a non-negative integer", 1: "a positive integer"}.get(low, f"an integer >= {low}")
        raise _fail(name, expected, value, allow_none)
    return int(value)


def real(name: str, value: Any, *, low: float = -math.inf, high: float = math.inf, low_inclusive: bool = True,
         high_inclusive: bool = True, allow_none: bool = False) -> float | None:
    """``value`` as a finite float in the interval given (None passes when ``allow_none``)."""
    if value is None and allow_none:
        return None
    number = float(value) if is_real(value) else math.nan
    above = number >= low if low_inclusive else number > low
    below = number <= high if high_inclusive else number < high
    if not (math.isfinite(number) and above and below):  # also refuses NaN and infinities
        if low == -math.inf and high == math.inf:
            expected = "a finite number"
        elif high == math.inf:
            expected = f"a finite number {'>=' if low_inclusive else '>'} {low:g}"
        else:
            expected = f"a number in {'[' if low_inclusive else '('}{low:g}, {high:g}{']' if high_inclusive else ')'}"
        raise _fail(name, expected, value, allow_none)
    return number


def output_path(name: str, value: Any, *, directory: bool = False, example: str = "out", parents: bool = True) -> str:
    """``value`` as a path kfit can write to: a file (or, ``directory``, a folder) that is not the other kind,
    under folders that are folders or can be made (the nearest existing one is not a file; not checked with
    ``parents=False``, for writers that report that as their own error when they write). A file path that is a
    symbolic link is resolved: a writer replaces the link's target, and the link stays."""
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise _fail(name, "a path (str or os.PathLike)", value)
    path = os.fspath(value)
    if "\0" in path:  # (os calls would fail later with "embedded null byte", naming no file)
        raise InvalidArgumentError(f"Invalid value for argument `{name}`: a path holds no NUL character (\\0). "
                                   f"Received: {name}={path!r}")
    if not directory and os.path.isdir(path):
        raise InvalidArgumentError(f"Invalid value for argument `{name}`: {path!r} is a directory; give a file name "
                                   f"in it, e.g. {os.path.join(path, example)!r}.")
    if directory and os.path.exists(path) and not os.path.isdir(path):
        raise InvalidArgumentError(f"Invalid value for argument `{name}`: {path!r} is a file; give a folder.")
    path = os.path.realpath(path) if not directory and os.path.islink(path) else path
    if not parents:
        return path
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise InvalidArgumentError(f"Invalid value for argument `{name}`: {path!r} cannot be made, because "
                                   f"{parent!r} is a file, not a folder.")
    return path


def boolean(name: str, value: Any) -> bool:
    """``value`` after checking it is True or False."""
    if not _is_bool(value):
        raise _fail(name, "True or False", value)
    return bool(value)


def choice(name: str, value: Any, choices: tuple) -> Any:
    """``value`` after checking it is one of ``choices``."""
    if not any(value is c or (type(value) is type(c) and value == c) or (_checks_int(value) and value == c)
               for c in choices):
        raise _fail(name, f"one of {list(choices)}", value)
    return value


def callback_list(name: str, value: Any) -> list:
    """``value`` as a list of callbacks, as ``model.fit`` takes them: None, one callback, or a list or tuple."""
    import keras

    if value is None:
        return []
    if isinstance(value, keras.callbacks.Callback):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(c, keras.callbacks.Callback) or hasattr(c, "set_model")
                                                 for c in value):  # (Keras calls any object with the hooks)
        return list(value)
    raise _fail(name, "a keras.callbacks.Callback or a list of them", value, allow_none=True)


def _checks_int(value: Any) -> bool:
    return is_integer(value) or _is_bool(value)


def log_float(value: Any) -> float | None:
    """A log value (Python or NumPy number, backend scalar, one-element array) as a float; None when it is
    not a single number (a string, None, a vector-valued metric)."""
    if _is_bool(value) or value is None or isinstance(value, str):
        return None
    try:
        array = np.asarray(value) if isinstance(value, (numbers.Real, np.ndarray, np.generic)) else _to_numpy(value)
        return float(array) if np.size(array) == 1 else None
    except (TypeError, ValueError, AttributeError, RuntimeError):
        return None


def log_value(value: Any) -> Any:
    """A result as Keras puts it in the logs: a float for a scalar, a list for an array-valued metric."""
    array = np.asarray(value if isinstance(value, (numbers.Real, np.ndarray, np.generic)) else _to_numpy(value))
    return float(array) if array.ndim == 0 else array.tolist()


def _to_numpy(value: Any) -> Any:
    import keras

    return keras.ops.convert_to_numpy(value)
