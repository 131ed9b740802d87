"""``kfit.fit``: ``model.fit`` with a sample clock, a seekable stream and minibatch-size schedules.

The data flow reads straight: data -> :class:`~kfit.data.SampleStream` -> the plan (which minibatch comes
next, a function of the clock) -> a prefetching reader -> one compiled train step -> callbacks. When no
kfit-only feature is asked for, ``kfit.fit`` *is* ``model.fit`` with kfit's clock added, so migrating a
project changes nothing until a kfit feature is used.
"""

from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np

from kfit import _backend
from kfit.callbacks._base import PEERS_ATTRIBUTE, KfitCallback
from kfit.callbacks._minibatch_size_schedule import MinibatchSizeSchedule
from kfit.callbacks._sample_clock import SampleClock, apply_minibatch_size
from kfit.clock import Clock, attach_clock
from kfit.data._prefetch import Prefetcher
from kfit.data._pydataset import PyDatasetStream
from kfit.data._stream import SampleStream, dataset_length, flatten, is_streamable, pack
from kfit.training import _plan
from kfit.training._context import TrainingContext, attach_context
from kfit.training._summaries import EpochSummaries


def _check_positive_int(name: str, value: Any, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"Invalid value for argument `{name}`: expected a positive integer{' or None' if allow_none else ''}. Received: {name}={value!r}")


def _to_host(structure: Any) -> Any:
    """Backend tensors to NumPy; arrays and h5py datasets stay as they are (read lazily)."""
    leaves = flatten(structure)
    converted = []
    for leaf in leaves:
        if leaf is None or isinstance(leaf, np.ndarray) or type(leaf).__module__.startswith("h5py"):
            converted.append(leaf)
        elif keras.ops.is_tensor(leaf) or hasattr(leaf, "__array__"):
            converted.append(keras.ops.convert_to_numpy(leaf))
        else:
            converted.append(leaf)
    return pack(structure, converted)


def _split_validation(x: Any, y: Any, sample_weight: Any, split: float) -> tuple:
    """Keras's ``validation_split``: the last ``split`` fraction of the arrays, before shuffling."""
    if not 0.0 < split < 1.0:
        raise ValueError(f"Invalid value for argument `validation_split`: expected a float in (0, 1). Received: validation_split={split!r}")
    n = dataset_length(x)
    cut = int(math.floor(n * (1.0 - split)))
    if cut == 0 or cut == n:
        raise ValueError(f"`validation_split={split}` leaves no training or no validation sample out of {n}.")

    def part(structure: Any, lo: int, hi: int | None) -> Any:
        if structure is None:
            return None
        return pack(structure, [None if a is None else a[lo:hi] for a in flatten(structure)])

    train = (part(x, 0, cut), part(y, 0, cut), part(sample_weight, 0, cut))
    val = (part(x, cut, None), part(y, cut, None), part(sample_weight, cut, None))
    return train, val


def _class_weights(y: Any, class_weight: dict) -> np.ndarray:
    leaves = [a for a in flatten(y) if a is not None]
    if len(leaves) != 1:
        raise ValueError("`class_weight` needs a single target array `y` (one output). Use `sample_weight` for several outputs.")
    labels = np.asarray(leaves[0])
    if labels.ndim > 1 and labels.shape[-1] > 1:
        labels = labels.argmax(axis=-1)
    labels = labels.reshape(len(labels), -1)[:, 0].astype(np.int64)
    try:
        return np.array([class_weight[int(c)] for c in labels], dtype="float32")
    except KeyError as missing:
        raise ValueError(f"`class_weight` has no weight for class {missing}. Received: class_weight={class_weight!r}") from None


def ordered_callbacks(callbacks: list) -> list:
    """Callbacks sorted (stably) by their ``order``: see :attr:`kfit.callbacks.KfitCallback.order`."""
    return sorted(callbacks, key=lambda c: getattr(c, "order", 0))


def _should_validate(epoch: int, validation_freq: Any) -> bool:
    if isinstance(validation_freq, int):
        return (epoch + 1) % validation_freq == 0
    return (epoch + 1) in validation_freq


def _pythonify(logs: dict) -> dict:
    out = {}
    for key, value in logs.items():
        try:
            out[key] = float(keras.ops.convert_to_numpy(value))
        except (TypeError, ValueError):
            out[key] = value
    return out


def _size_function(minibatch_size: Any) -> tuple[Any, int | None]:
    """``size_at(samples, minibatches)`` and the fixed size (None for a schedule)."""
    from kfit import schedules

    if isinstance(minibatch_size, schedules.HyperparameterSchedule):
        if minibatch_size.kind != "minibatch_size":
            raise ValueError(
                "Invalid value for argument `minibatch_size`: expected an int or kfit.schedules.minibatch_size(...). "
                f"Received a {minibatch_size.kind} schedule: {minibatch_size!r}"
            )
        return (lambda s, m: int(minibatch_size.value(s, m))), None
    if isinstance(minibatch_size, (list, tuple)) or callable(minibatch_size):
        schedule = schedules.minibatch_size(minibatch_size)
        return (lambda s, m: int(schedule.value(s, m))), None
    _check_positive_int("minibatch_size", minibatch_size, allow_none=False)
    size = int(minibatch_size)
    return (lambda s, m: size), size


def fit(
    model: keras.Model,
    x: Any = None,
    y: Any = None,
    batch_size: Any = None,
    epochs: int | None = None,
    verbose: Any = "auto",
    callbacks: list | None = None,
    validation_split: float = 0.0,
    validation_data: Any = None,
    shuffle: Any = True,
    class_weight: dict | None = None,
    sample_weight: Any = None,
    initial_epoch: int = 0,
    steps_per_epoch: int | None = None,
    validation_steps: int | None = None,
    validation_batch_size: int | None = None,
    validation_freq: Any = 1,
    *,
    minibatch_size: Any = None,
    epoch_size: int | None = None,
    max_samples: int | None = None,
    seed: int | None = None,
    prefetch: int = 2,
) -> keras.callbacks.History:
    """Trains ``model`` like ``model.fit``, on kfit's sample clock.

    Every argument of ``model.fit`` keeps its meaning. kfit adds:

    * ``minibatch_size``: an int, or a ``kfit.schedules.minibatch_size`` schedule read at the clock's value
      whenever a minibatch is drawn (``batch_size`` is its alias);
    * ``epoch_size``: samples per epoch (default: one sweep over the training data); epochs are units of
      the clock, decoupled from sweeps. A minibatch never crosses an epoch boundary;
    * ``max_samples``: stop after this many samples; with ``epochs`` too, the first bound reached ends
      training;
    * ``seed``: the seed of the data stream's shuffling (each sweep is shuffled by ``(seed, sweep)``);
    * ``prefetch``: minibatches read ahead on a background thread.

    When none of these (nor a callback that needs the stream, such as ``kfit.callbacks.Checkpoint`` or
    ``MinibatchSizeSchedule``) is used, this is exactly ``model.fit`` plus kfit's clock: the same weights
    for the same seed. Otherwise training data (arrays, h5py datasets, dicts/lists/tuples of them) is read
    as a seekable :class:`kfit.data.SampleStream` by kfit's own training loop, which runs the model's
    compiled train step.

    Returns:
        The run's ``keras.callbacks.History``, with ``epoch_summaries``: a list of
        :class:`kfit.training.EpochSummary` (loss, metrics, samples, seconds, samples per second).

    Raises:
        ValueError: bad arguments, named with the value received.

    Example:
        >>> import numpy as np, keras, kfit
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> model.compile(optimizer="sgd", loss="mse")
        >>> x, y = np.ones((40, 3), "float32"), np.ones((40, 1), "float32")
        >>> history = kfit.fit(model, x, y, minibatch_size=8, max_samples=100, verbose=0)
        >>> [s.samples for s in history.epoch_summaries]
        [40, 40, 20]
    """
    callbacks = list(callbacks or [])
    if batch_size is not None and minibatch_size is not None and batch_size != minibatch_size:
        raise ValueError(
            f"Arguments `batch_size` and `minibatch_size` are aliases; give one. Received: batch_size={batch_size!r}, minibatch_size={minibatch_size!r}"
        )
    minibatch_size = minibatch_size if minibatch_size is not None else batch_size
    size_callbacks = [c for c in callbacks if isinstance(c, MinibatchSizeSchedule)]
    if len(size_callbacks) > 1:
        raise ValueError("Give at most one MinibatchSizeSchedule callback.")
    if size_callbacks:
        if minibatch_size is not None:
            raise ValueError("Give the minibatch size either as `minibatch_size=` or as a MinibatchSizeSchedule callback, not both.")
        minibatch_size = size_callbacks[0].schedule
    for name, value in (("epoch_size", epoch_size), ("max_samples", max_samples), ("epochs", epochs), ("steps_per_epoch", steps_per_epoch)):
        _check_positive_int(name, value)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ValueError(f"Invalid value for argument `seed`: expected a non-negative integer or None. Received: seed={seed!r}")
    if not isinstance(initial_epoch, int) or initial_epoch < 0:
        raise ValueError(f"Invalid value for argument `initial_epoch`: expected a non-negative integer. Received: initial_epoch={initial_epoch!r}")
    if class_weight is not None and sample_weight is not None:
        raise ValueError("Arguments `sample_weight` and `class_weight` cannot be given together (as in model.fit).")

    from kfit import distributed

    distributed_run = distributed.size() > 1
    kfit_features = (
        (minibatch_size is not None and not isinstance(minibatch_size, (int, np.integer)))
        or epoch_size is not None
        or max_samples is not None
        or seed is not None
        or distributed_run
        or any(getattr(c, "needs_stream", False) for c in callbacks)
    )
    if not kfit_features:
        return _fit_with_model_fit(
            model, x, y, minibatch_size, epochs if epochs is not None else 1, verbose, callbacks,
            validation_split, validation_data, shuffle, class_weight, sample_weight, initial_epoch,
            steps_per_epoch, validation_steps, validation_batch_size, validation_freq,
        )
    if isinstance(x, keras.utils.PyDataset):
        if y is not None or sample_weight is not None:
            raise ValueError("With a PyDataset as `x`, `y` and `sample_weight` come from the dataset's batches; pass x only.")
    elif not is_streamable(x):
        raise ValueError(
            "kfit's stream (needed for minibatch-size schedules, epoch_size, max_samples, seed, checkpoints "
            "that resume mid-epoch and Horovod) reads arrays (NumPy arrays, h5py datasets, or dicts/lists/tuples "
            f"of them) or a keras.utils.PyDataset. Received x of type {type(x).__name__}. Convert the data, or drop the kfit-only "
            "arguments to train through model.fit."
        )
    return _StreamFit(
        model, x, y, minibatch_size if minibatch_size is not None else 32, epochs, verbose, callbacks,
        validation_split, validation_data, shuffle, class_weight, sample_weight, initial_epoch,
        steps_per_epoch, validation_steps, validation_batch_size, validation_freq,
        epoch_size, max_samples, seed, prefetch,
    ).run()


def _fit_with_model_fit(model, x, y, batch_size, epochs, verbose, callbacks, validation_split, validation_data,
                        shuffle, class_weight, sample_weight, initial_epoch, steps_per_epoch, validation_steps,
                        validation_batch_size, validation_freq) -> keras.callbacks.History:
    """No kfit-only feature asked for: ``model.fit`` itself, with kfit's clock kept by a SampleClock."""
    n = dataset_length(x) if is_streamable(x) else None
    if n is not None and validation_split and validation_data is None:
        n = int(math.floor(n * (1.0 - validation_split)))
    clock = attach_clock(model, Clock())
    clock_callbacks: list = []
    if n is not None and steps_per_epoch is None:
        clock_callbacks.append(SampleClock(batch_size=int(batch_size or 32), num_samples=n))
    history = RunHistory()
    summaries = EpochSummaries(history)
    callbacks = ordered_callbacks(clock_callbacks + callbacks + [summaries])
    object.__setattr__(model, PEERS_ATTRIBUTE, [])
    context = TrainingContext(clock=clock, callbacks=callbacks, history=history, kfit_fit=False, epochs=epochs)
    attach_context(model, context)
    try:
        model.fit(
            x, y, batch_size=batch_size, epochs=epochs, verbose=verbose,
            callbacks=callbacks + [history],
            validation_split=validation_split, validation_data=validation_data, shuffle=shuffle,
            class_weight=class_weight, sample_weight=sample_weight, initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
            validation_batch_size=validation_batch_size, validation_freq=validation_freq,
        )
    finally:
        attach_context(model, None)
    history.epoch_summaries = summaries.summaries
    return history


class RunHistory(keras.callbacks.History):
    """The run's History: called last at every epoch end (after cross-validation and the controllers
    have added their results to the logs); one per ``kfit.fit`` call, so it does not clear itself when
    training begins (a checkpoint restores it)."""

    order = 1000

    def on_train_begin(self, logs: dict | None = None) -> None:
        if not hasattr(self, "epoch"):
            self.epoch = []


class _BatchHooks:
    """Calls the per-step hooks of a run's callbacks without forcing a device sync at every step.

    ``keras.callbacks.CallbackList`` converts the step's logs to Python floats before calling any
    callback that overrides a batch hook, which blocks on the device at every step. kfit's callbacks
    take the logs as they are (and convert only when they print or write); other callbacks that
    override a batch hook get Python floats, converted once per step, as in ``model.fit``.
    """

    def __init__(self, callbacks: list):
        from keras.src.utils.python_utils import pythonify_logs

        self._pythonify = pythonify_logs
        self.begin = [c for c in callbacks if self._overrides(c, "on_train_batch_begin")]
        self.end = [c for c in callbacks if self._overrides(c, "on_train_batch_end")]

    @staticmethod
    def _overrides(callback: Any, hook: str) -> bool:
        return getattr(type(callback), hook) is not getattr(keras.callbacks.Callback, hook)

    def on_train_batch_begin(self, step: int) -> None:
        for callback in self.begin:
            callback.on_train_batch_begin(step, {})

    def on_train_batch_end(self, step: int, logs: dict) -> None:
        converted = None
        for callback in self.end:
            if isinstance(callback, KfitCallback):
                callback.on_train_batch_end(step, logs)
            else:
                if converted is None:
                    converted = self._pythonify(logs)
                callback.on_train_batch_end(step, converted)


class _StreamFit:
    """One run of kfit's own training loop (see :func:`fit`)."""

    def __init__(self, model, x, y, minibatch_size, epochs, verbose, callbacks, validation_split, validation_data,
                 shuffle, class_weight, sample_weight, initial_epoch, steps_per_epoch, validation_steps,
                 validation_batch_size, validation_freq, epoch_size, max_samples, seed, prefetch):
        from kfit import distributed

        if model.optimizer is None or not getattr(model, "compiled", True):
            raise ValueError("You must call `model.compile(...)` before kfit.fit(model, ...).")
        self.model = model
        if isinstance(x, keras.utils.PyDataset):
            if validation_split:
                raise ValueError("`validation_split` needs arrays (as in model.fit); give `validation_data` with a PyDataset.")
        else:
            x, y, sample_weight = _to_host(x), _to_host(y), _to_host(sample_weight)
        if validation_split and validation_data is None:
            (x, y, sample_weight), validation_data = _split_validation(x, y, sample_weight, validation_split)
        self.validation_data = validation_data
        self.validation_steps = validation_steps
        self.validation_batch_size = validation_batch_size
        self.validation_freq = validation_freq
        self.class_weight = class_weight
        if isinstance(x, keras.utils.PyDataset):
            self.stream = PyDatasetStream(x, shuffle=bool(shuffle), seed=int(seed or 0),
                                          rank=distributed.rank(), num_workers=distributed.size())
        else:
            self.stream = SampleStream(
                x, y, sample_weight, shuffle=bool(shuffle), seed=int(seed or 0),
                rank=distributed.rank(), num_workers=distributed.size(),
            )
        self.size_at, fixed_size = _size_function(minibatch_size)
        if epoch_size is None and steps_per_epoch is not None:
            if fixed_size is None:
                raise ValueError("With a minibatch-size schedule give the epoch length as `epoch_size` (samples), not `steps_per_epoch`.")
            epoch_size = steps_per_epoch * fixed_size
        self.epoch_size = int(epoch_size or self.stream.num_samples)
        self.fixed_size = fixed_size
        if epochs is None and max_samples is None:
            epochs = 1
        self.epochs = epochs
        self.max_samples = max_samples
        stops = [b for b in (max_samples, None if epochs is None else epochs * self.epoch_size) if b is not None]
        self.stop_at = min(stops)
        self.prefetch = prefetch
        self.verbose = 1 if verbose == "auto" else verbose
        if not distributed.is_chief():
            self.verbose = 0  # only rank 0 prints progress
        self.clock = attach_clock(model, Clock(samples=initial_epoch * self.epoch_size, epoch_size=self.epoch_size))
        self.history = RunHistory()
        self.summaries = EpochSummaries(self.history)
        self.callbacks = ordered_callbacks(callbacks + [self.summaries])
        object.__setattr__(model, PEERS_ATTRIBUTE, [])
        self.context = TrainingContext(
            clock=self.clock, stream=self.stream, callbacks=self.callbacks, history=self.history,
            kfit_fit=True, epochs=epochs, max_samples=max_samples,
        )
        self.runner = _backend.StepRunner(model)
        self.distributed = distributed.size() > 1

    # -- data ------------------------------------------------------------------------------------
    def read(self, start: int, size: int) -> tuple:
        """The minibatch at ``(start, size)`` as backend tensors (runs on the prefetch thread)."""
        x, y, sample_weight = self.stream.read(start, size)
        if self.class_weight is not None:
            sample_weight = _class_weights(y, self.class_weight)
        return _backend.to_tensors((x, y, sample_weight))

    def _steps_in_epoch(self) -> int | None:
        if self.fixed_size is None:
            return None
        return math.ceil(min(self.epoch_size, self.stop_at) / self.fixed_size)

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> keras.callbacks.History:
        model, clock = self.model, self.clock
        attach_context(model, self.context)
        callback_list = keras.callbacks.CallbackList(
            self.callbacks + [self.history],
            add_history=False,
            add_progbar=self.verbose != 0,
            verbose=self.verbose,
            epochs=self.epochs if self.epochs is not None else math.ceil(self.stop_at / self.epoch_size),
            steps=self._steps_in_epoch(),
            model=model,
        )
        prefetcher = None
        from kfit import distributed

        try:
            first = self.read(clock.samples % max(self.stream.num_samples, 1), self._first_size())
            if self.distributed:
                distributed.prepare_model(model)
            self.runner.build(first)
            model.stop_training = False
            callback_list.on_train_begin()
            if self.distributed:
                distributed.broadcast_training_state(model)
            self.stream.position = clock.samples
            prefetcher = Prefetcher(
                self.read,
                _plan.plan(clock.samples, clock.minibatches, self.size_at, self.epoch_size, self.stop_at),
                depth=self.prefetch,
            )
            logs = self._train(callback_list, _BatchHooks(callback_list.callbacks), prefetcher)
            callback_list.on_train_end(logs)
        finally:
            if prefetcher is not None:
                prefetcher.close()
            self.runner.end()
            attach_context(model, None)
        self.history.epoch_summaries = self.summaries.summaries
        return self.history

    def _first_size(self) -> int:
        size = _plan.next_minibatch(self.clock.samples, self.clock.minibatches, self.size_at, self.epoch_size, self.stop_at)
        return max(size, self.stream.num_workers)

    def _train(self, callback_list: Any, batch_hooks: _BatchHooks, prefetcher: Prefetcher) -> dict:
        from kfit import distributed
        model, clock, runner = self.model, self.clock, self.runner
        applied_size = None
        epoch_logs: dict = {}
        while clock.samples < self.stop_at and not model.stop_training:
            epoch = clock.epoch
            if clock.samples_in_epoch == 0 and not self.context.resumed_mid_epoch:
                model.reset_metrics()
            self.context.resumed_mid_epoch = False
            runner.begin()
            callback_list.on_epoch_begin(epoch)
            epoch_end = min(clock.epoch_end(), self.stop_at)
            step = 0
            logs: dict = {}
            while clock.samples < epoch_end:
                # (stream.read checks the size on the reader thread; the prefetcher raises its errors here)
                size = _plan.next_minibatch(clock.samples, clock.minibatches, self.size_at, self.epoch_size, self.stop_at)
                clock.minibatch_size = size
                apply_minibatch_size(model, size, applied_size)
                applied_size = size
                batch_hooks.on_train_batch_begin(step)
                logs = runner.step(prefetcher.get(clock.samples, size))
                clock.advance(size)
                self.stream.position = clock.samples
                batch_hooks.on_train_batch_end(step, logs)
                step += 1
                if self.distributed:
                    # A stop decided on any worker (cross-validation, early stopping, a user's callback)
                    # ends training on every worker after the same step: none is left in an allreduce alone.
                    model.stop_training = distributed.any_true(model.stop_training)
                if model.stop_training:
                    break
            runner.sync()
            epoch_logs = _pythonify(model.get_metrics_result())
            if self.distributed:
                epoch_logs = distributed.average_metrics(epoch_logs, model)
            if self.validation_data is not None and _should_validate(epoch, self.validation_freq):
                epoch_logs.update(self._validate(applied_size))
            callback_list.on_epoch_end(epoch, epoch_logs)
            runner.begin()
        return epoch_logs

    def _validate(self, last_size: int | None) -> dict:
        data = self.validation_data
        if isinstance(data, (list, tuple)) and len(data) in (2, 3):
            val_x, val_y = data[0], data[1]
            val_sw = data[2] if len(data) == 3 else None
        else:
            val_x, val_y, val_sw = data, None, None
        val_logs = self.model.evaluate(
            val_x, val_y, sample_weight=val_sw, batch_size=self.validation_batch_size or self.fixed_size or last_size,
            steps=self.validation_steps, verbose=0, return_dict=True,
        )
        return {f"val_{k}": float(v) for k, v in val_logs.items()}


__all__ = ["fit", "KfitCallback"]
