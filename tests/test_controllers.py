"""EarlyStopping and ReduceLROnPlateau: their decisions (table-driven), their state, and a real kill-and-resume."""

from __future__ import annotations

import functools
import warnings

import keras
import numpy as np
import pytest

import kfit
from kfit.callbacks import (
    Checkpoint,
    CrossValidation,
    EarlyStopping,
    KfitCallback,
    LearningRateSchedule,
    ReduceLROnPlateau,
)
from kfit.clock import Clock, attach_clock


# -- a run without training: the controllers see a sequence of evaluations ----------------------------
class FakeRun:
    """A compiled model with a clock and a (never run) CrossValidation among the peers; ``evaluate`` sends
    one cross-validation result to the controllers after ``step`` more samples."""

    def __init__(self, *controllers, epoch_size: int = 100, learning_rate: float = 1.0, schedule=None):
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(learning_rate), loss="mse")
        self.model = model
        self.clock = attach_clock(model, Clock(epoch_size=epoch_size))
        cv = CrossValidation((np.zeros((4, 2), "float32"), np.zeros((4, 1), "float32")))
        self.schedule = schedule
        self.callbacks = [cv, *([schedule] if schedule else []), *controllers]
        for callback in self.callbacks:
            callback.set_model(model)
        model.stop_training = False
        for callback in self.callbacks[1:]:
            callback.on_train_begin()
        self.index = 0

    def evaluate(self, value: float, step: int = 100, key: str = "val_loss") -> bool:
        self.clock.samples += step
        self.clock.minibatches += 1
        for callback in self.callbacks:
            callback.on_cross_validation_end(self.index, {key: value, "val_index": self.index})
        self.index += 1
        return bool(self.model.stop_training)

    def learning_rate(self) -> float:
        return float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))


def first_stop(run: FakeRun, values, step: int = 100, key: str = "val_loss") -> int | None:
    """The 1-based number of the evaluation after which training stops, or None."""
    for n, value in enumerate(values, start=1):
        if run.evaluate(value, step, key):
            return n
    return None


# -- EarlyStopping decisions -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, values, step, expected",
    [
        ({"patience": 0}, [3, 2, 1, 1, 1], 100, 4),
        ({"patience": 1}, [3, 2, 1, 1, 1], 100, 4),  # as Keras: 0 and 1 both stop at the first miss
        ({"patience": 2}, [3, 2, 1, 1.5, 1.2, 0.9], 100, 5),
        ({"patience": 2}, [3, 2, 1, 1.5, 0.9, 1.2, 1.0], 100, 7),  # an improvement restarts the count
        ({"patience": 1, "min_delta": 0.1}, [1.0, 0.95, 0.85], 100, 2),
        ({"patience": 1, "min_delta": 0.05, "min_delta_mode": "relative"}, [1.0, 0.94, 0.9], 100, 3),
        ({"patience": 2, "monitor": "val_accuracy"}, [0.5, 0.6, 0.55, 0.58], 100, 4),  # auto: max
        ({"patience": 2, "monitor": "val_accuracy", "mode": "min"}, [0.5, 0.6, 0.55, 0.58], 100, 3),
        ({"patience": 1, "burn_in": 3}, [1, 2, 3, 4, 5], 100, 4),
        ({"patience": 0, "burn_in": 3}, [1, 2, 3, 0.5, 0.7], 100, 5),
        ({"patience": 100, "burn_in": 250, "unit": "samples"}, [1, 2, 3, 4, 5], 100, 4),
        ({"patience": 1, "unit": "epochs"}, [1, 2, 2, 2], 50, 3),
        ({"patience": 2, "unit": "epochs", "burn_in": 1}, [1, 2, 2, 2, 2, 2, 2], 50, 6),
        ({"patience": 0, "min_samples": 500}, [1, 1, 1, 1, 1, 1], 100, 5),
        ({"patience": 0, "min_epochs": 3}, [1, 1, 1, 1, 1, 1], 100, 3),
        # Durations as intervals, as every "every N" in kfit: the same decisions as the ints with `unit`.
        ({"patience": "100sp", "burn_in": "250sp"}, [1, 2, 3, 4, 5], 100, 4),
        ({"patience": 100, "burn_in": "250sp"}, [1, 2, 3, 4, 5], 100, 4),  # the string sets the unit of both
        ({"patience": "1ep"}, [1, 2, 2, 2], 50, 3),
        ({"patience": "2ep", "burn_in": 1}, [1, 2, 2, 2, 2, 2, 2], 50, 6),
        ({"patience": "2ep", "burn_in": 1, "unit": "epochs"}, [1, 2, 2, 2, 2, 2, 2], 50, 6),
        ({"patience": 0, "min_duration": "500sp"}, [1, 1, 1, 1, 1, 1], 100, 5),
        ({"patience": 0, "min_duration": 500}, [1, 1, 1, 1, 1, 1], 100, 5),  # an int: samples
        ({"patience": 0, "min_duration": "3ep"}, [1, 1, 1, 1, 1, 1], 100, 3),
        ({"patience": 0, "min_duration": "4mb"}, [1, 1, 1, 1, 1, 1], 100, 4),  # one minibatch per evaluation here
        ({"patience": 2, "baseline": 0.5}, [0.8, 0.7, 0.6], 100, 2),
        ({"patience": 2, "baseline": 0.5}, [0.8, 0.4, 0.45, 0.42], 100, 4),
        ({"patience": 1}, [1.0, float("nan"), 0.5], 100, 2),
        ({"patience": 3}, [5, 4, 3, 2, 1], 100, None),
    ],
)
def test_early_stopping_decisions(kwargs, values, step, expected):
    kwargs = dict(kwargs)
    monitor = kwargs.pop("monitor", "val_loss")
    stop = EarlyStopping(monitor, **kwargs)
    run = FakeRun(stop)
    assert first_stop(run, values, step, key=monitor) == expected
    assert stop.stopped == (expected is not None)
    if expected is not None:
        assert stop.stopped_evaluation == expected
        assert stop.stopped_samples == expected * step


def test_early_stopping_keeps_counters_like_keras():
    stop = EarlyStopping(patience=5)
    run = FakeRun(stop)
    for value in [3, 2, 2.5, 2.2, 2.1]:
        run.evaluate(value)
    assert (stop.best, stop.best_evaluation, stop.best_samples, stop.wait) == (2.0, 2, 200, 3)


def test_early_stopping_reads_epoch_logs_without_cross_validation():
    model = classifier()
    stop = EarlyStopping("val_loss", patience=0, min_delta=10.0)  # nothing improves by 10
    history = kfit.fit(model, *digits(0, 600), minibatch_size=50, epoch_size=300, epochs=5,
                       validation_data=digits(600, 800), callbacks=[stop], verbose=0)
    assert len(history.history["val_loss"]) == 2
    assert stop.stopped_samples == 600


def test_early_stopping_on_training_loss_and_unknown_monitors():
    for extra in ([], [CrossValidation(digits(600, 800), frequency=100)]):  # a training value: epoch logs
        model = classifier()
        stop = EarlyStopping("loss", patience=0, min_delta=10.0)
        kfit.fit(model, *digits(0, 600), minibatch_size=50, epoch_size=300, epochs=5, callbacks=[*extra, stop],
                 verbose=0)
        assert stop.stopped_samples == 600 and stop.evaluations == 2

    with pytest.raises(ValueError, match=r"'val_los' is not among the cross-validation results \['val_accuracy'"):
        kfit.fit(classifier(), *digits(0, 600), minibatch_size=50, epoch_size=300, epochs=1, verbose=0,
                 callbacks=[CrossValidation(digits(600, 800)), EarlyStopping("val_los")])
    with pytest.raises(ValueError, match=r"'los' is not in the epoch's logs"):
        kfit.fit(classifier(), *digits(0, 600), minibatch_size=50, epoch_size=300, epochs=1, verbose=0,
                 callbacks=[EarlyStopping("los")])


# -- ReduceLROnPlateau decisions ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, values, rates, stop",
    [
        ({"factor": 0.5, "patience": 1}, [1, 1, 1, 1], [1, 0.5, 0.25, 0.125], None),
        ({"factor": 0.5, "patience": 0}, [1, 1, 1, 1], [1, 0.5, 0.25, 0.125], None),
        ({"factor": 0.5, "patience": 2}, [1, 1, 1, 1, 1], [1, 1, 0.5, 0.5, 0.25], None),
        ({"factor": 0.5, "patience": 1, "cooldown": 1}, [1, 1, 1, 1, 1], [1, 0.5, 0.5, 0.25, 0.25], None),
        ({"factor": 0.5, "patience": 1, "cooldown": 2}, [1, 1, 1, 1, 1, 1], [1, 0.5, 0.5, 0.5, 0.25, 0.25], None),
        ({"factor": 0.5, "patience": 1}, [1, 0.5, 0.4, 0.4], [1, 1, 1, 0.5], None),
        ({"factor": 0.5, "patience": 1, "min_delta": 0.2}, [1, 0.9, 0.5, 0.45], [1, 0.5, 0.5, 0.25], None),
        ({"factor": 0.5, "patience": 1, "burn_in": 2}, [1, 1, 1, 1], [1, 1, 0.5, 0.25], None),
        ({"factor": 0.5, "patience": 1, "min_lr": 0.3}, [1, 1, 1, 1, 1], [1, 0.5, 0.3, 0.3, 0.3], None),
        ({"factor": 0.5, "patience": 1, "min_lr": 0.3, "stop_at_floor": True}, [1, 1, 1, 1], [1, 0.5, 0.3, 0.3], 4),
        ({"factor": 0.5, "patience": 1, "max_reductions": 2}, [1, 1, 1, 1, 1], [1, 0.5, 0.25, 0.25], 4),
        ({"factor": 0.5, "patience": 1, "max_reductions": 0}, [1, 1], [1, 1], 2),
        ({"factor": 0.5, "patience": 1, "min_lr_change": 0.2}, [1, 1, 1, 1], [1, 0.5, 0.25, 0.25], None),
        ({"factor": 0.5, "patience": 150, "unit": "samples"}, [1, 1, 1, 1, 1], [1, 1, 0.5, 0.5, 0.25], None),
        ({"factor": 0.5, "patience": 1, "unit": "epochs"}, [1, 1, 1, 1, 1], [1, 1, 0.5, 0.5, 0.25], None),
        ({"factor": 0.5, "patience": "150sp"}, [1, 1, 1, 1, 1], [1, 1, 0.5, 0.5, 0.25], None),
        ({"factor": 0.5, "patience": "1ep"}, [1, 1, 1, 1, 1], [1, 1, 0.5, 0.5, 0.25], None),
        ({"factor": 0.5, "patience": 100, "cooldown": "200sp"}, [1, 1, 1, 1, 1, 1], [1, 0.5, 0.5, 0.5, 0.25, 0.25], None),
    ],
)
def test_reduce_lr_on_plateau_decisions(kwargs, values, rates, stop):
    reduce = ReduceLROnPlateau(**kwargs)
    step = 50 if reduce.unit == "epochs" else 100
    run = FakeRun(reduce, learning_rate=1.0)
    seen, stopped_at = [], None
    for n, value in enumerate(values, start=1):
        if run.evaluate(value, step=step) and stopped_at is None:
            stopped_at = n
        seen.append(run.learning_rate())
        if stopped_at is not None:
            break
    np.testing.assert_allclose(seen, rates[: len(seen)], rtol=1e-6)
    assert stopped_at == stop
    assert reduce.stopped == (stop is not None)


def test_reduce_lr_on_plateau_resets_the_learning_rate_schedule():
    schedule = LearningRateSchedule(kfit.schedules.learning_rate_per_sample([0.01, 0.001], epoch_size=1000))
    reduce = ReduceLROnPlateau("val_average_error", factor=0.5, patience=1, min_lr=0.003)
    run = FakeRun(reduce, schedule=schedule)
    changes = []

    class Listener(KfitCallback):
        def on_hyperparameter_change(self, name, value, scheduled, unit):
            changes.append((name, round(value, 9), round(scheduled, 9), unit))

    listener = Listener()
    listener.set_model(run.model)
    for value in [0.2, 0.2]:
        run.evaluate(value, key="val_average_error")
    assert schedule.learning_rate() == pytest.approx(0.005)  # per sample, from the schedule's 0.01
    run.clock.minibatch_size = 64
    schedule.on_step_begin(run.clock)
    assert run.learning_rate() == pytest.approx(0.005 * 64)
    assert changes == [("lr", pytest.approx(0.32), pytest.approx(0.005), "per_sample")]
    # The reset replaces the schedule: its own decay at 1000 samples no longer applies.
    run.clock.samples = 1500
    assert schedule.learning_rate() == pytest.approx(0.005)
    run.evaluate(0.2, key="val_average_error")
    assert schedule.learning_rate() == pytest.approx(0.003)  # the floor
    assert reduce.reductions == 2


def test_reduce_lr_on_plateau_without_a_schedule_sets_the_optimizer_in_the_loop():
    rates = []

    class Rates(KfitCallback):
        order = 10  # after the schedules: the rate this step uses

        def on_step_begin(self, clock):
            variable = kfit.optimizers.hyperparameter_variable(self.training_model.optimizer, "learning_rate")
            rates.append(float(kfit._backend.read_variable(self.training_model, variable)))

    reduce = ReduceLROnPlateau("val_loss", factor=0.5, patience=0, min_delta=10.0)  # every evaluation reduces
    cv = CrossValidation(digits(600, 800), frequency=150)
    kfit.fit(classifier(), *digits(0, 600), minibatch_size=50, epoch_size=300, epochs=2, verbose=0,
             callbacks=[cv, reduce, Rates()])
    assert reduce.reductions == 3  # the first evaluation is the first best
    np.testing.assert_allclose(rates, [0.1] * 6 + [0.05] * 3 + [0.025] * 3, rtol=1e-6)
    assert reduce.learning_rate() == pytest.approx(0.0125)



@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit"])
def test_reduce_lr_on_plateau_refuses_an_optimizer_with_a_keras_schedule_before_training(loop):
    """An optimizer whose rate is a ``keras.optimizers.schedules.LearningRateSchedule`` has no rate to set: the
    callback refuses it before the first step (it failed at the first epoch's end, an epoch of training lost)."""
    model = classifier()
    model.compile(optimizer=keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.8)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [keras.ops.convert_to_numpy(v) for v in model.weights]
    reduce = ReduceLROnPlateau("loss", factor=0.5, patience=0)
    x, y = digits(0, 100)
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau sets the optimizer's learning rate.*refused before "
                                         r"training.*ExponentialDecay.*float `learning_rate`"):
        if loop == "model.fit":
            model.fit(x, y, batch_size=50, epochs=2, verbose=0,
                      callbacks=[kfit.callbacks.SampleClock(batch_size=50, num_samples=100), reduce])
        else:
            kfit.fit(model, x, y, minibatch_size=50, epochs=2, verbose=0, callbacks=[reduce])
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 0  # not a step trained
    for a, b in zip(before, model.weights):
        np.testing.assert_array_equal(a, keras.ops.convert_to_numpy(b))

# -- state: decisions identical across a get_state / set_state --------------------------------------
def _json_like(state: dict) -> dict:
    """What a checkpoint gives back: lists for arrays, plain numbers."""
    import json

    arrays = {k: v for k, v in state.items() if k == "best_weights"}
    plain = json.loads(json.dumps({k: v for k, v in state.items() if k not in arrays}))
    plain.update(arrays)
    return plain


CONTROLLERS = [
    lambda: EarlyStopping(patience=3, burn_in=1, min_samples=400),
    lambda: EarlyStopping(patience=250, unit="samples", min_delta=0.01, min_delta_mode="relative"),
    lambda: ReduceLROnPlateau(factor=0.5, patience=2, cooldown=1, min_lr=0.1, stop_at_floor=True),
    lambda: ReduceLROnPlateau(factor=0.5, patience=2, max_reductions=2, burn_in=2),
]
VALUES = [5, 4, 4.1, 4.05, 3.9, 3.95, 3.97, 3.96, 3.8, 3.85, 3.9, 3.88, 3.86, 3.87, 3.9, 3.95] + [3.9] * 8


@pytest.mark.parametrize("make", CONTROLLERS)
@pytest.mark.parametrize("cut", [1, 3, 5, 7])
def test_a_restored_controller_decides_as_an_uninterrupted_one(make, cut):
    def trace(run, controller, values):
        out = []
        for value in values:
            stopped = run.evaluate(value)
            out.append((stopped, run.learning_rate(), controller.wait))
            if stopped:
                break
        return out

    whole = make()
    expected = trace(FakeRun(whole), whole, VALUES)

    first = make()
    run = FakeRun(first)
    before = trace(run, first, VALUES[:cut])
    assert not before[-1][0], "the cut must come before the stop"
    state, samples, lr = _json_like(first.get_state()), run.clock.samples, run.learning_rate()

    second = make()
    second.set_state(state)
    resumed = FakeRun(second, learning_rate=lr)
    resumed.clock.samples = samples
    after = trace(resumed, second, VALUES[cut:])
    assert before + after == expected
    assert expected[-1][0], "every controller here stops"
    final = {k: v for k, v in second.get_state().items() if k != "best_weights"}
    assert final == {k: v for k, v in whole.get_state().items() if k != "best_weights"}


def test_set_state_refuses_an_incomplete_state():
    with pytest.raises(ValueError, match=r"EarlyStopping state 'early_stopping' is missing \['best'"):
        EarlyStopping().set_state({"evaluations": 1, "best_evaluation": 1, "best_samples": 1})


def test_a_run_restored_after_its_stop_trains_no_further():
    stop = EarlyStopping(patience=0)
    run = FakeRun(stop)
    first_stop(run, [1, 2])
    resumed = EarlyStopping(patience=0)
    resumed.set_state(stop.get_state())
    model = classifier()
    kfit.fit(model, *digits(0, 600), minibatch_size=50, epoch_size=300, epochs=2, verbose=0,
             callbacks=[CrossValidation(digits(600, 800)), resumed])
    assert kfit.get_clock(model).samples == 0


# -- arguments ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cls, kwargs, error, match",
    [
        (EarlyStopping, {"patience": -1}, ValueError, r"`patience`.*patience=-1"),
        (EarlyStopping, {"patience": 1.5}, ValueError, r"patience=1.5"),
        (EarlyStopping, {"unit": "steps"}, ValueError, r"`unit`.*'evaluations', 'samples', 'epochs'.*unit='steps'"),
        (EarlyStopping, {"mode": "up"}, ValueError, r"`mode`.*mode='up'"),
        (EarlyStopping, {"min_delta": -0.1}, ValueError, r"`min_delta`.*min_delta=-0.1"),
        (EarlyStopping, {"min_delta_mode": "percent"}, ValueError, r"min_delta_mode='percent'"),
        (EarlyStopping, {"burn_in": -2}, ValueError, r"burn_in=-2"),
        (EarlyStopping, {"min_samples": 0.5}, ValueError, r"min_samples=0.5"),
        (EarlyStopping, {"min_epochs": -1}, ValueError, r"min_epochs=-1"),
        (EarlyStopping, {"patience": "3 epochs"}, ValueError, r"`patience`.*'2ep'.*patience='3 epochs'"),
        (EarlyStopping, {"patience": "30mb"}, ValueError, r"`patience`.*not minibatches.*patience='30mb'"),
        (EarlyStopping, {"patience": "3ep", "burn_in": "600sp"}, ValueError,
         r"one unit.*patience='3ep', burn_in='600sp'"),
        (EarlyStopping, {"patience": "3ep", "unit": "samples"}, ValueError, r"one unit.*patience='3ep', unit='samples'"),
        (EarlyStopping, {"min_duration": "0ep"}, ValueError, r"`min_duration`.*min_duration='0ep'"),
        (EarlyStopping, {"min_duration": "2ep", "min_samples": 10}, ValueError,
         r"minimum training length once.*min_duration='2ep', min_samples=10"),
        (EarlyStopping, {"baseline": float("nan")}, ValueError, r"baseline=nan"),
        (EarlyStopping, {"restore_best_weights": 1}, TypeError, r"restore_best_weights=1"),
        (EarlyStopping, {"monitor": ""}, ValueError, r"`monitor`"),
        (ReduceLROnPlateau, {"factor": 1.0}, ValueError, r"`factor`.*\(0, 1\).*factor=1.0"),
        (ReduceLROnPlateau, {"factor": 0}, ValueError, r"factor=0"),
        (ReduceLROnPlateau, {"cooldown": -1}, ValueError, r"cooldown=-1"),
        (ReduceLROnPlateau, {"patience": "2ep", "cooldown": "100sp"}, ValueError,
         r"one unit.*patience='2ep', cooldown='100sp'"),
        (ReduceLROnPlateau, {"min_lr": -1e-3}, ValueError, r"min_lr=-0.001"),
        (ReduceLROnPlateau, {"min_lr_change": float("inf")}, ValueError, r"min_lr_change=inf"),
        (ReduceLROnPlateau, {"max_reductions": -1}, ValueError, r"max_reductions=-1"),
        (ReduceLROnPlateau, {"stop_at_floor": "yes"}, TypeError, r"stop_at_floor='yes'"),
    ],
)
def test_bad_arguments_are_refused(cls, kwargs, error, match):
    with pytest.raises(error, match=match):
        cls(**kwargs)


@pytest.mark.parametrize(
    "monitor, mode",
    [("val_loss", "min"), ("val_average_error", "min"), ("val_accuracy", "max"),
     ("val_sparse_categorical_accuracy", "max"), ("val_acc", "max"), ("val_auc", "max"), ("loss", "min")],
)
def test_auto_mode(monitor, mode):
    assert EarlyStopping(monitor).mode == mode


# -- real training: digits -----------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    order = np.random.default_rng(0).permutation(len(data.target))
    return (data.data[order] / 16.0).astype("float32"), data.target[order].astype("int64")


def digits(start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = _digits()
    return x[start:stop], y[start:stop]


def classifier(seed: int = 1) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)])
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


class WeightsAtEvaluation(KfitCallback):
    """The model's weights at every cross-validation."""

    default_name = "weights_at_evaluation"

    def __init__(self):
        super().__init__()
        self.weights: list[list[np.ndarray]] = []

    def on_cross_validation_end(self, index, logs):
        self.weights.append([np.array(w) for w in self.model.get_weights()])


def test_restore_best_weights_gives_the_weights_of_the_best_evaluation():
    model = classifier()
    cv = CrossValidation(digits(600, 800), frequency=150, minibatch_size=100)
    stop = EarlyStopping("val_average_error", patience=2, restore_best_weights=True)
    snapshots = WeightsAtEvaluation()
    kfit.fit(model, *digits(0, 600), minibatch_size=30, epoch_size=600, epochs=8, verbose=0,
             callbacks=[cv, stop, snapshots])
    errors = [r["val_average_error"] for r in cv.results]
    best = int(np.argmin(errors))  # the first of equal minima, as ties do not improve
    assert stop.best == errors[best] and stop.best_evaluation == best + 1
    assert best < len(errors) - 1, "the test needs an evaluation after the best"
    for restored, kept in zip(model.get_weights(), snapshots.weights[best], strict=True):
        np.testing.assert_array_equal(restored, kept)
    assert len(stop.get_state()["best_weights"]) == len(model.weights)


# -- a real stop and restart ------------------------------------------------------------------------
EPOCH = 300


def _train(model, callbacks, epochs):
    """kfit.fit; returns the learning rate the optimizer used at every step."""
    rates = []

    class Rates(KfitCallback):
        def on_step_end(self, clock, logs):
            variable = kfit.optimizers.hyperparameter_variable(self.training_model.optimizer, "learning_rate")
            rates.append((clock.samples, float(kfit._backend.read_variable(self.training_model, variable))))

    kfit.fit(model, *digits(0, 600), minibatch_size=30, epoch_size=EPOCH, epochs=epochs,
             callbacks=[*callbacks, Rates()], verbose=0)
    return rates


def _kill_and_resume(tmp_path, make_callbacks, cut, epochs, fresh_controllers=False):
    """Trains ``cut`` epochs with a Checkpoint at every epoch end, then goes on in a new kfit.fit call with a
    fresh model and fresh callbacks, restored by a Checkpoint (``fresh_controllers``: the controllers get
    other names, so that the checkpoint holds no state for them)."""
    path = tmp_path / "run.ckpt"
    first_model, first = classifier(), make_callbacks()
    rates = _train(first_model, [*first, Checkpoint(path, epochs=1, async_write=False)], cut)

    model = classifier(seed=7)  # other initial weights: all restored from the checkpoint
    callbacks = make_callbacks()
    if fresh_controllers:
        for callback in callbacks:
            if not isinstance(callback, LearningRateSchedule):
                callback.name += "_fresh"
    rates += _train(model, [*callbacks, Checkpoint(path, epochs=1, async_write=False)], epochs)
    return model, first, callbacks, rates


def _early_stopping_run():
    # Per sample, by epoch: four epochs that learn, then a rate too small to improve val_loss by min_delta.
    lr = LearningRateSchedule(kfit.schedules.learning_rate_per_sample([0.01] * 4 + [1e-6], epoch_size=EPOCH))
    cv = CrossValidation(digits(600, 800), minibatch_size=100)
    stop = EarlyStopping("val_loss", patience=3, min_delta=1e-3, restore_best_weights=True)
    return [lr, cv, stop]


def test_early_stopping_decides_the_same_with_a_kill_and_resume(tmp_path):
    model, whole = classifier(), _early_stopping_run()
    rates = _train(model, whole, 20)
    stop = whole[2]
    assert stop.stopped and stop.best_evaluation == 4 and stop.stopped_evaluation == 7

    cut = 5  # one evaluation without improvement counted: the patience is running
    resumed_model, first, second, resumed_rates = _kill_and_resume(tmp_path / "a", _early_stopping_run, cut, 20)
    assert not first[2].stopped and first[2].wait == 1
    assert (second[2].stopped_samples, second[2].stopped_evaluation) == (stop.stopped_samples, stop.stopped_evaluation)
    assert (second[2].best, second[2].best_evaluation, second[2].wait) == (stop.best, stop.best_evaluation, stop.wait)
    assert [r["val_loss"] for r in second[1].results] == [r["val_loss"] for r in whole[1].results]
    assert resumed_rates == rates
    for a, b in zip(resumed_model.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)  # the best weights, restored at the end of both runs

    # Without the controllers' state the resumed run would have decided otherwise.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, _, fresh, _ = _kill_and_resume(tmp_path / "b", _early_stopping_run, cut, 20, fresh_controllers=True)
    assert any("holds no state for callback 'early_stopping_fresh'" in str(w.message) for w in caught)
    assert fresh[2].stopped_samples == (cut + 1 + 3) * EPOCH != stop.stopped_samples


def _reduce_run():
    lr = LearningRateSchedule(kfit.schedules.learning_rate_per_sample(0.01))
    cv = CrossValidation(digits(600, 800), minibatch_size=100)
    reduce = ReduceLROnPlateau("val_loss", factor=0.5, patience=1, cooldown=1, min_delta=0.05,
                               min_delta_mode="relative", max_reductions=3)
    return [lr, cv, reduce]


def test_reduce_lr_on_plateau_decides_the_same_with_a_kill_and_resume(tmp_path):
    model, whole = classifier(), _reduce_run()
    rates = _train(model, whole, 30)
    reduce = whole[2]
    assert reduce.stopped and reduce.reductions == 3
    # The first step at a reduced rate ends at (reduction + 30) samples: kill one epoch later, in the cooldown.
    first_change = next(s for (s, r), (_, r0) in zip(rates[1:], rates[:-1], strict=True) if r != r0)
    cut = (first_change - 30) // EPOCH + 1
    assert cut * EPOCH < reduce.stopped_samples

    resumed_model, first, second, resumed_rates = _kill_and_resume(tmp_path, _reduce_run, cut, 30)
    assert first[2].reductions == 1
    assert second[2].get_state() == _json_like(reduce.get_state())
    assert resumed_rates == rates
    for a, b in zip(resumed_model.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
