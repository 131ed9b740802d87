"""The train step sees the batch dimension ``model.fit`` gives it, so that a model trains to the same bits.

With no partial batch, Keras's array adapter hands TensorFlow's step a static batch dimension (the batch size);
with one, an unknown one. TensorFlow traces another graph for each, whose float rounding can differ (a
``SimpleRNN`` under oneDNN, TensorFlow's default on x86): ``kfit.fit``'s ``tf.data`` pipeline declares the batch
dimension as Keras does, static when every minibatch of the call has the same rows. On JAX and PyTorch the step
sees each batch's own shape; every test here runs on every backend (the oneDNN one in a child process, since the
suite turns oneDNN off).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from helpers import assert_same_weights

import kfit
from kfit.data._epochs_ahead import constant_size
from kfit.training import _plan


def sequences(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.RandomState(seed)
    return r.randn(n, 3, 2).astype("float32"), r.randint(0, 3, n)


class ShapeRecorder(keras.Model):
    """A SimpleRNN classifier whose ``train_step`` records the batch dimension it is traced (or run) with."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.rnn = keras.layers.SimpleRNN(4)
        self.dense = keras.layers.Dense(3, activation="softmax")
        self.seen: set = set()

    def call(self, x):
        return self.dense(self.rnn(x))

    def train_step(self, *args):
        data = args[-1]  # (state, data) on JAX
        self.seen.add(keras.tree.flatten(data)[0].shape[0])
        return super().train_step(*args)


def rnn(recording: bool = False, **compile_options) -> keras.Model:
    keras.utils.set_random_seed(1)
    if recording:
        model = ShapeRecorder()
    else:
        inputs = keras.Input((3, 2))
        model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(keras.layers.SimpleRNN(4)(inputs)))
    compile_options.setdefault("optimizer", keras.optimizers.SGD(0.05))
    model.compile(loss="sparse_categorical_crossentropy", **compile_options)
    return model


def way_options(way: str, monkeypatch) -> dict:
    """How kfit's data reaches the step on TensorFlow: one ``tf.data`` iterator reading epochs ahead, or Keras's own
    dataset of kfit's adapter (``steps_per_execution`` > 1, or reading ahead turned off). The compile options."""
    if way == "no read ahead":
        monkeypatch.setenv("KFIT_READ_AHEAD", "0")
    if way == "steps_per_execution":
        if keras.backend.backend() == "torch":
            pytest.skip("Keras's PyTorch trainer takes no steps_per_execution > 1")
        return {"steps_per_execution": 2}
    return {}


def plan_at(size: int, epoch_size: int, stop_at: int):
    """``kfit.fit``'s ``plan_at`` for a fixed minibatch size."""
    def at(samples, minibatches):
        end = min((samples // epoch_size + 1) * epoch_size, stop_at)
        return list(_plan.plan(samples, minibatches, lambda s, m: size, epoch_size, end))
    return at


def test_constant_size_is_the_size_of_every_minibatch_left_when_they_have_one():
    for size, epoch_size, epochs, extra in itertools.product((1, 3, 4, 16), (4, 12, 13, 48), (1, 2, 5), (0, 3, 8)):
        stop_at = epochs * epoch_size + extra
        at = plan_at(size, epoch_size, stop_at)
        # every reading a run may begin at: each minibatch's start, and starts a resize left (not multiples of size)
        for samples in sorted({start for start, _ in at(0, 0)} | set(range(0, stop_at, 5))):
            walk, left = (samples, 2), set()  # the sizes of every minibatch left, epoch by epoch
            while epoch := at(*walk):
                left |= {s for _, s in epoch}
                walk = (epoch[-1][0] + epoch[-1][1], walk[1] + len(epoch))
            expected = left.pop() if len(left) == 1 else None
            assert constant_size(at, (samples, 2), at(samples, 2)) == expected, (size, epoch_size, stop_at, samples)


@pytest.mark.parametrize("n", [192, 200], ids=["divisible", "remainder"])
def test_a_simple_rnn_trains_to_model_fits_weights(n):
    x, y = sequences(n)
    reference = rnn()
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    trained = rnn()
    kfit.fit(trained, x, y, minibatch_size=16, epochs=2, shuffle=False, seed=0, verbose=0)
    assert_same_weights(reference, trained)


@pytest.mark.parametrize("n", [192, 200], ids=["divisible", "remainder"])
@pytest.mark.parametrize("way", ["read ahead", "steps_per_execution", "no read ahead"])
def test_the_step_sees_the_batch_dimension_model_fit_gives_it(n, way, monkeypatch):
    options = way_options(way, monkeypatch)
    x, y = sequences(n)
    reference = rnn(recording=True, **options)
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    trained = rnn(recording=True, **options)
    kfit.fit(trained, x, y, minibatch_size=16, epochs=2, shuffle=False, seed=0, verbose=0)
    assert trained.seen == reference.seen
    assert_same_weights(reference, trained)


@pytest.mark.parametrize("n", [192, 200], ids=["divisible", "remainder"])
def test_data_read_from_h5py_reaches_the_step_as_model_fit_hands_it_the_arrays(n, tmp_path):
    """Data not in memory: kfit's reader hands ``tf.data`` the minibatches (``from_generator``)."""
    h5py = pytest.importorskip("h5py")
    x, y = sequences(n)
    reference = rnn(recording=True)
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    with h5py.File(tmp_path / "data.h5", "w") as file:
        file["x"], file["y"] = x, y
        trained = rnn(recording=True)
        kfit.fit(trained, file["x"], file["y"], minibatch_size=16, epochs=2, shuffle=False, seed=0, verbose=0)
    assert trained.seen == reference.seen
    assert_same_weights(reference, trained)


@pytest.mark.parametrize("way", ["read ahead", "steps_per_execution"])
def test_a_run_resumed_mid_epoch_still_trains_to_model_fits_weights(way, tmp_path, monkeypatch):
    options = way_options(way, monkeypatch)
    x, y = sequences(192)
    reference = rnn(**options)
    reference.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    path = tmp_path / "run.ckpt"
    run = dict(minibatch_size=16, epochs=3, shuffle=False, seed=0, verbose=0)
    kfit.fit(rnn(**options), x, y, max_samples=192 + 64, callbacks=[kfit.callbacks.Checkpoint(path)], **run)
    resumed = rnn(**options)
    checkpoint = kfit.callbacks.Checkpoint(path)
    kfit.fit(resumed, x, y, callbacks=[checkpoint], **run)
    assert checkpoint.restored_from.samples == 192 + 64  # in the second epoch
    assert_same_weights(reference, resumed)


@pytest.mark.parametrize("way", ["read ahead", "steps_per_execution", "no read ahead"])
def test_a_resume_that_leaves_a_remainder_trains_it(way, tmp_path, monkeypatch):
    """A checkpoint saved at 8 samples into an epoch, resumed at 16 a minibatch: the resumed epochs end in a
    remainder of 8, which the step must take (the batch dimension declared when ``model.fit`` began, before the
    restore moved the clock, no longer holds)."""
    options = way_options(way, monkeypatch)
    x, y = sequences(192)
    path = tmp_path / "run.ckpt"
    kfit.fit(rnn(recording=True, **options), x, y, minibatch_size=8, max_samples=8, shuffle=False, seed=0, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(path)])
    resumed = rnn(recording=True, **options)
    checkpoint = kfit.callbacks.Checkpoint(path)
    history = kfit.fit(resumed, x, y, minibatch_size=16, epochs=2, shuffle=False, seed=0, verbose=0,
                       callbacks=[checkpoint])
    assert checkpoint.restored_from.samples == 8
    assert [s.samples for s in history.epoch_summaries] == [184, 192]
    # TensorFlow: one trace for both sizes (the batch dimension unknown); elsewhere each batch's own shape.
    assert resumed.seen == ({None} if keras.backend.backend() == "tensorflow" else {16, 8})


CHILD = """
import numpy as np, keras, kfit

r = np.random.RandomState(0)

def make():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((3, 2))
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(keras.layers.SimpleRNN(4)(inputs)))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
    return model

for n in (192, 200):
    x, y = r.randn(n, 3, 2).astype("float32"), r.randint(0, 3, n)
    reference = make()
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    trained = make()
    kfit.fit(trained, x, y, minibatch_size=16, epochs=2, shuffle=False, seed=0, verbose=0)
    for a, b in zip(reference.get_weights(), trained.get_weights()):
        np.testing.assert_array_equal(a, b)
    if n == 192:
        path = {path!r}
        run = dict(minibatch_size=16, epochs=2, shuffle=False, seed=0, verbose=0)
        kfit.fit(make(), x, y, max_samples=192 + 64, callbacks=[kfit.callbacks.Checkpoint(path)], **run)
        resumed = make()
        kfit.fit(resumed, x, y, callbacks=[kfit.callbacks.Checkpoint(path)], **run)
        for a, b in zip(reference.get_weights(), resumed.get_weights()):
            np.testing.assert_array_equal(a, b)
print("same weights")
"""


def test_a_simple_rnn_trains_to_model_fits_weights_under_onednn(backend, tmp_path):
    """TensorFlow's default (oneDNN on), where the graph traced for an unknown batch dimension rounds otherwise."""
    if backend != "tensorflow":
        pytest.skip("oneDNN's rounding is TensorFlow's: the tests above cover this backend")
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1", KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD).format(path=str(tmp_path / "run.ckpt"))],
                           capture_output=True, text=True, env=env, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    assert "same weights" in child.stdout
