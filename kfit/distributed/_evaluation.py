"""Sharded evaluation: each worker evaluates its contiguous share, the metrics' states are summed.

A Keras metric keeps its state in ``metric.variables``; for most of Keras's metrics that state is a sum
over samples (``Mean``: the sum of ``weight * value`` and the sum of weights; confusion-matrix metrics:
counts per threshold; ``R2Score``: sums and sums of squares). Such a state summed over the workers'
shares is the state one worker would hold after evaluating the whole set, and ``metric.result()`` on it is
the single-process number (to the float reduction order). The loss tracker is a ``Mean`` of minibatch
losses weighted by the minibatch size, i.e. the sum of ``weight * loss`` over samples: additive as well.

:func:`can_shard` says whether a model's metrics are all of that kind (else every worker evaluates the whole
set); :func:`share` gives a worker's rows; :func:`combine_metric_states` sums the states over the workers
(one allreduce) and returns the model's results. Every worker must call :func:`combine_metric_states` at
the same point (it is a collective).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kfit.distributed import _select


def _additive_classes() -> tuple[type, ...]:
    """Keras's metric classes whose state is a sum over samples (subclasses included)."""
    m = keras.metrics
    return (
        m.Mean, m.Sum,  # and every MeanMetricWrapper: accuracies, crossentropies, MSE, MAE, RMSE...
        m.TruePositives, m.TrueNegatives, m.FalsePositives, m.FalseNegatives,
        m.Precision, m.Recall, m.AUC,
        m.PrecisionAtRecall, m.RecallAtPrecision, m.SensitivityAtSpecificity, m.SpecificityAtSensitivity,
        m.IoU, m.BinaryIoU, m.MeanIoU, m.OneHotIoU, m.OneHotMeanIoU,
        m.FBetaScore, m.R2Score,
    )


def additive_metric_variables(model: Any) -> list:
    """The variables of ``model``'s metrics whose state is a sum over samples (the Keras classes above): the sum
    of two workers' values of such a variable is the value one worker would hold after both shares."""
    additive = _additive_classes()
    return [v for metric in leaf_metrics(model) or [] if isinstance(metric, additive) for v in metric.variables]


def share(num_samples: int, rank: int, size: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of ``num_samples`` that worker ``rank`` of ``size`` evaluates: contiguous shares
    whose lengths differ by at most one, in rank order (the first shares are the shorter ones).

    Example:
        >>> [share(5, r, 2) for r in range(2)]
        [(0, 2), (2, 5)]
    """
    return num_samples * rank // size, num_samples * (rank + 1) // size


def leaf_metrics(model: Any) -> list | None:
    """The model's metrics, compiled ones unpacked; None when the compiled metrics are not built yet."""
    leaves = []
    for metric in getattr(model, "metrics", []):
        if type(metric).__name__ == "CompileMetrics":  # keras.src.trainers.compile_utils: holds the compiled ones
            if not metric.built:
                return None
            leaves.extend(metric.metrics)
        else:
            leaves.append(metric)
    return leaves


def _defined_by_keras(model: Any, method: str) -> bool:
    owner = next((c for c in type(model).__mro__ if method in c.__dict__), None)
    return owner is not None and owner.__module__.startswith("keras.")


def why_not_sharded(model: Any) -> str | None:
    """None when ``model``'s evaluation can be sharded, else the reason (for logs and tests).

    Sharded: Keras's own ``test_step`` and ``compute_metrics``, and every metric an instance of a Keras metric
    class whose state is a sum over samples (see the module). Anything else is evaluated whole on every worker.
    """
    return _why_not_additive(model, ("test_step", "compute_metrics"))


def training_metrics_split(model: Any) -> tuple[list, list] | None:
    """``(additive, other)``: ``model``'s metrics whose state is a sum over samples and the rest, when Keras's own
    ``train_step`` and ``compute_metrics`` update them (the JAX engine can then take padding rows out of the
    additive ones exactly); None for a model with its own ``train_step`` or ``compute_metrics``."""
    if not all(_defined_by_keras(model, m) for m in ("train_step", "compute_metrics")):
        return None
    additive = _additive_classes()
    leaves = leaf_metrics(model) or []
    return [m for m in leaves if isinstance(m, additive)], [m for m in leaves if not isinstance(m, additive)]


def _why_not_additive(model: Any, methods: tuple[str, ...]) -> str | None:
    for method in methods:
        if not _defined_by_keras(model, method):
            return f"the model defines its own {method}"
    leaves = leaf_metrics(model)
    if leaves is None:
        return "the compiled metrics are not built yet"
    additive = _additive_classes()
    for metric in leaves:
        if not isinstance(metric, additive):
            return f"metric {metric.name!r} ({type(metric).__name__}) may hold a state that is not a sum over samples"
    return None


def can_shard(model: Any) -> bool:
    """True when more than one worker trains and ``model``'s metrics can be combined from shares."""
    engine = _select.current()
    return engine is not None and engine.size() > 1 and why_not_sharded(model) is None


def combine_metric_states(model: Any) -> dict[str, Any]:
    """Sums the model's metric states over the workers (one allreduce, in float64) and returns its results.

    Call it on every worker right after each evaluated its share; afterwards every worker's metrics hold the
    state of the whole set and the returned results (``model.get_metrics_result()``) are the same everywhere.
    """
    variables = list(model.metrics_variables)
    values = [np.asarray(keras.ops.convert_to_numpy(v.value)) for v in variables]
    flat = np.concatenate([v.astype(np.float64).ravel() for v in values]) if values else np.zeros(0)
    engine = _select.current()
    engine.before_host_collective()
    (total,) = engine.host_sum([flat], "kfit.evaluation")
    offset = 0
    for variable, value in zip(variables, values):
        part = total[offset:offset + value.size].reshape(value.shape)
        offset += value.size
        variable.assign(part.astype(value.dtype))
    return dict(model.get_metrics_result())
