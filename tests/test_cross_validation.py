"""CrossValidation and Test: when they fire, what they evaluate, what they report, how they stop training."""

from __future__ import annotations

import functools
import importlib.util
import math
import sys

import keras
import numpy as np
import pytest

import kfit
import kfit.cntk
from kfit.callbacks import CrossValidation, KfitCallback, Test

BACKEND = keras.backend.backend()


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    return (digits.data[order] / 16.0).astype("float32"), digits.target[order].astype("int64")


def digits(start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = _digits()
    return x[start:stop], y[start:stop]


def classifier(metrics=("accuracy",), learning_rate: float = 0.1, seed: int = 1) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)])
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=list(metrics),
    )
    return model


class Recorder(KfitCallback):
    """Records the kfit events and the clock at each cross-validation."""

    default_name = "recorder"

    def __init__(self):
        super().__init__()
        self.cross_validations: list[tuple[int, dict]] = []
        self.tests: list[dict] = []

    def on_cross_validation_end(self, index, logs):
        self.cross_validations.append((index, dict(logs)))

    def on_final_test_end(self, logs):
        self.tests.append(dict(logs))


TRAIN = (0, 600)
VAL = (600, 800)
TEST = (800, 1000)


# -- when it fires -------------------------------------------------------------------------------------
def test_default_frequency_is_every_epoch_end_and_results_reach_the_history():
    model = classifier()
    recorder = Recorder()
    cv = CrossValidation(digits(*VAL), minibatch_size=64)
    history = kfit.fit(model, *digits(*TRAIN), minibatch_size=50, epoch_size=300, epochs=3,
                       callbacks=[recorder, cv], verbose=0)
    assert [logs["samples"] for _, logs in recorder.cross_validations] == [300, 600, 900]
    assert [index for index, _ in recorder.cross_validations] == [0, 1, 2]
    assert [r["val_index"] for r in cv.results] == [0, 1, 2]
    for key in ("val_loss", "val_accuracy", "val_average_error", "val_samples", "val_minibatches"):
        assert len(history.history[key]) == 3, key
    assert history.history["val_samples"] == [200] * 3
    assert history.history["val_minibatches"] == [4] * 3  # ceil(200 / 64)
    np.testing.assert_allclose(
        history.history["val_average_error"], 1.0 - np.array(history.history["val_accuracy"]), rtol=1e-6
    )
    assert history.history["val_loss"] == [r["val_loss"] for r in cv.results]
    assert "val_loss" in history.epoch_summaries[0].metrics


@pytest.mark.parametrize("frequency", [100, 150, 300])
def test_frequency_in_samples_fires_at_the_step_that_crosses_a_multiple(frequency):
    model = classifier()
    recorder = Recorder()
    cv = CrossValidation(digits(*VAL), frequency=frequency, minibatch_size=100)
    kfit.fit(model, *digits(*TRAIN), minibatch_size=40, epoch_size=600, epochs=2, callbacks=[cv, recorder], verbose=0)
    ends = range(40, 1201, 40)
    expected = [s for s in ends if (s - 40) // frequency != s // frequency]
    assert [logs["samples"] for _, logs in recorder.cross_validations] == expected
    assert [index for index, _ in recorder.cross_validations] == list(range(len(expected)))


@pytest.mark.parametrize("stop_index", [0, 3])
def test_false_at_index_k_stops_after_k_plus_one_frequencies(stop_index):
    frequency = 120
    model = classifier()
    calls = []

    def callback(index, average_error, num_samples, num_minibatches):
        calls.append((index, kfit.get_clock(model).samples))
        return index != stop_index

    cv = CrossValidation(digits(*VAL), frequency=frequency, minibatch_size=50, callback=callback)
    kfit.fit(model, *digits(*TRAIN), minibatch_size=40, epoch_size=600, epochs=5, callbacks=[cv], verbose=0)
    # Index k (counted from 0, as CNTK does) is the evaluation at (k + 1) * frequency samples.
    assert calls == [(k, (k + 1) * frequency) for k in range(stop_index + 1)]
    assert kfit.get_clock(model).samples == (stop_index + 1) * frequency


def test_a_callback_without_data_is_called_at_each_frequency_and_can_stop_training(capsys):
    """CNTK's CrossValidationConfig(None, frequency, callback=f): no evaluation, the callback alone is called at
    every frequency with average_error 0 and 0 samples and minibatches, and its False stops training."""
    model = classifier()
    calls = []

    def callback(index, average_error, num_samples, num_minibatches):
        calls.append((index, kfit.get_clock(model).samples, average_error, num_samples, num_minibatches))
        return index < 2

    cv = CrossValidation(None, frequency=120, callback=callback)
    printer = kfit.callbacks.ProgressPrinter()
    history = kfit.fit(model, *digits(*TRAIN), minibatch_size=40, epoch_size=600, epochs=2, callbacks=[cv, printer],
                       verbose=0)
    assert calls == [(k, 120 * (k + 1), 0.0, 0, 0) for k in range(3)]
    assert kfit.get_clock(model).samples == 360
    assert not any(key.startswith("val_") for key in history.history)  # nothing was evaluated
    assert "Evaluation" not in capsys.readouterr().err
    with pytest.raises(TypeError, match=r"needs its evaluation data once.*or only a callback.*none of them"):
        CrossValidation(frequency=120)


def test_false_stops_plain_model_fit_after_the_step():
    model = classifier()
    cv = CrossValidation(digits(*VAL), frequency=200, minibatch_size=50, callback=lambda i, e, n, m: i < 1)
    x, y = digits(*TRAIN)
    history = model.fit(x, y, batch_size=50, epochs=5, verbose=0,
                        callbacks=[kfit.callbacks.SampleClock(50, len(x)), cv])
    assert kfit.get_clock(model).samples == 400
    assert len(cv.results) == 2
    assert len(history.epoch) == 1


# -- what it evaluates and reports ------------------------------------------------------------------
def test_callback_arguments_max_samples_and_a_minibatch_size_schedule():
    model = classifier()
    seen = []
    sizes = kfit.schedules.minibatch_size([30, 70], epoch_size=300)
    cv = CrossValidation(digits(*VAL), frequency=300, minibatch_size=sizes, max_samples=150,
                         callback=lambda *args: seen.append(args))
    kfit.fit(model, *digits(*TRAIN), minibatch_size=50, epoch_size=300, epochs=2, callbacks=[cv], verbose=0)
    # At 300 samples the schedule gives 70 (its second entry); at 600 it still does.
    assert [(i, n, m) for i, _, n, m in seen] == [(0, 150, math.ceil(150 / 70)), (1, 150, math.ceil(150 / 70))]
    expected = model.evaluate(*digits(VAL[0], VAL[0] + 150), batch_size=70, verbose=0, return_dict=True)
    assert seen[-1][1] == pytest.approx(1.0 - expected["accuracy"], abs=1e-6)
    assert cv.results[-1]["val_loss"] == pytest.approx(expected["loss"], rel=1e-5)


def test_first_minibatch_size_of_a_schedule_before_the_first_boundary():
    model = classifier()
    seen = []
    cv = CrossValidation(digits(*VAL), frequency=100, minibatch_size=kfit.schedules.minibatch_size([30, 70], epoch_size=300),
                         callback=lambda *args: seen.append(args[3]))
    kfit.fit(model, *digits(*TRAIN), minibatch_size=50, epoch_size=300, epochs=1, callbacks=[cv], verbose=0)
    assert seen == [math.ceil(200 / 30)] * 2 + [math.ceil(200 / 70)]


@pytest.mark.parametrize(
    "metrics, metric, key, is_error",
    [
        (("accuracy",), None, "accuracy", True),
        (("xent", "accuracy"), None, "xent", False),  # the first compiled metric, not an accuracy
        (("accuracy",), "loss", "loss", False),
        (("accuracy",), "val_accuracy", "accuracy", True),
        ((), None, "loss", False),
    ],
)
def test_average_error_comes_from_the_chosen_metric(metrics, metric, key, is_error):
    metrics = [keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="xent") if m == "xent" else m
               for m in metrics]
    model = classifier(metrics=metrics)
    seen = []
    cv = CrossValidation(digits(*VAL), metric=metric, callback=lambda i, e, n, m: seen.append(e))
    kfit.fit(model, *digits(*TRAIN), minibatch_size=50, epoch_size=300, epochs=1, callbacks=[cv], verbose=0)
    value = cv.results[0][f"val_{key}"]
    assert seen == [pytest.approx(1.0 - value if is_error else value)]
    assert cv.results[0]["val_average_error"] == seen[0]


def test_an_unknown_metric_is_refused_naming_the_results():
    model = classifier()
    cv = CrossValidation(digits(*VAL), metric="f1")
    with pytest.raises(ValueError, match=r"`metric`.*'accuracy'.*'loss'.*metric='f1'"):
        kfit.fit(model, *digits(*TRAIN), minibatch_size=50, epoch_size=300, epochs=1, callbacks=[cv], verbose=0)


def test_an_evaluation_in_the_middle_of_an_epoch_changes_neither_training_nor_its_logs():
    def run(callbacks):
        model = classifier()
        history = kfit.fit(model, *digits(*TRAIN), minibatch_size=40, epoch_size=600, epochs=2,
                           callbacks=callbacks, verbose=0)
        return model, history

    plain_model, plain = run([])
    cv = CrossValidation(digits(*VAL), frequency=200, minibatch_size=64)
    cv_model, with_cv = run([cv])
    assert len(cv.results) == 6
    assert with_cv.history["loss"] == plain.history["loss"]
    assert with_cv.history["accuracy"] == plain.history["accuracy"]
    for a, b in zip(plain_model.get_weights(), cv_model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    # The epoch logs hold the epoch's latest evaluation.
    assert with_cv.history["val_index"] == [2, 5]


def test_sample_weights_h5py_and_dict_inputs(tmp_path):
    import h5py

    x, y = digits(*VAL)
    weights = np.where(np.arange(len(y)) % 2 == 0, 1.0, 0.0).astype("float32")
    model = classifier()
    model.fit(*digits(*TRAIN), epochs=1, batch_size=50, verbose=0)
    expected = model.evaluate(x, y, sample_weight=weights, batch_size=32, verbose=0, return_dict=True)

    path = tmp_path / "val.h5"
    with h5py.File(path, "w") as f:
        f["x"], f["y"], f["w"] = x, y, weights
    with h5py.File(path, "r") as f:
        for data in [(x, y, weights), (f["x"], f["y"], f["w"])]:
            cv = CrossValidation(data, minibatch_size=32)
            cv.set_model(model)
            kfit.clock.attach_clock(model, kfit.Clock())
            logs = cv.cross_validate()
            assert logs["val_loss"] == pytest.approx(expected["loss"], rel=1e-5)
            assert logs["val_accuracy"] == pytest.approx(expected["accuracy"], rel=1e-5)

    keras.utils.set_random_seed(2)
    a, b = keras.Input((40,), name="a"), keras.Input((24,), name="b")
    out = keras.layers.Dense(10)(keras.layers.Concatenate()([a, b]))
    multi = keras.Model({"a": a, "b": b}, out)
    multi.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    xt, yt = digits(*TRAIN)
    cv = CrossValidation(({"a": x[:, :40], "b": x[:, 40:]}, y), frequency=300)
    kfit.fit(multi, {"a": xt[:, :40], "b": xt[:, 40:]}, yt, minibatch_size=50, epoch_size=300, epochs=1,
             callbacks=[cv], verbose=0)
    assert len(cv.results) == 1 and 0.0 <= cv.results[0]["val_average_error"] <= 1.0
    # Keys that are not the model's inputs: refused, or evaluated, exactly as model.evaluate does.
    wrong_x = {"a": x[:, :40], "c": x[:, 40:]}
    try:
        keras_says = multi.evaluate(wrong_x, y, batch_size=32, verbose=0, return_dict=True)
    except ValueError as error:
        keras_says = error
    wrong = CrossValidation((wrong_x, y), minibatch_size=32)
    if isinstance(keras_says, ValueError):
        with pytest.raises(ValueError, match=r"CrossValidation: model.evaluate refuses it: Missing data for input"):
            kfit.fit(multi, {"a": xt[:, :40], "b": xt[:, 40:]}, yt, minibatch_size=50, epoch_size=300, epochs=1,
                     callbacks=[wrong], verbose=0)
    else:
        wrong.set_model(multi)
        kfit.clock.attach_clock(multi, kfit.Clock())
        assert wrong.cross_validate()["val_loss"] == pytest.approx(keras_says["loss"], rel=1e-5)


# -- state ---------------------------------------------------------------------------------------------
def test_state_round_trip_continues_the_index():
    model = classifier()
    cv = CrossValidation(digits(*VAL), frequency=300)
    kfit.fit(model, *digits(*TRAIN), minibatch_size=50, epoch_size=300, epochs=2, callbacks=[cv], verbose=0)
    state = cv.get_state()
    assert [r["val_index"] for r in state["results"]] == [0, 1]

    resumed = CrossValidation(digits(*VAL), frequency=300)
    resumed.set_state(state)
    kfit.fit(model, *digits(*TRAIN), minibatch_size=50, epoch_size=300, initial_epoch=2, epochs=3,
             callbacks=[resumed], verbose=0)
    assert [(r["val_index"], r["samples"]) for r in resumed.results] == [(0, 300), (1, 600), (2, 900)]
    with pytest.raises(ValueError, match="missing 'results'"):
        resumed.set_state({})


# -- Test ----------------------------------------------------------------------------------------------
def test_test_runs_once_at_the_end_and_reports_everywhere(capsys):
    model = classifier()
    recorder = Recorder()
    test = Test(digits(*TEST), minibatch_size=64)
    assert test.results is None
    history = kfit.fit(model, *digits(*TRAIN), minibatch_size=50, epoch_size=300, epochs=2,
                       callbacks=[test, recorder], verbose=0)
    expected = model.evaluate(*digits(*TEST), batch_size=64, verbose=0, return_dict=True)
    assert history.history["test_loss"] == [pytest.approx(expected["loss"], rel=1e-5)]
    assert history.history["test_average_error"] == [pytest.approx(1.0 - expected["accuracy"], abs=1e-6)]
    assert history.history["test_samples"] == [200] and history.history["test_minibatches"] == [4]
    assert recorder.tests == [test.results]
    assert len(history.history["loss"]) == 2  # the test is not an epoch
    error = (1.0 - expected["accuracy"]) * 100
    assert f"Finished Test: Minibatch[1-4]: 1 - accuracy = {error:.2f}% * 200;" in capsys.readouterr().out


def test_test_under_plain_model_fit_and_quiet_with_a_progress_printer(capsys, tmp_path):
    model = classifier()
    test = Test(digits(*TEST), verbose=1)
    x, y = digits(*TRAIN)
    history = model.fit(x, y, batch_size=50, epochs=1, verbose=0, callbacks=[test])
    assert history.history["test_samples"] == [200]
    assert "Finished Test" in capsys.readouterr().out

    printer = kfit.callbacks.ProgressPrinter(log_to_file=str(tmp_path / "log.txt"))
    history = kfit.fit(model, x, y, minibatch_size=50, epoch_size=300, epochs=1, verbose=0,
                       callbacks=[printer, Test(digits(*TEST))])
    assert "Finished Evaluation" not in capsys.readouterr().out
    assert "Finished Test: Minibatch[1-7]: test_loss = " in (tmp_path / "log.txt").read_text()


# -- bad input -----------------------------------------------------------------------------------------
def test_cntk_config_keywords_mb_size_is_the_minibatch_size_and_criterion_is_refused():
    """CNTK's CrossValidationConfig/TestConfig(..., mb_size=N, criterion=f): mb_size is the evaluation's
    minibatch size; a criterion Function has no Keras meaning and is refused, saying what to write."""
    model = classifier()
    cv = CrossValidation(digits(*VAL), mb_size=50, max_samples=kfit.cntk.FULL_DATA_SWEEP)  # (all of it)
    test = Test(digits(*TEST), mb_size=40, verbose=0)
    history = kfit.fit(model, *digits(*TRAIN), minibatch_size=100, epochs=1, callbacks=[cv, test], verbose=0)
    assert history.history["val_samples"] == [200]
    assert history.history["val_minibatches"] == [4]  # 200 samples in minibatches of 50, not the default 32's 7
    assert history.history["test_minibatches"] == [5]  # 200 / 40
    assert CrossValidation(digits(*VAL), minibatch_size=50, mb_size=50).minibatch_size == 50
    assert CrossValidation(digits(*VAL)).minibatch_size == Test(digits(*TEST)).minibatch_size == 32
    for make in (CrossValidation, Test):
        owner = make.__name__
        with pytest.raises(ValueError, match=rf"`minibatch_size` and `mb_size` of {owner}.*minibatch_size=64, mb_size=50"):
            make(digits(*VAL), minibatch_size=64, mb_size=50)
        with pytest.raises(ValueError, match=rf"`criterion` of {owner}.*model.compile\(loss=.*metric='accuracy'.*"
                                             r"leave criterion out. Received: criterion='loss, metric'"):
            make(digits(*VAL), criterion="loss, metric")
        with pytest.raises(ValueError, match=r"`model_inputs_to_streams`.*leave model_inputs_to_streams out"):
            make(digits(*VAL), model_inputs_to_streams={"features": 0})
        # CNTK's name of the data, minibatch_source (and its deprecated source): given once.
        assert make(minibatch_source=digits(*VAL)).data.num_samples == make(source=digits(*VAL)).data.num_samples == 200
        with pytest.raises(TypeError, match=rf"{owner} needs its evaluation data once.*Received: data \(a tuple\), minibatch_source \(a tuple\)"):
            make(digits(*VAL), minibatch_source=digits(*VAL))
        with pytest.raises(TypeError, match=r"give data=\(x, y\).*Received: none of them"):
            make()


def test_a_callback_that_returns_a_non_bool_is_refused():
    def adjust(index, average_error, num_samples, num_minibatches):
        return "stop"

    cv = CrossValidation(digits(*VAL), frequency=100, callback=adjust)
    with pytest.raises(TypeError, match=r"'adjust' must return True .* Received: 'stop' at index 0"):
        kfit.fit(classifier(), *digits(*TRAIN), minibatch_size=50, epoch_size=300, epochs=1, callbacks=[cv], verbose=0)


def test_numpy_bools_are_accepted():
    cv = CrossValidation(digits(*VAL), frequency=100, callback=lambda i, e, n, m: np.bool_(i < 1))
    model = classifier()
    kfit.fit(model, *digits(*TRAIN), minibatch_size=50, epoch_size=300, epochs=1, callbacks=[cv], verbose=0)
    assert kfit.get_clock(model).samples == 200


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"frequency": 0}, ValueError, r"`frequency`.*Received: frequency=0"),
        ({"frequency": -5}, ValueError, r"frequency=-5"),
        ({"frequency": 1.5}, ValueError, r"frequency=1.5"),
        ({"frequency": True}, ValueError, r"frequency=True"),
        # CNTK's 'once at the end of training' would never be reached: refused, naming what to use.
        ({"frequency": sys.maxsize}, ValueError, rf"frequency={sys.maxsize}.*sys.maxsize.*kfit.callbacks.Test"),
        ({"minibatch_size": 0}, ValueError, r"`minibatch_size`.*minibatch_size=0"),
        ({"minibatch_size": kfit.schedules.learning_rate_per_sample(0.1)}, ValueError, r"learning_rate schedule"),
        ({"max_samples": 0}, ValueError, r"`max_samples`.*max_samples=0"),
        ({"callback": 3}, TypeError, r"`callback`.*callback=3"),
        ({"metric": ""}, ValueError, r"`metric`"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        CrossValidation(digits(*VAL), **kwargs)


@pytest.mark.parametrize(
    "data, error, match",
    [
        (np.zeros((10, 64)), TypeError, r"`data` of CrossValidation: expected a tuple \(x, y\)"),
        ((np.zeros((10, 64)),), TypeError, r"expected a tuple"),
        ((np.zeros((10, 64)), np.zeros(9)), ValueError, r"lengths differ"),
        ((np.zeros((0, 64)), np.zeros(0)), ValueError, r"holds no sample"),
        ((np.zeros((10, 64)), [1, 2]), TypeError, r"y must be arrays"),
        ((None, np.zeros(3)), ValueError, r"x is None"),
    ],
)
def test_bad_data_is_refused_at_construction(data, error, match):
    with pytest.raises(error, match=match):
        CrossValidation(data)
    with pytest.raises(error, match=match.replace("CrossValidation", "Test")):
        Test(data)


@pytest.mark.parametrize("make", [lambda d: CrossValidation(d), lambda d: Test(d)])
def test_data_of_the_wrong_shape_is_refused_before_training(make):
    x, y = digits(*VAL)
    model = classifier()
    callback = make((x.reshape(-1, 8, 8), y))
    with pytest.raises(ValueError, match=r"(?s)of (CrossValidation|Test): model.evaluate refuses it: .*shape"):
        kfit.fit(model, *digits(*TRAIN), minibatch_size=50, epoch_size=300, epochs=1, callbacks=[callback], verbose=0)
    assert kfit.get_clock(model).samples == 0


def test_evaluation_data_follows_model_evaluate_rules_and_takes_sources():
    """Anything model.evaluate takes: (N,) arrays for an Input((1,)), tf.data, a Grain dataset (where Keras reads
    one: 3.11 and later), a generator; the same numbers.

    (A fresh model per kind: on TensorFlow one model evaluated on inputs of two ranks retraces to an unknown
    rank, under plain model.evaluate too.)"""
    import tensorflow as tf

    def model():
        keras.utils.set_random_seed(3)
        m = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2)])
        m.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return m

    x = np.linspace(-1, 1, 40).astype("float32")  # (N,) for an Input((1,)): Keras adds the axis
    y = (x > 0).astype("int64")
    sources = {
        "arrays": lambda: (x, y),
        "tf.data": lambda: tf.data.Dataset.from_tensor_slices((x[:, None], y)).batch(8),
    }
    if importlib.util.find_spec("keras.src.trainers.data_adapters.grain_dataset_adapter") is not None:
        import grain

        sources["grain"] = lambda: grain.MapDataset.source(list(zip(x[:, None], y))).batch(8)
    for kind, make in sources.items():
        data = make()
        expected = (model().evaluate(*data, batch_size=8, verbose=0, return_dict=True) if kind == "arrays"
                    else model().evaluate(data, verbose=0, return_dict=True))
        cv = CrossValidation(make(), minibatch_size=8)
        trained = model()
        cv.set_model(trained)
        kfit.clock.attach_clock(trained, kfit.Clock())
        cv.data.check_model(trained)
        logs = cv.cross_validate()
        assert logs["val_loss"] == pytest.approx(expected["loss"], rel=1e-5), kind
        assert (logs["val_samples"], logs["val_minibatches"]) == (40, 5), kind
    with pytest.raises(TypeError, match="a generator can be evaluated only once, and CrossValidation evaluates"):
        CrossValidation(b for b in [(x, y)])
    expected = model().evaluate(x[:, None], y, batch_size=8, verbose=0, return_dict=True)
    test = Test(((x[i:i + 8, None], y[i:i + 8]) for i in range(0, 40, 8)), verbose=0)
    test.set_model(model())
    assert test.run()["test_loss"] == pytest.approx(expected["loss"], rel=1e-5)


def test_frequency_none_keeps_kfits_meaning_every_epoch_end():
    # kfit's CrossValidation(frequency=None) has meant "at every epoch end" from the start and keeps that meaning
    # (CNTK's None, once at the end of training, is told apart in the migration guide).
    recorder = Recorder()
    cv = CrossValidation(digits(*VAL), frequency=None, minibatch_size=64)
    kfit.fit(classifier(), *digits(*TRAIN), minibatch_size=50, epoch_size=300, epochs=3,
             callbacks=[recorder, cv], verbose=0)
    assert [logs["samples"] for _, logs in recorder.cross_validations] == [300, 600, 900]
