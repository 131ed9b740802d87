"""LearningRateSchedule, MomentumSchedule and SampleClock: the values at every step, in kfit.fit and model.fit."""

import math
import warnings

import keras
import numpy as np
import pytest
from conftest import BACKEND
from helpers import BatchSamples, StepRecorder, mlp, regression_data, weights
from reference_momentum_sgd import MomentumSGDReference

import kfit


def linear_model(features=4, seed=2):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(1)])


def test_values_at_every_step_of_a_plain_model_fit():
    """Under plain model.fit a SampleClock tells the callbacks each step's size, the last short one included."""
    x, y = regression_data(50)
    model = mlp()
    model.compile(optimizer=kfit.optimizers.MomentumSGD(), loss="mse", metrics=[BatchSamples()])
    lr = kfit.schedules.learning_rate_per_sample([0.01, 0.005], epoch_size=50)
    tau = kfit.schedules.momentum_as_time_constant([0, 64], epoch_size=50)
    recorder = StepRecorder(names=("learning_rate", "momentum"))
    history = model.fit(
        x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
        callbacks=[kfit.callbacks.LearningRateSchedule(lr), kfit.callbacks.MomentumSchedule(tau), recorder,
                   kfit.callbacks.SampleClock(batch_size=16, num_samples=50)],
    )
    sizes = [16, 16, 16, 2] * 2
    assert [r["size"] for r in recorder.rows] == sizes
    samples = 0
    for row, size in zip(recorder.rows, sizes):
        assert row["learning_rate"] == pytest.approx(lr[samples] * size, rel=1e-6)
        expected_mu = 0.0 if tau[samples] == 0 else math.exp(-size / tau[samples])
        assert row["momentum"] == pytest.approx(expected_mu, rel=1e-6, abs=1e-7)
        samples += size
    assert kfit.get_clock(model).samples == 100
    # The epoch logs carry the values in force at the epoch's end: those of its last full minibatch, not of
    # the 2-sample minibatch that ends it (whose per-minibatch rate is 8 times smaller).
    assert history.history["lr"] == pytest.approx([0.01 * 16, 0.005 * 16], rel=1e-6)
    assert history.history["momentum"] == pytest.approx([0.0, math.exp(-16 / 64)], rel=1e-6)


def test_kfit_fit_matches_the_numpy_reference_through_changes_of_rate_momentum_and_size():
    """Rate, momentum and minibatch size all change mid-epoch; CNTK's update, exactly as SPEC section 2 writes it."""
    x, y = regression_data(30, seed=4)
    model = linear_model()
    model.compile(optimizer=kfit.optimizers.MomentumSGD(), loss="mse")
    reference = MomentumSGDReference(weights(model))
    sizes = kfit.schedules.minibatch_size(lambda s: 4 if s < 20 else (8 if s < 50 else 6))
    lrs = kfit.schedules.learning_rate_per_sample(lambda s: 0.01 if s < 36 else 0.004)
    taus = kfit.schedules.momentum_as_time_constant(lambda s: 0.0 if s < 12 else (40.0 if s < 70 else 10.0))
    kfit.fit(model, x, y, minibatch_size=sizes, max_samples=90, shuffle=False, verbose=0,
             callbacks=[kfit.callbacks.LearningRateSchedule(lrs), kfit.callbacks.MomentumSchedule(taus)])
    samples = 0
    while samples < 90:
        size = min(sizes[samples], 30 - samples % 30, 90 - samples)
        idx = np.arange(samples, samples + size) % 30
        mu = 0.0 if taus[samples] == 0 else math.exp(-size / taus[samples])
        expected = reference.step(x[idx], y[idx], learning_rate=lrs[samples] * size, momentum=mu)
        samples += size
    for got, want in zip(weights(model), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_plain_model_fit_with_schedule_callbacks_trains_like_kfit_fit():
    """The same schedules under Keras's own loop (no callback reading the model) and under kfit's loop."""
    x, y = regression_data(48, seed=3)
    results = []
    for use_kfit in (False, True):
        model = linear_model()
        model.compile(optimizer=kfit.optimizers.MomentumSGD(), loss="mse")
        callbacks = [kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(lambda s: 0.002 + 1e-5 * s)),
                     kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant(lambda s: 5.0 + s))]
        if use_kfit:
            kfit.fit(model, x, y, minibatch_size=8, epochs=2, shuffle=False, seed=0, verbose=0, callbacks=callbacks)
        else:
            model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                      callbacks=[kfit.callbacks.SampleClock(batch_size=8, num_samples=48)] + callbacks)
        results.append(weights(model))
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _sgd_mlp() -> keras.Model:
    model = mlp()
    model.compile(optimizer=kfit.optimizers.MomentumSGD(), loss="mse")
    return model


def _train_two_epochs_of_16(loop: str, model, x, y, callbacks: list) -> None:
    """Two epochs of minibatches of 16 in order, by plain ``model.fit`` (the clock's callback first: it plans each
    step, and a schedule's fast path applies) or by ``kfit.fit``."""
    if loop == "model.fit":
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
                  callbacks=[kfit.callbacks.SampleClock(batch_size=16, num_samples=len(x)), *callbacks])
    else:
        kfit.fit(model, x, y, minibatch_size=16, epochs=2, shuffle=False, seed=0, verbose=0, callbacks=callbacks)


@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit"])
def test_a_subclass_step_hook_runs_at_every_step_while_the_value_holds(loop):
    """A schedule's own work is skipped on the steps where its value holds; a subclass's ``on_step_begin`` is not:
    it runs before every step, at the clock reading and minibatch size of that step."""
    x, y = regression_data(50)
    model = _sgd_mlp()
    seen = []

    class Noted(kfit.callbacks.LearningRateSchedule):
        def on_step_begin(self, clock):
            super().on_step_begin(clock)
            seen.append((clock.samples, clock.minibatch_size))

    schedule = Noted(kfit.schedules.learning_rate_per_sample(0.01))
    _train_two_epochs_of_16(loop, model, x, y, [schedule])
    assert seen == [(0, 16), (16, 16), (32, 16), (48, 2), (50, 16), (66, 16), (82, 16), (98, 2)]


@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit"])
def test_a_subclass_with_keras_legacy_batch_hooks_gets_them_at_every_step(loop):
    """Keras calls ``on_batch_begin``/``on_batch_end`` (the legacy aliases) from ``on_train_batch_begin/end``: a kfit
    callback's subclass that has them gets them at every step, also while the schedule's own hook sleeps, and
    the rates it applies are the schedule's."""
    x, y = regression_data(50)
    model = _sgd_mlp()
    seen = []

    class Legacy(kfit.callbacks.LearningRateSchedule):
        def on_batch_begin(self, batch, logs=None):
            seen.append(("begin", batch, float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))))

        def on_batch_end(self, batch, logs=None):
            seen.append(("end", batch, sorted(logs)))

    schedule = Legacy(kfit.schedules.learning_rate_per_sample(0.01))
    _train_two_epochs_of_16(loop, model, x, y, [schedule])
    rates = [0.16, 0.16, 0.16, 0.02] * 2  # 0.01 per sample: 16 samples, and the last 2 of each epoch
    expected = []
    for batch, rate in zip([0, 1, 2, 3] * 2, rates):
        expected += [("begin", batch, pytest.approx(rate)), ("end", batch, ["loss"])]
    assert seen == expected


@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit"])
def test_a_keras_callback_reads_the_rate_a_schedule_set_for_the_step(loop):
    """A Keras callback after a kfit schedule reads, through ``self.model``, the learning rate of the step about to
    run, as it would read one set by Keras's own ``LearningRateScheduler`` (on JAX, kfit hands a changed value to
    the next step without a state sync; a callback's sync must not show it the value before)."""
    x, y = regression_data(48)
    model = _sgd_mlp()
    seen = []

    class Reader(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))

    schedule = kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample([0.01, 0.001], epoch_size=24))
    _train_two_epochs_of_16(loop, model, x, y, [schedule, Reader()])
    # Steps of 16 samples from 0, 16, 32 (epoch 1) and 48, 64, 80: the rate per sample is 0.01 below sample 24.
    assert seen == pytest.approx([0.16, 0.16, 0.016, 0.016, 0.016, 0.016])


@pytest.mark.parametrize("optimizer", ["MomentumSGD", "Adam(variant='cntk')"])
@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit"])
def test_gradient_accumulation_counts_every_sample_of_an_update(loop, optimizer):
    """With Keras's ``gradient_accumulation_steps=2`` an update averages two minibatches of 8: a per-sample rate and
    a momentum time constant are converted for its 16 samples, so training matches minibatches of 16 without
    accumulation (a schedule means the same whatever the minibatch; before, the rate was half). CNTK's Adam, whose
    update reads the minibatch size, is told the update's 16 too (before, its steps were twice CNTK's)."""
    x, y = regression_data(64)
    results = []
    for size, accumulation in ((16, None), (8, 2)):
        model = mlp()
        model.compile(optimizer=kfit.optimizers.MomentumSGD(gradient_accumulation_steps=accumulation)
                      if optimizer == "MomentumSGD" else
                      kfit.optimizers.Adam(variant="cntk", beta_2=0.999, beta_2_minibatch_size=1,
                                           gradient_accumulation_steps=accumulation), loss="mse")
        callbacks = [kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample([0.004, 0.001], epoch_size=32)),
                     kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant([40, 100], epoch_size=32))]
        if loop == "model.fit":
            history = model.fit(x, y, batch_size=size, epochs=2, shuffle=False, verbose=0,
                                callbacks=[kfit.callbacks.SampleClock(batch_size=size, num_samples=64), *callbacks])
        else:
            history = kfit.fit(model, x, y, minibatch_size=size, epochs=2, shuffle=False, seed=0, verbose=0,
                               callbacks=callbacks)
        results.append((weights(model), history.history["lr"]))
    for a, b in zip(results[0][0], results[1][0]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for _, rates in results:  # the rate in force at each epoch's end, for updates of 16 samples
        assert rates == pytest.approx([0.001 * 16, 0.001 * 16])


@pytest.mark.skipif(BACKEND == "torch", reason="Keras: steps_per_execution must be 1 with the PyTorch backend")
def test_the_clock_counts_every_step_of_an_execution_under_plain_model_fit():
    """``compile(steps_per_execution=3)``: Keras calls the batch hooks once per call of 3 steps (the epoch's last
    call shorter); SampleClock counts all of them, so schedules and the clock agree with kfit.fit's."""
    x, y = regression_data(50)
    seen = {}
    for loop in ("model.fit", "kfit.fit"):
        model = mlp()
        model.compile(optimizer=kfit.optimizers.MomentumSGD(), loss="mse", steps_per_execution=3)
        readings = seen[loop] = []

        class Reader(keras.callbacks.Callback):
            def __init__(self, readings):
                super().__init__()
                self.readings = readings

            def on_train_batch_begin(self, batch, logs=None):
                clock = kfit.get_clock(self.model)
                rate = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
                self.readings.append((batch, clock.samples, clock.minibatches, round(rate, 6)))

        schedule = kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample([0.01, 0.001], epoch_size=40))
        if loop == "model.fit":
            model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                      callbacks=[kfit.callbacks.SampleClock(batch_size=8, num_samples=50), schedule, Reader(readings)])
        else:
            kfit.fit(model, x, y, minibatch_size=8, epochs=2, shuffle=False, seed=0, verbose=0, callbacks=[schedule, Reader(readings)])
        clock = kfit.get_clock(model)
        readings.append((clock.samples, clock.minibatches))
    # Epochs of 50 samples: steps 0-2 (24 samples), 3-5 (24), 6 (2, at 2 x the rate per sample, which falls at 40).
    assert seen["model.fit"] == [(0, 0, 0, 0.08), (3, 24, 3, 0.08), (6, 48, 6, 0.002),
                                 (0, 50, 7, 0.008), (3, 74, 10, 0.008), (6, 98, 13, 0.002), (100, 14)]
    assert seen["kfit.fit"] == seen["model.fit"]


@pytest.mark.parametrize("batch_end", [True, False], ids=["batch_end", "no_batch_end"])
@pytest.mark.parametrize("unknown_length", [False, True], ids=["arrays", "unknown_length"])
@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit"])
def test_a_keras_callback_reads_the_same_clock_before_or_after_kfits_callbacks(loop, unknown_length, batch_end):
    """A Keras callback that reads ``kfit.get_clock`` sees every step that has run counted, wherever it is in the
    callbacks' list. Under plain model.fit, listed before the SampleClock, it saw each step counted a step late (at
    the step's batch end, at the next step's batch begin, at the epoch's end), and after it, at the step's batch
    end, still uncounted (kfit.fit's own loop counts it there). Under kfit.fit (kfit's stream, a tf.data source), listed
    before kfit's callbacks, it saw the clock of the step before at a step's batch begin (its ``minibatch_size`` too),
    and, without a batch-end hook (Keras then dispatches batch ends asynchronously), a step late at the epoch's end.
    Also on data of unknown length (a filtered ``tf.data``), where Keras's JAX and TensorFlow loops begin a step past
    each epoch's end, which is not counted. (Under plain model.fit the ``minibatch_size`` of the step about to run is set
    at the SampleClock's batch begin: a callback before it reads it there as the step before's, as documented.)"""
    import tensorflow as tf

    x, y = regression_data(40)
    if unknown_length:
        x = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda *_: True).batch(16)
        y = None

    class Reader(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.readings = []

        def _read(self, hook):
            clock = kfit.get_clock(self.model)
            size = (clock.minibatch_size,) if loop == "kfit.fit" else ()
            self.readings.append((hook, clock.samples, clock.minibatches, *size))

        def on_train_batch_begin(self, batch, logs=None):
            self._read("begin")

        def on_epoch_end(self, epoch, logs=None):
            self._read("epoch_end")

    class EndReader(Reader):
        def on_train_batch_end(self, batch, logs=None):
            self._read("end")

    seen = {}
    for where in ("first", "last"):
        model = _sgd_mlp()
        reader = EndReader() if batch_end else Reader()
        seen[where] = reader.readings
        kfits = [kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(0.001))]
        if loop == "model.fit":
            kfits.insert(0, kfit.callbacks.SampleClock(batch_size=16, num_samples=40))
        callbacks = [reader, *kfits] if where == "first" else [*kfits, reader]
        if loop == "model.fit":
            model.fit(x, y, batch_size=None if unknown_length else 16, epochs=2, shuffle=False, verbose=0,
                      callbacks=callbacks)
        elif unknown_length:
            kfit.fit(model, x, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
        else:
            kfit.fit(model, x, y, minibatch_size=16, epochs=2, seed=0, verbose=0, callbacks=callbacks)
    past_end = unknown_length and BACKEND != "torch"  # (read at its batch begin, with the epoch's steps counted)
    expected, samples, steps = [], 0, 0
    with_size = (lambda size: (size,)) if loop == "kfit.fit" else (lambda size: ())
    for _ in range(2):  # epochs of 40 samples: steps of 16, 16, 8
        for size in (16, 16, 8):
            expected += [("begin", samples, steps, *with_size(size))]
            expected += [("end", samples + size, steps + 1, *with_size(size))] * batch_end
            samples, steps = samples + size, steps + 1
        expected += [("begin", samples, steps, *with_size(8))] * past_end + [("epoch_end", samples, steps, *with_size(8))]
    assert seen["last"] == expected
    assert seen["first"] == expected


@pytest.mark.parametrize("step_end", [False, True], ids=["", "step_end"])
@pytest.mark.parametrize("num_samples", [40, None])
def test_the_clock_counts_no_step_past_the_end_of_data_of_unknown_length(num_samples, step_end):
    """On data whose length Keras does not know (a filtered ``tf.data`` pipeline, a generator), Keras's JAX and
    TensorFlow loops begin one more step after each epoch's last and find no data for it: the clock counted that
    step (56 samples for an epoch of 40), and a schedule's epoch boundary fell a step late in every epoch after.
    Also with a kfit callback that acts at every step's end (a ProgressPrinter, a Checkpoint: the step is counted
    at its batch end there), where, with ``num_samples``, the step past the end was still counted."""
    import tensorflow as tf

    x, y = regression_data(40)
    data = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda *_: True).batch(16)
    model = _sgd_mlp()
    readings = []

    class Reader(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            clock = kfit.get_clock(self.model)
            readings.append((clock.samples, round(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)), 6)))

        def on_epoch_end(self, epoch, logs=None):
            readings.append(kfit.get_clock(self.model).samples)

    class AtStepEnd(kfit.callbacks.KfitCallback):
        def on_step_end(self, clock, logs):
            pass

    schedule = kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample([0.01, 0.001], epoch_size=40))
    model.fit(data, epochs=2, shuffle=False, verbose=0,
              callbacks=[kfit.callbacks.SampleClock(batch_size=16, num_samples=num_samples), schedule, Reader(),
                         *([AtStepEnd()] if step_end else [])])
    end = 40 if num_samples else 48  # (without num_samples every step counts as 16 samples)
    # The Reader sees Keras's step past the end too (not on PyTorch), with the clock at the epoch's end (and the
    # schedule's value there).
    past = [] if BACKEND == "torch" else [end]
    assert [r for r in readings if not isinstance(r, tuple)] == [end, 2 * end]
    last = 8 if num_samples else 16  # the size of each epoch's last step, as the clock counts it
    assert [r for r in readings if isinstance(r, tuple)] == (
        [(0, 0.16), (16, 0.16), (32, 0.01 * last)] + [(s, 0.001 * last) for s in past]
        + [(end, 0.016), (end + 16, 0.016), (end + 32, 0.001 * last)] + [(2 * s, 0.001 * last) for s in past])
    assert kfit.get_clock(model).samples == 2 * end


@pytest.mark.skipif(BACKEND == "torch", reason="Keras: steps_per_execution must be 1 with the PyTorch backend")
def test_the_last_call_of_an_epoch_of_unknown_length_counts_the_steps_it_ran():
    """Data of unknown length, ``steps_per_execution=2``, no ``num_samples``: an epoch of 40 samples in minibatches
    of 16 is 3 steps, whose last call runs one step; the clock counted two there (64 samples, 4 minibatches per
    epoch). Now each epoch counts its 3 steps as 16 samples each, as with ``steps_per_execution=1``."""
    import tensorflow as tf

    x, y = regression_data(40)
    data = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda *_: True).batch(16)
    model = mlp()
    model.compile(optimizer=kfit.optimizers.MomentumSGD(), loss="mse", steps_per_execution=2)
    ends = []

    class Reader(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            clock = kfit.get_clock(self.model)
            ends.append((clock.samples, clock.minibatches))

    model.fit(data, epochs=2, verbose=0, callbacks=[kfit.callbacks.SampleClock(batch_size=16), Reader()])
    assert ends == [(48, 3), (96, 6)]


@pytest.mark.parametrize("samples, steps_per_execution", [(10, 1), (40, 3)])
def test_data_of_unknown_length_whose_first_steps_end_it_is_not_taken_for_a_wrong_batch_size(samples, steps_per_execution):
    """Data of unknown length whose first call of the train function holds the data's short last step (10 samples in
    minibatches of 16; 40 in 16, 16, 8 with steps_per_execution=3): the clock counts that step as 16 (its size is
    not known then), and the check of the clock's batch_size against Keras's count refused a right batch_size
    ("counted 48 samples ... but model.fit trained 40: give SampleClock the batch_size given to model.fit")."""
    import tensorflow as tf

    if BACKEND == "torch" and steps_per_execution > 1:
        pytest.skip("Keras: steps_per_execution must be 1 with the PyTorch backend")
    x, y = regression_data(samples)
    data = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda *_: True).batch(16)
    model = mlp()
    model.compile(optimizer=kfit.optimizers.MomentumSGD(), loss="mse", steps_per_execution=steps_per_execution)
    history = model.fit(data, epochs=2, verbose=0, callbacks=[
        kfit.callbacks.SampleClock(batch_size=16),
        kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(0.001))])
    assert len(history.history["loss"]) == 2
    steps = math.ceil(samples / 16)  # each counted as 16 samples without num_samples
    assert kfit.get_clock(model).samples == 2 * 16 * steps
    # A wrong batch_size is still refused on such data.
    with pytest.raises(ValueError, match=r"give SampleClock the batch_size given to model.fit"):
        model.fit(data.unbatch().batch(8), epochs=1, verbose=0, callbacks=[
            kfit.callbacks.SampleClock(batch_size=16),
            kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(0.001))])


@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit", "kfit.fit stream"])
def test_initial_epoch_starts_the_clock_at_that_epoch(loop):
    """``initial_epoch=2`` (Keras's way to go on with a run) starts the clock at epoch 2's first sample on every
    path, so that a schedule goes on where the run was, as Keras's epoch-indexed LearningRateScheduler does (under
    plain model.fit and kfit.fit without a kfit-only argument the clock started at 0)."""
    x, y = regression_data(32)
    model = _sgd_mlp()
    readings = []

    class Reader(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            clock = kfit.get_clock(self.model)
            rate = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
            readings.append((clock.epoch, clock.samples, clock.minibatches, round(rate, 6)))

    schedule = kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample([0.01, 0.001], epoch_size=64))
    if loop == "model.fit":
        model.fit(x, y, batch_size=16, epochs=4, initial_epoch=2, verbose=0,
                  callbacks=[kfit.callbacks.SampleClock(batch_size=16, num_samples=32), schedule, Reader()])
    else:
        kfit.fit(model, x, y, minibatch_size=16, epochs=4, initial_epoch=2, verbose=0, callbacks=[schedule, Reader()],
                 **({"seed": 0} if loop == "kfit.fit stream" else {}))
    # Epochs of 32 samples: epoch 2 begins at sample 64, where the rate per sample falls to 0.001.
    assert readings == [(2, 64, 4, 0.016), (2, 80, 5, 0.016), (3, 96, 6, 0.016), (3, 112, 7, 0.016)]


@pytest.mark.parametrize("case", ["boundary_mid_epoch", "boundary_in_minibatches", "reset_from_a_keras_callback"])
def test_a_schedule_after_the_clock_applies_every_change_on_time(case):
    """Placed after the SampleClock, a schedule whose value holds is not even called at most steps under plain
    model.fit; a boundary of the schedule, a cut minibatch and a reset made by a Keras callback between the two still
    reach the optimizer at the step where they fall."""
    x, y = regression_data(95)
    model = mlp()
    model.compile(optimizer=kfit.optimizers.MomentumSGD(), loss="mse", metrics=[BatchSamples()])
    lr = {"boundary_mid_epoch": kfit.schedules.learning_rate_per_sample([0.01, 0.005], epoch_size=30),
          "boundary_in_minibatches": kfit.schedules.learning_rate_per_minibatch([0.1] * 6 + [0.05]),
          "reset_from_a_keras_callback": kfit.schedules.learning_rate_per_sample(0.01)}[case]
    schedule = kfit.callbacks.LearningRateSchedule(lr)

    class ResetAt50(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if case == "reset_from_a_keras_callback" and schedule.clock.samples == 50:
                schedule.reset_learning_rate(0.002)

    recorder = StepRecorder()
    model.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0,
              callbacks=[kfit.callbacks.SampleClock(batch_size=10, num_samples=95), ResetAt50(), schedule, recorder])
    sizes = [10] * 9 + [5]
    assert [r["size"] for r in recorder.rows] == sizes * 2
    samples, expected = 0, []
    for minibatches, size in enumerate(sizes * 2):
        if case == "reset_from_a_keras_callback":
            expected.append((0.01 if samples < 50 else 0.002) * size)
        else:
            expected.append(lr.for_minibatch(samples, minibatches, size))
        samples += size
    assert [r["learning_rate"] for r in recorder.rows] == pytest.approx(expected, rel=1e-6)


def test_a_per_sample_rate_means_the_same_at_any_minibatch_size():
    """One epoch with lr_s at minibatch 1 and the same data in one minibatch of 8: the summed-gradient update."""
    x, y = regression_data(8, seed=6)
    lr = kfit.schedules.learning_rate_per_sample(0.002)
    results = []
    for size in (8, 4):
        model = linear_model()
        model.compile(optimizer=kfit.optimizers.MomentumSGD(), loss="mse")
        kfit.fit(model, x, y, minibatch_size=size, epochs=1, shuffle=False, verbose=0,
                 callbacks=[kfit.callbacks.LearningRateSchedule(lr)])
        results.append(weights(model))
        reference = MomentumSGDReference(weights(linear_model()))
        for start in range(0, 8, size):
            want = reference.step(x[start:start + size], y[start:start + size], learning_rate=0.002 * size, momentum=0.0)
        for got, expected in zip(weights(model), want):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_reset_learning_rate_mid_run_and_its_state():
    x, y = regression_data(40)
    model = _sgd_mlp()
    lr = kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(0.01))

    class HalveAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if kfit.get_clock(self.model).samples == 16:
                lr.reset_learning_rate(lr.learning_rate() / 2)

    recorder = StepRecorder()
    kfit.fit(model, x, y, minibatch_size=8, max_samples=40, verbose=0, callbacks=[lr, HalveAt(), recorder])
    assert [r["learning_rate"] for r in recorder.rows] == pytest.approx([0.08, 0.08, 0.04, 0.04, 0.04])
    assert lr.learning_rate() == pytest.approx(0.005)
    state = lr.get_state()
    fresh = kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(0.01))
    fresh.set_state(state)
    assert fresh.active_schedule(16)[0].value(0) == pytest.approx(0.005)
    assert fresh.active_schedule(15)[0].value(0) == pytest.approx(0.01)


@pytest.mark.parametrize("kind", ["learning_rate", "momentum"])
def test_a_reset_to_a_python_callable_in_a_run_that_checkpoints_is_refused_at_the_reset(kind, tmp_path):
    """A checkpoint saves the schedule in force, and one built from a Python callable cannot be saved: the reset
    was accepted and the next save failed ("cannot be serialized"), a run ended by its own checkpoint. It is refused
    at the reset now, naming the argument and what works; the checkpoint before it resumes, and the same reset in a
    run without a checkpoint still works."""
    x, y = regression_data(32)
    path = str(tmp_path / "run.ckpt")
    initial = {"learning_rate": kfit.schedules.learning_rate_per_sample(0.01),
               "momentum": kfit.schedules.momentum_as_time_constant(0)}[kind]
    callable_reset, value_reset = {"learning_rate": (lambda samples: 0.005, 0.005), "momentum": (lambda samples: 64, 64)}[kind]
    method = {"learning_rate": "reset_learning_rate", "momentum": "reset_momentum"}[kind]

    def train(values, *checkpoint):
        keras.utils.set_random_seed(0)
        schedule = (kfit.callbacks.LearningRateSchedule if kind == "learning_rate" else kfit.callbacks.MomentumSchedule)(initial)

        class ResetAtEpoch1(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                if epoch == 1:
                    getattr(schedule, method)(values)

        return kfit.fit(_sgd_mlp(), x, y, minibatch_size=16, epochs=2, seed=0, verbose=0,
                        callbacks=[schedule, ResetAtEpoch1(), *checkpoint])

    with pytest.raises(TypeError, match=rf"argument `values` of {method}: a schedule built from a Python callable "
                       r"cannot be saved, and this run writes checkpoints.*Give a value, a list of values, or a schedule"):
        train(callable_reset, kfit.callbacks.Checkpoint(path, async_write=False))
    assert kfit.checkpoint.read_checkpoint_info(path).samples == 32  # the last checkpoint, before the reset
    resumed = train(value_reset, kfit.callbacks.Checkpoint(path, async_write=False))
    assert kfit.checkpoint.read_checkpoint_info(path).samples == 64
    unsaved = train(callable_reset)  # (nothing to save it in: the callable is used)
    log = "lr" if kind == "learning_rate" else "momentum"
    assert unsaved.history[log][1] == pytest.approx(resumed.history[log][1]) != unsaved.history[log][0]


@pytest.mark.parametrize("kind", ["learning_rate", "momentum"])
def test_a_save_after_a_reset_to_a_python_callable_names_the_reset(kind, tmp_path):
    """A run without a Checkpoint takes a reset to a Python callable; kfit.save_checkpoint then failed with the
    schedule's own TypeError, whose advice ("rebuild it in code when restoring") does not fit a reset. The error names
    the reset, its sample and what to give it; nothing is written. The same save after a value reset is written."""
    x, y = regression_data(32)
    path = tmp_path / "run.ckpt"
    initial = {"learning_rate": kfit.schedules.learning_rate_per_sample(0.01),
               "momentum": kfit.schedules.momentum_as_time_constant(0)}[kind]
    method = {"learning_rate": "reset_learning_rate", "momentum": "reset_momentum"}[kind]
    schedule = (kfit.callbacks.LearningRateSchedule if kind == "learning_rate" else kfit.callbacks.MomentumSchedule)(initial)

    class ResetThenSave(keras.callbacks.Callback):
        def __init__(self, values):
            super().__init__()
            self.values = values

        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                getattr(schedule, method)(self.values)
            else:
                kfit.save_checkpoint(path, self.model)

    def train(values):
        keras.utils.set_random_seed(0)
        kfit.fit(_sgd_mlp(), x, y, minibatch_size=16, epochs=2, seed=0, verbose=0, callbacks=[schedule, ResetThenSave(values)])

    with pytest.raises(TypeError, match=rf"^{type(schedule).__name__} '{schedule.name}' cannot be saved: {method}\(values\) "
                       r"at sample 32 gave it a schedule built from a Python callable, .*FromCallable.*Give "
                       rf"{method} a value, a list of values, or a schedule built from kfit.schedules shapes"):
        train(lambda samples: 0.005 if kind == "learning_rate" else 64)
    assert not path.exists()
    train(0.005 if kind == "learning_rate" else 64)
    assert kfit.checkpoint.read_checkpoint_info(path).samples == 64


@pytest.mark.parametrize("kind", ["learning_rate", "momentum"])
def test_a_load_into_the_run_after_a_reset_to_a_python_callable_goes_back_to_the_checkpoints_schedule(kind, tmp_path):
    """kfit.load_checkpoint from a callback of a run whose schedule was reset to a Python callable (taken: the run
    writes no checkpoint) failed with "cannot be restored: callback ... refused its saved state (TypeError: ... cannot
    be saved ...)": the load read the callback's state to undo with, and get_state refuses such a reset. Nothing in a
    load needs to save it: the load works, the checkpoint's schedule is in force again (the callable reset is gone),
    and a later save works."""
    x, y = regression_data(32)
    path = tmp_path / "run.ckpt"
    initial = {"learning_rate": kfit.schedules.learning_rate_per_sample(0.01),
               "momentum": kfit.schedules.momentum_as_time_constant(0)}[kind]
    method = {"learning_rate": "reset_learning_rate", "momentum": "reset_momentum"}[kind]
    schedule = (kfit.callbacks.LearningRateSchedule if kind == "learning_rate" else kfit.callbacks.MomentumSchedule)(initial)
    values = []

    class SaveResetLoad(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            values.append(float(getattr(self.model.optimizer, kind)))
            if epoch == 0:
                kfit.save_checkpoint(path, self.model)
                getattr(schedule, method)(lambda samples: 0.0005 if kind == "learning_rate" else 64)
            elif epoch == 1:
                assert kfit.load_checkpoint(path, self.model).samples == 32

    keras.utils.set_random_seed(0)
    kfit.fit(_sgd_mlp(), x, y, minibatch_size=16, epochs=3, seed=0, verbose=0, callbacks=[schedule, SaveResetLoad()])
    assert values[0] == values[2] != values[1]  # (the reset's value in epoch 1 only)
    assert schedule.get_state()["resets"] == []
    kfit.save_checkpoint(path, schedule.model)


def test_hyperparameters_a_keras_optimizer_compiles_in_are_refused():
    x, y = regression_data(16)
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse")
    with pytest.raises(ValueError, match="MomentumSGD"):
        kfit.fit(model, x, y, minibatch_size=4, seed=0, verbose=0,
                 callbacks=[kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant(100))])
    with pytest.raises(ValueError, match="`schedule`.*momentum"):
        kfit.callbacks.LearningRateSchedule(kfit.schedules.momentum_as_time_constant(100))


def test_callbacks_without_a_clock_say_how_to_fix_it():
    x, y = regression_data(16)
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(RuntimeError, match="SampleClock"):
        model.fit(x, y, batch_size=4, verbose=0,
                  callbacks=[kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(0.01))])
    with pytest.raises(ValueError, match="expects 4 steps per epoch, but model.fit runs 2"):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[kfit.callbacks.SampleClock(batch_size=4, num_samples=16)])
    with pytest.raises(ValueError, match="`batch_size`"):
        kfit.callbacks.SampleClock(batch_size=0)


def test_a_sample_clock_given_twice_is_refused_and_the_next_fit_runs():
    """Two SampleClocks: the last one handed the model drove the clock, and the first one's check at the second step
    blamed itself ("SampleClock(batch_size=16) counted 8 samples ... give SampleClock the batch_size given to
    model.fit", where 16 was model.fit's). Refused as training begins, naming both; the next model.fit starts fresh."""
    x, y = regression_data(48)
    model = _sgd_mlp()
    with pytest.raises(ValueError, match=r"more than one kfit.callbacks.SampleClock: SampleClock\(batch_size=16, "
                                         r"num_samples=None\), SampleClock\(batch_size=8, num_samples=None\)"):
        model.fit(x, y, batch_size=16, verbose=0,
                  callbacks=[kfit.callbacks.SampleClock(batch_size=16), kfit.callbacks.SampleClock(batch_size=8)])
    model.fit(x, y, batch_size=16, verbose=0, callbacks=[kfit.callbacks.SampleClock(batch_size=16, num_samples=48)])
    assert kfit.get_clock(model).samples == 48


@pytest.mark.parametrize("last_batch", [16, 2], ids=["full-minibatches", "short-last-minibatch"])
def test_a_keras_callback_that_changes_a_scheduled_rate_is_refused(last_batch):
    """Keras's ReduceLROnPlateau next to kfit's LearningRateSchedule: its cut held while the schedule's value and the
    minibatch size held, and was undone at the next change (a short last minibatch undid it at the next epoch's
    first step). kfit.fit refuses the pair as it starts; under model.fit the changed rate is found at the next epoch's
    start, and refused saying what to use."""
    x, y = regression_data(48 + last_batch % 16)
    schedule = kfit.schedules.learning_rate_per_minibatch(0.01)
    plateau = keras.callbacks.ReduceLROnPlateau("loss", patience=0, min_delta=100.0, factor=0.5)
    with pytest.raises(ValueError, match=r"keras.callbacks.ReduceLROnPlateau and kfit.callbacks.LearningRateSchedule "
                                         r"both set.*kfit.callbacks.ReduceLROnPlateau"):
        kfit.fit(_sgd_mlp(), x, y, minibatch_size=16, epochs=3, verbose=0,
                 callbacks=[kfit.callbacks.LearningRateSchedule(schedule), plateau])
    model = _sgd_mlp()
    with pytest.raises(ValueError, match=r"learning rate was changed from 0.01 \(set by kfit's LearningRateSchedule\) "
                                         r"to 0.005 by another callback before epoch 3 began.*kfit.callbacks.ReduceLROnPlateau"):
        model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0,
                  callbacks=[plateau, kfit.callbacks.SampleClock(batch_size=16, num_samples=len(x)),
                             kfit.callbacks.LearningRateSchedule(schedule)])
    # kfit's own ReduceLROnPlateau scales the schedule's rate and goes on.
    model = _sgd_mlp()
    history = model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0,
                        callbacks=[kfit.callbacks.SampleClock(batch_size=16, num_samples=len(x)),
                                   kfit.callbacks.LearningRateSchedule(schedule),
                                   kfit.callbacks.ReduceLROnPlateau("loss", patience=0, min_delta=100.0, factor=0.5)])
    assert len(history.history["loss"]) == 3
    assert history.history["learning_rate"][0] == pytest.approx(0.01)
    assert float(np.asarray(model.optimizer.learning_rate)) == pytest.approx(0.005, rel=1e-6)  # its cut, kept


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_a_sample_clock_given_another_batch_size_than_model_fit_is_refused_at_the_second_step(steps_per_execution):
    """Without num_samples nothing else shows the mismatch: the schedule would run at half the clock, silently."""
    if BACKEND == "torch" and steps_per_execution > 1:
        pytest.skip("steps_per_execution > 1 is TensorFlow and JAX only (Keras refuses it on PyTorch)")
    x, y = regression_data(64)
    lr = kfit.schedules.learning_rate_per_sample([0.001, 0.0005], epoch_size=64)
    trained = {}
    for clock_size in (8, 4):
        model = mlp()
        model.compile(optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
        recorder = StepRecorder(names=("learning_rate",))
        try:
            model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                      callbacks=[kfit.callbacks.SampleClock(batch_size=clock_size),
                                 kfit.callbacks.LearningRateSchedule(lr), recorder])
            trained[clock_size] = [row["learning_rate"] for row in recorder.rows]
        except ValueError as error:
            trained[clock_size] = str(error)
    calls = -(-8 // steps_per_execution)  # per epoch of 8 steps
    assert np.allclose(trained[8], [0.001 * 8] * calls + [0.0005 * 8] * calls)  # the rate of each epoch's samples
    counted, keras_counted = 4 * steps_per_execution, 8 * steps_per_execution
    assert f"SampleClock(batch_size=4) counted {counted} samples in model.fit's first" in trained[4]
    assert f"but model.fit trained {keras_counted}: give SampleClock the batch_size given to model.fit" in trained[4]


def test_per_step_hyperparameter_changes_do_not_sync_the_jax_state():
    """On JAX a schedule writes into the state the loop holds: no full state sync per step."""
    x, y = regression_data(64)
    model = _sgd_mlp()
    syncs = []
    if BACKEND == "jax":
        original = model.jax_state_sync
        model.jax_state_sync = lambda: (syncs.append(1), original())[1]
    recorder_lr = kfit.schedules.learning_rate_per_sample(lambda s: 0.001 * (1 + s % 5))  # changes every step
    kfit.fit(model, x, y, minibatch_size=4, epochs=2, seed=1, verbose=0,
             callbacks=[kfit.callbacks.LearningRateSchedule(recorder_lr),
                        kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant(lambda s: 10.0 + s))])
    steps = 32
    if BACKEND == "jax":
        assert len(syncs) < steps / 4, f"{len(syncs)} state syncs for {steps} steps"
    # Whatever the backend, the last step used the scheduled values.
    last_samples = 124
    optimizer = model.optimizer
    assert float(optimizer.learning_rate.numpy()) == pytest.approx(recorder_lr[last_samples] * 4, rel=1e-6)
    assert float(optimizer.momentum.numpy()) == pytest.approx(math.exp(-4 / (10.0 + last_samples)), rel=1e-6)


def test_history_lr_is_the_rate_in_force_not_the_tail_minibatch():
    """kfit.fit cuts the last minibatch of an epoch short (100 = 3 * 32 + 4): History's ``lr`` is the rate
    of a full minibatch, as the schedule gives it, not the 8 times smaller rate of the 4-sample tail."""
    x, y = regression_data(100)
    model = _sgd_mlp()
    lr = kfit.schedules.learning_rate_per_sample([0.001, 0.0005], epoch_size=100)
    history = kfit.fit(model, x, y, minibatch_size=32, epochs=2, seed=0, verbose=0,
                       callbacks=[kfit.callbacks.LearningRateSchedule(lr)])
    assert history.history["lr"] == pytest.approx([0.001 * 32, 0.0005 * 32], rel=1e-6)


@pytest.mark.parametrize("kind", ["callable", "per_minibatch_list", "cosine", "reset_mid_segment",
                                  "reset_to_another_unit"])
def test_the_value_at_every_step_whatever_how_far_a_schedule_value_holds(kind):
    """The callbacks read a schedule only when its value can have changed (``Schedule.holds_until``): a value that
    changes every sample, one indexed by minibatches, one of unknown extent, and a reset inside a held segment all
    reach the optimizer at the right step."""
    x, y = regression_data(50)
    model = mlp()
    model.compile(optimizer=kfit.optimizers.MomentumSGD(), loss="mse", metrics=[BatchSamples()])
    lr = {
        "callable": kfit.schedules.learning_rate_per_sample(lambda s: 0.01 / (1 + s)),
        "per_minibatch_list": kfit.schedules.learning_rate_per_minibatch([0.1, 0.1, 0.05, 0.02]),
        "cosine": kfit.schedules.learning_rate_per_sample(kfit.schedules.cosine_decay(0.01, 80)),
        "reset_mid_segment": kfit.schedules.learning_rate_per_sample(0.01),
        "reset_to_another_unit": kfit.schedules.learning_rate_per_sample(0.01),
    }[kind]
    # The same number in another unit: 0.01 per minibatch from sample 16 on, where it was 0.01 per sample.
    reset_to = {"reset_mid_segment": 0.002, "reset_to_another_unit": kfit.schedules.learning_rate_per_minibatch(0.01)}
    schedule = kfit.callbacks.LearningRateSchedule(lr)

    class ResetAt(kfit.callbacks.KfitCallback):  # before the schedule: the reset holds from this step on
        def on_step_begin(self, clock):
            if kind in reset_to and clock.samples == 16:
                schedule.reset_learning_rate(reset_to[kind])

    recorder = StepRecorder()
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
              callbacks=[ResetAt(), schedule, recorder, kfit.callbacks.SampleClock(batch_size=16, num_samples=50)])
    sizes = [16, 16, 16, 2] * 2
    assert [r["size"] for r in recorder.rows] == sizes
    samples = 0
    for minibatches, (row, size) in enumerate(zip(recorder.rows, sizes)):
        if kind == "reset_mid_segment":
            expected = (0.01 if samples < 16 else 0.002) * size
        elif kind == "reset_to_another_unit":
            expected = 0.01 * size if samples < 16 else 0.01
        else:
            expected = lr.for_minibatch(samples, minibatches, size)
        assert row["learning_rate"] == pytest.approx(expected, rel=1e-6), (samples, minibatches)
        samples += size


@pytest.mark.parametrize("kind", ["learning_rate", "momentum"])
def test_a_load_into_the_run_of_a_file_without_the_reset_schedules_state_keeps_the_reset(kind, tmp_path):
    """kfit.load_checkpoint from a callback, of a file that holds other callbacks' states but none for a schedule reset
    to a Python callable, failed with the schedule's "cannot be saved" TypeError: the check for callbacks the file holds
    no state for read the schedule's state with get_state(), which refuses such a reset. The load works as for any
    callback the file lacks: it says so, and the schedule keeps its state (the reset stays in force)."""
    x, y = regression_data(32)
    path = tmp_path / "run.ckpt"
    initial = {"learning_rate": kfit.schedules.learning_rate_per_sample(0.01),
               "momentum": kfit.schedules.momentum_as_time_constant(0)}[kind]
    method = {"learning_rate": "reset_learning_rate", "momentum": "reset_momentum"}[kind]
    kind_of = kfit.callbacks.LearningRateSchedule if kind == "learning_rate" else kfit.callbacks.MomentumSchedule
    keras.utils.set_random_seed(0)
    kfit.fit(_sgd_mlp(), x, y, minibatch_size=16, epochs=1, seed=0, verbose=0,
             callbacks=[kind_of(initial, name="another_schedule"), kfit.callbacks.Checkpoint(path, async_write=False)])
    schedule = kind_of(initial)
    values = []

    class ResetThenLoad(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            values.append(float(getattr(self.model.optimizer, kind)))
            if epoch == 0:
                getattr(schedule, method)(lambda samples: 0.0005 if kind == "learning_rate" else 64)
            elif epoch == 1:
                assert kfit.load_checkpoint(path, self.model).samples == 32

    keras.utils.set_random_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kfit.fit(_sgd_mlp(), x, y, minibatch_size=16, epochs=3, seed=0, verbose=0, callbacks=[schedule, ResetThenLoad()])
    assert any(f"holds no state for callback '{schedule.name}'" in str(w.message) for w in caught)
    reset = 0.0005 * 16 if kind == "learning_rate" else math.exp(-16 / 64)  # (per minibatch of 16)
    assert values[1:] == pytest.approx([reset, reset], rel=1e-6) and values[0] != values[1]  # (the load left it in force)
