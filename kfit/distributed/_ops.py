"""Horovod's collective operations on values, for scripts that call ``hvd.allreduce``, ``hvd.allgather`` or
``hvd.broadcast`` (to average a metric of their own, gather predictions, share a value chosen on rank 0).

They run over the host on every engine (Horovod, or the native one) and take what Horovod-Keras takes: a Python
number, a NumPy array or a backend tensor. A tensor comes back as a tensor of the backend, anything else as a NumPy
array. With one worker each returns its input's value. They are not for the training step: the gradients go through
:func:`kfit.distributed.DistributedOptimizer` (or ``kfit.fit``).

Example:
    >>> import numpy as np
    >>> import kfit.distributed as hvd
    >>> hvd.allreduce(np.array([1.0, 3.0]))  # one worker: its own value (the mean over the workers)
    array([1., 3.])
    >>> hvd.allgather(np.arange(2)).tolist(), hvd.broadcast(7, root_rank=0).tolist()
    ([0, 1], 7)
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kfit.distributed import _select
from kfit.distributed._optimizer import Adasum, Average, Sum


def allreduce(value: Any, name: str | None = None, average: bool | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op: str | None = None, compression: Any = None) -> Any:
    """The mean (``op=Average``, the default) or the sum (``op=Sum``) of ``value`` over the workers, on every worker.

    Horovod-Keras's ``hvd.allreduce``: ``average=True/False`` is its older spelling of ``op``; ``prescale_factor``
    multiplies each worker's value before the sum, ``postscale_factor`` the result. ``compression`` is accepted and
    unused (the values travel as they are).

    Raises:
        ValueError: ``op=Adasum``, or ``average`` given together with another ``op``.
    """
    op = _op(op, average)
    array, as_tensor = _as_array(value)
    total = array.astype(np.float64) if array.dtype.kind in "biu" and op == Average else array
    if prescale_factor != 1.0:
        total = total * prescale_factor
    engine = _select.current()
    if engine is not None and engine.size() > 1:
        engine.before_host_collective()
        (total,) = engine.host_sum([np.ascontiguousarray(total).reshape(-1)], _name(name, "allreduce"))
        total = total.reshape(array.shape)  # (engines send 1-d arrays: a number comes back as a number)
        if op == Average:
            total = total / engine.size()
    if postscale_factor != 1.0:
        total = total * postscale_factor
    if array.dtype.kind == "f":
        total = np.asarray(total).astype(array.dtype)
    return _back(np.asarray(total), as_tensor)


def allgather(value: Any, name: str | None = None) -> Any:
    """Every worker's ``value``, concatenated along the first axis in rank order, on every worker (the first axis
    may differ between the workers; the others, and the dtype, must not)."""
    array, as_tensor = _as_array(value)
    if array.ndim == 0:
        array = array.reshape(1)
    engine = _select.current()
    if engine is None or engine.size() <= 1:
        return _back(array, as_tensor)
    size, rank = engine.size(), engine.rank()
    engine.before_host_collective()
    rows = np.zeros(size, np.int64)
    rows[rank] = array.shape[0]
    (rows,) = engine.host_sum([rows], _name(name, "allgather.rows"))
    slots = np.zeros((size, int(rows.max()), *array.shape[1:]), array.dtype)
    slots[rank, : array.shape[0]] = array
    (slots,) = engine.host_sum([slots], _name(name, "allgather"))  # each worker fills its own slot: sums are copies
    return _back(np.concatenate([slots[r, : rows[r]] for r in range(size)]), as_tensor)


def broadcast(value: Any, root_rank: int, name: str | None = None) -> Any:
    """Rank ``root_rank``'s ``value`` on every worker (the same shape and dtype on every worker)."""
    from kfit.distributed import _check_rank

    _check_rank(root_rank)
    array, as_tensor = _as_array(value)
    engine = _select.current()
    if engine is not None and engine.size() > 1:
        engine.before_host_collective()
        shape = array.shape
        array = engine.host_broadcast(np.ascontiguousarray(array).reshape(-1), int(root_rank), _name(name, "broadcast"))
        array = np.asarray(array).reshape(shape)
    return _back(np.asarray(array), as_tensor)


def _op(op: str | None, average: bool | None) -> str:
    if op == Adasum:
        raise ValueError("Invalid value for argument `op`: expected kfit.distributed.Average or Sum (kfit has no "
                         "Adasum). Received: op=Adasum")
    if op not in (None, Average, Sum):
        raise ValueError(f"Invalid value for argument `op`: expected kfit.distributed.Average or Sum. Received: op={op!r}")
    if average is not None:
        if op is not None:
            raise ValueError(f"Arguments `average` and `op` both say how to reduce; give one (op is Horovod's newer "
                             f"spelling). Received: average={average!r}, op={op!r}")
        return Average if average else Sum
    return op or Average


def _as_array(value: Any) -> tuple[np.ndarray, bool]:
    """``value`` as a NumPy array, and whether it was a backend tensor (returned as one)."""
    if isinstance(value, (np.ndarray, np.generic, int, float, bool, list, tuple)):
        return np.asarray(value), False
    return np.asarray(keras.ops.convert_to_numpy(value)), True


def _back(array: np.ndarray, as_tensor: bool) -> Any:
    return keras.ops.convert_to_tensor(array) if as_tensor else array


def _name(name: str | None, what: str) -> str:
    return f"kfit.{what}" if name is None else f"kfit.{what}.{name}"
