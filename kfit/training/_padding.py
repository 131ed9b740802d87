"""Pad the minibatches an epoch end cuts short to their scheduled size, so that they add no compiled shape.

A minibatch never crosses an epoch boundary (nor ``max_samples``): the one that reaches it is cut short. Under JAX,
and under TensorFlow with ``jit_compile=True`` (XLA), every new shape compiles, so a run whose epoch length is no
multiple of its minibatch size compiles one more step per scheduled size, and with a minibatch-size schedule each cut
size is new. ``kfit.fit(..., pad_remainders=True)``
hands the step such a minibatch at its scheduled size instead (``size_at`` of the clock reading where it is drawn, a
pure function of the clock: a resumed run pads exactly as the run it resumes):

* the ``p - r`` padding rows are copies of the minibatch's last row, with sample weight 0;
* inside the step, given the real count ``r`` (a traced scalar, from a row mask the batch carries), the sample
  weights the loss sees are scaled by ``p / r``: with Keras's default reduction (``sum_over_batch_size``, a sum
  over the ``p`` rows divided by ``p``) the loss, its gradient and the regularization are those of the ``r`` rows;
* the loss trackers (the loss and each output's loss) count ``r`` samples, weighted metrics see weight 0 on the
  padding rows, and the contribution of the padding rows to every metric whose state is a sum over samples is
  taken out (``kfit/_backend.py:exclude_padding_from_metrics``).

Every minibatch then carries sample weights and the row mask (all ones when nothing is padded), so one compiled step
serves each scheduled size. Mathematically exact, not bit-identical to an unpadded run: the float sums run over other
shapes, and Dropout draws for ``p`` rows. Refused (:func:`check`) where it would not be exact: a model's own
``train_step``, ``compute_loss`` or ``compute_metrics``, a loss reduced otherwise than by ``sum_over_batch_size`` or
``mean_with_sample_weight``, ``BatchNormalization``, an activity regularizer or another loss a layer adds in its forward
pass (``add_loss``, found when the step is traced), a source that batches by itself,
data-parallel training, and on TensorFlow data without targets (``tf.data`` cannot pair sample weights with an absent
``y``). The batches are padded as kfit's data adapter reads them (:class:`Padding`; on TensorFlow over data in memory,
by ``tf.data`` itself: ``kfit.data._epochs_ahead.gathered_dataset``). On PyTorch, and on TensorFlow without XLA,
nothing is padded: a new size adds no compiled shape there (kfit's ``tf.data`` pipeline leaves the batch dimension
unknown where the sizes differ; PyTorch's step is not compiled).

Example:
    >>> import numpy as np
    >>> from kfit.training._padding import pad_batch, padded_rows
    >>> padded_rows([(0, 8), (8, 8), (16, 4)], minibatches=0, size_at=lambda s, m: 8)
    [8, 8, 8]
    >>> x, y, w, mask = pad_batch((np.arange(3.0), np.arange(3.0)), rows=5)
    >>> x.tolist(), w.tolist(), mask.tolist()
    ([0.0, 1.0, 2.0, 2.0, 2.0], [1.0, 1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from kfit import _backend
from kfit.distributed import _engine

FIX = "Train without pad_remainders=True (each cut size then compiles once, on its first step or ahead of it)."

#: Reductions under which scaling the sample weights by ``p / r`` gives the loss of the ``r`` real rows.
EXACT_REDUCTIONS = ("sum_over_batch_size", "mean_with_sample_weight")

def padded_rows(plan: list[tuple[int, int]], minibatches: int, size_at: Callable[[int, int], int]) -> list[int]:
    """The rows each minibatch of an epoch's ``plan`` is handed to the step with: its scheduled size, ``size_at`` of
    the clock reading where it is drawn (``minibatches``: the clock's minibatch count at the plan's first)."""
    return [max(size, int(size_at(start, minibatches + i))) for i, (start, size) in enumerate(plan)]


class Padding:
    """What kfit's data adapter pads with (``StreamAdapter(pad=...)``): the rows of each minibatch of a plan, and
    the padded batch.

    Args:
        size_at: the minibatch-size schedule, ``size_at(samples, minibatches)``.
    """

    def __init__(self, size_at: Callable[[int, int], int]):
        self._size_at = size_at

    def rows(self, plan: list[tuple[int, int]], minibatches: int) -> list[int]:
        """The rows each minibatch of ``plan`` (an epoch beginning at the clock's minibatch count ``minibatches``) is
        handed to the step with."""
        return padded_rows(plan, minibatches, self._size_at)

    @staticmethod
    def batch(batch: Any, rows: int) -> tuple:
        """``batch`` padded to ``rows`` rows: :func:`pad_batch`."""
        return pad_batch(batch, rows)


def pad_batch(batch: Any, rows: int) -> tuple:
    """``(x, y, sample_weight, mask)``: the host batch ``batch`` (``x``, ``(x, y)`` or ``(x, y, sample_weight)``,
    NumPy leaves) padded to ``rows`` rows as kfit's JAX engine pads a worker's share (``pad_share``: copies of its
    last row, sample weight 0 on them, 1 where ``batch`` has none), and ``mask`` 1 on its real rows, 0 on the
    padding rows."""
    from kfit.distributed._jax_engine import batch_rows, pad_share

    real = batch_rows(batch)
    mask = np.zeros((rows,), np.float32)
    mask[:real] = 1.0
    return (*pad_share(batch, rows, weights=True, xp=np), mask)


def check(model: Any) -> None:
    """Raises ValueError when padding would not be exact for ``model`` (built, compiled), naming why and what to do.

    Called when training begins (the compiled losses are built then), where the step is compiled per shape. Warns
    when some metric's training value will include the padding rows."""
    from kfit.distributed._evaluation import _defined_by_keras, training_metrics_split

    for method in ("train_step", "compute_loss", "compute_metrics"):
        if not _defined_by_keras(model, method):
            raise ValueError(
                f"pad_remainders=True needs Keras's own {method}: {type(model).__name__} defines its own, which "
                f"would see the padding rows. {FIX}")
    for name, reduction in _backend.loss_reductions(model):
        if reduction not in EXACT_REDUCTIONS:
            raise ValueError(
                f"pad_remainders=True needs every loss reduced by one of {list(EXACT_REDUCTIONS)}; loss {name!r} has "
                f"reduction={reduction!r}, for which the padding rows would change the loss. {FIX}")
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, keras.layers.BatchNormalization):
            raise ValueError(
                f"pad_remainders=True cannot pad for layer {layer.name!r} (BatchNormalization): its batch statistics "
                f"would include the padding rows. {FIX}")
        if getattr(layer, "activity_regularizer", None) is not None:
            raise ValueError(
                f"pad_remainders=True cannot pad for layer {layer.name!r}: its activity regularizer is a mean over "
                f"the rows, padding rows included. {FIX}")
    split = training_metrics_split(model)
    if split is not None and split[1]:
        import warnings

        names = ", ".join(f"{m.name!r} ({type(m).__name__})" for m in split[1])
        warnings.warn(f"pad_remainders=True: the state of metric {names} may not be a sum over samples, so its "
                      f"training value includes the padding rows of a padded minibatch (the loss, the gradient and "
                      f"the other metrics stay exact).", stacklevel=3)


def install(model: Any) -> Callable[[], None]:
    """Makes ``model.fit`` train ``model`` on padded batches (:func:`pad_batch`): Keras's own step, jitted as Keras
    jits it, reads the row mask off each batch. Returns the function that undoes it (nothing of it stays on the
    model)."""
    from kfit.distributed._evaluation import training_metrics_split

    ops = keras.ops
    original_step = model.train_step

    def train_step(*arguments: Any) -> Any:  # (state, data) on JAX, (data,) on TensorFlow
        *state, data = arguments
        *batch, mask = data
        real = ops.sum(mask)
        _engine.STEP.real, _engine.STEP.padding = real, ops.cast(ops.size(mask), real.dtype) - real
        try:
            return original_step(*state, tuple(batch))
        finally:
            _engine.STEP.real = _engine.STEP.padding = None

    original_loss = model.compute_loss

    def compute_loss(x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None,
                     training: bool = True) -> Any:
        real = _engine.step_real_count()
        if real is not None and (added := _backend.layers_that_added_losses(model)):
            raise ValueError(
                f"pad_remainders=True cannot pad for layer {added[0].name!r}: it adds a loss in its forward pass "
                f"(add_loss), which would include the padding rows. {FIX}")
        if real is not None and sample_weight is not None:

            def scaled(w: Any) -> Any:  # by rows / real: the loss's mean over the rows is the real rows' mean
                return w * ops.cast(ops.divide(ops.cast(ops.shape(w)[0], real.dtype), real), w.dtype)

            sample_weight = keras.tree.map_structure(scaled, sample_weight)
        return original_loss(x, y, y_pred, sample_weight, training=training)

    def counts_real_rows(tracker: Any) -> Callable:
        original = tracker.update_state

        def update_state(values: Any, sample_weight: Any = None) -> Any:
            # Keras weights the value by the batch's rows, or (TensorFlow: a batch dimension unknown to the trace,
            # each output's loss) by nothing: the padding rows go out of the first, the second counts the step once.
            real = _engine.step_real_count()
            return original(values, sample_weight=sample_weight if real is None or sample_weight is None else real)

        return update_state

    trackers = _backend.loss_trackers(model)
    object.__setattr__(model, "train_step", train_step)
    object.__setattr__(model, "compute_loss", compute_loss)
    for tracker in trackers:
        object.__setattr__(tracker, "update_state", counts_real_rows(tracker))
    _backend.exclude_padding_from_metrics(model, _engine.step_padding, lambda: training_metrics_split(model),
                                          tracker_count=False)
    model.train_function = None

    def uninstall() -> None:
        for owner, name in ((model, "train_step"), (model, "compute_loss"), (model, "compute_metrics"),
                            *((tracker, "update_state") for tracker in trackers)):
            vars(owner).pop(name, None)
        model.train_function = None

    return uninstall


__all__ = ["Padding", "check", "install", "pad_batch", "padded_rows"]
