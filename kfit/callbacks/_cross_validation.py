"""Cross-validation on the sample clock, whose results can steer and stop training (CNTK's CrossValidationConfig).

Also the evaluation that :class:`kfit.callbacks.Test` shares: validated data (arrays, h5py datasets, dicts
and lists of them), read minibatch by minibatch, evaluated with ``model.evaluate`` without disturbing the
training metrics of the epoch in progress.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from kfit import _backend, _checks
from kfit.callbacks._base import KfitCallback
from kfit.clock import Clock
from kfit.data._stream import flatten, pack, to_host
from kfit.interval import FULL_DATA_SWEEP, Interval

_PARTS = ("x", "y", "sample_weight")


def _describe(leaf: Any) -> str:
    shape = getattr(leaf, "shape", None)
    return f"{type(leaf).__name__} of shape {tuple(shape)}" if shape is not None else type(leaf).__name__


def _is_source(data: Any) -> bool:
    """A source that batches by itself: tf.data, a PyDataset, a torch DataLoader, a Grain dataset, a generator."""
    if isinstance(data, keras.utils.PyDataset) or hasattr(data, "__next__"):
        return True
    module = type(data).__module__
    return module.startswith(("tensorflow", "torch.utils.data", "grain."))


class EvaluationData:
    """Evaluation data checked once: anything ``model.evaluate`` accepts.

    Arrays ``(x, y)`` or ``(x, y, sample_weight)`` (NumPy arrays, h5py datasets, dicts/lists of them for
    several inputs; ``y`` may be None) are read minibatch by minibatch, so an h5py dataset is never read
    whole. A source that batches by itself (``tf.data``, a ``keras.utils.PyDataset``, a torch
    ``DataLoader``, a Grain dataset, and, for an evaluation that runs once, a generator) is evaluated as it batches.
    ``model.evaluate`` applies Keras's own rules to the inputs (dict keys, shapes).

    Raises:
        TypeError: ``data`` is neither.
        ValueError: empty data, or arrays of different lengths.
    """

    def __init__(self, data: Any, owner: str, argument: str = "data", reusable: bool = True):
        self.owner, self.argument = owner, argument
        self.source: Any = None
        if _is_source(data) and not isinstance(data, (tuple, list)):
            if reusable and hasattr(data, "__next__"):
                raise TypeError(
                    f"Invalid value for argument `{argument}` of {owner}: a generator can be evaluated only once, "
                    f"and {owner} evaluates its data many times. Give arrays, a tf.data.Dataset, a "
                    "keras.utils.PyDataset, a torch DataLoader or a Grain dataset."
                )
            self.source, self.x, self.y, self.sample_weight = data, None, None, None
            self.num_samples = None
            return
        if not isinstance(data, (tuple, list)) or len(data) not in (2, 3):
            raise TypeError(
                f"Invalid value for argument `{argument}` of {owner}: expected a tuple (x, y) or (x, y, sample_weight) "
                "of arrays (NumPy arrays, h5py datasets, or dicts/lists of them for several inputs), or a source "
                "that batches itself (tf.data.Dataset, keras.utils.PyDataset, torch DataLoader, Grain dataset). "
                f"Received: {argument}={_describe(data)}"
            )
        parts = [to_host(part) for part in data] + [None] * (3 - len(data))
        self.x, self.y, self.sample_weight = parts
        lengths = {}
        for index, part in enumerate(parts):
            for leaf in flatten(part):
                if leaf is None:
                    continue
                if not (hasattr(leaf, "__len__") and hasattr(leaf, "shape") and hasattr(leaf, "__getitem__")):
                    raise TypeError(
                        f"Invalid value for argument `{argument}` of {owner}: {_PARTS[index]} must be arrays "
                        f"(NumPy arrays, h5py datasets, or dicts/lists of them). Received a {_describe(leaf)}"
                    )
                lengths.setdefault(_PARTS[index], set()).add(len(leaf))
        if "x" not in lengths:
            raise ValueError(f"Invalid value for argument `{argument}` of {owner}: x is None. Received: {argument}={data!r}")
        sizes = set().union(*lengths.values())
        if len(sizes) != 1:
            detail = ", ".join(f"{k}: {sorted(v)}" for k, v in lengths.items())
            raise ValueError(
                f"Invalid value for argument `{argument}` of {owner}: its arrays must hold one row per sample, "
                f"but their lengths differ ({detail})."
            )
        self.num_samples = sizes.pop()
        if self.num_samples == 0:
            raise ValueError(f"Invalid value for argument `{argument}` of {owner}: it holds no sample.")

    def check_model(self, model: Any) -> None:
        """Evaluates one minibatch of arrays now, so that data that does not fit the model (by Keras's own
        rules) is refused when training begins, not at the first evaluation."""
        if self.source is not None:
            return
        n = min(self.num_samples, 32)
        x, y, sample_weight = (_rows(part, 0, n) for part in (self.x, self.y, self.sample_weight))
        try:
            _keeping_training_state(model, lambda: model.evaluate(x, y, sample_weight=sample_weight, batch_size=n,
                                                                  verbose=0, return_dict=True))
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(
                f"Invalid value for argument `{self.argument}` of {self.owner}: model.evaluate refuses it: {error}"
            ) from error

    def check_same_on_workers(self) -> None:
        """Under data-parallel training, refuses (on every worker) arrays that differ between the workers in their
        length, shapes, dtypes or a few rows (one host collective; call it on every worker as training begins): each
        worker evaluates its share of the same data, and every worker decides the same on the results. A source
        that batches itself is not compared."""
        from kfit.distributed import _select, _state

        engine = _select.current()
        if engine is None or engine.size() == 1:
            return
        if self.source is not None:
            check = _state.DataCheck(f"`{self.argument}` of {self.owner}", -2, type(self.source).__name__)
        else:
            leaves = [leaf for part in (self.x, self.y, self.sample_weight) for leaf in flatten(part)]
            check = _state.DataCheck(
                f"`{self.argument}` of {self.owner}", self.num_samples, _state.signature_of(leaves),
                _state.fingerprint(leaves, self.num_samples),
                fix=f"Under data-parallel training {self.owner} evaluates each worker's share of its data and every "
                    f"worker acts on the results of the whole set: give every worker the same full data (do not "
                    f"shard it yourself).")
        _state.check_same([check])

    def minibatches(self, batch_size: int, max_samples: int | None = None) -> Any:
        """The first ``max_samples`` samples (default: all) in minibatches of ``batch_size``; a source as it
        batches itself (its first minibatches up to ``max_samples`` samples)."""
        if self.source is not None:
            return _SourceBatches(self.source, max_samples)
        count = self.num_samples if max_samples is None else min(self.num_samples, max_samples)
        return _Minibatches(self, count, batch_size)


def _rows(part: Any, lo: int, hi: int) -> Any:
    """Rows ``[lo, hi)`` of every array of ``part`` (read from h5py only now)."""
    if part is None:
        return None
    return pack(part, [None if leaf is None else np.asarray(leaf[lo:hi]) for leaf in flatten(part)])


class _Share:
    """The rows ``[lo, hi)`` of the ``num_samples`` rows of an evaluation that this worker evaluates."""

    @property
    def local_samples(self) -> int:
        """The samples this worker evaluates."""
        return self.hi - self.lo

    def select(self, sharded: bool) -> bool:
        """Makes this worker evaluate its share when ``sharded`` and there are at least as many rows as workers
        (the same decision on every worker), else all rows; returns whether it did."""
        from kfit.distributed import _evaluation, _select

        engine = _select.current()
        size = engine.size() if engine is not None else 1
        if not sharded or size == 1 or self.num_samples < size:
            self.lo, self.hi = 0, self.num_samples
            return False
        self.lo, self.hi = _evaluation.share(self.num_samples, engine.rank(), size)
        return True


class _Minibatches(_Share, keras.utils.PyDataset):
    """Consecutive minibatches of evaluation data, read lazily (an h5py dataset is never read whole).

    ``num_samples`` and :attr:`num_minibatches` describe the whole evaluation; the rows this worker
    evaluates are ``[lo, hi)`` (all of them unless :meth:`select` shards them), and ``len()`` counts the
    minibatches of those rows (what Keras iterates).
    """

    def __init__(self, data: EvaluationData, num_samples: int, batch_size: int):
        super().__init__()
        self.data, self.num_samples, self.batch_size = data, num_samples, batch_size
        self.lo, self.hi = 0, num_samples

    def __len__(self) -> int:
        return math.ceil((self.hi - self.lo) / self.batch_size)

    @property
    def num_minibatches(self) -> int:
        """The minibatches of the whole evaluation (as one worker evaluates it)."""
        return math.ceil(self.num_samples / self.batch_size)

    def parts(self) -> tuple:
        return self.data.x, self.data.y, self.data.sample_weight

    def in_memory(self) -> bool:
        """True when every array is a NumPy array (no h5py dataset to read by minibatch)."""
        return all(isinstance(leaf, np.ndarray) for part in self.parts() for leaf in flatten(part) if leaf is not None)

    def __getitem__(self, index: int) -> tuple:
        lo = self.lo + index * self.batch_size
        hi = min(lo + self.batch_size, self.hi)
        x, y, sw = (_rows(p, lo, hi) for p in self.parts())
        if isinstance(x, tuple):
            x = list(x)  # Keras reads a tuple inside the batch as (x, y, ...)
        if sw is not None:
            return x, y, sw
        return (x, y) if y is not None else (x,)


class _SourceBatches(_Share):
    """A source's minibatches, read (up to ``max_samples`` samples) and counted (``num_samples``, ``len``);
    :meth:`select` picks this worker's share of the rows after :meth:`read`."""

    def __init__(self, source: Any, max_samples: int | None):
        self.source, self.max_samples = source, max_samples
        self.num_samples = 0
        self.count = 0
        self.lo, self.hi = 0, 0

    def __len__(self) -> int:
        return self.count

    @property
    def num_minibatches(self) -> int:
        """The source's minibatches read (the whole evaluation's)."""
        return self.count

    def read(self) -> tuple:
        """The minibatches, read now and laid end to end: ``(x, y, sample_weight, batch_size)`` arrays that
        Keras's own array path evaluates in minibatches of the source's size."""
        from kfit import _backend
        from kfit.data._source import batch_size_of

        inner = _backend.keras_data_adapter(self.source, None, None, None, None, False, None)
        inner.on_epoch_begin()
        batches, sizes = [], []
        for batch in _backend.numpy_batches(inner):
            if self.max_samples is not None and self.num_samples >= self.max_samples:
                break
            sizes.append(batch_size_of(batch))
            self.num_samples += sizes[-1]
            batches.append(batch if isinstance(batch, tuple) else (batch,))
        inner.on_epoch_end()
        self.count = len(batches)
        parts = [keras.tree.map_structure(lambda *leaves: np.concatenate(leaves), *part) if part[0] is not None
                 else None for part in zip(*batches)]
        return (*parts, *[None] * (3 - len(parts)), max(sizes) if sizes else None)


def check_minibatch_size(value: Any, owner: str) -> Any:
    """An int, or a ``kfit.schedules.minibatch_size`` schedule; anything else is refused."""
    from kfit import schedules

    is_schedule = isinstance(value, schedules.HyperparameterSchedule)
    if is_schedule and value.kind == "minibatch_size":
        return value
    if not is_schedule and _checks.is_integer(value) and value >= 1:
        return int(value)
    received = f" a {value.kind} schedule: {value!r}" if is_schedule else f": minibatch_size={value!r}"
    raise ValueError(f"Invalid value for argument `minibatch_size` of {owner}: expected a positive integer or "
                     f"kfit.schedules.minibatch_size(...). Received{received}")


DEFAULT_MINIBATCH_SIZE = 32


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def cntk_keywords(owner: str, minibatch_size: Any, mb_size: Any, criterion: Any, model_inputs_to_streams: Any) -> Any:
    """The evaluation minibatch size once CNTK's ``CrossValidationConfig``/``TestConfig`` keywords are read, checked
    (:func:`check_minibatch_size`).

    ``mb_size`` is CNTK's deprecated name of ``minibatch_size``: taken for it (refused when both are given
    and differ). ``criterion`` and ``model_inputs_to_streams`` have no counterpart in Keras: refused, saying
    what to write instead. ``minibatch_size`` None: the default, 32.
    """
    if criterion is not None:
        raise ValueError(
            f"Invalid value for argument `criterion` of {owner}: CNTK's criterion Function (loss, metric) has no "
            f"counterpart in kfit: {owner} evaluates the model's compiled loss and metrics. Give them to "
            "model.compile(loss=..., metrics=['accuracy']), choose the one that gives average_error with "
            "metric='accuracy' (default: the first compiled metric; an accuracy is reported as CNTK's error, "
            f"1 - accuracy), and leave criterion out. Received: criterion={_short(criterion)}"
        )
    if model_inputs_to_streams is not None:
        raise ValueError(
            f"Invalid value for argument `model_inputs_to_streams` of {owner}: kfit reads the data as model.evaluate "
            "does, (x, y) in the model's input order (or a dict keyed by the input names); there are no streams to "
            f"map: leave model_inputs_to_streams out. Received: model_inputs_to_streams={_short(model_inputs_to_streams)}"
        )
    if mb_size is not None:
        if minibatch_size is not None and minibatch_size is not mb_size and minibatch_size != mb_size:
            raise ValueError(
                f"Arguments `minibatch_size` and `mb_size` of {owner} disagree: mb_size is CNTK's deprecated name of "
                f"minibatch_size; give one of them. Received: minibatch_size={minibatch_size!r}, mb_size={mb_size!r}"
            )
        minibatch_size = mb_size
    return check_minibatch_size(DEFAULT_MINIBATCH_SIZE if minibatch_size is None else minibatch_size, owner)


def cntk_data(owner: str, data: Any, minibatch_source: Any, source: Any, optional: bool = False) -> Any:
    """The evaluation data, given as ``data`` or by CNTK's names ``minibatch_source`` (and its deprecated
    ``source``): exactly one of them, or none (None) when ``optional``."""
    given = [(name, value) for name, value in (("data", data), ("minibatch_source", minibatch_source),
                                                ("source", source)) if value is not None]
    if not given and optional:
        return None
    if len(given) != 1:
        received = ", ".join(f"{name} (a {_describe(value)})" for name, value in given) or "none of them"
        alone = (", or only a callback, called with no evaluation as by CNTK's CrossValidationConfig(None, "
                 "frequency, callback=f)") if owner == "CrossValidation" else ""
        raise TypeError(
            f"{owner} needs its evaluation data once: give data=(x, y) (CNTK's minibatch_source and source are "
            f"accepted as its names){alone}. Received: {received}"
        )
    return given[0][1]


def check_metric(metric: Any) -> str | None:
    """``metric``, a metric's name or None; anything else is refused."""
    if metric is not None and (not isinstance(metric, str) or not metric):
        raise ValueError(f"Invalid value for argument `metric`: expected a metric's name or None. Received: metric={metric!r}")
    return metric


def minibatch_size_at(size: Any, clock: Clock | None) -> int:
    """The evaluation minibatch size at the clock's reading (a schedule's value, or the int)."""
    if isinstance(size, int):
        return size
    samples, minibatches = (clock.samples, clock.minibatches) if clock is not None else (0, 0)
    return int(size.value(samples, minibatches))


def is_accuracy(name: str) -> bool:
    """Whether a metric is an accuracy, reported as CNTK's classification error ``1 - accuracy``."""
    return name == "acc" or name.endswith("_acc") or name.endswith("accuracy")


def choose_metric(model: Any, results: dict, metric: str | None, owner: str) -> str:
    """The key of ``results`` that gives the average error: ``metric``, else the first compiled metric,
    else the loss."""
    if metric is not None:
        for key in (metric, metric[4:] if metric.startswith("val_") else None, metric[5:] if metric.startswith("test_") else None):
            if key in results:
                return key
        raise ValueError(
            f"Invalid value for argument `metric` of {owner}: the evaluation gives {sorted(results)}. "
            f"Received: metric={metric!r}"
        )
    for tracker in getattr(model, "metrics", []):
        for m in getattr(tracker, "metrics", None) or [tracker]:
            name = getattr(m, "name", None)
            if name in results and not name.endswith("loss"):
                return name
    others = [k for k in results if not k.endswith("loss")]
    return others[0] if others else ("loss" if "loss" in results else sorted(results)[0])


def average_error(name: str, value: float) -> float:
    """CNTK's average error: ``1 - accuracy`` for an accuracy, else the value itself."""
    return 1.0 - value if is_accuracy(name) else value


def evaluation_logs(callback: Any, prefix: str, owner: str, max_samples: int | None = None) -> tuple:
    """Evaluates ``callback.data`` (in minibatches of ``callback.minibatch_size`` at the run's clock) and
    sets ``callback.evaluated_samples``; returns the logs, ``<prefix>_<name>`` for every result then
    ``<prefix>_average_error``, ``<prefix>_samples`` and ``<prefix>_minibatches``, and the key and value of
    the result that gives the average error (:func:`choose_metric` of ``callback.metric``)."""
    model = callback.model  # on JAX this syncs the loop's state into the variables
    size = minibatch_size_at(callback.minibatch_size, callback.training_run.clock)
    batches = callback.data.minibatches(size, max_samples)
    results = evaluate(model, batches)
    callback.evaluated_samples = batches.local_samples
    key = choose_metric(model, results, callback.metric, owner)
    logs: dict[str, Any] = {f"{prefix}_{k}": v for k, v in results.items()}
    logs[f"{prefix}_average_error"] = average_error(key, results[key])
    logs[f"{prefix}_samples"] = batches.num_samples
    logs[f"{prefix}_minibatches"] = batches.num_minibatches
    return logs, key, results[key]


def evaluate(model: Any, batches: Any) -> dict[str, Any]:
    """``model.evaluate`` on ``batches``, leaving the training metrics and the training mode as they were.

    ``model.evaluate`` resets the metrics that training accumulates over the epoch; their values are put
    back afterwards, so an evaluation in the middle of an epoch does not change the epoch's logs.

    When more than one worker trains and the model's metrics can be combined
    (:func:`kfit.distributed._evaluation.why_not_sharded`), each worker evaluates only its contiguous share
    of the rows (``batches.lo``, ``batches.hi``) and the metric states are summed over the workers: every
    worker returns the results of the whole set. Every worker must call it at the same point then.
    """
    from kfit.distributed import _evaluation

    shardable = _evaluation.can_shard(model)
    if isinstance(batches, _SourceBatches):
        x, y, sample_weight, size = batches.read()
        sharded = batches.select(shardable)
        if sharded:
            x, y, sample_weight = (_rows(p, batches.lo, batches.hi) for p in (x, y, sample_weight))
        return _keeping_training_state(model, lambda: model.evaluate(
            x, y, sample_weight=sample_weight, batch_size=size, verbose=0, return_dict=True), sharded)
    sharded = batches.select(shardable)
    if batches.in_memory():  # NumPy arrays: Keras's own array path (its rules for shapes and dict inputs)
        x, y, sample_weight = (_rows(p, batches.lo, batches.hi) for p in batches.parts())
        return _keeping_training_state(model, lambda: model.evaluate(
            x, y, sample_weight=sample_weight, batch_size=batches.batch_size, verbose=0, return_dict=True), sharded)
    return _keeping_training_state(model, lambda: model.evaluate(batches, verbose=0, return_dict=True), sharded)


def _keeping_training_state(model: Any, run: Callable[[], dict], combine: bool = False) -> dict[str, Any]:
    # (A model's compiled metrics may be built by this very evaluation: only those that existed are put back.)
    saved = [(v, np.array(_backend.to_numpy(v))) for v in model.metrics_variables]
    training = getattr(model, "training", None)  # torch modules: evaluate() switches to eval mode
    try:
        results = run()
        if combine:
            from kfit.distributed import _evaluation

            results = _evaluation.combine_metric_states(model)
    finally:
        for variable, value in saved:
            variable.assign(value)
        if training is True and callable(getattr(model, "train", None)):
            model.train()
        _backend.record_state_sharding(model)
    return {k: _checks.log_value(v) for k, v in results.items()}


class CrossValidation(KfitCallback):
    """Evaluates the model on ``data`` every ``frequency`` samples and lets a callback steer training.

    At the end of the step where the clock crosses a multiple of ``frequency`` (default ``"1ep"``: at every
    epoch end), the model is evaluated on the first ``max_samples`` samples of ``data`` in minibatches of
    ``minibatch_size`` (an int or a ``kfit.schedules.minibatch_size`` schedule, read at the clock), then
    ``callback(index, average_error, cv_num_samples, cv_num_minibatches)`` is called (``index`` counts
    evaluations from 0). Its return value steers training: ``False`` stops it after the current step;
    ``True`` or ``None`` continue; anything else is a ``TypeError``. The callback may change the learning
    rate (``LearningRateSchedule.learning_rate()`` / ``reset_learning_rate``) or any schedule.

    ``average_error`` is the value of ``metric`` (a compiled metric's name; default: the first compiled
    metric, else the loss), or ``1 - accuracy`` when that metric is an accuracy (CNTK's classification
    error).

    Then every kfit callback of the run receives ``on_cross_validation_end(index, logs)`` (early stopping,
    learning-rate reduction, progress printers, CSV writers react in the same step), with ``logs`` holding
    ``val_<name>`` for every evaluation result, ``val_average_error``, ``val_samples``,
    ``val_minibatches``, ``val_index`` and ``samples`` (the clock). The latest results of an epoch also go
    into that epoch's logs (and so into the ``History``), replacing ``validation_data``'s results of the
    same names; epochs without an evaluation have none. All
    results are kept in :attr:`results` and in the state that checkpoints save (the user's callback keeps
    its own state).

    The evaluation uses ``model.evaluate``; the training metrics of the epoch in progress are put back
    afterwards.

    Under data-parallel training (more than one worker), each worker evaluates only its contiguous share of
    the samples and the metrics' states are summed over the workers (one allreduce), so every worker gets
    the single-process results and its callbacks decide the same; :attr:`evaluated_samples` is the share's
    size. Every worker must be given the same ``data``. A model with a metric whose state is not a sum over
    samples (see the README's "Sharded evaluation") is evaluated whole on every worker.

    Args:
        data: ``(x, y)`` or ``(x, y, sample_weight)``: NumPy arrays, h5py datasets (read one minibatch at
            a time), or dicts/lists of them for several inputs. Or None with a ``callback``, as CNTK's
            ``CrossValidationConfig(None, frequency, callback=f)``: nothing is evaluated; at each ``frequency``
            the callback alone is called, with ``average_error`` 0.0 and 0 samples and minibatches (its return
            value steers training as above; no ``val_*`` results are logged).
        frequency: samples between evaluations (a positive int), or an interval string (``"2ep"``, ``"100mb"``,
            ``"5000sp"``, or a :class:`kfit.interval.Interval`); by default ``"1ep"``: at the end of every
            epoch; None is the same. CNTK's ``sys.maxsize`` (one evaluation, at the end of training) is refused,
            saying what to give instead (:class:`Test` evaluates the final model); CNTK's None meant the same
            once-at-the-end, but in kfit None has always meant every epoch end and keeps that meaning.
        minibatch_size: the evaluation's minibatch size: a positive int or a minibatch-size schedule (None:
            32).
        callback: ``callback(index, average_error, cv_num_samples, cv_num_minibatches) -> bool | None``.
        max_samples: evaluate on at most this many samples of ``data`` (None, or CNTK's
            ``kfit.cntk.FULL_DATA_SWEEP``: all).
        metric: the result that gives ``average_error`` (e.g. ``"accuracy"``, ``"loss"``).
        name: the key of this callback's state in checkpoints.
        minibatch_source, source: CNTK's names of ``data`` (``source`` deprecated there), taken for it; give
            one of the three.
        mb_size: CNTK's deprecated name of ``minibatch_size``, taken for it (refused when both are given and
            differ).
        criterion, model_inputs_to_streams: CNTK's ``CrossValidationConfig`` arguments with no counterpart in
            Keras (the evaluation uses the model's compiled loss and metrics, on ``(x, y)`` in the model's input
            order): accepted as None only; anything else is refused, saying what to write instead.

    Raises:
        TypeError: ``data`` not in one of the forms above or given not exactly once (none only with a
            ``callback``), or ``callback`` not callable.
        ValueError: a bad ``frequency``, ``minibatch_size``, ``max_samples`` or ``metric``, a ``criterion``
            or ``model_inputs_to_streams``, named with the value; at the start of training, ``data`` whose
            inputs do not fit the model.

    Example:
        >>> import numpy as np, kfit
        >>> x, y = np.zeros((100, 8), "float32"), np.zeros((100,), "int64")
        >>> def adjust(index, average_error, num_samples, num_minibatches):
        ...     return average_error > 0.01  # False stops training
        >>> cv = kfit.callbacks.CrossValidation((x, y), frequency=3000, minibatch_size=50, callback=adjust)
        >>> cv.frequency, cv.data.num_samples
        (3000, 100)
    """

    default_name = "cross_validation"
    order = -10

    def __init__(
        self,
        data: Any = None,
        frequency: int | str | Interval | None = "1ep",
        minibatch_size: Any = None,
        callback: Callable[[int, float, int, int], bool | None] | None = None,
        max_samples: int | None = None,
        metric: str | None = None,
        name: str | None = None,
        *,
        minibatch_source: Any = None,
        source: Any = None,
        mb_size: Any = None,
        criterion: Any = None,
        model_inputs_to_streams: Any = None,
    ):
        super().__init__(name=name)
        owner = "CrossValidation"
        data = cntk_data(owner, data, minibatch_source, source, optional=callback is not None)
        self.minibatch_size = cntk_keywords(owner, minibatch_size, mb_size, criterion, model_inputs_to_streams)
        if isinstance(frequency, int) and not isinstance(frequency, bool) and frequency >= sys.maxsize:
            # CNTK's CrossValidationConfig: sys.maxsize (or None) is one cross-validation, at the end of training.
            raise ValueError(
                "Invalid value for argument `frequency`: expected a number of samples reached in training or an interval "
                f"string such as '2ep' (leave it out: every epoch end). Received: frequency={frequency!r}. In CNTK's "
                "CrossValidationConfig, sys.maxsize means 'once, at the end of training'; CrossValidation "
                "evaluates on the clock and would never evaluate at it. For an evaluation of the final model use "
                "kfit.callbacks.Test(data, minibatch_size) (its results are in the History); to cross-validate after "
                "the last epoch, give frequency=f'{epochs}ep'; for every epoch end, leave frequency out or give '1ep'.")
        if frequency is None:  # kfit's meaning since the start (every epoch end); CNTK's None is once at the end
            frequency = "1ep"
        self.data = None if data is None else EvaluationData(data, owner)
        #: When it evaluates: an :class:`kfit.interval.Interval` (by default every epoch end, ``"1ep"``).
        self.interval = Interval.parse(frequency)
        self.frequency = self.interval.value if self.interval.unit == "sp" else None
        if callback is not None and not callable(callback):
            raise TypeError(f"Invalid value for argument `callback`: expected a callable or None. Received: callback={callback!r}")
        self.callback = callback
        if max_samples is FULL_DATA_SWEEP:  # CNTK's one pass over the data: all of it
            max_samples = None
        self.max_samples = _checks.count("max_samples", max_samples, low=1, allow_none=True)
        self.metric = check_metric(metric)
        self._restored = False
        #: The samples this worker evaluated in the latest evaluation (its share when sharded; 0 before any).
        self.evaluated_samples = 0
        self._reset()

    def _reset(self) -> None:
        #: Every evaluation's logs (what ``on_cross_validation_end`` received), oldest first.
        self.results: list[dict[str, Any]] = []
        self._epoch_logs: dict[str, Any] = {}

    @property
    def index(self) -> int:
        """The index of the next evaluation (evaluations so far)."""
        return len(self.results)

    # -- hooks -----------------------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.data is not None:
            self.data.check_same_on_workers()
            self.data.check_model(self.training_model)
        if not self._restored:
            self._reset()
        self._restored = False

    def on_train_end(self, logs: dict | None = None) -> None:
        self._restored = False

    def on_step_end(self, clock: Clock, logs: dict | None) -> None:
        if self.interval.unit != "ep" and clock.crossed(self.interval):
            self.cross_validate()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.interval.unit == "ep" and (epoch + 1) % self.interval.value == 0:
            self.cross_validate()
        if logs is not None and self._epoch_logs:
            self._add_to_epoch_logs(epoch, logs, self._epoch_logs)
        self._epoch_logs = {}

    # -- the evaluation --------------------------------------------------------------------------
    def cross_validate(self) -> dict[str, Any]:
        """Evaluates now, calls the user's callback, tells the run's kfit callbacks; returns the logs."""
        clock = self.clock
        if self.data is None:  # CNTK's CrossValidationConfig(None, ..., callback=f): the callback alone, told 0, 0, 0
            logs = {"val_index": self.index, "samples": clock.samples}
            self.results.append(dict(logs))
            self._call_back(logs["val_index"], 0.0, 0, 0)
            return logs
        logs, _, _ = evaluation_logs(self, "val", "CrossValidation", self.max_samples)
        index = self.index
        logs.update(val_index=index, samples=clock.samples)
        self.results.append(dict(logs))
        self._epoch_logs = {k: v for k, v in logs.items() if k.startswith("val_")}
        self._call_back(index, logs["val_average_error"], logs["val_samples"], logs["val_minibatches"])
        self.publish("on_cross_validation_end", index, dict(logs))
        return logs

    def _call_back(self, index: int, error: float, samples: int, minibatches: int) -> None:
        if self.callback is None:
            return
        verdict = self.callback(index, error, samples, minibatches)
        if verdict is not None and not isinstance(verdict, (bool, np.bool_)):
            raise TypeError(
                f"The cross-validation callback {getattr(self.callback, '__name__', self.callback)!r} must return "
                f"True (continue), False (stop training) or None. Received: {verdict!r} at index {index}."
            )
        if verdict is not None and not verdict:
            self.training_model.stop_training = True

    def _add_to_epoch_logs(self, epoch: int, logs: dict, values: dict) -> None:
        """Puts ``values`` into the epoch's logs; under kfit.fit, where the run's History is called first and
        has already recorded this epoch, into the History too."""
        before = set(logs)
        logs.update(values)
        history = self.training_run.history
        if history is None or not getattr(history, "epoch", None) or history.epoch[-1] != epoch:
            return
        for key, value in values.items():
            series = history.history.setdefault(key, [])
            if key in before and series:
                series[-1] = value
            else:
                series.append(value)

    # -- state -----------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {"results": [dict(r) for r in self.results], "epoch_logs": dict(self._epoch_logs)}

    def renamed_state(self, state: dict[str, Any], renamed: Any) -> dict[str, Any]:
        """``state`` with its results under this model's log keys (a restore's ``renamed``)."""
        return dict(state, results=[{renamed(k): v for k, v in r.items()} for r in state.get("results", [])],
                    epoch_logs={renamed(k): v for k, v in state.get("epoch_logs", {}).items()})

    def set_state(self, state: dict[str, Any]) -> None:
        if "results" not in state:
            raise ValueError(f"CrossValidation state {self.name!r} is missing 'results'. Received keys: {sorted(state)}")
        self.results = [dict(r) for r in state["results"]]
        self._epoch_logs = dict(state.get("epoch_logs", {}))
        self._restored = True
