"""``kfit.fit(..., pad_remainders=True)``: the minibatches an epoch end cuts short reach a step compiled per shape (JAX;
TensorFlow with ``jit_compile=True``) at their scheduled size, padded with zero-weight rows whose effect is taken out,
so that they compile no step of their own. The models here are compiled with ``jit_compile=True`` on TensorFlow (XLA,
Keras's default on a GPU). On PyTorch, and on TensorFlow without XLA, nothing is padded (a new size compiles nothing
there): the runs are the unpadded ones."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
from helpers import BatchSamples, assert_same_weights, regression_data, weights

import kfit

BACKEND = keras.backend.backend()
PADS = BACKEND in ("jax", "tensorflow")  # with the models' jit_compile below
JIT_COMPILE = "auto" if BACKEND == "torch" else True
SCHEDULE = dict(epoch_size=100)  # epochs of 100 samples: 8s then a 4, 16s then a 4, 32s then a 4
SIZES = [8, 16, 32]


class TrainingShapes(keras.layers.Layer):
    """Passes its input through and records the batch dimension of every training call it is traced (JAX,
    TensorFlow) or run (PyTorch) with: the minibatch shapes the train step is compiled for."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.shapes = set()

    def call(self, x, training=None):
        if training:
            self.shapes.add(x.shape[0])
        return x


def model_with(*layers, metrics=("mae",), weighted_metrics=("mse",), loss="mse", seed=1, jit_compile=JIT_COMPILE):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), TrainingShapes(), *layers,
                              keras.layers.Dense(8, activation="tanh", kernel_regularizer="l2"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5), loss=loss, metrics=list(metrics),
                  weighted_metrics=list(weighted_metrics), jit_compile=jit_compile)
    return model


class StepRows(keras.callbacks.Callback):
    """The rows each train step was handed, read from the running total of a :class:`BatchSamples` metric."""

    def __init__(self):
        super().__init__()
        self.rows, self._total = set(), 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._total = 0.0

    def on_train_batch_end(self, batch, logs=None):
        total = float(logs["batch_samples"])
        self.rows.add(round(total - self._total))
        self._total = total


def train(model, pad, **options):
    x, y = regression_data(100)
    sample_weight = np.random.default_rng(4).uniform(0.5, 1.5, size=(100,)).astype("float32")
    run = {}

    class GrabRun(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            run["run"] = kfit._run.current_run(self.model)

    options = dict(minibatch_size=kfit.schedules.minibatch_size(SIZES, **SCHEDULE), epoch_size=100, epochs=3, seed=1,
                   verbose=0) | options
    callbacks = [*options.pop("callbacks", []), GrabRun()]
    history = kfit.fit(model, x, y, sample_weight=sample_weight, pad_remainders=pad, callbacks=callbacks, **options)
    return history, run["run"]


def test_padded_remainders_train_as_unpadded_ones_and_compile_no_shape_of_their_own():
    runs = {}
    for pad in (False, True):
        model = model_with(metrics=("mae", BatchSamples()))
        rows = StepRows()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="pad_remainders=True: the state of metric 'batch_samples'")
            history, run = train(model, pad, callbacks=[rows])
        runs[pad] = model, history, run, rows.rows
    (plain, plain_history, _, plain_rows), (padded, padded_history, run, padded_rows) = runs[False], runs[True]
    # The clock and the epochs count the real samples; the logs (loss with its regularization, an unweighted and a
    # weighted metric) and the weights are the unpadded run's.
    assert [s.samples for s in padded_history.epoch_summaries] == [100, 100, 100]
    assert padded_history.history.keys() == plain_history.history.keys()
    for name, values in plain_history.history.items():
        if name != "batch_samples":  # the rows the step was handed (padding rows included): below
            np.testing.assert_allclose(padded_history.history[name], values, rtol=2e-6, err_msg=name)
    shapes = {False: plain.layers[0].shapes, True: padded.layers[0].shapes}
    assert plain_rows == {4, 8, 16, 32}
    if PADS:  # the step is only handed the scheduled sizes: the cut 4s compile no step of their own
        for a, b in zip(weights(plain), weights(padded), strict=True):
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
        assert padded_rows == {8, 16, 32}
    else:  # nothing to pad: the same run
        assert_same_weights(plain, padded)
        assert padded_rows == plain_rows
    if BACKEND == "jax":  # the shapes the step was traced (and compiled) for; compiled ahead of their first step
        assert shapes == {False: {4, 8, 16, 32}, True: {8, 16, 32}}
        ahead = run.compile_ahead
        assert ahead.errors == [] and ahead._requested == {8, 16, 32}
    else:  # TensorFlow: one trace, batch dimension unknown (XLA compiles per shape it runs); PyTorch: no trace
        assert shapes[True] == shapes[False] == ({None} if BACKEND == "tensorflow" else {4, 8, 16, 32})
    # Nothing of the padding stays on the model: its attributes are the unpadded model's, and a plain model.fit
    # trains it on Keras's own step, unpadded.
    assert sorted(vars(padded)) == sorted(vars(plain))
    padded.layers[0].shapes.clear()
    x, y = regression_data(20)
    before = weights(padded)
    padded.fit(x, y, batch_size=6, epochs=1, verbose=0)
    assert padded.layers[0].shapes == ({None} if BACKEND == "tensorflow" else {6, 2})
    assert not np.array_equal(before[-1], weights(padded)[-1])


def test_a_step_compiled_for_no_shape_is_handed_the_minibatches_as_cut():
    """Without XLA (``jit_compile=False``: TensorFlow's default on a CPU) one step serves every size: nothing to pad."""
    runs = {}
    for pad in (False, True):
        model = model_with(metrics=("mae", BatchSamples()), jit_compile=False)
        rows = StepRows()
        train(model, pad, callbacks=[rows], epochs=2)
        runs[pad] = model, rows.rows
    assert runs[False][1] == runs[True][1] == {4, 8, 16}
    assert_same_weights(runs[False][0], runs[True][0])


@pytest.mark.skipif(BACKEND != "tensorflow",
                    reason="tf.data's limit: JAX's padded batches are NumPy; torch pads nothing")
def test_pad_remainders_on_tensorflow_needs_targets():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.add_loss(keras.ops.convert_to_tensor(0.0))
    model.compile(optimizer="sgd", jit_compile=True)
    x, _ = regression_data(40)
    with pytest.raises(ValueError, match="pad_remainders=True on TensorFlow needs targets `y`"):
        kfit.fit(model, x, minibatch_size=16, pad_remainders=True, verbose=0)


def test_a_padded_run_resumed_mid_epoch_is_bit_identical(tmp_path):
    """Each minibatch is padded to the scheduled size at its clock reading: a resumed run pads as the run it
    resumes, the epoch it resumes in included."""
    reference = model_with()
    train(reference, True)
    path = tmp_path / "run.ckpt"
    train(model_with(), True, max_samples=148, callbacks=[kfit.callbacks.Checkpoint(path, frequency=40)])
    resumed = model_with()
    history, _ = train(resumed, True, callbacks=[kfit.callbacks.Checkpoint(path, frequency=40)])
    assert [s.samples for s in history.epoch_summaries] == [100, 52, 100]  # epoch 2 resumed 48 samples in
    # The resumed epoch's last minibatch (4 samples, drawn at 196) is padded to 16, as in the uninterrupted run.
    assert resumed.layers[0].shapes == {"jax": {16, 32}, "tensorflow": {None}}.get(BACKEND, {4, 16, 32})
    assert_same_weights(reference, resumed)
    for a, b in zip(reference.optimizer.variables, resumed.optimizer.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(a.value), np.asarray(b.value))


class OwnTrainStep(keras.Sequential):
    def train_step(self, *args, **kwargs):
        return super().train_step(*args, **kwargs)


class AddsLoss(keras.layers.Layer):
    """Adds the mean of its input to the loss (``add_loss`` in ``call``): a mean over the rows, padding rows too."""

    def call(self, x):
        self.add_loss(0.01 * keras.ops.mean(keras.ops.square(x)))
        return x


REFUSED = {
    "add_loss": (lambda: model_with(AddsLoss(name="adds_loss")), "layer 'adds_loss': it adds a loss"),
    "BatchNormalization": (lambda: model_with(keras.layers.BatchNormalization()), "BatchNormalization"),
    "activity regularizer": (lambda: model_with(keras.layers.Dense(4, activity_regularizer="l2")),
                             "activity regularizer"),
    "sum reduction": (lambda: model_with(loss=keras.losses.MeanSquaredError(reduction="sum")), "reduction='sum'"),
    "own train_step": (lambda: _own_train_step(), "defines its own"),
}


def _own_train_step():
    keras.utils.set_random_seed(1)
    model = OwnTrainStep([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=JIT_COMPILE)
    return model


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_pad_remainders_is_refused_where_padding_would_not_be_exact(case):
    make, reason = REFUSED[case]
    if not PADS:  # nothing is padded: it trains as without
        history, _ = train(make(), True)
        assert [s.samples for s in history.epoch_summaries] == [100, 100, 100]
        return
    with pytest.raises(ValueError, match=f"pad_remainders=True.*{reason}.*Train without pad_remainders=True"):
        train(make(), True)


def test_a_metric_whose_state_is_not_a_sum_over_samples_is_named_in_a_warning():
    model = model_with(metrics=("mae", BatchSamples()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(model, True, epochs=1)
    named = [w for w in caught if "pad_remainders=True" in str(w.message)]
    if PADS:
        assert len(named) == 1 and "'batch_samples' (BatchSamples)" in str(named[0].message)
    else:
        assert named == []


def test_dict_inputs_read_from_h5py_are_padded_as_the_same_arrays_in_memory(tmp_path):
    """The reader thread's batches (h5py) and the arrays gathered in memory are padded alike, each input of a dict."""
    import h5py

    x, y = regression_data(100)
    with h5py.File(tmp_path / "train.h5", "w") as f:
        f["a"], f["b"], f["y"] = x[:, :2], x[:, 2:], y

    def model():
        keras.utils.set_random_seed(1)
        a, b = keras.Input((2,), name="a"), keras.Input((2,), name="b")
        hidden = keras.layers.Dense(8, activation="tanh")(keras.layers.Concatenate()([a, b]))
        m = keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(hidden))
        m.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"], jit_compile=JIT_COMPILE)
        return m

    schedule = kfit.schedules.minibatch_size(SIZES, **SCHEDULE)
    options = dict(minibatch_size=schedule, epoch_size=100, epochs=3, seed=1, verbose=0, pad_remainders=True)
    memory = model()
    logs = kfit.fit(memory, {"a": x[:, :2], "b": x[:, 2:]}, y, **options).history
    read = model()
    with h5py.File(tmp_path / "train.h5", "r") as f:
        assert kfit.fit(read, {"a": f["a"], "b": f["b"]}, f["y"], **options).history == logs
    assert_same_weights(memory, read)


def test_pad_remainders_is_refused_for_a_source_that_batches_by_itself():
    import tensorflow as tf

    x, y = regression_data(40)
    model = model_with()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    with pytest.raises(ValueError, match="`pad_remainders` needs data that kfit cuts into minibatches; x is a"):
        kfit.fit(model, dataset, pad_remainders=True, verbose=0)


def test_a_model_with_two_outputs_logs_each_output_loss_as_unpadded():
    """Keras tracks each output's loss in a Mean of its own, weighted by the batch's rows: it counts the real rows."""
    x, y = regression_data(100)
    results = {}
    for pad in (False, True):
        keras.utils.set_random_seed(1)
        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(8, activation="tanh")(inputs)
        model = keras.Model(inputs, {"a": keras.layers.Dense(1, name="a")(hidden),
                                     "b": keras.layers.Dense(1, name="b")(hidden)})
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss={"a": "mse", "b": "mae"},
                      loss_weights={"a": 1.0, "b": 0.5}, metrics={"a": ["mae"]}, jit_compile=JIT_COMPILE)
        history = kfit.fit(model, x, {"a": y, "b": -y}, minibatch_size=kfit.schedules.minibatch_size(SIZES, **SCHEDULE),
                           epoch_size=100, epochs=3, seed=1, verbose=0, pad_remainders=pad)
        results[pad] = model, history.history
    (plain, plain_logs), (padded, padded_logs) = results[False], results[True]
    assert {"loss", "a_loss", "b_loss", "a_mae"} <= padded_logs.keys() == plain_logs.keys()
    for name, values in plain_logs.items():
        np.testing.assert_allclose(padded_logs[name], values, rtol=2e-6, err_msg=name)
    for a, b in zip(weights(plain), weights(padded), strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)


@pytest.mark.parametrize("source", ["memory", "h5py"])
def test_each_epoch_reader_pads_as_the_reader_that_runs_on_across_epochs(monkeypatch, tmp_path, source):
    """With ``KFIT_READ_AHEAD=0`` every epoch starts a reader of its own (``tf.data`` over memory, a generator over
    h5py): the padded minibatches, and so the run, are those of the one reader that serves every epoch."""
    import h5py

    x, y = regression_data(100)
    with h5py.File(tmp_path / "train.h5", "w") as f:
        f["x"], f["y"] = x, y
    runs = {}
    with h5py.File(tmp_path / "train.h5", "r") as f:
        xs, ys = (x, y) if source == "memory" else (f["x"], f["y"])
        for read_ahead in ("1", "0"):
            monkeypatch.setenv("KFIT_READ_AHEAD", read_ahead)
            model = model_with(metrics=("mae", BatchSamples()))
            rows = StepRows()
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="pad_remainders=True: the state of metric 'batch_samples'")
                history = kfit.fit(model, xs, ys, minibatch_size=kfit.schedules.minibatch_size(SIZES, **SCHEDULE),
                                   epoch_size=100, epochs=3, seed=1, verbose=0, pad_remainders=True, callbacks=[rows])
            runs[read_ahead] = model, history.history, rows.rows
    assert runs["0"][1] == runs["1"][1]
    assert runs["0"][2] == runs["1"][2] == ({8, 16, 32} if PADS else {4, 8, 16, 32})
    assert_same_weights(runs["0"][0], runs["1"][0])
