"""``kfit.fit``'s ``validation_data`` under data-parallel training: each worker validates its share.

When more than one worker trains, ``validation_data`` given as arrays (``(x, y)`` or ``(x, y,
sample_weight)``: NumPy arrays, h5py datasets, dicts/lists of them) with no ``validation_steps`` is cut
into contiguous shares (:func:`kfit.distributed._evaluation.share`), one per worker, before ``model.fit``
sees it. Keras's own validation then evaluates only the worker's share, and :class:`CombineValidation`,
at the epoch end, sums the metric states that validation left over the workers and puts the results of
the whole set into the logs (``val_*``): the single-process numbers, the same on every worker, so that
early stopping and learning-rate reduction decide the same everywhere.

Not sharded (every worker validates the whole set, as before): a source that batches itself (tf.data, a
PyDataset, a DataLoader), ``validation_steps``, fewer samples than workers, and a model whose metrics
cannot be combined from shares (:func:`kfit.distributed._evaluation.why_not_sharded`).
"""

from __future__ import annotations

from typing import Any

import keras

from kfit.data._stream import flatten, pack
from kfit.distributed import _evaluation, _select


def _leaves(data: Any) -> list | None:
    """The arrays of ``(x, y[, sample_weight])``, or None when ``data`` is not such a tuple of arrays."""
    if not isinstance(data, (tuple, list)) or len(data) not in (2, 3):
        return None
    leaves = [leaf for part in data if part is not None for leaf in flatten(part) if leaf is not None]
    if not leaves or not all(hasattr(a, "shape") and hasattr(a, "__len__") and hasattr(a, "__getitem__")
                             for a in leaves):
        return None
    return leaves


def shard_validation_data(data: Any, model: Any, validation_steps: int | None) -> tuple[Any, bool]:
    """This worker's contiguous share of ``data`` and True, or ``data`` unchanged and False (see the module).

    Call it on every worker with the same data after the model (and its compiled metrics) is built.
    """
    engine = _select.current()
    if data is None or validation_steps is not None or engine is None or engine.size() == 1:
        return data, False
    leaves = _leaves(data)
    if leaves is None or len({len(a) for a in leaves}) != 1 or len(leaves[0]) < engine.size():
        return data, False  # not arrays, or arrays Keras will refuse with its own message
    if _evaluation.why_not_sharded(model) is not None:
        return data, False
    lo, hi = _evaluation.share(len(leaves[0]), engine.rank(), engine.size())

    def rows(part: Any) -> Any:
        return None if part is None else pack(part, [None if a is None else a[lo:hi] for a in flatten(part)])

    return tuple(rows(part) for part in data), True


def same_data_check(data: Any, what: str = "validation_data") -> Any:
    """What :func:`kfit.distributed._state.check_same` compares of ``data`` across the workers: arrays by their
    length, shapes, dtypes and a few rows; a source that batches itself by its type only; None as none.

    Every worker validates the same set (each its share of it, or the whole of it where it is not sharded, see the
    module), and decides the same stops on the ``val_*`` logs: each worker given its own validation shard (as a
    Horovod-Keras script gives ``model.fit``) would be sharded again, or would stop apart.
    """
    from kfit.distributed._state import DataCheck, fingerprint, signature_of

    fix = (f"Data-parallel kfit.fit splits {what} among the workers itself (or every worker validates all of it) "
           f"and every worker must decide the same stops on the val_* results: give every worker the same full "
           f"{what} (do not shard it yourself).")
    if data is None:
        return DataCheck(what, -1, "None", fix=fix)
    leaves = _leaves(data)
    if leaves is None or len({len(a) for a in leaves}) != 1:
        return DataCheck(what, -2, type(data).__name__, fix=fix)
    n = len(leaves[0])
    return DataCheck(what, n, signature_of(leaves), fingerprint(leaves, n), fix=fix)


class CombineValidation(keras.callbacks.Callback):
    """At the epoch end, the ``val_*`` logs of the whole set from the workers' shares (a collective).

    Keras's validation leaves the metric states of this worker's share in the model's metrics until the
    epoch ends; they are summed over the workers and their results replace the ``val_*`` entries, before
    any other callback reads the logs.
    """

    order = -1001  # before every other epoch-end hook

    def __init__(self) -> None:
        super().__init__()
        self._validated = False

    def on_test_end(self, logs: dict | None = None) -> None:
        self._validated = True  # model.fit's own validation (kfit's evaluations pass no callbacks)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not self._validated:
            return
        self._validated = False
        results = _evaluation.combine_metric_states(self.model)
        if logs is not None:
            logs.update({f"val_{k}": float(keras.ops.convert_to_numpy(v)) for k, v in results.items()})
