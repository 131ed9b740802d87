"""A run's state belongs to the run: nothing of it stays on the user's model, and the next run starts fresh."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import kfit
from kfit.callbacks import (
    Checkpoint,
    CrossValidation,
    EarlyStopping,
    LearningRateSchedule,
    SampleClock,
)


def _data(n=64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    return x, (x @ np.arange(1, 5, dtype="float32")[:, None]).astype("float32")


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def _kfit_state(model) -> list[str]:
    """The attributes of ``model`` that hold kfit objects or carry kfit's name (but ``model.history``, which Keras's
    fit sets to the run's History, as model.fit does)."""
    found = []
    for name, value in vars(model).items():
        if name == "history" and isinstance(value, keras.callbacks.History):
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        if "kfit" in name or any(type(v).__module__.startswith("kfit") for v in values):
            found.append(name)
    return found


def test_nothing_of_a_kfit_fit_run_stays_on_the_model(tmp_path):
    model = _model()
    x, y = _data()
    callbacks = [Checkpoint(tmp_path / "run.ckpt"), CrossValidation(_data(16), frequency=32),
                 LearningRateSchedule(kfit.schedules.learning_rate_per_minibatch(0.01))]
    history = kfit.fit(model, x, y, minibatch_size=8, epochs=2, seed=0, callbacks=callbacks, verbose=0)
    assert _kfit_state(model) == []
    assert kfit.get_context(model) is None  # the run ended with kfit.fit
    assert kfit.get_clock(model).samples == 128 == sum(s.samples for s in history.epoch_summaries)


def test_nothing_of_a_model_fit_run_with_kfit_callbacks_stays_on_the_model():
    model = _model()
    x, y = _data()
    cv = CrossValidation(_data(16), frequency=32)
    callbacks = [SampleClock(batch_size=8, num_samples=64), cv,
                 LearningRateSchedule(kfit.schedules.learning_rate_per_minibatch(0.01)),
                 EarlyStopping(monitor="val_loss", unit="evaluations", patience=100)]
    model.fit(x, y, batch_size=8, epochs=2, callbacks=callbacks, verbose=0)
    assert _kfit_state(model) == []
    assert kfit.get_context(model) is None
    assert len(cv.results) == 4  # every 32 samples of 128
    assert kfit.get_clock(model).samples == 128  # the clock the run ended with stays readable


def test_a_schedule_in_a_later_model_fit_without_a_sample_clock_is_refused_not_frozen():
    # The previous run's clock used to stay on the model: a later schedule read it and never advanced.
    model = _model()
    x, y = _data()
    kfit.fit(model, x, y, minibatch_size=8, epochs=1, seed=0, verbose=0)
    schedule = LearningRateSchedule(kfit.schedules.learning_rate_per_minibatch([0.01, 0.001], epoch_size=8))
    with pytest.raises(RuntimeError, match="needs kfit's sample clock, and this run has none.*SampleClock"):
        model.fit(x, y, batch_size=8, epochs=1, callbacks=[schedule], verbose=0)


def test_callbacks_of_an_earlier_model_fit_do_not_reach_a_later_run():
    model = _model()
    x, y = _data()
    cv = CrossValidation(_data(16), frequency=32)
    stopper = EarlyStopping(monitor="val_loss", unit="evaluations", patience=100)
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[SampleClock(batch_size=8, num_samples=64), cv, stopper],
              verbose=0)
    assert cv in stopper.peers()
    clock = SampleClock(batch_size=8, num_samples=64)
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[clock, stopper], verbose=0)
    assert stopper.peers() == [clock, stopper]
    assert stopper.clock.samples == 64  # the second run's own clock, from zero


@pytest.mark.parametrize("loop", ["kfit.fit", "model.fit"])
def test_a_second_run_with_the_same_callbacks_starts_fresh(loop):
    model = _model()
    x, y = _data()
    schedule = LearningRateSchedule(kfit.schedules.learning_rate_per_minibatch([0.02] * 8 + [0.002], epoch_size=8))

    def train():
        if loop == "kfit.fit":
            return kfit.fit(model, x, y, minibatch_size=8, epochs=2, seed=0, callbacks=[schedule], verbose=0)
        return model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                         callbacks=[SampleClock(batch_size=8, num_samples=64), schedule])

    first = train().history["lr"]
    second = train().history["lr"]
    assert first == pytest.approx([0.02, 0.002])
    assert second == first  # the schedule starts over with the second run's clock (not at sample 128)
    assert kfit.get_clock(model).samples == 128  # the second run's samples only


def _steering_callbacks(x_val, y_val) -> list:
    """Every kfit callback that keeps state across a run, each made to change it: the cross-validation callback
    resets both schedules at its second evaluation, ReduceLROnPlateau cuts the rate at every evaluation
    (``min_delta`` no loss can meet), EarlyStopping counts, the printer numbers its evaluations, Test keeps its
    results."""
    lr = LearningRateSchedule(kfit.schedules.learning_rate_per_sample(0.002))
    momentum = kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant(40))

    def steer(index, average_error, samples, minibatches):
        if index == 1:
            lr.reset_learning_rate(0.001)
            momentum.reset_momentum(20)

    return [lr, momentum, CrossValidation((x_val, y_val), frequency=16, callback=steer),
            kfit.callbacks.ReduceLROnPlateau(monitor="val_loss", patience=0, factor=0.5, min_delta=1e9),
            EarlyStopping(monitor="val_loss", unit="evaluations", patience=100),
            kfit.callbacks.ProgressPrinter(freq=4), kfit.callbacks.Test((x_val, y_val))]


class _StatesAtFirstStep(keras.callbacks.Callback):
    """Notes the state of each of ``callbacks`` as the run's first step begins."""

    def __init__(self, callbacks):
        super().__init__()
        self.callbacks, self.states = callbacks, None

    def on_train_batch_begin(self, batch, logs=None):
        if self.states is None:
            self.states = repr([c.get_state() for c in self.callbacks])


@pytest.mark.parametrize("loop", ["kfit.fit", "model.fit"])
def test_every_callback_used_again_starts_as_a_new_one(loop, capsys):
    """A second run with the same callback objects begins, trains, logs and ends as a run with new ones: no reset of a
    schedule, no counter, no result of the first run reaches the second (the first is longer, so that what it left
    past the second's end would show)."""
    x, y = _data()
    x_val, y_val = _data(16)

    def train(callbacks, epochs):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=kfit.optimizers.MomentumSGD(0.01), loss="mse")
        probe = _StatesAtFirstStep(callbacks)
        if loop == "kfit.fit":
            history = kfit.fit(model, x, y, minibatch_size=8, epochs=epochs, seed=0, callbacks=[*callbacks, probe],
                               verbose=0)
        else:
            history = model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0,
                                callbacks=[SampleClock(batch_size=8, num_samples=64), *callbacks, probe])
        return history.history, model.get_weights(), probe.states, repr([c.get_state() for c in callbacks])

    new = train(_steering_callbacks(x_val, y_val), epochs=1)
    printed_new = capsys.readouterr().out
    reused = _steering_callbacks(x_val, y_val)
    train(reused, epochs=2)
    capsys.readouterr()
    again = train(reused, epochs=1)
    assert again[2] == new[2]  # each callback's state as the first step begins, as a checkpoint would hold it
    assert again[0] == new[0]  # every logged value: lr, momentum, val_*, test_*
    assert all(np.array_equal(a, b) for a, b in zip(again[1], new[1]))
    assert again[3] == new[3]  # and as the run ends
    evaluations = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Finished Evaluation")]
    assert evaluations == [line for line in printed_new.splitlines() if line.startswith("Finished Evaluation")]
    assert new[0]["lr"][-1] < 0.002 * 8 / 2  # (the rate was cut: the callbacks did change their state)


class _FailsAtTrainEnd(kfit.callbacks.KfitCallback):
    default_name = "fails"

    def on_train_end(self, logs=None):
        raise RuntimeError("on_train_end failed")


@pytest.mark.parametrize("ending", ["normal", "error_at_train_end"])
def test_the_epoch_a_restore_starts_model_fit_at_is_not_left_for_the_next_fit(tmp_path, ending):
    """A restore under plain model.fit tells Keras the epoch to start from; the next model.fit on the same model
    starts at its own initial_epoch, also when the restored run ended with an error (Keras then skips the other
    callbacks' on_train_end)."""
    model = _model()
    x, y = _data()
    path = tmp_path / "run.ckpt"
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[SampleClock(8, 64), Checkpoint(path)])
    callbacks = [SampleClock(8, 64), Checkpoint(path)]
    if ending == "error_at_train_end":
        callbacks.insert(0, _FailsAtTrainEnd())
    with pytest.warns(UserWarning, match="training goes on from the start of epoch 3"):
        if ending == "normal":
            resumed = model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=callbacks)
            assert resumed.epoch == [0, 1, 2]  # the restored history's epochs, and the one trained
        else:
            with pytest.raises(RuntimeError, match="on_train_end failed"):
                model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=callbacks)
    assert callbacks[-1].restored_from is not None and callbacks[-1].restored_from.epoch == 2
    assert model.fit(x, y, batch_size=8, epochs=2, verbose=0).epoch == [0, 1]
    assert kfit.fit(model, x, y, minibatch_size=8, epochs=2, seed=0, verbose=0).epoch == [0, 1]


# -- one validation for both ways kfit.fit trains --------------------------------------------------
BAD_ARGUMENTS = [
    ({"minibatch_size": 0}, r"`minibatch_size`: expected a positive integer. Received: minibatch_size=0"),
    ({"batch_size": -3}, r"`minibatch_size`: expected a positive integer. Received: minibatch_size=-3"),
    ({"minibatch_size": 8.0}, r"Received: minibatch_size=8.0"),
    ({"batch_size": 8, "minibatch_size": 16}, r"aliases; give one"),
    ({"validation_split": -0.1}, r"`validation_split`: expected a number in \[0, 1\]. Received: validation_split=-0.1"),
    ({"validation_split": 1.0}, r"Training data contains 64 samples, which is not sufficient .* `validation_split=1.0`"),
    ({"epochs": -1}, r"`epochs`: expected a non-negative integer or None. Received: epochs=-1"),
    ({"epochs": True}, r"Received: epochs=True"),
    ({"steps_per_epoch": -1}, r"steps_per_epoch=-1"),
    ({"validation_steps": 0}, r"validation_steps=0"),
    ({"validation_batch_size": 0}, r"validation_batch_size=0"),
    ({"initial_epoch": -1}, r"`initial_epoch`: expected a non-negative integer. Received: initial_epoch=-1"),
    ({"validation_freq": 0}, r"validation_freq=0"),
    ({"verbose": 3}, r"`verbose`: expected one of \['auto', 0, 1, 2\]. Received: verbose=3"),
    ({"shuffle": "yes"}, r"shuffle='yes'"),
    ({"class_weight": [1.0, 2.0]}, r"`class_weight`: expected a dict"),
    ({"class_weight": {0: 1.0}, "sample_weight": np.ones(64)}, r"You cannot `class_weight` and `sample_weight` at the same time"),
    ({"prefetch": -1}, r"prefetch=-1"),
    ({"pad_remainders": "yes"}, r"`pad_remainders`: expected True or False. Received: pad_remainders='yes'"),
    ({"epoch_size": 0}, r"epoch_size=0"),
    ({"max_samples": -5}, r"max_samples=-5"),
    ({"callbacks": "progress"}, r"`callbacks`: expected a keras.callbacks.Callback or a list of them or None. "
                                r"Received: callbacks='progress'"),
    ({"callbacks": [None]}, r"Received: callbacks=\[None\]"),
]


@pytest.mark.parametrize("arguments, match", BAD_ARGUMENTS, ids=[str(a) for a, _ in BAD_ARGUMENTS])
def test_kfit_fit_validates_its_arguments_the_same_on_both_paths(arguments, match):
    x, y = _data()
    # Without a kfit-only option kfit.fit is model.fit; with seed= it trains on kfit's stream.
    paths = [{}] if {"epoch_size", "max_samples"} & set(arguments) else [{}, {"seed": 0}]
    for extra in paths:
        model = _model()
        before = [w.copy() for w in model.get_weights()]
        with pytest.raises(ValueError, match=match):
            kfit.fit(model, x, y, **{"verbose": 0, **arguments, **extra})
        assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights())), extra  # nothing trained
        assert _kfit_state(model) == [] and kfit.get_context(model) is None


@pytest.mark.parametrize("extra", [{}, {"seed": 0}], ids=["model.fit path", "stream path"])
def test_one_callback_or_a_tuple_of_them_as_model_fit_takes_them(extra):
    """``model.fit(callbacks=cb)`` takes one callback, not in a list, and a tuple: so does kfit.fit, on both paths."""
    x, y = _data()
    model = _model()
    ends = []
    single = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: ends.append(epoch))
    kfit.fit(model, x, y, minibatch_size=8, epochs=2, verbose=0, callbacks=single, **extra)
    kfit.fit(model, x, y, minibatch_size=8, epochs=1, verbose=0, callbacks=(single,), **extra)
    assert ends == [0, 1, 0]


def test_a_wrong_type_is_also_a_type_error():
    x, y = _data()
    with pytest.raises(TypeError, match="epochs='2'"):
        kfit.fit(_model(), x, y, epochs="2", verbose=0)
