"""kfit.fit: a drop-in for model.fit, the stream-driven loop, minibatch-size schedules."""

import functools
import math
import time

import h5py
import keras
import numpy as np
import pytest
from conftest import BACKEND
from helpers import (
    BatchSamples,
    StepRecorder,
    assert_same_weights,
    classification_data,
    mlp,
    regression_data,
    weights,
)

import kfit


def compiled(model, loss="mse", metrics=None, optimizer=None):
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.05), loss=loss, metrics=metrics)
    return model


# -- drop-in: with no kfit feature, kfit.fit is model.fit ------------------------------------------

DROP_IN_CASES = {
    "plain": dict(batch_size=8, epochs=2),
    "no_shuffle": dict(batch_size=16, epochs=2, shuffle=False),
    "validation_split": dict(batch_size=8, epochs=2, validation_split=0.25),
    "validation_data_freq": dict(batch_size=8, epochs=3, validation_freq=2, validation="data"),
    "sample_weight": dict(batch_size=8, epochs=2, sample_weight=True),
    "initial_epoch": dict(batch_size=8, epochs=3, initial_epoch=1),
    "steps_per_epoch": dict(batch_size=8, epochs=2, steps_per_epoch=3),
}


@pytest.mark.parametrize("case", sorted(DROP_IN_CASES))
def test_kfit_fit_equals_model_fit_without_kfit_features(case):
    x, y = regression_data(48)
    kwargs = dict(DROP_IN_CASES[case])
    if kwargs.pop("validation", None) == "data":
        kwargs["validation_data"] = regression_data(16, seed=5)
    if kwargs.pop("sample_weight", False):
        kwargs["sample_weight"] = np.linspace(0.5, 1.5, 48).astype("float32")
    runs = []
    for use_kfit in (False, True):
        model = compiled(mlp(dropout=0.1), metrics=["mae"])
        keras.utils.set_random_seed(7)
        if use_kfit:
            history = kfit.fit(model, x, y, verbose=0, **kwargs)
        else:
            history = model.fit(x, y, verbose=0, **kwargs)
        runs.append((model, history))
    (keras_model, keras_history), (kfit_model, kfit_history) = runs
    assert_same_weights(keras_model, kfit_model)
    assert kfit_history.history == keras_history.history
    assert len(kfit_history.epoch_summaries) == len(keras_history.history["loss"])


def test_class_weight_is_model_fits_and_the_streams():
    x, y = classification_data(48)
    class_weight = {0: 1.0, 1: 2.0, 2: 0.5}
    a = compiled(mlp(outputs=3), loss="sparse_categorical_crossentropy")
    keras.utils.set_random_seed(3)
    a.fit(x, y, batch_size=8, epochs=2, shuffle=False, class_weight=class_weight, verbose=0)
    b = compiled(mlp(outputs=3), loss="sparse_categorical_crossentropy")
    keras.utils.set_random_seed(3)
    kfit.fit(b, x, y, batch_size=8, epochs=2, shuffle=False, class_weight=class_weight, verbose=0)
    assert_same_weights(a, b)
    # The stream path (seed= asks for it) with shuffle=False draws the same batches: same weights.
    c = compiled(mlp(outputs=3), loss="sparse_categorical_crossentropy")
    keras.utils.set_random_seed(3)
    kfit.fit(c, x, y, batch_size=8, epochs=2, shuffle=False, class_weight=class_weight, seed=0, verbose=0)
    np.testing.assert_allclose(np.concatenate([w.ravel() for w in weights(c)]),
                               np.concatenate([w.ravel() for w in weights(a)]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("labels", ["soft", "a class without a weight"])
def test_class_weight_follows_keras_rules_for_soft_labels_and_missing_classes(labels):
    """Keras rounds labels to the nearest class and weighs a class missing from ``class_weight`` by 1: kfit's loop
    truncated soft labels (other weights, another loss) and refused a missing class."""
    x, y = regression_data(48)
    y = np.clip(np.abs(y), 0.0, 1.0)[:, :1]  # soft binary labels in [0, 1]
    class_weight = {0: 1.0, 1: 3.0} if labels == "soft" else {0: 2.0}
    if labels != "soft":
        y = np.round(y)
    runs = []
    for loop in ("model.fit", "kfit.fit"):
        keras.utils.set_random_seed(3)
        model = compiled(mlp(), loss="binary_crossentropy")
        extra = {"seed": 0} if loop == "kfit.fit" else {}
        fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model)
        runs.append((model, fit(x, y, batch_size=8, epochs=2, shuffle=False, class_weight=class_weight, verbose=0,
                                **extra)))
    (a, history_a), (b, history_b) = runs
    assert sorted(set(np.round(y).ravel())) == [0.0, 1.0]
    np.testing.assert_allclose(history_b.history["loss"], history_a.history["loss"], rtol=1e-5)
    for wa, wb in zip(weights(a), weights(b)):
        np.testing.assert_allclose(wa, wb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit"])
@pytest.mark.parametrize("targets", ["list of one array", "dict of two arrays"])
def test_class_weight_with_targets_given_as_a_list_or_dict_is_refused_as_by_model_fit(loop, targets):
    """Keras refuses ``class_weight`` for ``y`` given as a list or dict, even of one array: kfit's loop trained on."""
    x, labels = classification_data(48)
    y = [labels] if targets == "list of one array" else {"a": labels, "b": labels}
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8)(inputs)
    outputs = [keras.layers.Dense(3, name="a")(hidden)]
    if targets != "list of one array":
        outputs.append(keras.layers.Dense(3, name="b")(hidden))
    model = compiled(keras.Model(inputs, outputs), loss="sparse_categorical_crossentropy")
    fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
    before = weights(model)
    with pytest.raises(ValueError, match="only supported for [mM]odels with a single output"):
        fit(x, y, batch_size=8, epochs=1, class_weight={0: 1.0, 1: 2.0}, verbose=0)
    assert all(np.array_equal(a, b) for a, b in zip(before, weights(model)))


def test_stream_loop_without_shuffle_trains_like_model_fit():
    x, y = regression_data(50)
    a = compiled(mlp(), metrics=["mae"])
    history_a = a.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    b = compiled(mlp(), metrics=["mae"])
    history_b = kfit.fit(b, x, y, minibatch_size=16, epochs=3, shuffle=False, seed=0, verbose=0)
    for wa, wb in zip(weights(a), weights(b)):
        np.testing.assert_allclose(wa, wb, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history_a.history["loss"], history_b.history["loss"], rtol=1e-5)
    assert [s.samples for s in history_b.epoch_summaries] == [50, 50, 50]


def test_keras_callbacks_keep_working_in_the_stream_loop(tmp_path):
    x, y = regression_data(40)
    model = compiled(mlp())
    csv = tmp_path / "log.csv"
    saved = tmp_path / "best.keras"
    stopper = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=1e9)
    history = kfit.fit(
        model, x, y, minibatch_size=8, epochs=5, seed=1, verbose=0,
        callbacks=[keras.callbacks.CSVLogger(str(csv)), keras.callbacks.ModelCheckpoint(str(saved)), stopper],
    )
    # min_delta is huge: no epoch improves enough, so EarlyStopping ends training after the second epoch.
    assert len(history.history["loss"]) == 2
    assert len(csv.read_text().strip().splitlines()) == 1 + 2
    assert saved.exists() and keras.models.load_model(saved).count_params() == model.count_params()


# -- epochs, max_samples, epoch summaries ------------------------------------------------------------


def test_epoch_size_and_max_samples_bound_training():
    x, y = regression_data(40)
    model = compiled(mlp(), metrics=[BatchSamples()])
    history = kfit.fit(model, x, y, minibatch_size=16, epoch_size=50, max_samples=120, epochs=10, verbose=0)
    summaries = history.epoch_summaries
    # 120 samples in epochs of 50: 50, 50, 20 — each minibatch cut at the epoch end.
    assert [s.samples for s in summaries] == [50, 50, 20]
    assert [s.epoch for s in summaries] == [0, 1, 2]
    assert history.history["batch_samples"] == [50.0, 50.0, 20.0]
    assert all(s.seconds > 0 and s.samples_per_second > 0 for s in summaries)
    assert kfit.get_clock(model).samples == 120
    # epochs bounds first when it is reached first
    model = compiled(mlp())
    history = kfit.fit(model, x, y, minibatch_size=16, epoch_size=50, max_samples=10_000, epochs=2, verbose=0)
    assert kfit.get_clock(model).samples == 100 and len(history.epoch_summaries) == 2


def test_numpy_integers_are_taken_as_pythons_and_a_checkpoint_holds_them(tmp_path):
    """Counts computed with NumPy (``np.int64(len(x)) * 3``) are valid arguments; the run stores them as Python
    integers, so a checkpoint (JSON metadata) is written and holds them."""
    x, y = regression_data(40)
    model = compiled(mlp())
    path = tmp_path / "run.ckpt"
    kfit.fit(model, x, y, minibatch_size=np.int64(16), epoch_size=np.int32(40), max_samples=np.int64(56),
             epochs=np.int64(5), initial_epoch=np.int64(1), verbose=0, callbacks=[kfit.callbacks.Checkpoint(path)])
    clock = kfit.get_clock(model)
    assert (clock.samples, clock.minibatch_size) == (56, 16)
    assert type(clock.samples) is int and type(clock.minibatch_size) is int
    info = kfit.checkpoint.read_checkpoint_info(path)
    assert (info.samples, info.minibatch_size, info.status, info.status_reason) == (56, 16, "complete", "reached max_samples=56")


# -- minibatch-size schedules -------------------------------------------------------------------------


def test_cntk_seed_example_minibatch_lr_and_momentum_at_every_step():
    """Reference 001 section 5, scaled down 64x: sizes [256]*6+[512]*9+[1024]*7+[2048]*8+[4096] over epochs."""
    n = 64
    x, y = regression_data(n)
    sizes = kfit.schedules.minibatch_size([4] * 6 + [8] * 9 + [16] * 7 + [32] * 8 + [64], epoch_size=n)
    lrs = kfit.schedules.learning_rate_per_sample(
        [0.001] * 12 + [0.0005] * 6 + [0.00025] * 6 + [0.000125] * 3 + [0.0000625] * 3 + [0.00003125], epoch_size=n)
    moms = kfit.schedules.momentum_as_time_constant([0] * 5 + [1024], epoch_size=n)
    model = mlp()
    model.compile(optimizer=kfit.optimizers.MomentumSGD(), loss="mse", metrics=[BatchSamples()])
    recorder = StepRecorder(names=("learning_rate", "momentum", "minibatch_size"))
    epochs = 32
    kfit.fit(model, x, y, minibatch_size=sizes, epoch_size=n, epochs=epochs, seed=3, verbose=0,
             callbacks=[kfit.callbacks.LearningRateSchedule(lrs), kfit.callbacks.MomentumSchedule(moms), recorder])
    expected = []
    samples = 0
    while samples < epochs * n:
        b = min(sizes[samples], n - samples % n)
        mu = 0.0 if moms[samples] == 0 else math.exp(-b / moms[samples])
        expected.append((b, lrs[samples] * b, mu))
        samples += b
    assert len(recorder.rows) == len(expected)
    for step, (row, (b, lr, mu)) in enumerate(zip(recorder.rows, expected)):
        assert row["size"] == b, f"step {step}"
        assert row["minibatch_size"] == b, f"step {step}"
        assert row["learning_rate"] == pytest.approx(lr, rel=1e-6), f"step {step}"
        assert row["momentum"] == pytest.approx(mu, rel=1e-6, abs=1e-7), f"step {step}"
    assert kfit.get_clock(model).samples == epochs * n


def test_minibatch_size_schedule_callback_changes_size_mid_epoch():
    x, y = regression_data(40)
    model = compiled(mlp(), metrics=[BatchSamples()])
    recorder = StepRecorder()
    schedule = kfit.callbacks.MinibatchSizeSchedule(lambda s: 4 if s < 20 else 16)
    history = kfit.fit(model, x, y, epochs=2, callbacks=[schedule, recorder], verbose=0)
    # epoch 0: 4,4,4,4,4 (20 samples) then 16, 4 (cut at the epoch end); epoch 1: 16, 16, 8
    assert [r["size"] for r in recorder.rows] == [4, 4, 4, 4, 4, 16, 4, 16, 16, 8]
    assert [s.samples for s in history.epoch_summaries] == [40, 40]


def test_compiled_train_functions_are_bounded_by_distinct_shapes():
    x, y = regression_data(64)
    model = compiled(mlp())
    traces = []
    original = model.train_step

    def counting_train_step(*args, **kwargs):
        traces.append(1)
        return original(*args, **kwargs)

    model.train_step = counting_train_step
    sizes = [4, 8, 16, 4, 8, 16, 32]  # per minibatch: sizes repeat
    steps = 60
    kfit.fit(model, x, y, minibatch_size=kfit.schedules.minibatch_size(sizes), max_samples=10_000, epoch_size=64,
             epochs=None, verbose=0, callbacks=[_StopAfter(steps)])
    train_function = model.train_function
    distinct_shapes = {4, 8, 16, 32} | {r for r in range(1, 33)}  # epoch-end cuts may add shapes
    if BACKEND == "torch":
        # Eager PyTorch compiles nothing: the Python step runs once per minibatch.
        assert len(traces) == steps
    else:
        assert len(traces) <= 8, f"{len(traces)} traces for {steps} steps"
        assert len(traces) <= len(distinct_shapes)
    assert model.train_function is train_function


class _StopAfter(keras.callbacks.Callback):
    def __init__(self, steps):
        super().__init__()
        self.steps = steps
        self.seen = 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen >= self.steps:
            self.model.stop_training = True


# -- inputs: multi-input/output, h5py -----------------------------------------------------------------


def test_multi_input_multi_output_model():
    rng = np.random.default_rng(0)
    a_in, b_in = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    h = keras.layers.Dense(4, activation="relu")(keras.layers.Concatenate()([a_in, b_in]))
    model = keras.Model({"a": a_in, "b": b_in}, {"out1": keras.layers.Dense(1, name="out1")(h),
                                                  "out2": keras.layers.Dense(2, name="out2")(h)})
    model.compile(optimizer="sgd", loss={"out1": "mse", "out2": "mse"})
    x = {"a": rng.normal(size=(30, 3)).astype("float32"), "b": rng.normal(size=(30, 2)).astype("float32")}
    y = {"out1": rng.normal(size=(30, 1)).astype("float32"), "out2": rng.normal(size=(30, 2)).astype("float32")}
    before = weights(model)
    history = kfit.fit(model, x, y, minibatch_size=8, max_samples=70, verbose=0)
    assert kfit.get_clock(model).samples == 70
    assert [s.samples for s in history.epoch_summaries] == [30, 30, 10]
    assert any(not np.array_equal(a, b) for a, b in zip(before, weights(model)))


def test_h5py_training_equals_in_memory_training(tmp_path):
    x, y = regression_data(40)
    path = tmp_path / "train.h5"
    with h5py.File(path, "w") as f:
        f["x"], f["y"] = x, y
    a = compiled(mlp())
    kfit.fit(a, x, y, minibatch_size=8, epochs=2, seed=4, verbose=0)
    b = compiled(mlp())
    with h5py.File(path, "r") as f:
        kfit.fit(b, f["x"], f["y"], minibatch_size=8, epochs=2, seed=4, verbose=0)
    assert_same_weights(a, b)


IN_MEMORY_CASES = {
    # A minibatch-size schedule whose minibatches are cut at epoch ends and span two sweeps.
    "schedule": dict(minibatch_size=kfit.schedules.minibatch_size([6, 11], epoch_size=34), epoch_size=34, epochs=3),
    "class_weight": dict(minibatch_size=7, epochs=2, class_weight={0: 0.5, 1: 2.0, 2: 1.0}),
    "sample_weight_dict": dict(minibatch_size=9, epochs=2, sample_weight=True, dict_inputs=True),
    "prefetch": dict(minibatch_size=8, epochs=2, prefetch=3),
}


@pytest.mark.parametrize("case", sorted(IN_MEMORY_CASES))
def test_arrays_in_memory_train_as_the_same_data_read_from_h5py(tmp_path, case):
    """Arrays in memory are gathered directly (on TensorFlow inside tf.data, with no reader thread unless
    ``prefetch`` asks for one); h5py datasets are read by minibatch on a reader thread. Same minibatches, same
    weights, same logs."""
    kwargs = dict(IN_MEMORY_CASES[case])
    x, y = classification_data(40, classes=3)
    sample_weight = np.linspace(0.5, 1.5, 40).astype("float32") if kwargs.pop("sample_weight", False) else None
    dict_inputs = kwargs.pop("dict_inputs", False)

    def model():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((4,), name="features")
        outputs = keras.layers.Dense(3)(keras.layers.Dense(8, activation="relu")(inputs))
        m = keras.Model({"features": inputs} if dict_inputs else inputs, outputs)
        m.compile(optimizer=keras.optimizers.SGD(0.05), metrics=[BatchSamples()],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    runs = []
    path = tmp_path / "train.h5"
    with h5py.File(path, "w") as f:
        f["x"], f["y"] = x, y
        if sample_weight is not None:
            f["w"] = sample_weight
    with h5py.File(path, "r") as f:
        for xs, ys, ws in ((x, y, sample_weight), (f["x"], f["y"], None if sample_weight is None else f["w"])):
            m = model()
            history = kfit.fit(m, {"features": xs} if dict_inputs else xs, ys, sample_weight=ws, seed=4, verbose=0,
                               **kwargs)
            runs.append((m, history.history))
    (memory_model, memory_logs), (h5py_model, h5py_logs) = runs
    assert_same_weights(memory_model, h5py_model)
    assert memory_logs == h5py_logs
    assert sum(memory_logs["batch_samples"]) == kfit.get_clock(memory_model).samples > 0


# -- bad input ----------------------------------------------------------------------------------------


def test_bad_input_raises_clear_errors(tmp_path):
    x, y = regression_data(20)
    model = compiled(mlp())
    with pytest.raises(ValueError, match=r"x: 20.*y: 19"):
        kfit.fit(model, x, y[:19], minibatch_size=4, seed=0, verbose=0)
    with pytest.raises(ValueError, match=r"sample_weight: 5"):
        kfit.fit(model, x, y, sample_weight=np.ones(5), minibatch_size=4, seed=0, verbose=0)
    with pytest.raises(ValueError, match="empty"):
        kfit.fit(model, x[:0], y[:0], minibatch_size=4, seed=0, verbose=0)
    with pytest.raises(ValueError, match=r"argument `x`: expected the training inputs.*Received: x=None$"):
        kfit.fit(model, None, y, minibatch_size=4, seed=0, verbose=0)  # (model.fit fails calling the model)
    with pytest.raises(ValueError, match="`x`: the training data is empty"):  # model.fit's path (it named num_samples)
        kfit.fit(model, x[:0], y[:0], batch_size=4, verbose=0)
    with pytest.raises(ValueError, match="`minibatch_size`"):
        kfit.fit(model, x, y, minibatch_size=0, seed=0, verbose=0)
    with pytest.raises(ValueError, match="`epoch_size`"):
        kfit.fit(model, x, y, minibatch_size=4, epoch_size=0, verbose=0)
    with pytest.raises(ValueError, match="`max_samples`"):
        kfit.fit(model, x, y, minibatch_size=4, max_samples=-3, verbose=0)
    with pytest.raises(ValueError, match="aliases"):
        kfit.fit(model, x, y, batch_size=4, minibatch_size=8, verbose=0)
    with pytest.raises(ValueError, match="`seed`"):
        kfit.fit(model, x, y, minibatch_size=4, seed=-1, verbose=0)
    with pytest.raises(ValueError, match=r"kfit.schedules.minibatch_size"):
        kfit.fit(model, x, y, minibatch_size=kfit.schedules.learning_rate_per_sample(0.1), verbose=0)
    path = tmp_path / "small.h5"
    with h5py.File(path, "w") as f:
        f["x"], f["y"] = x, y
    with h5py.File(path, "r") as f:
        with pytest.raises(ValueError, match="h5py dataset holds only 20 samples"):
            kfit.fit(model, f["x"], f["y"], minibatch_size=32, epoch_size=64, verbose=0)


def test_minibatch_size_schedule_needs_kfit_fit():
    x, y = regression_data(20)
    model = compiled(mlp())
    with pytest.raises(RuntimeError, match="needs kfit.fit"):
        model.fit(x, y, batch_size=4, verbose=0, callbacks=[
            kfit.callbacks.SampleClock(batch_size=4, num_samples=20), kfit.callbacks.MinibatchSizeSchedule([4, 8])])
    with pytest.raises(RuntimeError, match="needs kfit.fit"):  # without a SampleClock too (it trained on, ignored)
        model.fit(x, y, batch_size=4, verbose=0, callbacks=[kfit.callbacks.MinibatchSizeSchedule([4, 8])])


def test_pydataset_input_with_a_minibatch_size_schedule():
    from test_stream import Batches

    class Regression(Batches):
        def __getitem__(self, i):
            x, _ = super().__getitem__(i)
            return np.repeat(x / 30.0, 4, axis=1), x / 15.0

    model = compiled(mlp(), metrics=[BatchSamples()])
    recorder = StepRecorder()
    history = kfit.fit(model, Regression(), minibatch_size=kfit.schedules.minibatch_size([4, 8], epoch_size=30),
                       epochs=2, seed=2, verbose=0, callbacks=[recorder])
    assert [r["size"] for r in recorder.rows] == [4] * 7 + [2] + [8] * 3 + [6]
    assert [s.samples for s in history.epoch_summaries] == [30, 30]
    with pytest.raises(ValueError, match="pass x only"):
        kfit.fit(model, Regression(), np.zeros(30), seed=0, verbose=0)


@pytest.mark.parametrize("case", ["validation_freq_0", "closed_h5py", "uncompiled"])
def test_clear_errors_before_training(case, tmp_path):
    x, y = regression_data(16)
    model = mlp()
    kwargs = dict(seed=0, verbose=0)
    if case == "validation_freq_0":
        model = compiled(model)
        kwargs.update(validation_data=(x, y), validation_freq=0)
        match = r"`validation_freq`.*Received: validation_freq=0"
    elif case == "closed_h5py":
        model = compiled(model)
        with h5py.File(tmp_path / "data.h5", "w") as f:
            f["x"] = x
            x = f["x"]
        match = r"`x`: an h5py dataset whose file is closed"
    else:
        match = r"call `model.compile\(optimizer=..., loss=...\)` before kfit.fit"
    before = weights(model) if model.built else None
    with pytest.raises(ValueError, match=match):
        kfit.fit(model, x, y, **kwargs)
    if before is not None:
        assert all(np.array_equal(a, b) for a, b in zip(before, weights(model)))


# -- compiling ahead the step for the coming minibatch sizes (JAX) ------------------------------------


def _backend_compiles(record):
    """Records the name of every function XLA compiles (JAX), with the thread that compiles it.

    The event wraps JAX's lookup in its persistent compilation cache too (``tests/conftest.py`` turns the cache on),
    so a step loaded from that cache counts as compiled: only JAX's in-memory caches make no event."""
    import threading

    import jax

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration" and record.get("on"):
            record["compiles"].append((kwargs.get("fun_name"), threading.current_thread().name))

    jax.monitoring.register_event_duration_secs_listener(listener)


def test_a_minibatch_size_compiled_ahead_is_not_compiled_again_when_training_reaches_it():
    from kfit.training._compile_ahead import CompileAhead

    x, y = regression_data(96)
    model = compiled(mlp())
    kfit.fit(model, x, y, minibatch_size=8, epochs=1, seed=0, verbose=0)  # makes the train function
    ahead = CompileAhead(model, (x[:8], y[:8]))
    assert ahead.active == (BACKEND == "jax")  # TensorFlow and PyTorch compile nothing ahead
    ahead.request([24])
    ahead.wait()
    ahead.close()
    if BACKEND != "jax":
        assert ahead.compiled == set()
        return
    assert ahead.compiled == {24} and ahead.errors == []
    record = {"on": True, "compiles": []}
    _backend_compiles(record)
    kfit.fit(model, x, y, minibatch_size=24, epochs=1, seed=0, verbose=0)
    record["on"] = False
    assert not [name for name, _ in record["compiles"] if "train_step" in name]


@pytest.mark.skipif(BACKEND != "tensorflow", reason="XLA compiling a traced TensorFlow step for each new shape: JAX's "
                    "steps compiled ahead have the test above, PyTorch compiles nothing ahead")
def test_tensorflows_xla_does_not_compile_again_a_size_compiled_ahead_when_training_reaches_it():
    """With ``jit_compile=True`` one trace serves every minibatch size, but XLA compiles it per shape when that shape's
    first step runs. A size compiled ahead (the traced step run once on copies of its variables) is found compiled:
    XLA's own log (``device_compiler``) shows no compile in the second epoch, which trains the new size, where
    without compiling ahead it shows one."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent / "scripts" / "xla_compile_ahead.py"
    env = dict(os.environ, TF_CPP_VMODULE="device_compiler=2", TF_CPP_MIN_LOG_LEVEL="0",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
    compiles = {}
    for mode in ("ahead", "none"):
        done = subprocess.run([sys.executable, str(script), mode], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        first, _, second = done.stderr.partition("KFIT-MARK second epoch")
        assert "trained: 200 samples" in second, done.stderr[-3000:]
        compiled = "Compilation of XLA executable time"  # (one line per compile, TensorFlow 2.20-2.21)
        compiles[mode] = (first.count(compiled), second.count(compiled))
        if mode == "ahead":
            assert "compiled ahead: [16] errors: []" in first
    # The 8 and the 4 (the first epoch's last minibatch) compile as they train; the 16 ahead, or in the second epoch.
    assert compiles == {"ahead": (3, 0), "none": (2, 1)}


class GrabRun(keras.callbacks.Callback):
    """Keeps the run object of the training it is part of."""

    def on_train_begin(self, logs=None):
        self.run = kfit._run.current_run(self.model)


def test_a_minibatch_size_schedule_compiles_the_coming_sizes_ahead_and_trains_as_without(monkeypatch):
    x, y = regression_data(100)
    schedule = kfit.schedules.minibatch_size([8, 16, 32], epoch_size=100)  # epochs end on a 4-sample minibatch
    results = {}
    for ahead in ("1", "0"):
        monkeypatch.setenv("KFIT_COMPILE_AHEAD", ahead)
        keras.utils.set_random_seed(3)
        model = mlp()
        # TensorFlow: with XLA (a new shape compiles on its first step; without, one trace serves every size).
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=BACKEND != "torch")
        grab = GrabRun()
        history = kfit.fit(model, x, y, minibatch_size=schedule, epoch_size=100, epochs=3, seed=1, verbose=0,
                           callbacks=[grab])
        results[ahead] = (model, history.history, grab.run.compile_ahead)
    (with_model, with_logs, ahead), (without_model, without_logs, off) = results["1"], results["0"]
    assert_same_weights(with_model, without_model)
    assert with_logs == without_logs
    assert not off.active and off.compiled == set()
    assert not ahead.active  # closed when training ended: it keeps no step alive
    if BACKEND != "torch":
        # Epoch 1 trains 8s and a 4, epoch 2 16s and a 4, epoch 3 32s and a 4: the 8 compiles on its first step;
        # the 4, 16 and 32 are asked for ahead (an epoch early for 16 and 32). Those the thread reached compiled
        # (on TensorFlow from training's second step on, once the first has traced the step).
        assert ahead.errors == []
        assert ahead._requested == {8, 4, 16, 32}
        assert ahead.compiled <= {4, 16, 32} and ahead.compiled
    else:
        assert ahead._requested == set() and ahead.compiled == set()


class CountingSequential(keras.Sequential):
    """Counts how often its ``train_step`` runs in Python: once per trace on TensorFlow and JAX, once per step
    on PyTorch (not compiled)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.python_runs = 0

    def train_step(self, *args, **kwargs):
        self.python_runs += 1
        return super().train_step(*args, **kwargs)


def test_a_minibatch_size_schedule_traces_the_train_step_once_on_tensorflow_and_once_per_shape_on_jax():
    x, y = regression_data(100)
    model = CountingSequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    compiled(model)
    schedule = kfit.schedules.minibatch_size([8, 16, 32], epoch_size=100)
    history = kfit.fit(model, x, y, minibatch_size=schedule, epoch_size=100, epochs=3, seed=1, verbose=0)
    # Epoch 1 trains twelve 8s and a 4, epoch 2 six 16s and a 4, epoch 3 three 32s and a 4: 24 steps, 4 shapes.
    assert [s.samples for s in history.epoch_summaries] == [100, 100, 100]
    # TensorFlow: kfit's tf.data pipeline leaves the batch dimension unknown, so one trace serves every size
    # (no new size waits for a trace). JAX: one trace per shape, each compiled ahead or on its first step.
    expected = {"tensorflow": 1, "jax": 4, "torch": 24}[BACKEND]
    assert model.python_runs == expected


@pytest.mark.parametrize("source", ["memory", "h5py"])
def test_one_reader_serves_every_epoch_until_a_callback_changes_the_plan(monkeypatch, tmp_path, source):
    """The minibatches of a ``fit`` call come through one reader that reads each next epoch's plan ahead: on
    TensorFlow one ``tf.data`` iterator (Keras makes a new one at every epoch begin, whose first minibatch the
    epoch's first step waits for), over h5py one reader thread on every backend (data in memory is gathered by
    ``tf.data`` on TensorFlow, on the trainer's thread elsewhere). A callback that changes what the schedule reads, at an
    epoch begin, makes a plan already read ahead wrong: a new reader starts there, and the steps train the new sizes."""
    import tensorflow as tf

    import kfit.data._adapter as adapter_module

    made = {"iterators": 0, "threads": 0}

    def counted_iter(self):
        made["iterators"] += 1
        return dataset_iter(self)

    dataset_iter = tf.data.Dataset.__iter__
    monkeypatch.setattr(tf.data.Dataset, "__iter__", counted_iter)

    class CountedPrefetcher(adapter_module.Prefetcher):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if self.active:  # a reader thread (data in memory is read on the trainer's thread)
                made["threads"] += 1

    monkeypatch.setattr(adapter_module, "Prefetcher", CountedPrefetcher)
    x, y = regression_data(40)
    with h5py.File(tmp_path / "train.h5", "w") as f:
        f["x"], f["y"] = x, y
    box = {"size": 8}

    class Resize(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                box["size"] = 16

    class StepSizes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs = []

        def on_epoch_begin(self, epoch, logs=None):
            self.epochs.append([0.0])

        def on_train_batch_end(self, batch, logs=None):
            self.epochs[-1].append(float(logs["batch_samples"]))

    runs = {}
    with h5py.File(tmp_path / "train.h5", "r") as f:
        xs, ys = (x, y) if source == "memory" else (f["x"], f["y"])
        for name, size, callbacks in (("fixed", 8, []), ("changed", lambda samples: box["size"], [Resize()])):
            made.update(iterators=0, threads=0)
            sizes = StepSizes()
            model = compiled(mlp(), metrics=[BatchSamples()])
            kfit.fit(model, xs, ys, minibatch_size=size, epochs=4, seed=2, verbose=0, callbacks=[*callbacks, sizes])
            runs[name] = (made["iterators"], made["threads"],
                          [np.diff(totals).astype(int).tolist() for totals in sizes.epochs])
    iterators = 1 if BACKEND == "tensorflow" else 0
    threads = 1 if source == "h5py" else 0
    assert runs["fixed"] == (iterators, threads, [[8] * 5] * 4)
    # A new reader starts where the plan read ahead is stale: when the reader had read epoch 2's plan before the
    # callback changed the size (it reads ahead on its own thread, so under load it may read it after, and go on).
    made_iterators, made_threads, step_sizes = runs["changed"]
    assert iterators <= made_iterators <= 2 * iterators and threads <= made_threads <= 2 * threads, runs["changed"]
    assert step_sizes == [[8] * 5] * 2 + [[16, 16, 8]] * 2


class PausingInTrace(keras.Sequential):
    """Records when its JAX step is traced on each thread, inside ``compute_loss`` (where Keras holds the forward
    pass's losses, the regularization, on the model). A trace on the trainer's thread waits there until one on the
    compile-ahead thread is there too, if one can be (0.5 s at most); the thread's trace pauses there."""

    def __init__(self, *args, **kwargs):
        import threading

        super().__init__(*args, **kwargs)
        self.ahead_in_trace = threading.Event()
        self.traces = []  # (thread name, start, end)

    def compute_loss(self, *args, **kwargs):
        import threading
        import time

        if BACKEND != "jax":  # (the step runs this once per trace; on PyTorch once per step)
            return super().compute_loss(*args, **kwargs)
        thread, start = threading.current_thread().name, time.perf_counter()
        if thread == "kfit-compile-ahead":
            self.ahead_in_trace.set()
            time.sleep(0.3)
        else:
            self.ahead_in_trace.wait(timeout=0.5)
        try:
            return super().compute_loss(*args, **kwargs)
        finally:
            self.traces.append((thread, start, time.perf_counter()))


def test_a_size_compiled_ahead_and_a_size_traced_by_training_never_trace_at_once(monkeypatch):
    """Keras's JAX train step writes the forward pass's losses to the model while it is traced: the trainer's trace
    of a new size and the thread's of the next one, at once, leaked each other's tracers (UnexpectedTracerError)
    or mixed their losses. One trace at a time: the same weights as without compiling ahead."""
    x, y = regression_data(100)
    results = []
    for ahead in ("1", "0"):
        monkeypatch.setenv("KFIT_COMPILE_AHEAD", ahead)
        keras.utils.set_random_seed(3)
        model = PausingInTrace([keras.Input((4,)), keras.layers.Dense(8, activation="tanh", kernel_regularizer="l2"),
                                keras.layers.Dense(1)])
        compiled(model)
        schedule = kfit.schedules.minibatch_size([8, 16], epoch_size=100)
        grab = GrabRun()
        # Steps of 20 ms leave the thread time to trace while training runs, also on a loaded machine.
        slow = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: time.sleep(0.02))
        kfit.fit(model, x, y, minibatch_size=schedule, epoch_size=100, epochs=2, seed=1, verbose=0,
                 callbacks=[grab, slow])
        results.append((model, grab.run.compile_ahead))
    (model, ahead), (reference, _) = results
    assert_same_weights(model, reference)
    if BACKEND == "jax":  # the thread traced and compiled ahead (the 4, the 16), nothing failed, no overlap
        assert ahead.errors == [] and ahead.compiled and ahead.compiled <= {4, 16}
        on_thread = [(a, b) for name, a, b in model.traces if name == "kfit-compile-ahead"]
        on_trainer = [(a, b) for name, a, b in model.traces if name != "kfit-compile-ahead"]
        assert on_thread and on_trainer
        assert not [(t, m) for t in on_thread for m in on_trainer if t[0] < m[1] and m[0] < t[1]]


def test_a_model_compiled_again_trains_with_its_new_metrics_after_sizes_were_compiled_ahead():
    """A jitted step kept alive keeps its traces in JAX's caches, where the step of the model compiled again
    (the same ``train_step``) would find the old metrics: the helper lets go of it when training ends."""
    x, y = regression_data(100)
    schedule = kfit.schedules.minibatch_size([8, 16, 32], epoch_size=100)
    model = compiled(mlp(), metrics=["mean_squared_error"])
    first = kfit.fit(model, x, y, minibatch_size=schedule, epoch_size=100, epochs=3, seed=1, verbose=0)
    compiled(model, metrics=["mean_absolute_error"])
    second = kfit.fit(model, x, y, minibatch_size=schedule, epoch_size=100, epochs=3, seed=1, verbose=0)
    assert sorted(first.history) == ["loss", "mean_squared_error"]
    assert sorted(second.history) == ["loss", "mean_absolute_error"]
