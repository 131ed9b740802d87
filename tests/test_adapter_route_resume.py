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
from helpers import assert_same_weights, mlp, regression_data

import kfit

X, Y = regression_data(50)  # 7 batches of 8 a pass, the last of 2 rows
INEXACT = ("resume is not exact", "resume may not be exact")


class _CrashAtStep(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step, self.steps = step, 0

    def on_train_batch_begin(self, batch, logs=None):
        if self.steps == self.step:
            raise RuntimeError("crash")
        self.steps += 1


def _train(loop, data, epochs, steps_per_epoch, path=None, crash_at=None, **options):
    """Trains a small model on ``data()`` under ``model.fit`` or ``kfit.fit`` (with a Checkpoint at every step when
    ``path`` is given, crashing before step ``crash_at``); returns the model, its History and the messages of the
    warnings that say a resume is not exact."""
    keras.utils.set_random_seed(4)
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    callbacks = [] if path is None else [kfit.callbacks.Checkpoint(path, frequency="1mb", async_write=False)]
    callbacks += [] if crash_at is None else [_CrashAtStep(crash_at)]
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


def test_a_tf_data_pipeline_of_unknown_length_read_on_across_epochs_says_at_resume_that_it_may_not_be_exact(tmp_path):
    """A ``tf.data`` pipeline of unknown cardinality (``filter``: 7 batches a pass), ``steps_per_epoch=3``: Keras
    finds a pass's end only by reading past it, then takes the steps its iterator had counted for the length of every
    pass. A resumed run's Keras began counting at the resume, so after the pass ends its epochs are cut elsewhere: the
    History differed from model.fit's (resumed two steps in: epochs of 3, 3, 1, 3, 2, 2 steps, not 3, 3, 1, 3, 3, 1),
    and the weights too once later passes were cut short, with nothing said. It now says once that it may not be
    exact. The same pipeline given its length (``assert_cardinality``, as the warning advises) resumes exactly."""
    def unknown():
        return tf.data.Dataset.from_tensor_slices((X, Y)).batch(8).filter(lambda x, y: True)

    said = _said_at_resume(tmp_path, unknown, 6, 3, 2)
    assert len(said) == 1
    assert "length Keras does not know" in said[0] and "assert_cardinality" in said[0]
    _resumes_to_model_fit(tmp_path, lambda: unknown().apply(tf.data.experimental.assert_cardinality(7)), 6, 3, (2, 8))
    endless = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8).repeat()  # (no pass ends: nothing to say)
    (tmp_path / "endless").mkdir()
    assert _said_at_resume(tmp_path / "endless", lambda: endless, 3, 4, 5) == []


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
