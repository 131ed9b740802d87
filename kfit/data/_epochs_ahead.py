"""One reader for a whole ``fit`` call: each next epoch's plan, and its first minibatches, read ahead.

Keras's loop starts its data anew at every epoch: on TensorFlow a new iterator over its dataset at every epoch
begin (and one at every epoch end, never read), on every backend a new pass over the adapter. A reader that
starts with its epoch makes the epoch's first step wait for it: on TensorFlow, over data in memory, about
20 ms more than ``model.fit``'s first step (the epoch's row indices read in Python, the inner dataset made:
``benchmarks/epoch_boundary.py``); over h5py or a ``PyDataset``, the reading of one minibatch.

The plan is a function of the clock (``kfit.training._plan``), so the next epoch's plan is known before it
begins. :class:`EpochChain` lets one reader run on from epoch to epoch, reading each next epoch's plan ahead,
from the clock reading at which the epoch before it ends, while that epoch trains: on TensorFlow over data in
memory the ``tf.data`` pipeline of :func:`gathered_dataset` (one iterator for the call), elsewhere kfit's
reader thread (:class:`kfit.data._prefetch.Prefetcher` over :meth:`EpochChain.positions`). When the epoch
begins, the adapter checks that the plan read ahead is the one the clock now gives (a callback may have changed
what the minibatch-size schedule reads, a restore may have moved the clock). If it is, the reader goes on, the
epoch's first minibatch already read; if not, a new reader starts at the clock, as without reading ahead. The
minibatches are the same either way. A callable minibatch-size schedule is therefore also called from the
reader's thread.

Example:
    >>> chain = EpochChain(lambda samples, minibatches: [(samples, 2)] if samples < 4 else [])
    >>> chain.start((0, 0), [(0, 2)])
    >>> chain.produce(0), chain.produce(1), chain.produce(2)
    ([(0, 2)], [(2, 2)], [])
    >>> chain.continues((2, 1), [(2, 2)])
    True
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

PlanAt = Callable[[int, int], list]

#: The most epochs :func:`constant_size` looks ahead for the end of the ``fit`` call.
_GALLOP_LIMIT = 1 << 62
#: How long an epoch begin waits for the pipeline to have read the epoch's plan ahead before it starts anew.
WAIT_SECONDS = 10.0


class EpochChain:
    """The epochs one ``tf.data`` iterator produces: the first from the clock when the iterator starts, each
    next one read ahead by the pipeline's thread from where the one before ends.

    Args:
        plan_at: ``plan_at(samples, minibatches)``, the ``(start, size)`` plan of the epoch beginning at that clock
            reading; pure (called on ``tf.data``'s thread).
    """

    def __init__(self, plan_at: PlanAt):
        self._plan_at = plan_at
        self._changed = threading.Condition()
        self._produced: list[tuple[tuple[int, int], list]] = []
        self._next: tuple[int, int] | None = None
        self._first: list | None = None
        self._failed = False
        self.begun = 0

    def start(self, reading: tuple[int, int], plan: list) -> None:
        """The chain's first epoch begins at clock ``reading``, with ``plan`` (main thread)."""
        self._next, self._first, self.begun = reading, list(plan), 1

    def produce(self, index: int) -> list:
        """The plan of the chain's epoch ``index`` (``tf.data``'s thread: epochs are produced in order)."""
        try:
            with self._changed:
                reading = self._next
            if reading is None:
                raise RuntimeError("kfit: the tf.data pipeline was read before its first epoch began.")
            plan = self._first if index == 0 else self._plan_at(*reading)
            end = plan[-1][0] + plan[-1][1] if plan else reading[0]
            with self._changed:
                self._produced.append((reading, plan))
                self._next = (end, reading[1] + len(plan))
                self._changed.notify_all()
            return plan
        except BaseException:
            with self._changed:
                self._failed = True
                self._changed.notify_all()
            raise

    def positions(self) -> Iterator[tuple[int, int]]:
        """The ``(start, size)`` of every minibatch of the chain's epochs, in order, until an empty plan (the
        reader thread's plan: each next epoch's is read when the reader reaches it)."""
        index = 0
        while plan := self.produce(index):
            yield from plan
            index += 1

    def read_epochs(self) -> Iterator[tuple[tuple[int, int], list]]:
        """``(reading, plan)`` of each epoch whose ``(start, size)`` :meth:`positions` gives, on another thread:
        each epoch's once the thread running :meth:`positions` has read its plan."""
        index = 0
        while produced := self._produced_epoch(index):  # None: the reader failed (its error reaches the trainer)
            if not produced[1]:
                return
            yield produced
            index += 1

    def reading(self, index: int) -> tuple[int, int]:
        """The clock reading at which the chain's epoch ``index`` begins (once :meth:`produce` has planned it)."""
        return self._produced[index][0]

    def continues(self, reading: tuple[int, int], plan: list, timeout: float = WAIT_SECONDS) -> bool:
        """Whether the epoch beginning at clock ``reading`` with ``plan`` is the chain's next (main thread). Waits
        for the pipeline to read it ahead; False (start anew) if it read another, failed, or took too long."""
        if self._produced_epoch(self.begun, timeout) != (tuple(reading), list(plan)) or self._failed:
            return False
        self.begun += 1
        return True

    def _produced_epoch(self, index: int, timeout: float | None = None) -> tuple[tuple[int, int], list] | None:
        """``(reading, plan)`` of the chain's epoch ``index`` once the reader has produced it; None if it failed
        before, or ``timeout`` passed."""
        with self._changed:
            self._changed.wait_for(lambda: len(self._produced) > index or self._failed, timeout)
            return self._produced[index] if len(self._produced) > index else None


def gathered_dataset(tensors: Any, rows: Callable[[int, int], np.ndarray], plan_of: Callable[[int], list],
                     padded_rows: Callable[[int, list], list[int]] | None = None, static_rows: int | None = None) -> Any:
    """A ``tf.data`` dataset of minibatches gathered from ``tensors`` (the data in memory, as tensors: ``(x, y)`` or
    ``(x, y, sample_weight)``): epoch after epoch, the plan ``plan_of(index)`` of each (one Python call per epoch),
    the rows ``rows(start, size)`` of each of its minibatches gathered by ``tf.gather``; it ends at the first empty
    plan.

    With ``padded_rows``, ``padded_rows(index, plan)`` gives the rows each minibatch of the plan is padded to:
    each is then ``(x, y, sample_weight, mask)`` as ``kfit.training._padding.pad_batch`` pads a host batch (copies
    of its last row, sample weight 0 on them, 1 where there is none; ``mask`` 1 on the real rows).

    With ``static_rows``, every minibatch the dataset yields has that many rows (:func:`constant_size`): it is the
    static batch dimension of the dataset's elements, as Keras's own array adapter declares it when no epoch ends in
    a partial batch (TensorFlow traces the train step for that shape; a minibatch of another size would be refused
    by ``tf.ensure_shape``). Else the batch dimension is unknown."""
    import keras
    import tensorflow as tf

    def epoch_rows(index: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        plan = plan_of(int(index))
        parts = [rows(start, size) for start, size in plan]
        reals = np.array([len(p) for p in parts], np.int64)
        if padded_rows is not None and parts:
            padded = padded_rows(int(index), plan)
            parts = [np.concatenate([p, np.repeat(p[-1:], n - len(p))]) for p, n in zip(parts, padded)]
        flat = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        return flat, np.array([len(p) for p in parts], np.int64), reals

    def read_epoch(index: Any) -> tuple[Any, Any, Any]:
        arrays = tf.numpy_function(epoch_rows, [index], (tf.int64, tf.int64, tf.int64), stateful=True)
        for array in arrays:
            array.set_shape([None])
        return tuple(arrays)

    def static(batch: Any) -> Any:
        if static_rows is None:
            return batch
        return tf.nest.map_structure(lambda t: t if t is None else tf.ensure_shape(t, [static_rows, *t.shape[1:]]),
                                     batch)

    def minibatch(flat: Any, start: Any, size: Any, real: Any) -> Any:
        batch = tf.nest.map_structure(lambda t: t if t is None else tf.gather(t, flat[start:start + size]), tensors)
        if padded_rows is None:
            return static(batch)
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
        mask = tf.sequence_mask(real, size, dtype=tf.float32)

        def weight(w: Any) -> Any:  # 0 on the padding rows
            return w * tf.reshape(tf.cast(mask, w.dtype), tf.concat([[-1], tf.ones([tf.rank(w) - 1], tf.int32)], 0))

        sample_weight = mask if sample_weight is None else tf.nest.map_structure(weight, sample_weight)
        return static((x, y, sample_weight, mask))

    def epoch(flat: Any, sizes: Any, reals: Any) -> Any:
        starts = tf.cumsum(sizes, exclusive=True)
        return tf.data.Dataset.from_tensor_slices((starts, sizes, reals)).map(
            lambda start, size, real: minibatch(flat, start, size, real))

    epochs = tf.data.Dataset.range(np.iinfo(np.int64).max).map(read_epoch)
    return epochs.take_while(lambda flat, sizes, reals: tf.size(sizes) > 0).flat_map(epoch).prefetch(tf.data.AUTOTUNE)



def constant_size(plan_at: PlanAt, reading: tuple[int, int], plan: list) -> int | None:
    """The size of every minibatch from clock ``reading`` to the end of the ``fit`` call when they all have one
    (the minibatch size: no epoch end, nor the end of the call, cuts one short), else None.

    For a fixed minibatch size: ``plan_at``'s sizes then depend on the samples alone, every epoch after the one
    ``reading`` is in is cut into the same minibatches (but the one the call ends in), and a few plans tell: ``plan``
    (the plan of the epoch beginning at ``reading``), the next epoch's (whole, unless the call ends in it), the last
    minibatch of later epochs, galloping, to find the epoch the call ends in, and that epoch's plan.

    Example:
        >>> from kfit.training import _plan
        >>> def plan_at(epoch_size, stop_at):
        ...     return lambda samples, minibatches: list(_plan.plan(samples, minibatches, lambda s, m: 16, epoch_size,
        ...         min((samples // epoch_size + 1) * epoch_size, stop_at)))
        >>> constant_size(plan_at(192, 5 * 192), (0, 0), plan_at(192, 5 * 192)(0, 0))
        16
        >>> constant_size(plan_at(200, 5 * 200), (0, 0), plan_at(200, 5 * 200)(0, 0)) is None  # 200 % 16 == 8
        True
    """
    if not plan:
        return None
    size = plan[0][1]

    def uniform(minibatches: list) -> bool:
        return all(s == size for _, s in minibatches)

    if not uniform(plan):
        return None
    start = plan[-1][0] + plan[-1][1]  # where the next epoch begins (if the call goes on: an epoch boundary)
    minibatches = reading[1] + len(plan)
    following = plan_at(start, minibatches)
    if not uniform(following):
        return None
    if not following:
        return size
    # The samples and minibatches of a whole epoch (if the call ends in ``following``, no epoch comes after it).
    epoch, count = following[-1][0] + following[-1][1] - start, len(following)

    def whole(j: int) -> bool:
        """Whether the ``j``-th epoch from ``start`` (0: ``following``) runs to its end: its last minibatch is whole."""
        last = start + (j + 1) * epoch - size
        return plan_at(last, minibatches + (j + 1) * count - 1) == [(last, size)]

    done, open_ = 0, 1  # epoch ``done`` is whole, epoch ``open_`` is not: gallop, then bisect
    while whole(open_):
        if open_ > _GALLOP_LIMIT:
            return None  # no end in sight
        done, open_ = open_, 2 * open_
    while open_ - done > 1:
        middle = (done + open_) // 2
        done, open_ = (middle, open_) if whole(middle) else (done, middle)
    # Epochs up to ``done`` are whole, each of ``count`` minibatches of ``size``; the call ends in epoch ``open_``
    # (or where it begins, and its plan is empty).
    return size if uniform(plan_at(start + open_ * epoch, minibatches + open_ * count)) else None
