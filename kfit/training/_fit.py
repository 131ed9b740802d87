"""``kfit.fit``: ``model.fit`` with a sample clock, a seekable stream and minibatch-size schedules.

The data flow reads straight: data -> :class:`~kfit.data.SampleStream` -> the plan (which minibatch comes
next, a function of the clock) -> a prefetching reader -> one compiled train step -> callbacks. When no
kfit-only feature is asked for, ``kfit.fit`` *is* ``model.fit`` with kfit's clock added, so migrating a
project changes nothing until a kfit feature is used.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
import warnings
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from kfit import _backend, _checks, _run
from kfit.callbacks._base import KfitCallback
from kfit.callbacks._sample_clock import SampleClock
from kfit.checkpoint import _restore
from kfit.clock import Clock
from kfit.data import _stream
from kfit.data._adapter import StreamAdapter, declared_batches, pack_batch
from kfit.data._pydataset import PyDatasetStream
from kfit.data._source import SourceAdapter, SourceDriver, batch_size_of
from kfit.data._stream import SampleStream, dataset_length, flatten, is_sparse, is_streamable, pack, to_host
from kfit.distributed._callbacks import AgreedStopCallback
from kfit.training import _padding, _plan, _validation
from kfit.training._compile_ahead import CompileAhead
from kfit.training._driver import PlanDriver
from kfit.training._options import FitOptions, refuse_unknown_keywords, size_function, training_rows
from kfit.training._progress_bar import ProgressBar
from kfit.training._summaries import EpochSummaries


def _split_validation(x: Any, y: Any, sample_weight: Any, split: float) -> tuple:
    """Keras's ``validation_split``: the last ``split`` fraction of the arrays, before shuffling."""
    cut = training_rows(dataset_length(x), split)

    def part(structure: Any, lo: int, hi: int | None) -> Any:
        if structure is None:
            return None
        return pack(structure, [None if a is None else a[lo:hi] for a in flatten(structure)])

    train = (part(x, 0, cut), part(y, 0, cut), part(sample_weight, 0, cut))
    val = (part(x, cut, None), part(y, cut, None), part(sample_weight, cut, None))
    return train, val


def _check_dtypes(x: Any, y: Any, sample_weight: Any) -> None:
    """Refuses the arrays ``model.fit`` refuses for their dtype (text as a NumPy ``str``, bytes or object array), with
    Keras's reason: Keras's array adapter (``array_slicing.convert_to_sliceable``, checked against Keras 3.15.1) takes
    Keras's dtypes only ("Invalid dtype: str32"), and on TensorFlow an object array of Python ``str`` (one per row),
    which it makes a ``tf.string`` tensor. kfit's stream read the others on TensorFlow, and failed at the first step
    on JAX."""
    for name, part in zip(("x", "y", "sample_weight"), (x, y, sample_weight)):
        for leaf in flatten(part) if part is not None else []:
            dtype = getattr(leaf, "dtype", None)
            if not isinstance(dtype, np.dtype) or (_backend.BACKEND == "tensorflow" and dtype.kind == "O"
                                                   and all(isinstance(row, str) for row in leaf)):
                continue
            try:
                keras.backend.standardize_dtype(dtype)
            except ValueError as error:
                text = ("text as a tf.string tensor or a 1-D object array of Python str" if _backend.BACKEND ==
                        "tensorflow" else "text as ids (say from a StringLookup layer applied before training)")
                raise ValueError(f"Invalid value for argument `{name}`: an array of dtype {dtype} ({error}), which "
                                 f"model.fit refuses too. Give numbers, or {text}.") from None


def _class_weights(y: Any, class_weight: dict) -> np.ndarray:
    if keras.tree.is_nested(y):  # Keras's rule: a list or dict of targets is refused, even of one array
        raise ValueError("`class_weight` is only supported for Models with a single output. y is a "
                         f"{type(y).__name__} of {len(flatten(y))} array(s): give y as one array, or weigh several "
                         "outputs with `sample_weight` (one array per output).")
    # Keras's rule (class_weight_to_sample_weights): one-hot rows by their largest entry, labels rounded to the
    # nearest class, a class without a weight weighs 1.
    labels = np.asarray(y)
    if labels.ndim > 1 and labels.shape[-1] > 1:
        labels = labels.argmax(axis=-1)
    labels = np.round(labels.reshape(len(labels), -1)[:, 0]).astype(np.int32)
    return np.array([class_weight.get(int(c), 1.0) for c in labels], dtype=keras.config.floatx())


def _check_sample_weight(y: Any, sample_weight: Any) -> None:
    """Keras's checks of ``sample_weight`` against a ``y`` of several outputs (its array adapter's), with its errors:
    one array per output in ``y``'s structure, or one array of one weight per sample for all of them."""
    if sample_weight is None or not keras.tree.is_nested(y):
        return
    if isinstance(sample_weight, (list, tuple, dict)):
        try:
            keras.tree.assert_same_structure(y, sample_weight)
        except (ValueError, TypeError):
            raise ValueError("You should provide one `sample_weight` array per output in `y`. The two structures did "
                             f"not match: y has {len(flatten(y))} arrays in a {type(y).__name__}, sample_weight "
                             f"{len(flatten(sample_weight))} in a {type(sample_weight).__name__}.") from None
    elif not (np.ndim(sample_weight) == 1 or np.ndim(sample_weight) == 2 and np.shape(sample_weight)[1] == 1):
        raise ValueError("For a model with multiple outputs, when providing a single `sample_weight` array, it should "
                         "only have one scalar score per sample (i.e. shape `(num_samples,)`). If you want to use "
                         "non-scalar sample weights, pass a `sample_weight` argument with one array per model output. "
                         f"Received: sample_weight of shape {np.shape(sample_weight)}")


def ordered_callbacks(callbacks: list) -> list:
    """Callbacks sorted (stably) by their ``order``: see :attr:`kfit.callbacks.KfitCallback.order`."""
    return sorted(callbacks, key=lambda c: getattr(c, "order", 0))


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
    prefetch: int | None = None,
    pad_remainders: bool = False,
    **unknown: Any,
) -> keras.callbacks.History:
    """Trains ``model`` like ``model.fit``, on kfit's sample clock.

    Every argument of ``model.fit`` keeps its meaning. kfit adds:

    * ``minibatch_size``: an int, or a ``kfit.schedules.minibatch_size`` schedule read at the clock's value
      whenever a minibatch is drawn (``batch_size`` is its alias, but for a ``keras.utils.PyDataset``, which
      ``model.fit`` reads in its own batches whatever the ``batch_size``: ``minibatch_size`` cuts it anew);
    * ``epoch_size``: samples per epoch (default: one sweep over the training data); epochs are units of
      the clock, decoupled from sweeps. A minibatch never crosses an epoch boundary;
    * ``max_samples``: stop after this many samples; with ``epochs`` too, the first bound reached ends
      training;
    * ``seed``: the seed of the data stream's shuffling (each sweep is shuffled by ``(seed, sweep)``); a source that
      batches itself (tf.data, a generator, a DataLoader) keeps its own order and seeds;
    * ``prefetch``: minibatches read ahead on a background thread by kfit's loop (None: 2 from h5py datasets and
      ``PyDataset``s, none from NumPy arrays in memory, whose gather is faster than a hand-off between threads);
      alone it does not make kfit's loop train, and is then unused;
    * ``pad_remainders``: for a step compiled per shape (JAX; TensorFlow with ``jit_compile=True``), hand it each
      minibatch that an epoch end (or ``max_samples``) cuts short at its scheduled size, padded with zero-weight
      rows whose effect is taken out exactly, so that cut sizes compile no step of their own (mathematically exact,
      not bit-identical to an unpadded run; refused, with the reason, for a model it would not be exact for: see
      ``kfit/training/_padding.py``). Nothing to pad on PyTorch and on TensorFlow without XLA, where one step serves
      every size.

    When none of these but ``prefetch`` (nor a callback that needs the stream, such as ``kfit.callbacks.Checkpoint``
    or ``MinibatchSizeSchedule``) is used, this is exactly ``model.fit`` plus kfit's clock: the same weights
    for the same seed. Otherwise training data (arrays, h5py datasets, dicts/lists/tuples of them) is read
    as a seekable :class:`kfit.data.SampleStream` by kfit's own training loop, which runs the model's
    compiled train step.

    With a ``steps_per_epoch`` that cuts the arrays' sweeps into epochs of other sizes, or other than a ``PyDataset``'s
    length, Keras's own adapter reads the data, as under ``model.fit``: an epoch ends early where a pass ends, and a
    resumed run draws and drops the batches before its step. A ``PyDataset``'s ``on_epoch_begin`` and ``on_epoch_end``
    are then called for the epochs it skips, as ``model.fit`` called them; on TensorFlow, whose ``tf.data`` reads a
    varying number of batches ahead of those calls (under ``model.fit`` too), a dataset that changes its rows there
    does not resume exactly, and the resumed run says so.

    Returns:
        The run's ``keras.callbacks.History``, with ``epoch_summaries``: a list of
        :class:`kfit.training.EpochSummary` (loss, metrics, samples, seconds, samples per second).

    Raises:
        ValueError: bad arguments, named with the value received.
        TypeError: a keyword ``kfit.fit`` does not take, named with the value; for CNTK's ``Function.train``
            names (``max_epochs``, ``parameter_learners``, ...) saying what to write, else the closest
            argument's name.

    Example:
        >>> import numpy as np, keras, kfit
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> model.compile(optimizer="sgd", loss="mse")
        >>> x, y = np.ones((40, 3), "float32"), np.ones((40, 1), "float32")
        >>> history = kfit.fit(model, x, y, minibatch_size=8, max_samples=100, verbose=0)
        >>> [s.samples for s in history.epoch_summaries]
        [40, 40, 20]
    """
    if unknown:
        refuse_unknown_keywords("kfit.fit", unknown, list(inspect.signature(fit).parameters)[1:-1])
    callbacks = _checks.callback_list("callbacks", callbacks)
    for name, part in (("x", x), ("y", y), ("sample_weight", sample_weight)):
        _check_open(name, part)  # (before anything reads x's length)
    options = FitOptions.from_arguments(
        batch_size=batch_size, callbacks=callbacks, sample_weight=sample_weight, minibatch_size=minibatch_size,
        num_samples=dataset_length(x) if validation_data is None and is_streamable(x) else None,
        epochs=epochs, verbose=verbose, validation_split=validation_split, shuffle=shuffle, class_weight=class_weight,
        initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
        validation_batch_size=validation_batch_size, validation_freq=validation_freq, epoch_size=epoch_size,
        max_samples=max_samples, seed=seed, prefetch=prefetch, pad_remainders=pad_remainders)
    if validation_data is not None:  # (model.fit ignores validation_split then)
        options = dataclasses.replace(options, validation_split=0.0)
    _check_callbacks(callbacks)
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", True):
        raise ValueError("You must call `model.compile(optimizer=..., loss=...)` before kfit.fit(model, ...), as "
                         "before model.fit.")

    from kfit import distributed

    if not (options.kfit_only or distributed.size() > 1 or any(getattr(c, "needs_stream", False) for c in callbacks)
            or not _model_fit_keeps_clock(x, options) and any(isinstance(c, KfitCallback) for c in callbacks)):
        return _fit_with_model_fit(model, x, y, sample_weight, validation_data, callbacks, options)
    if x is None:  # (model.fit fails calling the model on nothing)
        raise ValueError("Invalid value for argument `x`: expected the training inputs (arrays, a dict or list of "
                         "them, a dataset, a generator, a DataLoader). Received: x=None")
    if isinstance(x, keras.utils.PyDataset):
        if y is not None or sample_weight is not None:
            raise ValueError("With a PyDataset as `x`, `y` and `sample_weight` come from the dataset's batches; pass x only.")
        # An endless PyDataset has no sweeps to seek in; with steps_per_epoch other than its length, Keras's epochs
        # are not sweeps: Keras's adapter reads it, as a source that cannot seek.
        num_batches = getattr(x, "num_batches", 0)
        seekable = num_batches is not None and not _keras_epochs_differ(model, x, options, distributed.size())
    else:
        seekable = is_streamable(x)
        if seekable and _keras_epochs_differ(model, x, options, distributed.size()):
            # Keras's own epochs on arrays: Keras's adapter reads them, as a source that cannot seek.
            seekable = False
            if options.validation_split and validation_data is None:
                # (the arrays as given: Keras's adapter reads them, a tf.string tensor too, not a NumPy object array)
                (x, y, sample_weight), validation_data = _split_validation(x, y, sample_weight, options.validation_split)
            options = dataclasses.replace(options, validation_split=0.0)
    if not seekable:
        _check_source_options(x, options, callbacks)
        return _StreamFit(model, x, y, sample_weight, validation_data, callbacks, options, source=True).train()
    return _StreamFit(model, x, y, sample_weight, validation_data, callbacks, options).train()


def _keras_epochs_differ(model: Any, x: Any, options: FitOptions, workers: int) -> bool:
    """True when ``steps_per_epoch`` on arrays or a ``PyDataset`` gives epochs that kfit's stream cannot reproduce.

    kfit's stream makes every epoch ``steps_per_epoch * batch_size`` samples, across sweeps. Keras ends an
    epoch early at the end of a sweep, and with ``steps_per_execution`` draws whole executions. The two
    agree when a sweep is a whole number of epochs and an epoch a whole number of executions; otherwise
    ``kfit.fit`` trains as ``model.fit`` would, on Keras's own adapter (resume then skips ahead). A ``PyDataset``
    read in its own batches also needs an epoch to be a sweep: Keras calls its ``on_epoch_end`` and
    ``on_epoch_begin`` at each epoch's end and begin, kfit's stream at each sweep's. With a minibatch-size
    schedule, an ``epoch_size`` or several workers, kfit's epochs are kept.
    """
    o = options
    if o.steps_per_epoch is None or o.epoch_size is not None or o.fixed_minibatch_size is None and o.minibatch_size \
            is not None or workers > 1:
        return False
    per_execution = _backend.steps_per_execution(model)
    if isinstance(x, keras.utils.PyDataset):
        return (o.minibatch_size is None or o.from_batch_size) and (o.steps_per_epoch != x.num_batches
                                                                    or o.steps_per_epoch % per_execution != 0)
    n = dataset_length(x)
    if n is None:
        return False
    if o.validation_split:
        n = training_rows(n, o.validation_split)
    return n % (o.steps_per_epoch * (o.fixed_minibatch_size or 32)) != 0 or o.steps_per_epoch % per_execution != 0


def _check_open(name: str, data: Any) -> None:
    """An h5py dataset whose file was closed cannot be read: say so, not h5py's own error."""
    for leaf in flatten(data) if data is not None else []:
        if type(leaf).__module__.startswith("h5py") and hasattr(leaf, "id") and not leaf.id.valid:
            raise ValueError(
                f"Invalid value for argument `{name}`: an h5py dataset whose file is closed. Keep the file open "
                "while training (e.g. train inside `with h5py.File(path) as f:`), or read it into memory first.")


def _check_callbacks(callbacks: list) -> None:
    from kfit.callbacks._checkpoint import Checkpoint
    from kfit.callbacks._hyperparameter_schedules import LearningRateSchedule

    keras_rate = [c for c in callbacks if isinstance(
        c, (keras.callbacks.ReduceLROnPlateau, keras.callbacks.LearningRateScheduler))]
    if keras_rate and any(isinstance(c, LearningRateSchedule) for c in callbacks):
        raise ValueError(
            f"keras.callbacks.{type(keras_rate[0]).__name__} and kfit.callbacks.LearningRateSchedule both set the "
            "optimizer's learning rate; the schedule, which sets it before each step, would keep or undo Keras's change "
            "depending on the minibatch size. Give one: to reduce the rate on a plateau next to a schedule use "
            "kfit.callbacks.ReduceLROnPlateau (it scales the schedule's rate).")

    if any(isinstance(c, keras.callbacks.BackupAndRestore) for c in callbacks) and any(
            isinstance(c, Checkpoint) for c in callbacks):
        raise ValueError(
            "keras.callbacks.BackupAndRestore and kfit.callbacks.Checkpoint both restore the run when training "
            "begins; give one. kfit's Checkpoint resumes exactly, also in the middle of an epoch; Keras's "
            "BackupAndRestore restarts the saved epoch from its first minibatch."
        )


def _check_source_options(x: Any, options: FitOptions, callbacks: list) -> None:
    """A source that batches by itself (tf.data, a generator, a DataLoader) cannot follow kfit's plan."""
    kind = type(x).__name__
    sparse = any(leaf is not None and is_sparse(leaf) for leaf in flatten(x))
    own = ("is sparse, which Keras's own adapter reads (kfit's stream gathers dense rows)" if sparse
           else "makes its own minibatches")
    works = ("Give the data as arrays (NumPy arrays, h5py datasets, dicts/lists of them) or as a "
             "keras.utils.PyDataset, which kfit cuts into minibatches itself")
    if options.minibatch_size is not None and options.fixed_minibatch_size is None:
        raise ValueError(f"A minibatch-size schedule needs data that kfit cuts into minibatches; x is a {kind}, which "
                         f"{own}. {works}, or train at the source's own minibatch size.")
    if options.epoch_size is not None:
        raise ValueError(f"Argument `epoch_size` needs data that kfit reads as a stream of samples; x is a {kind}, whose "
                         f"epochs are its own passes (use `steps_per_epoch`, as with model.fit). {works}. "
                         f"Received: epoch_size={options.epoch_size!r}")
    if options.pad_remainders:
        raise ValueError(f"Argument `pad_remainders` needs data that kfit cuts into minibatches; x is a {kind}, which "
                         f"{own}. {works}. Received: pad_remainders=True")
    if options.validation_split:
        raise ValueError(f"Argument `validation_split` needs arrays (as in model.fit); x is a {kind}. Give "
                         f"`validation_data` instead. Received: validation_split={options.validation_split!r}")


def _model_fit_keeps_clock(x: Any, options: FitOptions) -> bool:
    """Whether plain ``model.fit`` on ``x`` can keep kfit's clock (a :class:`SampleClock` knows every step's size):
    on arrays, with epochs that are sweeps. Other data (a PyDataset, tf.data, a generator, a DataLoader) makes minibatches
    of sizes only its reader sees: kfit's callbacks then need kfit's loop, which reads it."""
    return is_streamable(x) and options.steps_per_epoch is None


def _fit_with_model_fit(model: Any, x: Any, y: Any, sample_weight: Any, validation_data: Any, callbacks: list,
                        options: FitOptions) -> keras.callbacks.History:
    """No kfit-only feature asked for: ``model.fit`` itself, with kfit's clock kept by a SampleClock."""
    o = options
    epochs = o.epochs if o.epochs is not None else 1
    clock_callbacks: list = []
    if _model_fit_keeps_clock(x, o):
        n = dataset_length(x)
        if o.validation_split and validation_data is None:
            n = training_rows(n, o.validation_split)
        if n == 0:  # (as kfit's stream says it, not as the SampleClock's num_samples=0 the user never passed)
            raise ValueError("Invalid value for argument `x`: the training data is empty (0 samples).")
        clock_callbacks.append(SampleClock(batch_size=o.minibatch_size or 32, num_samples=n))
    history = RunHistory()
    summaries = EpochSummaries(history)
    callbacks = ordered_callbacks(clock_callbacks + callbacks + [summaries])
    run = _run.start(_run.Run(model, clock=Clock(), callbacks=list(callbacks), history=history, epochs=epochs))
    try:
        model.fit(
            x, y, batch_size=o.minibatch_size, epochs=epochs, verbose=o.verbose, callbacks=callbacks + [history],
            validation_split=o.validation_split, validation_data=validation_data, shuffle=o.shuffle,
            class_weight=o.class_weight, sample_weight=sample_weight, initial_epoch=o.initial_epoch,
            steps_per_epoch=o.steps_per_epoch, validation_steps=o.validation_steps,
            validation_batch_size=o.validation_batch_size, validation_freq=o.validation_freq,
        )
    finally:
        _run.end(run)
    return _returned_history(model, callbacks, history, summaries)


SHUFFLED_ARRAYS_RESUME = (
    "This resume is not exact: with steps_per_epoch, arrays are read by Keras's own adapter, which with "
    "shuffle='batch' on PyTorch shuffles each batch with torch's random state between the steps (or the checkpoint "
    "holds no shuffle state: written by an older kfit), and the resumed run's passes draw other orders. For an exact "
    "resume give kfit.fit epoch_size=steps_per_epoch * minibatch_size in place of steps_per_epoch (kfit's own "
    "stream, which resumes arrays exactly), or shuffle=True."
)


PYDATASET_HOOKS_RESUME = (
    "This resume may not be exact: with steps_per_epoch other than its length, a PyDataset is read by Keras's own "
    "adapter, on TensorFlow through tf.data, which reads batches ahead on a thread of its own: how many of the next "
    "batches it has read when the dataset's on_epoch_end or on_epoch_begin runs varies from run to run (under "
    "model.fit too), so rows that those methods change differ between runs. For an exact resume give "
    "steps_per_epoch equal to the dataset's length or leave it out (kfit's own stream reads the dataset), or keep "
    "the rows those methods serve fixed."
)


def _returned_history(model: Any, callbacks: list, history: RunHistory, summaries: EpochSummaries) -> Any:
    """What ``fit`` returns and leaves as ``model.history``: as under ``model.fit``, a ``History`` the user passed
    (the last, as Keras picks it), here holding the run's record (a checkpoint's restored epochs too), else the
    run's own; with the run's ``epoch_summaries``."""
    history.epoch_summaries = summaries.summaries
    users = [c for c in callbacks if isinstance(c, keras.callbacks.History) and not isinstance(c, RunHistory)]
    if not users:
        return history
    mine = users[-1]
    mine.epoch, mine.history = list(history.epoch), {key: list(values) for key, values in history.history.items()}
    mine.params, mine.epoch_summaries = history.params, history.epoch_summaries
    model.history = mine
    return mine


class RunHistory(keras.callbacks.History):
    """The run's History: called last at every epoch end (after cross-validation and the controllers
    have added their results to the logs); one per ``kfit.fit`` call, so it does not clear itself when
    training begins (a checkpoint restores it)."""

    order = 1000

    def on_train_begin(self, logs: dict | None = None) -> None:
        if not hasattr(self, "epoch"):
            self.epoch = []


class _RunControl(keras.callbacks.Callback):
    """kfit.fit's own hooks in ``model.fit``: the checkpoint restore, where the run starts, the
    restored metric state of an epoch resumed in its middle, Horovod's broadcast."""

    order = 150  # after the on_train_begin of every kfit callback (they reset their state there), before Keras's
    # History and progress bar

    def __init__(self, fit: _StreamFit):
        super().__init__()
        self.fit = fit
        self.unquiet: Callable[[], None] = lambda: None

    def on_train_begin(self, logs: dict | None = None) -> None:
        fit = self.fit
        model, clock = fit.model, fit.clock
        fit.run.begun = True
        fit.release_writes = _backend.hold_writes(model)
        if fit.source is None and not fit.distributed:
            fit.run.compile_ahead = CompileAhead(model, fit.first_host)
        finished = _restore.restore_run(fit.run)  # restoring is a step of the loop: after every on_train_begin
        started_at = _backend.initial_epoch(model)
        if started_at and clock.samples == 0 and fit.source is None:
            # Another callback (Keras's BackupAndRestore) restored an epoch number, as under model.fit: the
            # fit goes on from that epoch's first minibatch.
            clock.samples = started_at * fit.epoch_size
            clock.minibatches = _plan.minibatches_before(clock.samples, fit.size_at, fit.epoch_size)
        if fit.distributed:
            from kfit import distributed

            distributed.broadcast_training_state(model)
            fit.run.gathers_worker_metrics = _same_checkpoints_on_every_worker(fit.callbacks)
        if fit.stream is not None:
            fit.stream.position = clock.samples
        # Nothing left to train: the bounds are reached, a restored run had finished, or one of kfit's controllers
        # holds a stop (restored by hand). Any other callback's stop_training set in its on_train_begin lets one step
        # run, as under model.fit, which checks it after each step.
        held = any(isinstance(c, KfitCallback) and getattr(c, "stopped", False) for c in fit.callbacks)
        if clock.samples >= fit.stop_at or finished or held:
            _backend.set_initial_epoch(model, fit.num_epochs)
            return
        if any(_backend.validates_in_epoch(model, e, fit.options.validation_freq) for e in getattr(fit.history, "epoch", [])):
            # Resumed after an epoch that validated: the validation iterator model.fit kept from then, made drawing
            # nothing the interrupted run had not drawn before its checkpoint.
            _backend.make_validation_iterator_again(model, *fit.keras_validation, fit.options.validation_steps)
        if fit.source is not None:
            mid_epoch = self._resume_source(fit)
        else:
            _backend.set_initial_epoch(model, clock.epoch)
            mid_epoch = fit.run.resumed_mid_epoch
            # (the restored random state holds the draw of the pass the interrupted run opened for this epoch)
            fit.adapter.skip_pass_draw = mid_epoch
            if mid_epoch:  # (known before the epoch's on_epoch_begin, as for a source: a ProgressPrinter reads it)
                fit.count_steps_run_in_epoch()
        if mid_epoch:
            # model.fit begins the resumed epoch anew: it resets the metrics, and the callbacks' on_epoch_begin run
            # again (Keras's LearningRateScheduler would step the restored rate a second time). The restored
            # metric state and the optimizer's scalars (its rate, kfit's hyperparameters) are put back then.
            scalars = [v for v in getattr(model.optimizer, "variables", []) if len(v.shape) == 0]
            fit.run.restored_values = [(v, _backend.to_numpy(v.value))
                                       for v in [*model.metrics_variables, *scalars]]
            self.unquiet = _backend.quiet_rate_schedulers(fit.callbacks)  # (it would print the rate put back)

    def _resume_source(self, fit: _StreamFit) -> bool:
        """Positions a source for the restored clock (by skipping ahead); True when that is mid-epoch."""
        clock = fit.clock
        if clock.samples == 0:
            _backend.set_initial_epoch(fit.model, fit.options.initial_epoch)
            return False
        source = fit.source
        source.first_step = clock.minibatches
        source.learn_epoch_size(clock)  # (a checkpoint written at the first pass's last step before kfit learned it)
        if source.epochs_vary:
            epoch, steps_in_epoch = source.position(clock.minibatches)  # Keras's epochs, whatever their sizes
            mid_epoch = steps_in_epoch > 0
            source.replay_epoch_hooks(epoch)
            if clock.epoch_start is not None:  # (saved by the run: initial_epoch counted in)
                epoch = clock.epoch
        else:
            epoch, steps_in_epoch = clock.epoch, 0
            mid_epoch = clock.samples_in_epoch > 0
        _backend.set_initial_epoch(fit.model, epoch)
        skip = source.resume(clock.samples_in_epoch, clock.samples, steps_in_epoch, getattr(fit.history, "epoch", []))
        source.make_owed_pass_end_call()
        if mid_epoch:
            fit.run.batch_offset = steps_in_epoch or source.steps_into_epoch(epoch, clock.minibatches, clock.samples_in_epoch)
        from kfit import distributed

        chief = distributed.is_chief()  # every worker's source skips the same way (the clock is the job's): said once
        if source.reopens:  # (epochs counted from 1, as in the resume line)
            reopened = "the pass it was reading" if source.continues else f"epoch {epoch + 1}"
            if chief:
                print(f"kfit: resuming at sample {clock.samples}: the {source.state_kind} source restarts {reopened} "
                      f"from {source.saved_state}, saved in the checkpoint, and the first {skip} samples it yields "
                      "are drawn and dropped.", file=sys.stderr)
        else:
            kind = type(source.inner).__name__.removesuffix("Adapter").removesuffix("Data")  # Array, TorchDataLoader
            if chief:
                print(f"kfit: {'an' if kind[:1] in 'AEIOU' else 'a'} {kind} source cannot seek: resuming at "
                      f"sample {clock.samples} by drawing and dropping the first {skip} samples it yields"
                      f"{'' if source.continues else ' in epoch ' + str(epoch + 1)}.", file=sys.stderr)
            if _backend.shuffles_from_process_random_state(source.inner):
                warnings.warn(SHUFFLED_ARRAYS_RESUME, stacklevel=2)
        if source.has_epoch_hooks and source.epochs_vary and _backend.BACKEND == "tensorflow":
            warnings.warn(PYDATASET_HOOKS_RESUME, stacklevel=2)
        return mid_epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        ahead, step = self.fit.run.compile_ahead, batch - self.fit.run.batch_offset  # (the step of this call)
        if ahead is not None and ahead.active and 0 <= step < len(self.fit.epoch_step_rows):
            ahead.before_step(self.fit.epoch_step_rows[step])  # one thread traces the step at a time

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.fit.run.batch_offset = 0  # the next epoch's steps are all this call's
        if self.fit.run.compile_ahead is not None:
            self.fit.run.compile_ahead.after_steps()
        clock = self.fit.clock
        if self.fit.source is not None and clock.epoch_size is None:
            self.fit.run.flush()
            self.fit.source.learn_epoch_size(clock, epoch_ended=True)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        # (after the on_epoch_begin of every callback of the default order)
        for variable, value in self.fit.run.restored_values:
            variable.assign(value)
        self.fit.run.restored_values = []
        self.fit.run.resumed_mid_epoch = False
        self.unquiet()


class _EmptyEpoch(keras.callbacks.Callback):
    """Plays to the callbacks, as the first epoch of a run resumed on a source begins, the epoch of no step that the
    uninterrupted run had right before it (:attr:`SourceAdapter.empty_epoch`: Keras found a pass ended there), which a
    new ``model.fit`` call cannot run (it has no earlier step's logs: on JAX its loop fails): its ``on_epoch_begin`` and
    ``on_epoch_end``, with the logs ``model.fit`` gave it (:func:`_backend.empty_epoch_logs`; the validation of the
    same weights as the epoch before it, where both validate), so that the History and every callback see that epoch
    as in the uninterrupted run. First in the list: no callback has seen the run's first epoch begin."""

    def __init__(self, fit: _StreamFit):
        super().__init__()
        self.fit = fit
        #: The ``CallbackList`` of the fit call (set once made).
        self.callbacks: Any = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        source = self.fit.source
        empty = None if source is None else source.empty_epoch
        if empty is None or self.callbacks is None:
            return
        source.empty_epoch = None
        history = self.fit.history
        record = getattr(history, "history", {})
        previous = {key: values[-1] for key, values in record.items() if values and not key.startswith("val_")}
        validation: dict = {}
        freq = self.fit.options.validation_freq
        validated = self.fit.validation_data is not None and empty - 1 in getattr(history, "epoch", []) \
            and _backend.validates_in_epoch(self.model, empty - 1, freq)
        if self.fit.validation_data is not None and _backend.validates_in_epoch(self.model, empty, freq):
            if validated:  # the weights the epoch before it ended with, which it validated: the same logs
                validation = {key: values[-1] for key, values in record.items() if values and key.startswith("val_")}
            else:
                warnings.warn(EMPTY_EPOCH_VALIDATION_RESUME, stacklevel=2)
        self.callbacks.on_epoch_begin(empty)
        logs = _backend.empty_epoch_logs(self.model, previous, validated)
        self.callbacks.on_epoch_end(empty, {**logs, **validation})


EMPTY_EPOCH_VALIDATION_RESUME = (
    "This resume is not exact in its History: the run resumed where a pass of a source of unknown length ended with an "
    "epoch (steps_per_epoch divides its batches), and Keras's uninterrupted loop went on with an epoch that trains no "
    "step and validates (validation_freq), after an epoch that did not validate. kfit gives that epoch the History "
    "entry model.fit gave it, without the validation logs. Every other epoch, and the weights, are the uninterrupted "
    "run's."
)


def _same_checkpoints_on_every_worker(callbacks: list) -> bool:
    """Data-parallel runs: whether every worker has checkpoints that save at the same steps (rank 0's list of their
    frequencies, compared by every worker; two collectives as training begins). Only then do the workers gather
    their training-metric states at a checkpoint's step: one without that checkpoint would never join in."""
    from kfit import distributed
    from kfit.distributed import _state as collective

    mine = [repr(getattr(c, "interval", None)) for c in callbacks if getattr(c, "writes_checkpoints", False)]
    chiefs = collective.broadcast_json(mine, 0, "kfit.checkpoints")
    return not distributed.any_true(chiefs != mine) and bool(mine)


class _CountStep(keras.callbacks.Callback):
    """Counts each step on the clock before any other callback's batch-end hook reads it.

    Added only when some callback already makes Keras dispatch batch ends synchronously (otherwise the
    clock counts a step at the next hook that reads it, and Keras keeps its asynchronous dispatch).
    """

    order = -10_000

    def __init__(self, run: _run.Run):
        super().__init__()
        self.run = run

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.run.flush()


class _PlanStep(keras.callbacks.Callback):
    """Sets the clock for each step, and counts an epoch's last step, before any other callback's hook reads it: a
    Keras callback listed before kfit's (or with only kfit's epoch summaries after it) read ``kfit.get_clock`` a step
    late. Keras dispatches batch ends asynchronously still (this callback has none)."""

    order = -10_000

    def __init__(self, run: _run.Run):
        super().__init__()
        self.run = run

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        run = self.run
        if run.driver.pending_batch != batch:
            run.driver.batch_begin(run.clock, batch)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.run.flush()


def _dispatches_batch_end_synchronously(callback: Any) -> bool:
    """Keras's rule (``CallbackList._configure_async_dispatch``)."""
    if getattr(callback, "async_safe", False):
        return False
    return any(not getattr(getattr(callback, hook), "_is_default", False) for hook in ("on_batch_end", "on_train_batch_end"))


class _StopAtSamples(_CountStep):
    """``max_samples`` on a source that makes its own minibatches: stop after the step that reaches it."""

    order = 1500

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.run.flush()
        if self.run.clock.samples >= self.run.max_samples and not self.model.stop_training:
            self.model.stop_training = self.run.stopped_at_bound = True


class _AverageMetrics(keras.callbacks.Callback):
    """The epoch's training logs over the workers (``_state.take_training_metrics``): taken before Keras's
    validation resets the metrics, else at the epoch's end."""

    order = -1000  # first at the epoch end: every other callback sees the combined logs

    def __init__(self) -> None:
        super().__init__()
        self._taken: tuple | None = None

    def on_test_begin(self, logs: dict | None = None) -> None:
        from kfit.distributed import _state

        self._taken = _state.take_training_metrics(self.model)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        from kfit.distributed import _state

        taken, self._taken = self._taken, None
        if logs is None:
            return
        taken = taken or _state.take_training_metrics(self.model)
        logs.update(_state.combine_training_logs({k: v for k, v in logs.items() if not k.startswith("val_")}, taken))


class _StreamFit:
    """One run of ``kfit.fit`` with kfit's features: ``model.fit`` fed by kfit's stream (see :func:`fit`)."""

    #: The Keras progress bar of the run (verbose runs), whose target follows each epoch's plan.
    progbar: Any = None

    def __init__(self, model: Any, x: Any, y: Any, sample_weight: Any, validation_data: Any, callbacks: list,
                 options: FitOptions, source: bool = False):
        from kfit import distributed

        o = self.options = options
        #: The run's parts (model, clock, stream, callbacks, history, bounds) live in the run, not here.
        self.run = _run.Run(model, loop=_run.RunLoop(), history=RunHistory())
        self.source: SourceAdapter | None = None
        self.stream: Any = None
        self.adapter: Any = None  # what model.fit reads (a StreamAdapter, or the source)
        self.class_weight = o.class_weight
        #: What Keras's loop is given (the History's ``params`` keep ``"auto"``), and what it means.
        self.keras_verbose = o.verbose if distributed.is_chief() else 0  # only rank 0 prints progress
        self.verbose = 1 if self.keras_verbose == "auto" else self.keras_verbose
        self.distributed = distributed.size() > 1
        if source:
            self._init_source(x, y, sample_weight, o,
                              saves=any(getattr(c, "writes_checkpoints", False) for c in callbacks))
            self.run.clock = Clock(epoch_start=(o.initial_epoch, 0) if self.source.epochs_vary else None)
        else:
            validation_data = self._init_stream(x, y, sample_weight, validation_data, o)
            start = o.initial_epoch * self.epoch_size  # initial_epoch: the clock starts as if those epochs had run
            minibatches = _plan.minibatches_before(start, self.size_at, self.epoch_size)
            self.run.clock = Clock(samples=start, minibatches=minibatches, epoch_size=self.epoch_size)
        self.run.stream = self.stream if self.source is None else self.source
        self.validation_data = validation_data
        #: What model.fit is given to validate on: the data (this worker's share) and its minibatch size.
        self.keras_validation: tuple = (None, None)
        self.summaries = EpochSummaries(self.history)
        self.run.callbacks = ordered_callbacks(callbacks + [self.summaries])
        self.release_writes: Any = lambda: None
        self.unpad: Any = None  # undoes _padding.install
        self.first_host: Any = None  # the first minibatch as read (NumPy): what the step is compiled ahead for
        if o.pad_remainders and self.distributed:
            raise ValueError("Argument `pad_remainders` is for one-process training: under data-parallel training "
                             "each worker trains its share of the global minibatch. Received: pad_remainders=True")
        # Padding the minibatches an epoch end cuts short (a step compiled per shape): kfit.training._padding.
        self.pads = (o.pad_remainders and _backend.BACKEND in ("jax", "tensorflow") and self.source is None
                     and model.jit_compile and not model.run_eagerly)
        self.epoch_step_rows: list[int] = []  # the rows the step is handed for each minibatch of the epoch

    model = property(lambda self: self.run.model, doc="The model being trained.")
    clock = property(lambda self: self.run.clock, doc="The run's sample clock.")
    history = property(lambda self: self.run.history, doc="The run's History (:class:`RunHistory`).")
    callbacks = property(lambda self: self.run.callbacks, doc="The user's callbacks and kfit's, in calling order.")
    epochs = property(lambda self: self.run.epochs, doc="The epochs to train (None: until ``max_samples``).")
    max_samples = property(lambda self: self.run.max_samples, doc="The samples to train (None: no bound).")

    def _init_stream(self, x: Any, y: Any, sample_weight: Any, validation_data: Any, o: FitOptions) -> Any:
        """kfit's stream over arrays or a PyDataset; returns the validation data (``validation_split`` cut)."""
        from kfit import distributed

        if isinstance(x, keras.utils.PyDataset):
            if o.validation_split:
                raise ValueError("`validation_split` needs arrays (as in model.fit); give `validation_data` with a PyDataset.")
            self.stream = PyDatasetStream(x, shuffle=bool(o.shuffle), seed=o.seed or 0,
                                          rank=distributed.rank(), num_workers=distributed.size())
            self.stream.telling = False  # until the first epoch begins (StreamAdapter(source=...))
        else:
            _check_dtypes(x, y, sample_weight)
            if o.validation_split and validation_data is None:
                # (before to_host: the validation rows keep their type, a tf.string tensor, which Keras's adapter reads
                # and refuses as a NumPy object array)
                (x, y, sample_weight), validation_data = _split_validation(x, y, sample_weight, o.validation_split)
            x, y, sample_weight = to_host(x), to_host(y), to_host(sample_weight)
            _check_sample_weight(y, sample_weight)
            self.stream = SampleStream(x, y, sample_weight, shuffle=o.shuffle, seed=o.seed or 0,
                                       rank=distributed.rank(), num_workers=distributed.size())
        if self.distributed:  # a worker whose share of a global minibatch is empty trains a padding row, or refuses
            from kfit.distributed import _optimizer

            self.stream.pads_empty_shares = _optimizer.pads_empty_shares()
        # Without a size, Keras's: a PyDataset's own batch size (also for model.fit's `batch_size`, which model.fit does
        # not apply to it), else 32.
        own = isinstance(self.stream, PyDatasetStream)
        size = None if own and o.from_batch_size else o.minibatch_size
        default = self.stream.batch_size if own else 32
        self.size_at = size_function(default if size is None else size)
        self.fixed_size = (size if isinstance(size, int) else None) or default
        if size is not None and o.fixed_minibatch_size is None:
            self.fixed_size = None
        epoch_size = o.epoch_size
        if epoch_size is None and o.steps_per_epoch is not None:
            if self.fixed_size is None:
                raise ValueError("With a minibatch-size schedule give the epoch length as `epoch_size` (samples), not "
                                 "`steps_per_epoch`.")
            epoch_size = o.steps_per_epoch * self.fixed_size
            if own and size is None and o.steps_per_epoch == self.stream.num_batches:
                epoch_size = self.stream.num_samples  # (a pass, as in model.fit: its last batch may be short)
        self.epoch_size = int(epoch_size or self.stream.num_samples)
        if isinstance(self.stream, SampleStream) and o.epoch_size is None:
            # Keras's epochs (steps_per_epoch): model.fit reads from the first row at `initial_epoch`, where kfit's
            # clock (the stream's position) starts at that epoch's first sample, maybe inside a sweep.
            self.stream.origin = o.initial_epoch * self.epoch_size % self.stream.num_samples
        self.run.epochs = 1 if o.epochs is None and o.max_samples is None else o.epochs
        self.run.max_samples = o.max_samples
        self.stop_at = min(b for b in (o.max_samples, None if self.epochs is None else self.epochs * self.epoch_size)
                           if b is not None)
        self.num_epochs = math.ceil(self.stop_at / self.epoch_size)
        self.prefetch = o.prefetch if o.prefetch is not None else 0 if getattr(self.stream, "in_memory", False) else 2
        if self.distributed:  # the same data and the same global minibatches on every worker, or a clear error
            from kfit.distributed import _state

            signature = self.stream.signature() if isinstance(self.stream, SampleStream) else type(x).__name__
            settings = (f"minibatch_size={self.size_at(0, 0)} (the first), epoch_size={self.epoch_size}, "
                        f"samples={self.stop_at}, shuffle={o.shuffle!r}, seed={o.seed!r}")
            content = (_state.fingerprint(self.stream.leaves, self.stream.num_samples)
                       if isinstance(self.stream, SampleStream) else "")
            _state.check_same_data(self.stream.num_samples, signature, settings=settings, content=content,
                                   also=(_validation.same_data_check(validation_data),))
        return validation_data

    def _init_source(self, x: Any, y: Any, sample_weight: Any, o: FitOptions, saves: bool) -> None:
        """A source that batches itself (tf.data, a generator, a DataLoader), read through Keras's adapter."""
        if self.distributed:
            raise ValueError(
                f"Data-parallel training reads each worker's share of kfit's stream; x is a {type(x).__name__}, which "
                "kfit cannot split. Give arrays, h5py datasets or a keras.utils.PyDataset, or shard the source "
                "yourself and train each worker on its own shard.")
        inner = _backend.keras_data_adapter(x, y, sample_weight, o.fixed_minibatch_size, o.steps_per_epoch, o.shuffle,
                                            o.class_weight)
        self.source = SourceAdapter(inner, restarts=type(inner).__name__ != "GeneratorDataAdapter",
                                    steps_per_epoch=o.steps_per_epoch, save_passes=saves)
        self.class_weight = None
        self.fixed_size = inner.batch_size
        self.run.epochs = o.epochs if o.epochs is not None or o.max_samples is not None else 1
        self.run.max_samples = o.max_samples
        self.stop_at = o.max_samples if o.max_samples is not None else math.inf
        self.num_epochs = self.epochs if self.epochs is not None else 2**31 - 1
        self.prefetch = 0

    # -- data ------------------------------------------------------------------------------------
    def read(self, start: int, size: int) -> tuple:
        """The host minibatch ``(x, y, sample_weight)`` at ``(start, size)`` (runs on a reader thread)."""
        x, y, sample_weight = self.stream.read(start, size)
        if self.class_weight is not None:
            if sample_weight is not None:  # a PyDataset that yields (x, y, sample_weight): refused, as by model.fit
                raise ValueError("You cannot specify `class_weight` and `sample_weight` at the same time. The "
                                 "training data yields sample weights. Give one of them (e.g. multiply the class "
                                 f"weights into the sample weights). Received: class_weight={self.class_weight!r}")
            sample_weight = _class_weights(y, self.class_weight)
        return x, y, sample_weight

    def _rows_in_memory(self) -> tuple | None:
        """``(data, rows)`` for :class:`StreamAdapter` when the training data is in memory, else None."""
        stream = self.stream
        if not getattr(stream, "in_memory", False):
            return None
        x, y, sample_weight = stream.structure
        if self.class_weight is not None:
            sample_weight = _class_weights(y, self.class_weight)
        return (x, y, sample_weight), stream.rows

    def plan_at(self, samples: int, minibatches: int) -> list:
        """The ``(start, size)`` minibatches of the epoch beginning at the clock reading ``(samples, minibatches)``.
        Reads nothing else, changes nothing: ``tf.data`` reads the next epoch's plan with it, ahead."""
        end = min((samples // self.epoch_size + 1) * self.epoch_size, self.stop_at)
        return list(_plan.plan(samples, minibatches, self.size_at, self.epoch_size, end))

    def whole_epoch_at(self, samples: int, minibatches: int) -> list:
        """The ``(start, size)`` minibatches of the whole epoch the clock reading ``(samples, minibatches)`` is in,
        from its first sample to its end, ``max_samples`` aside (asked for a fixed minibatch size only, whose plan
        does not read ``minibatches``)."""
        first = samples - samples % self.epoch_size
        return list(_plan.plan(first, minibatches, self.size_at, self.epoch_size, first + self.epoch_size))

    def epoch_plan(self) -> list:
        """The ``(start, size)`` minibatches of the epoch beginning at the clock's reading."""
        clock = self.clock
        self.run.flush()
        plan = self.plan_at(clock.samples, clock.minibatches)
        if self.distributed and not self.stream.pads_empty_shares:  # refused as the epoch begins, not as it is read
            for _, size in plan:
                _stream.check_global_minibatch(size, self.stream.num_workers, pads_empty_shares=False)
        end = min(clock.epoch_end(), self.stop_at)
        self.count_steps_run_in_epoch()
        if self.progbar is not None:
            self.progbar.plan_epoch([size for _, size in plan], done=self.run.batch_offset)
        self.epoch_step_rows = self.step_rows(plan, clock.minibatches)
        ahead = self.run.compile_ahead
        if ahead is not None and ahead.active and plan:
            # This epoch's first size compiles on its first step, if it is new; its other sizes and the next
            # epoch's compile meanwhile, in the background.
            ahead.seen(self.epoch_step_rows[:1])
            ahead.request(self.epoch_step_rows)
            following = clock.minibatches + len(plan)  # the next epoch's first minibatch
            ahead.request(self.step_rows(self.plan_at(end, following), following))
        return plan

    def count_steps_run_in_epoch(self) -> None:
        """Sets ``run.batch_offset`` in the epoch a run resumes in: its first steps ran before this call."""
        clock = self.clock
        if clock.samples_in_epoch:
            first = _plan.minibatches_before(clock.samples - clock.samples_in_epoch, self.size_at, self.epoch_size)
            self.run.batch_offset = max(clock.minibatches - first, 0)

    def step_rows(self, plan: list, minibatches: int) -> list[int]:
        """The rows the step is handed for each minibatch of ``plan`` (drawn from the clock's ``minibatches`` on):
        its size, or with ``pad_remainders`` its scheduled size."""
        if self.pads:
            return _padding.padded_rows(plan, minibatches, self.size_at)
        return [size for _, size in plan]

    # -- the run ---------------------------------------------------------------------------------
    def _feed(self) -> tuple[Any, Any, Any, int | None]:
        """What ``model.fit`` reads: the adapter, the clock's driver, a first batch to build the model with,
        and the size of the first minibatch."""
        clock = self.clock
        if self.source is not None:
            first = self.source.peek(draws=_backend.fit_reads_a_first_batch(self.model))
            # Until a step's batch is read (tf.data reads on its own thread), its size is taken as the first's.
            clock.minibatch_size = clock.minibatch_size or batch_size_of(first)
            if any(is_sparse(leaf) for leaf in flatten(first)):
                first = self.source.first_batch()  # Keras's own conversion of sparse inputs
            else:
                first = _backend.to_tensors(first)
            return self.source, SourceDriver(self.model, self.source), first, self.fixed_size
        workers = self.stream.num_workers
        adapter = StreamAdapter(
            self.read, self.epoch_plan,
            declared_batches(self.size_at, self.fixed_size, clock.samples, clock.minibatches, self.epoch_size,
                             self.stop_at, _plan.plan),
            batch_size=None if self.fixed_size is None else max(self.fixed_size // workers, 1),
            prefetch=self.prefetch, rows=self._rows_in_memory(),
            ahead=(lambda: (clock.samples, clock.minibatches), self.plan_at),
            pad=_padding.Padding(self.size_at) if self.pads else None,
            whole_epoch_at=self.whole_epoch_at,
            source=self.stream if isinstance(self.stream, PyDatasetStream) else None,
        )
        if clock.samples < self.stop_at:
            first_size = _plan.next_minibatch(clock.samples, clock.minibatches, self.size_at, self.epoch_size,
                                              self.stop_at)
        else:
            first_size = self.fixed_size or 1
        rows = max(first_size, workers)
        origin = getattr(self.stream, "origin", 0)
        x, y, sample_weight = self.read(origin + (clock.samples - origin) % max(self.stream.num_samples, 1), rows)
        if self.pads and _backend.BACKEND == "tensorflow" and y is None:
            raise ValueError("pad_remainders=True on TensorFlow needs targets `y`: a padded minibatch carries sample "
                             "weights, which tf.data cannot pair with an absent y. Give y, or train without "
                             "pad_remainders=True.")
        first = pack_batch(x, y, sample_weight)
        self.first_host = _padding.pad_batch(first, rows) if self.pads else first
        return adapter, PlanDriver(self.model, adapter, self.run), _backend.to_tensors(first), self.fixed_size or first_size

    def _validation_batch_size(self, first_size: int | None) -> int | None:
        """Keras's ``validation_batch_size or batch_size``: the minibatch size the user gave (a schedule's first
        size), else None, Keras's default (not the batch size of a PyDataset or DataLoader, as under model.fit)."""
        o = self.options
        if o.validation_batch_size is not None:
            return o.validation_batch_size
        if o.minibatch_size is None:
            return None
        return o.fixed_minibatch_size or first_size

    def train(self) -> keras.callbacks.History:
        from kfit import distributed

        model = self.model
        _run.start(self.run)
        adapter = None
        try:
            adapter, self.run.driver, first, first_size = self._feed()
            self.adapter = adapter
            extra: list = [_RunControl(self), _PlanStep(self.run)]
            if any(_dispatches_batch_end_synchronously(c) for c in self.callbacks):
                extra.append(_CountStep(self.run))
            if self.source is not None and self.max_samples is not None:
                extra.append(_StopAtSamples(self.run))
            if self.distributed:
                extra += [AgreedStopCallback(), _AverageMetrics()]
                self.run.agreed_stops = self.run.logs_averaged = True
            callbacks = ordered_callbacks(self.callbacks + extra) + [self.history]
            empty_epoch = _EmptyEpoch(self) if self.source is not None else None
            users_bar = any(isinstance(c, keras.callbacks.ProgbarLogger) for c in self.callbacks)
            if self.verbose != 0 and self.source is None and not users_bar:  # Keras adds none next to a user's own
                self.progbar = ProgressBar()
                callbacks.append(self.progbar)
            if self.distributed:
                distributed.prepare_model(model)
            keras_reads_first = self.source is None and _backend.fit_reads_a_first_batch(model)
            _backend.build(model, first)
            if keras_reads_first and not _backend.fit_reads_a_first_batch(model):
                _backend.draw_as_a_data_loader_pass()  # the pass model.fit opens to build the model (PyTorch)
            if self.source is None and self.fixed_size is None:
                _refuse_stateful_layers(model)
            if self.pads:
                _padding.check(model)
                self.unpad = _padding.install(model)
            validation_data, sharded = _validation.shard_validation_data(self.validation_data, model,
                                                                         self.options.validation_steps)
            if sharded:  # first at the epoch end (the lowest order), before _AverageMetrics
                callbacks = [_validation.CombineValidation(), *callbacks]
            with warnings.catch_warnings():
                # Keras's "ran out of data" for an epoch kfit ends early by design: one whose plan holds fewer
                # minibatches than declared, or the steps a resumed epoch had left. A source's own running out, and
                # validation data's, are Keras's to report, as under model.fit.
                warnings.showwarning = _unless_cut_short(warnings.showwarning, adapter, self.source)
                steps_per_epoch = self.source.steps_per_epoch if self.source is not None else None
                callbacks = _backend.callback_list([empty_epoch] * (empty_epoch is not None) + callbacks, model,
                                                   self.keras_verbose, self.num_epochs,
                                                   steps_per_epoch or adapter.num_batches,
                                                   lambda: self.run.batch_offset)
                if empty_epoch is not None:
                    empty_epoch.callbacks = callbacks
                self.keras_validation = (validation_data, self._validation_batch_size(first_size))
                model.fit(
                    adapter, epochs=self.num_epochs, verbose=self.keras_verbose, callbacks=callbacks,
                    validation_data=validation_data, validation_steps=self.options.validation_steps,
                    validation_batch_size=self.keras_validation[1],
                    validation_freq=self.options.validation_freq, initial_epoch=0, steps_per_epoch=steps_per_epoch,
                )
        finally:
            if self.run.compile_ahead is not None:
                self.run.compile_ahead.close()
            if self.unpad is not None:
                self.unpad()
            self.release_writes()
            if isinstance(adapter, StreamAdapter):
                adapter.close()
            elif self.source is not None:  # a run stopped inside an epoch: Keras's loop left its reader running
                _backend.stop_epoch_reader(self.source.inner)
            self.adapter = None  # (it holds the steps compiled ahead: JAX's caches must let go of them)
            _run.end(self.run)
            _backend.set_initial_epoch(model, None)
        return _returned_history(model, self.callbacks, self.history, self.summaries)


def _refuse_stateful_layers(model: Any) -> None:
    """A minibatch-size schedule cannot feed a stateful layer (a recurrent layer with ``stateful=True`` keeps a state
    for each row of a fixed batch size): refused before training, on every backend (TensorFlow's own error comes
    at the first step of another size, and does not say why)."""
    todo, seen = list(getattr(model, "layers", [])), set()
    while todo:
        layer = todo.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        if getattr(layer, "stateful", False) is True:
            raise ValueError(
                f"A minibatch-size schedule cannot train the stateful layer {layer.name!r}: it keeps a state for each "
                "row of a fixed batch size. Give a fixed `minibatch_size` (that batch size), or make the layer "
                "stateful=False.")
        todo += list(getattr(layer, "layers", None) or [])
        todo += [inner for inner in (getattr(layer, "forward_layer", None), getattr(layer, "layer", None))
                 if isinstance(inner, keras.layers.Layer)]


def _unless_cut_short(show: Callable[..., None], adapter: Any, source: SourceAdapter | None) -> Callable[..., None]:
    """``show`` (``warnings.showwarning``) without Keras's "ran out of data" of the training iterator over
    ``adapter``: kfit's stream's (an epoch kfit ended early), or while ``source`` is in an epoch that a resume cut
    short. The same warning of the validation data, or of a callback's ``model.evaluate``, is shown."""
    def showwarning(message: Any, *args: Any, **kwargs: Any) -> None:
        if not ("Your input ran out of data" in str(message) and (source is None or source.cut_short)
                and _backend.warned_by_iterator_of(adapter)):
            show(message, *args, **kwargs)
    return showwarning


__all__ = ["fit"]
