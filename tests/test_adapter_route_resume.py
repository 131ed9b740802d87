"""Runs killed and resumed on the route through Keras's own data adapter (a source read on across epochs:
``steps_per_epoch`` other than its length): each resumes to the uninterrupted run, which trains as ``model.fit``,
or says once, as it resumes, that it cannot.
"""

import functools
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
import torch
from helpers import assert_same_weights, mlp, regression_data

import kfit
from kfit.data import _source

X, Y = regression_data(50)  # 7 batches of 8 a pass, the last of 2 rows
INEXACT = ("resume is not exact", "resume may not be exact")


class _CrashAtStep(keras.callbacks.Callback):
    """Crashes as the step after ``step`` trained steps begins (Keras's try of a step past a pass's end, which trains
    nothing, counts none)."""

    def __init__(self, step):
        super().__init__()
        self.step, self.steps = step, 0

    def on_train_batch_begin(self, batch, logs=None):
        if self.steps == self.step:
            raise RuntimeError("crash")

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1


class _Epochs(keras.callbacks.Callback):
    """Records the epoch hooks the callbacks see: ``(hook, epoch, logs)``."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_begin(self, epoch, logs=None):
        self.seen.append(("begin", epoch, dict(logs or {})))

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(("end", epoch, dict(logs or {})))


def _train(loop, data, epochs, steps_per_epoch, path=None, crash_at=None, metrics=None, save=None, seen=None,
           **options):
    """Trains a small model on ``data()`` under ``model.fit`` or ``kfit.fit`` (with a Checkpoint when ``path`` is
    given, at every step unless ``save`` gives its arguments, crashing before step ``crash_at``; ``seen``: an
    :class:`_Epochs` to add); returns the model, its History and the messages of the warnings that say a resume is not
    exact."""
    keras.utils.set_random_seed(4)
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse", metrics=metrics)
    save = save or {"frequency": "1mb"}
    callbacks = [] if path is None else [kfit.callbacks.Checkpoint(path, async_write=False, **save)]
    callbacks += [] if crash_at is None else [_CrashAtStep(crash_at)]
    callbacks += [] if seen is None else [seen]
    fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = fit(data(), epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=0, callbacks=callbacks,
                      **options)
    return model, history, [str(w.message) for w in caught if any(s in str(w.message) for s in INEXACT)]


def _resumes_to_model_fit(tmp_path, data, epochs, steps_per_epoch, crashes, **options):
    """kfit.fit trains as model.fit, and runs crashed before each step of ``crashes`` resume to it, saying nothing of
    an inexact resume."""
    expected, expected_history, _ = _train("model.fit", data, epochs, steps_per_epoch, **options)
    looped, history, _ = _train("kfit.fit", data, epochs, steps_per_epoch, tmp_path / "reference.ckpt", **options)
    assert_same_weights(expected, looped)
    assert history.history == expected_history.history
    for crash_at in crashes:
        path = tmp_path / f"run{crash_at}.ckpt"
        with pytest.raises(RuntimeError, match="crash"):
            _train("kfit.fit", data, epochs, steps_per_epoch, path, crash_at, **options)
        resumed, resumed_history, said = _train("kfit.fit", data, epochs, steps_per_epoch, path, **options)
        assert said == []
        assert_same_weights(expected, resumed)
        assert resumed_history.epoch == expected_history.epoch
        assert resumed_history.history == expected_history.history


def _said_at_resume(tmp_path, data, epochs, steps_per_epoch, crash_at, **options):
    path = tmp_path / "run.ckpt"
    with pytest.raises(RuntimeError, match="crash"):
        _train("kfit.fit", data, epochs, steps_per_epoch, path, crash_at, **options)
    return _train("kfit.fit", data, epochs, steps_per_epoch, path, **options)[2]


class _Rows(keras.utils.PyDataset):
    """X, Y in batches of 8, read by ``workers`` threads."""

    def __init__(self, workers=0):
        super().__init__(workers=workers)

    def __len__(self):
        return 7

    def __getitem__(self, index):
        return X[index * 8:(index + 1) * 8], Y[index * 8:(index + 1) * 8]


# -- a PyDataset read by workers -----------------------------------------------------------------------------------
def test_a_pydataset_read_by_workers_in_order_resumes_to_model_fit(tmp_path):
    """``workers=2``, ``shuffle=False``, ``steps_per_epoch=4`` (passes of 7 steps: epochs of 4 and 3): Keras's queue of
    workers serves the batches in order, also across the epochs' ends, where it stops and restarts; a resumed run
    drops the batches trained from a new queue and lands where the interrupted run was. (Needed no fix. Worker
    processes, ``use_multiprocessing=True``, pass alone too, but on TensorFlow a pool forked after the other tests of
    this file once left a child that never ended.)"""
    _resumes_to_model_fit(tmp_path, lambda: _Rows(2), 4, 4, (2, 5, 7), shuffle=False)


def test_a_pydataset_read_by_workers_that_keras_shuffles_says_at_resume_that_it_is_not_exact(tmp_path):
    """``workers=2`` with ``shuffle=True`` (the default) and ``steps_per_epoch=4``: Keras's queue draws an order of the
    batches from Python's random state as every epoch begins (its worker thread's ``random.shuffle``) and keeps the
    batches of the orders not yet read (``OrderedEnqueuer.stop`` moves them to its ready queue); an epoch's end stops
    the thread of the order drawn as it began, and whether that thread has queued its batches by then depends on
    timing: orders are lost from run to run (seen on JAX, TensorFlow and PyTorch, under model.fit too: runs read the
    draws 0, 1, 3, 6, ... or 0, 1, 2, 5, ...). No resume can find the batches the interrupted run would have trained:
    it ended with other weights, and said nothing. It now says so, once."""
    said = _said_at_resume(tmp_path, lambda: _Rows(2), 4, 4, 5)
    assert len(said) == 1
    assert "workers and shuffle=True" in said[0] and "shuffle=False" in said[0]


# -- sources of unknown length -------------------------------------------------------------------------------------
def _batches():
    for start in range(0, len(X), 8):
        yield X[start:start + 8], Y[start:start + 8]


def test_a_finite_generator_read_on_across_epochs_resumes_to_model_fit(tmp_path):
    """A generator of 7 batches, ``steps_per_epoch=3``, 3 epochs (3, 3 and 1 steps: it runs out in the last): a resumed
    run draws and drops every batch trained since the start from a new generator, so it resumes exactly inside an
    epoch, at an epoch's end and in the epoch the generator runs out in. (Needed no fix.)"""
    _resumes_to_model_fit(tmp_path, _batches, 3, 3, (2, 3, 5, 6))


def _unknown_length(batches=7):
    """The first ``batches`` batches of 8 of X, Y, as a ``tf.data`` pipeline of unknown cardinality (``filter``)."""
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(8).take(batches).filter(lambda x, y: True)


class _Batches(torch.utils.data.IterableDataset):
    """X, Y in batches of 8, with no ``__len__``: Keras does not know a DataLoader's length over it."""

    def __iter__(self):
        yield from _batches()


def test_a_tf_data_pipeline_of_unknown_length_read_on_across_epochs_resumes_to_model_fit(tmp_path):
    """A ``tf.data`` pipeline of unknown cardinality (7 batches a pass), ``steps_per_epoch=3``: Keras finds a pass's end
    only by trying a step past it, and takes the steps its iterator had counted since it made it (7, and the try) for
    the length of every later pass. A resumed run's Keras made its iterator at the resume: it counted from there and
    cut the later epochs elsewhere (resumed two steps in, epochs of 3, 3, 1, 3, 2, 2 steps, not model.fit's 3, 3, 1, 3,
    3, 1; other weights), and kfit only warned that the resume may not be exact. The checkpoint now holds the pass
    length once kfit's reader has found the first pass ended, and the resumed run's Keras counts the pass from where
    the uninterrupted run's stood: runs crashed in the first pass (2 steps in, and 6: an epoch's end), at its end (7),
    and in the passes after (8, 10, 13) resume to model.fit, History and weights, with nothing said. The pipeline given
    its length (``assert_cardinality``) and an endless one resume exactly too."""
    _resumes_to_model_fit(tmp_path, _unknown_length, 6, 3, (2, 6, 7, 8, 10, 13))
    (tmp_path / "known").mkdir()
    known = lambda: _unknown_length().apply(tf.data.experimental.assert_cardinality(7))  # noqa: E731
    _resumes_to_model_fit(tmp_path / "known", known, 6, 3, (2, 8))
    endless = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8).repeat()  # (no pass ends: nothing to say)
    (tmp_path / "endless").mkdir()
    assert _said_at_resume(tmp_path / "endless", lambda: endless, 3, 4, 5) == []


def test_a_data_loader_without_a_length_read_on_across_epochs_resumes_to_model_fit(tmp_path):
    """A torch ``DataLoader`` over an ``IterableDataset`` with no ``__len__`` (7 batches a pass), ``steps_per_epoch=3``:
    as for ``tf.data`` of unknown cardinality, Keras learns the pass length as the first pass ends. The checkpoint also
    holds where the pass began (a DataLoader's pass is reopened, not read from the run's start): the pass length kfit
    saves gives the resumed run's Keras its count. Crashed in the first pass, at its end and after, it resumes to
    model.fit (it warned, and its History and weights differed, before)."""
    _resumes_to_model_fit(tmp_path, lambda: torch.utils.data.DataLoader(_Batches(), batch_size=None), 6, 3,
                          (2, 7, 10))


def test_a_pass_of_unknown_length_that_ends_an_epoch_resumes_exactly(tmp_path):
    """Passes of 6 batches, ``steps_per_epoch=3``: the pass's last batch ends an epoch, and Keras finds the pass ended
    only in the next epoch, which trains no step. Its History entry comes from the logs of the fit call's earlier steps:
    the metrics reset on TensorFlow (``loss`` and ``mae`` 0.0), the last epoch's on JAX, none on PyTorch (its ``epoch``
    listed, no value). Resumed anywhere else (2, 5, 7, 10 steps in) the run is model.fit's. Resumed from a checkpoint
    written at such a pass's end (at every step: 6 and 12 steps in), before that epoch, a new fit call cannot make it
    (on JAX its loop failed, its logs unset): kfit resumed with the epoch after it, with model.fit's weights but a
    History without that epoch, and said so. It now plays that epoch to the callbacks as the run begins, with model.fit's
    logs. Resumed from a checkpoint written at that epoch's end (once per epoch, crashed 7 and 13 steps in), on JAX
    the clock had not moved past it (kfit's reader found the pass ended only there) and the run trained it again (other
    weights, two History entries for epoch 2), and on PyTorch the checkpoint's History lacked it (empty logs) and the
    run resumed at its step again. Every case now resumes to model.fit: weights, History, and the epoch hooks every
    callback sees with their logs, from the uninterrupted run's epoch the resumed run begins in on."""
    data = functools.partial(_unknown_length, 6)
    _resumes_to_model_fit(tmp_path, data, 7, 3, (2, 5, 7, 10))
    expected_hooks = _Epochs()
    expected, expected_history, _ = _train("model.fit", data, 7, 3, metrics=["mae"], seen=expected_hooks)
    looped_hooks = _Epochs()
    looped, looped_history = _train("kfit.fit", data, 7, 3, tmp_path / "uninterrupted.ckpt", metrics=["mae"],
                                    seen=looped_hooks)[:2]
    assert_same_weights(expected, looped)
    assert looped_history.epoch == expected_history.epoch and looped_history.history == expected_history.history
    assert looped_hooks.seen == expected_hooks.seen
    every_epoch = {"epochs": 1}
    for save, crash_at, first_epoch in ((None, 6, 2), (None, 12, 5), (every_epoch, 7, 3), (every_epoch, 13, 6)):
        path = tmp_path / f"{crash_at}" / "run.ckpt"
        path.parent.mkdir()
        with pytest.raises(RuntimeError, match="crash"):
            _train("kfit.fit", data, 7, 3, path, crash_at, metrics=["mae"], save=save)
        hooks = _Epochs()
        resumed, history, said = _train("kfit.fit", data, 7, 3, path, metrics=["mae"], save=save, seen=hooks)
        assert said == []
        assert_same_weights(expected, resumed)
        assert history.epoch == expected_history.epoch
        assert history.history == expected_history.history
        assert hooks.seen == expected_hooks.seen[expected_hooks.seen.index(("begin", first_epoch, {})):]


def test_a_pass_of_unknown_length_that_ends_an_epoch_resumes_exactly_with_validation(tmp_path):
    """As above, with validation data: the epoch of no step validates the weights the epoch before it ended with (the
    same ``val_loss``), and on JAX its ``loss`` is the reset metric's 0.0, as on TensorFlow (the validation handed
    the loop's state back to the model; ``model.fit`` itself fails there on JAX, reading a purged metric variable, so
    the reference is the uninterrupted ``kfit.fit``). Resumed before that epoch (6 steps in) and at its end (once per
    epoch, 7 steps in), the History is the uninterrupted run's, with nothing said."""
    data = functools.partial(_unknown_length, 6)
    validation = {"validation_data": (X[:16], Y[:16])}
    expected, expected_history, _ = _train("kfit.fit", data, 4, 3, tmp_path / "uninterrupted.ckpt", **validation)
    assert len(expected_history.history["val_loss"]) == 4
    for save, crash_at in ((None, 6), ({"epochs": 1}, 7)):
        path = tmp_path / f"{crash_at}" / "run.ckpt"
        path.parent.mkdir()
        with pytest.raises(RuntimeError, match="crash"):
            _train("kfit.fit", data, 4, 3, path, crash_at, save=save, **validation)
        resumed, history, said = _train("kfit.fit", data, 4, 3, path, save=save, **validation)
        assert said == []
        assert_same_weights(expected, resumed)
        assert history.epoch == expected_history.epoch
        assert history.history == expected_history.history


def test_a_checkpoint_without_the_pass_length_says_at_resume_that_it_may_not_be_exact(tmp_path, monkeypatch):
    """A checkpoint written by a kfit that did not save the pass length (no ``pass_batches`` in the source's state)
    still loads; its resume says once that it may not be exact, and why."""
    get_state = _source.SourceAdapter.get_state

    def without_pass_length(self):
        state = get_state(self)
        state = {k: v for k, v in (state or {}).items() if k != "pass_batches"}
        return state if set(state) - {"kind"} else None

    path = tmp_path / "run.ckpt"
    with monkeypatch.context() as older_kfit:
        older_kfit.setattr(_source.SourceAdapter, "get_state", without_pass_length)
        with pytest.raises(RuntimeError, match="crash"):
            _train("kfit.fit", _unknown_length, 6, 3, path, 8)
    said = _train("kfit.fit", _unknown_length, 6, 3, path)[2]
    assert len(said) == 1
    assert "did not save how long the passes are" in said[0]


# -- a PyDataset's epoch hooks that do nothing ---------------------------------------------------------------------
class _Passes(_Rows):
    def on_epoch_end(self):
        pass


class _Documented(_Rows):
    def on_epoch_begin(self):
        """Nothing to do here."""

    def on_epoch_end(self):
        return None


class _Reordering(_Rows):
    def __init__(self):
        super().__init__()
        self.rng = np.random.default_rng(7)

    def on_epoch_end(self):
        self.rng.permutation(7)  # (what a dataset that reorders itself would draw)


@pytest.mark.parametrize("dataset", [_Passes, _Documented, _Reordering])
def test_a_pydataset_whose_epoch_hooks_do_nothing_resumes_without_a_warning(tmp_path, dataset):
    """On TensorFlow a run resumed on a PyDataset read on across epochs with an ``on_epoch_begin`` or ``on_epoch_end``
    of its own says it may not be exact (tf.data reads ahead of those calls, which may change its rows): also for
    hooks whose body is only ``pass``, a docstring or ``return None``, which change nothing. Those are now told apart:
    no warning; a hook that does something still warns (TensorFlow only)."""
    said = _said_at_resume(tmp_path, dataset, 3, 4, 5, shuffle=False)
    does_something = dataset is _Reordering and keras.backend.backend() == "tensorflow"
    assert len(said) == does_something
    assert all("on_epoch_end" in message for message in said)
