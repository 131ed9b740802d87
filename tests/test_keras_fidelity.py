"""A kfit feature must not take away what ``model.fit`` gave: kfit's loop is ``model.fit`` itself.

Each test runs a working Keras project twice, once with ``model.fit`` and once with ``kfit.fit`` and a
kfit-only feature (``seed``, ``max_samples``, a ``Checkpoint``), on the same minibatches
(``shuffle=False``), and compares what a user sees: the weights, the logs, what ``train_step`` received.
"""

import functools
import itertools
import re
import time
import warnings

import keras
import numpy as np
import pytest
from helpers import assert_same_weights, mlp, regression_data, weights
from keras.src.backend.common import global_state

import kfit


def compiled(model, **kwargs):
    kwargs.setdefault("optimizer", keras.optimizers.SGD(0.05))
    kwargs.setdefault("loss", "mse")
    model.compile(**kwargs)
    return model


class GuideModel(keras.Model):
    """The Keras guide's custom ``train_step``: ``x, y = data``, logs of its own."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(1)
        self.received: list[str] = []
        self.tracker = keras.metrics.Mean(name="loss")
        self.doubled = keras.metrics.Mean(name="doubled_loss")

    def call(self, x):
        return self.dense(x)

    def train_step(self, *args):
        data = args[-1]  # JAX's train_step is stateless: (state, data)
        self.received.append(type(data).__name__ + str(len(data)) if isinstance(data, tuple) else "x")
        x, y = data  # raises "too many values to unpack" when handed (x, y, None)
        if keras.backend.backend() == "jax":
            return super().train_step(*args)  # Keras's own step; the unpacking above is what is tested
        if keras.backend.backend() == "torch":
            y_pred = self(x, training=True)
            loss = keras.ops.mean(keras.ops.square(y - y_pred))
            self.zero_grad()
            loss.backward()
            grads = [v.value.grad for v in self.trainable_weights]
        else:
            import tensorflow as tf

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = keras.ops.mean(keras.ops.square(y - y_pred))
            grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply(grads, self.trainable_weights)
        self.tracker.update_state(loss)
        self.doubled.update_state(2 * loss)
        return {"loss": self.tracker.result(), "doubled_loss": self.doubled.result()}

    @property
    def metrics(self):
        if keras.backend.backend() == "jax":
            return super().metrics
        return [self.tracker, self.doubled]


@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit"])
def test_custom_train_step_receives_x_y_and_its_logs_are_the_history(loop):
    x, y = regression_data(32)
    keras.utils.set_random_seed(3)
    model = GuideModel()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    if loop == "model.fit":
        history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    else:
        history = kfit.fit(model, x, y, batch_size=8, epochs=2, shuffle=False, seed=0, verbose=0)
    assert set(model.received) == {"tuple2"}
    if keras.backend.backend() == "jax":  # Keras's own train_step ran: its logs
        assert "loss" in history.history and len(history.history["loss"]) == 2
        return
    assert set(history.history) == {"loss", "doubled_loss"}
    np.testing.assert_allclose(history.history["doubled_loss"], 2 * np.array(history.history["loss"]), rtol=1e-5)


def test_guide_train_step_on_tf_data_with_a_checkpoint_trains_as_model_fit(tmp_path):
    """The Keras guide's ``x, y = data`` step on a ``tf.data`` pipeline: ``kfit.fit(..., seed=0)`` with a Checkpoint
    (kfit-only features) gives the weights and the history of ``model.fit``, and leaves nothing of kfit on the model;
    a minibatch-size schedule on that pipeline is refused, saying what works instead."""
    import tensorflow as tf  # (kfit[all], which the tests install, includes TensorFlow on every backend)
    x, y = regression_data(40)

    def pipeline():
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(8)

    def train(loop):
        keras.utils.set_random_seed(3)
        model = GuideModel()
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        if loop == "model.fit":
            return model, model.fit(pipeline(), epochs=3, verbose=0)
        checkpoint = kfit.callbacks.Checkpoint(tmp_path / "run.ckpt")
        return model, kfit.fit(model, pipeline(), epochs=3, seed=0, verbose=0, callbacks=[checkpoint])

    plain, plain_history = train("model.fit")
    routed, routed_history = train("kfit.fit")
    assert set(routed.received) == set(plain.received), (plain.received, routed.received)
    assert_same_weights(plain, routed)
    assert routed_history.history == plain_history.history and routed_history.epoch == [0, 1, 2]
    assert kfit.checkpoint.read_checkpoint_info(tmp_path / "run.ckpt").samples == 120
    assert [name for name in vars(routed) if "kfit" in name] == []
    # (but model.history, which Keras's fit sets to the run's History, as model.fit does)
    assert [name for name, value in vars(routed).items() if type(value).__module__.startswith("kfit")] == ["history"]
    assert isinstance(routed.history, keras.callbacks.History) and routed.history is routed_history
    with pytest.raises(ValueError, match="A minibatch-size schedule needs data that kfit cuts into minibatches.*"
                                         "Give the data as arrays"):
        kfit.fit(routed, pipeline(), minibatch_size=kfit.schedules.minibatch_size([8, 16], epoch_size=40),
                 epochs=1, verbose=0)


class XOnlyNoCall(keras.Model):
    """A VAE-like model: a custom ``train_step`` on ``x`` alone, and no ``call()``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.encoder = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        self.decoder = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)])
        self.tracker = keras.metrics.Mean(name="reconstruction")

    def train_step(self, data):
        x = data
        if keras.backend.backend() == "torch":
            self.zero_grad()
            loss = keras.ops.mean(keras.ops.square(self.decoder(self.encoder(x)) - x))
            loss.backward()
            grads = [v.value.grad for v in self.trainable_weights]
        elif keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            with tf.GradientTape() as tape:
                loss = keras.ops.mean(keras.ops.square(self.decoder(self.encoder(x)) - x))
            grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply(grads, self.trainable_weights)
        self.tracker.update_state(loss)
        return {"reconstruction": self.tracker.result()}

    @property
    def metrics(self):
        return [self.tracker]


def test_model_without_call_and_x_only_train_step_behaves_as_in_model_fit(backend):
    if backend == "jax":
        pytest.skip("Keras's JAX trainer takes a stateless train_step(state, data): this model is written for TF/torch")
    x, _ = regression_data(32)
    results = []
    for loop in ("model.fit", "kfit.fit"):
        keras.utils.set_random_seed(5)
        model = XOnlyNoCall()
        model.compile(optimizer=keras.optimizers.SGD(0.1))
        try:
            if loop == "model.fit":
                history = model.fit(x, batch_size=8, epochs=2, shuffle=False, verbose=0)
            else:
                history = kfit.fit(model, x, batch_size=8, epochs=2, shuffle=False, seed=0, verbose=0)
        except RuntimeError as error:  # Keras's torch trainer cannot build a model without call()
            results.append(("error", str(error).splitlines()[0]))
            continue
        results.append((weights(model), history.history))
    (w_keras, h_keras), (w_kfit, h_kfit) = results
    assert w_kfit != "error", h_kfit
    if w_keras == "error":  # Keras 3's torch trainer cannot build it; kfit.fit trains it all the same
        assert len(h_kfit["reconstruction"]) == 2 and np.isfinite(h_kfit["reconstruction"]).all()
        return
    assert h_kfit == h_keras and len(h_kfit["reconstruction"]) == 2
    for a, b in zip(w_keras, w_kfit):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_ema_weights_are_swapped_in_at_the_end_as_in_model_fit():
    x, y = regression_data(48)
    models = []
    for loop in ("model.fit", "kfit.fit"):
        model = compiled(mlp(), optimizer=keras.optimizers.SGD(0.05, use_ema=True, ema_momentum=0.9))
        if loop == "model.fit":
            model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        else:
            kfit.fit(model, x, y, batch_size=8, epochs=2, shuffle=False, seed=0, verbose=0)
        models.append(model)
    assert_same_weights(*models)


def test_a_finished_run_with_ema_continues_exactly_and_reloads_as_model_fit_left_it(tmp_path):
    """The final checkpoint (written after model.fit swapped the moving averages in) holds the trained weights: a run
    continued from it equals one never stopped; a rerun, and load_checkpoint, give model.fit's averaged weights."""
    x, y = regression_data(40)

    def run(epochs, path=None):
        model = compiled(mlp(), optimizer=keras.optimizers.SGD(0.05, momentum=0.9, use_ema=True, ema_momentum=0.9))
        callbacks = [] if path is None else [kfit.callbacks.Checkpoint(path, frequency=24, async_write=False)]
        kfit.fit(model, x, y, batch_size=8, epochs=epochs, shuffle=False, seed=0, verbose=0, callbacks=callbacks)
        return model

    path = str(tmp_path / "run.ckpt")
    two_epochs = run(2, path)  # its last save is the one after model.fit's end (24 does not divide 80)
    assert_same_weights(run(2, path), two_epochs)  # a rerun of the finished run trains nothing
    fresh = compiled(mlp(), optimizer=keras.optimizers.SGD(0.05, momentum=0.9, use_ema=True, ema_momentum=0.9))
    info = kfit.load_checkpoint(path, fresh)  # the newest checkpoint
    assert info.samples == 80
    assert_same_weights(fresh, two_epochs)
    assert_same_weights(run(3, path), run(3))  # continued from the finished run: as one never stopped


def test_keras_callbacks_see_what_model_fit_shows_them():
    x, y = regression_data(40)
    seen = {}
    for loop in ("model.fit", "kfit.fit"):
        events: list = []
        recorder = keras.callbacks.LambdaCallback(
            on_train_batch_begin=lambda batch, logs, events=events: events.append(("begin", batch)),
            on_train_batch_end=lambda batch, logs, events=events: events.append(("end", batch, sorted(logs))),
            on_epoch_end=lambda epoch, logs, events=events: events.append(("epoch", epoch, sorted(logs))),
        )
        model = compiled(mlp(), metrics=["mae"])
        if loop == "model.fit":
            model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[recorder])
        else:
            kfit.fit(model, x, y, batch_size=16, epochs=2, shuffle=False, seed=0, verbose=0, callbacks=[recorder])
        seen[loop] = events
    assert seen["kfit.fit"] == seen["model.fit"]


def test_terminate_on_nan_stops_after_the_step_as_in_model_fit():
    x, y = regression_data(64)
    y = y * 1e30
    stops = {}
    for loop in ("model.fit", "kfit.fit"):
        model = compiled(mlp(), optimizer=keras.optimizers.SGD(1e10))
        if loop == "model.fit":
            history = model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0,
                                callbacks=[keras.callbacks.TerminateOnNaN()])
        else:
            history = kfit.fit(model, x, y, batch_size=8, epochs=3, shuffle=False, seed=0, verbose=0,
                               callbacks=[keras.callbacks.TerminateOnNaN()])
        stops[loop] = (len(history.history["loss"]), model.stop_training)
    assert stops["kfit.fit"] == stops["model.fit"] == (1, True)


def test_early_stopping_on_loss_and_non_scalar_validation_metric():
    x, y = regression_data(48)
    val = regression_data(16, seed=3)

    class PerOutputError(keras.metrics.Metric):
        """A metric whose result is a vector (as F1Score(average=None) is)."""

        def __init__(self, name="per_output_error", **kwargs):
            super().__init__(name=name, **kwargs)
            self.total = self.add_variable(shape=(2,), initializer="zeros", name="total")

        def update_state(self, y_true, y_pred, sample_weight=None):
            err = keras.ops.mean(keras.ops.abs(y_true - y_pred))
            self.total.assign_add(keras.ops.stack([err, 2 * err]))

        def result(self):
            return keras.ops.convert_to_tensor(self.total)

    model = compiled(mlp(), metrics=[PerOutputError()])
    history = kfit.fit(model, x, y, batch_size=8, epochs=30, seed=0, verbose=0, validation_data=val,
                       callbacks=[keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0)])
    assert len(history.history["loss"]) == 2  # no improvement of 10 after the first epoch: stops at the second
    assert np.shape(history.history["val_per_output_error"][0]) == (2,)


class UnseededNoise(keras.layers.Layer):
    """A layer that draws from keras.random without a SeedGenerator of its own (Keras's global one)."""

    def call(self, x, training=False):
        if training:
            return x + 0.1 * keras.random.normal(keras.ops.shape(x))
        return x


def test_resume_is_exact_for_layers_drawing_from_the_global_seed_generator(backend, tmp_path):
    if backend == "jax":
        pytest.skip("JAX refuses unseeded random ops inside a traced step: such a layer cannot train there")
    x, y = regression_data(48)

    def model():
        keras.utils.set_random_seed(4)
        # A fresh global generator, as set_random_seed makes on Keras 3.11+ (3.10's keeps the one it has: the
        # runs in this process would otherwise start from where the one before left it).
        global_state.set_global_attribute("global_seed_generator", None)
        m = keras.Sequential([keras.Input((4,)), UnseededNoise(), keras.layers.Dense(1)])
        return compiled(m)

    options = dict(minibatch_size=8, epochs=2, seed=0, verbose=0)
    reference = model()
    kfit.fit(reference, x, y, **options)
    path = tmp_path / "run.ckpt"
    kfit.fit(model(), x, y, max_samples=56, callbacks=[kfit.callbacks.Checkpoint(path, frequency=1000)], **options)
    keras.utils.set_random_seed(99)  # the resumed process draws from other seeds until the checkpoint says
    resumed = model()
    keras.random.normal((3,))  # and has used the global generator before training
    kfit.fit(resumed, x, y, callbacks=[kfit.callbacks.Checkpoint(path, frequency=1000)], **options)
    assert_same_weights(reference, resumed)


def test_keras_callbacks_counters_and_best_survive_a_resume(tmp_path):
    """Keras's EarlyStopping, ReduceLROnPlateau and ModelCheckpoint decide from what they saw before the
    interruption: the resumed run lowers the rate, stops, restores the best weights and keeps the best file as
    the uninterrupted run does. (``min_delta=10``: only the first epoch counts as an improvement, so the
    counters alone decide; ``mode="max"`` keeps the first epoch's weights as the best file.)"""
    x, y = regression_data(64)

    def train(run_dir, max_samples=None):
        keras.utils.set_random_seed(2)
        model = compiled(mlp(), optimizer=keras.optimizers.SGD(0.05))
        best = keras.callbacks.ModelCheckpoint(str(run_dir / "best.weights.h5"), monitor="loss", mode="max",
                                               save_best_only=True, save_weights_only=True)
        history = kfit.fit(model, x, y, minibatch_size=16, epochs=7, seed=0, verbose=0, max_samples=max_samples, callbacks=[
            keras.callbacks.ReduceLROnPlateau(monitor="loss", min_delta=10, patience=2, factor=0.5),
            keras.callbacks.EarlyStopping(monitor="loss", min_delta=10, patience=5, restore_best_weights=True),
            best, kfit.callbacks.Checkpoint(run_dir / "run.ckpt", frequency="1ep")])
        return model, history, best

    reference, reference_history, reference_best = train(tmp_path / "once")
    # (what the counters make of seven epochs: two cuts of the rate, a stop after the sixth epoch)
    assert reference_history.history["learning_rate"] == pytest.approx([0.05] * 3 + [0.025] * 2 + [0.0125])
    train(tmp_path / "twice", max_samples=64 * 3)  # interrupted after epoch 3: a rate cut due at the next
    resumed, history, best = train(tmp_path / "twice")

    assert history.history["learning_rate"] == reference_history.history["learning_rate"]
    assert_same_weights(reference, resumed)  # the first epoch's weights, restored by EarlyStopping
    assert best.best == reference_best.best
    saved = [compiled(mlp()), compiled(mlp())]
    for model, run_dir in zip(saved, ("once", "twice")):
        model.load_weights(str(tmp_path / run_dir / "best.weights.h5"))
    assert_same_weights(*saved)


def test_keras_tensorboard_batch_steps_go_on_after_a_resume(tmp_path):
    """Keras's TensorBoard with ``update_freq=1``: a run interrupted mid-epoch and resumed into the same log
    folder writes each step's ``batch_loss`` once, at the step the uninterrupted run gives it, with its value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    x, y = regression_data(64)

    def train(run_dir, max_samples=None):
        keras.utils.set_random_seed(2)
        model = compiled(mlp(), optimizer=keras.optimizers.SGD(0.05))
        kfit.fit(model, x, y, minibatch_size=16, epochs=3, seed=0, verbose=0, max_samples=max_samples, callbacks=[
            keras.callbacks.TensorBoard(str(run_dir / "tb"), update_freq=1),
            kfit.callbacks.Checkpoint(run_dir / "run.ckpt", frequency=16)])

    def batch_losses(run_dir):
        accumulator = EventAccumulator(str(run_dir / "tb" / "train"), size_guidance={"tensors": 0})
        accumulator.Reload()
        return [(event.step, float(make_ndarray(event.tensor_proto))) for event in accumulator.Tensors("batch_loss")]

    train(tmp_path / "once")
    train(tmp_path / "twice", max_samples=16 * 6)  # stopped after the second step of the second epoch
    train(tmp_path / "twice")

    reference = batch_losses(tmp_path / "once")
    assert [step for step, _ in reference] == list(range(1, 13))
    assert batch_losses(tmp_path / "twice") == reference


def test_backup_and_restore_resumes_at_the_saved_epoch_as_under_model_fit(tmp_path):
    x, y = regression_data(32)

    class InterruptAt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                raise RuntimeError("interrupted")

    epochs_seen = {}
    for loop in ("model.fit", "kfit.fit"):
        backup_dir = tmp_path / loop
        seen: list = []
        recorder = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs, seen=seen: seen.append(epoch))
        model = compiled(mlp())
        fit = model.fit if loop == "model.fit" else (lambda *a, model=model, **k: kfit.fit(model, *a, seed=0, **k))
        with pytest.raises(RuntimeError, match="interrupted"):
            fit(x, y, batch_size=8, epochs=4, verbose=0, shuffle=False,
                callbacks=[keras.callbacks.BackupAndRestore(str(backup_dir)), InterruptAt()])
        history = fit(x, y, batch_size=8, epochs=4, verbose=0, shuffle=False,
                      callbacks=[keras.callbacks.BackupAndRestore(str(backup_dir)), recorder])
        epochs_seen[loop] = (seen, len(history.history["loss"]))
    assert epochs_seen["kfit.fit"] == epochs_seen["model.fit"] == ([2, 3], 2)


def test_backup_and_restore_next_to_a_kfit_checkpoint_is_refused(tmp_path):
    x, y = regression_data(16)
    with pytest.raises(ValueError, match="BackupAndRestore and kfit.callbacks.Checkpoint both restore.*give one"):
        kfit.fit(compiled(mlp()), x, y, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(str(tmp_path / "b")), kfit.callbacks.Checkpoint(tmp_path / "c.ckpt")])


def test_the_keras_progress_bar_follows_each_epochs_steps_with_samples_per_second(capsys):
    x, y = regression_data(100)
    schedule = kfit.schedules.minibatch_size([16, 32], epoch_size=100)
    kfit.fit(compiled(mlp()), x, y, minibatch_size=schedule, epochs=2, seed=0, verbose=1)
    out = capsys.readouterr().out
    first, second = out.split("Epoch 2/2")
    assert "7/7" in first and "4/4" in second  # ceil(100 / 16) and ceil(100 / 32) steps
    assert "samples/s:" in first and "samples/s:" in second


@pytest.mark.parametrize("verbose", [1, 2])
def test_the_epoch_line_shows_the_logs_in_model_fits_order_then_samples_per_second(verbose, capsys):
    """With verbose=1 the samples per second came before the validation logs (first seen at the epoch's end)."""
    x, y = regression_data(32)
    lines = {}
    for loop in ("model.fit", "kfit.fit"):
        model = compiled(mlp(), metrics=["mae"])
        extra = {} if loop == "model.fit" else {"seed": 0}
        kfit.fit(model, x, y, batch_size=8, epochs=1, verbose=verbose, validation_data=(x[:8], y[:8]), **extra)
        last = capsys.readouterr().out.replace("\r", "\n").strip().splitlines()[-1]
        lines[loop] = [part.split(":")[0].strip() for part in last.split(" - ") if ":" in part]
    assert lines["model.fit"] == ["loss", "mae", "val_loss", "val_mae"]
    assert lines["kfit.fit"] == [*lines["model.fit"], "samples/s"]


RATES = [0.08, 0.04, 0.02, 0.01]


def _rate_callbacks(kind: str, source: str) -> list:
    """A learning-rate callback of Keras's, or kfit's that takes its place (the same rates)."""
    if kind == "schedule" and source == "keras":
        return [keras.callbacks.LearningRateScheduler(lambda epoch, lr: RATES[epoch])]
    if kind == "schedule":
        return [kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_minibatch(RATES, epoch_size=40))]
    # min_delta larger than any change: an evaluation after the first never improves, a reduction each epoch.
    if source == "keras":
        return [keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=1, min_delta=1e9)]
    return [kfit.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=1, min_delta=1e9)]


@pytest.mark.parametrize("kind", ["schedule", "plateau"])
@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit"])
def test_kfits_rate_callbacks_log_learning_rate_as_the_keras_callbacks_they_replace(kind, loop, tmp_path):
    """A user who trades Keras's LearningRateScheduler or ReduceLROnPlateau for kfit's keeps the epoch logs'
    ``learning_rate`` (history, CSVLogger); kfit's own CSV history keeps one rate column, ``lr``."""
    x, y = regression_data(40)
    histories = {}
    for source in ("keras", "kfit"):
        model = compiled(mlp(), optimizer=keras.optimizers.SGD(RATES[0]))
        callbacks = _rate_callbacks(kind, source) + [kfit.callbacks.CSVHistory(tmp_path / f"{source}.csv")]
        if loop == "model.fit":
            callbacks.append(kfit.callbacks.SampleClock(batch_size=8, num_samples=40))
            history = model.fit(x, y, batch_size=8, epochs=4, shuffle=False, verbose=0, callbacks=callbacks)
        else:
            history = kfit.fit(model, x, y, batch_size=8, epochs=4, shuffle=False, seed=0, verbose=0, callbacks=callbacks)
        histories[source] = history.history
    expected = RATES if kind == "schedule" else [0.08, 0.08, 0.04, 0.02]
    np.testing.assert_allclose(histories["keras"]["learning_rate"], expected, rtol=1e-6)
    np.testing.assert_allclose(histories["kfit"]["learning_rate"], expected, rtol=1e-6)
    for source in ("keras", "kfit"):
        header = (tmp_path / f"{source}.csv").read_text().splitlines()[0].split(",")
        assert "learning_rate" not in header and "lr" in header
        rows = [line.split(",") for line in (tmp_path / f"{source}.csv").read_text().splitlines()[1:]]
        np.testing.assert_allclose([float(r[header.index("lr")]) for r in rows], expected, rtol=1e-6)


def test_kfits_reduce_lr_on_plateau_after_an_epoch_end_cross_validation_logs_the_rate_the_epoch_trained_with(tmp_path):
    """Keras's ReduceLROnPlateau on ``validation_data``, or kfit's on a CrossValidation at each epoch's end: the same
    training, and the epoch logs' ``learning_rate`` is the rate each epoch trained with. kfit's logged the next
    epoch's: the evaluation, made before the epoch's logs, had reduced it already."""
    x, y = regression_data(40)
    validation = regression_data(16, seed=5)
    reduce = dict(monitor="val_loss", factor=0.5, patience=1, min_delta=1e9)  # a reduction at each epoch after the first
    keras_model = compiled(mlp(), optimizer=keras.optimizers.SGD(RATES[0]))
    expected = keras_model.fit(x, y, batch_size=8, epochs=4, shuffle=False, verbose=0, validation_data=validation,
                               callbacks=[keras.callbacks.ReduceLROnPlateau(**reduce)]).history
    model = compiled(mlp(), optimizer=keras.optimizers.SGD(RATES[0]))
    history = kfit.fit(model, x, y, batch_size=8, epochs=4, shuffle=False, seed=0, verbose=0, callbacks=[
        kfit.callbacks.CrossValidation(validation, frequency="1ep", minibatch_size=8),
        kfit.callbacks.ReduceLROnPlateau(**reduce), kfit.callbacks.CSVHistory(tmp_path / "history.csv")]).history
    np.testing.assert_allclose(expected["learning_rate"], [0.08, 0.08, 0.04, 0.02], rtol=1e-6)
    np.testing.assert_allclose(history["learning_rate"], expected["learning_rate"], rtol=1e-6)
    np.testing.assert_allclose(history["val_loss"], expected["val_loss"], rtol=1e-5)
    for a, b in zip(weights(keras_model), weights(model)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    header, *rows = [line.split(",") for line in (tmp_path / "history.csv").read_text().splitlines()]
    epochs = [row for row in rows if row[header.index("kind")] == "epoch"]  # (and one row per cross-validation)
    np.testing.assert_allclose([float(row[header.index("lr")]) for row in epochs], expected["learning_rate"], rtol=1e-6)


class RowRecorder(keras.layers.Layer):
    """Passes its input on; in training (run eagerly) records the first column of each minibatch: its rows' numbers."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.minibatches: list[list[int]] = []

    def call(self, x, training=False):
        if training:
            self.minibatches.append(keras.ops.convert_to_numpy(x[:, 0]).astype(int).tolist())
        return x


@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit"])
def test_shuffle_batch_shuffles_inside_each_minibatch_as_model_fit_does(loop, tmp_path):
    """``shuffle="batch"`` (Keras's option for HDF5 data): the minibatches come in order, each one range of rows
    in an order of its own. kfit's loop made it a full shuffle, mixing rows from everywhere."""
    x = np.zeros((24, 2), "float32")
    x[:, 0] = np.arange(24)
    y = np.zeros((24, 1), "float32")
    runs = []
    for _ in range(2):
        recorder = RowRecorder()
        model = compiled(keras.Sequential([keras.Input((2,)), recorder, keras.layers.Dense(1)]), run_eagerly=True)
        if loop == "model.fit":
            model.fit(x, y, batch_size=8, epochs=2, shuffle="batch", verbose=0)
        else:
            kfit.fit(model, x, y, batch_size=8, epochs=2, shuffle="batch", seed=0, verbose=0,
                     callbacks=[kfit.callbacks.Checkpoint(tmp_path / f"run{len(runs)}.ckpt")])
        runs.append(recorder.minibatches)
    for minibatches in runs:
        assert [sorted(rows) for rows in minibatches] == [list(range(0, 8)), list(range(8, 16)), list(range(16, 24))] * 2
        assert sum(rows != sorted(rows) for rows in minibatches) >= 4  # shuffled inside (8! orders: rarely sorted)
    if loop == "kfit.fit":
        assert runs[0] == runs[1]  # by (seed, position): the same run twice reads the same minibatches


def test_shuffle_batch_resumes_exactly_mid_epoch(tmp_path):
    """The checkpoint's stream state keeps ``"batch"``: the resumed epoch reads the interrupted one's minibatches."""
    x, y = regression_data(64)
    reference = compiled(mlp())
    kfit.fit(reference, x, y, batch_size=8, epochs=3, shuffle="batch", seed=0, verbose=0)
    path = tmp_path / "run.ckpt"
    kfit.fit(compiled(mlp()), x, y, batch_size=8, epochs=3, shuffle="batch", seed=0, max_samples=88, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(path)])
    resumed = compiled(mlp())
    checkpoint = kfit.callbacks.Checkpoint(path)
    kfit.fit(resumed, x, y, batch_size=8, epochs=3, shuffle="batch", seed=0, verbose=0, callbacks=[checkpoint])
    assert checkpoint.restored_from.samples == 88  # in the second epoch
    assert_same_weights(reference, resumed)


@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit"])
def test_zero_epochs_train_nothing_as_in_model_fit(loop, tmp_path):
    """``epochs=0`` (a script whose epochs come from a setting): ``model.fit`` trains nothing and returns an empty
    History; kfit refused it."""
    x, y = regression_data(64)
    model = compiled(mlp())
    before = weights(model)
    extra = {} if loop == "model.fit" else {"seed": 0, "callbacks": [kfit.callbacks.Checkpoint(tmp_path / "c.ckpt")]}
    history = kfit.fit(model, x, y, batch_size=8, epochs=0, verbose=0, **extra)
    assert history.history == {} and history.epoch == []
    assert history.params == {"verbose": 0, "epochs": 0, "steps": 8}  # (kfit's loop told 1 step)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 0
    for a, b in zip(before, weights(model)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("verbose", ["auto", 0, 2])
def test_history_params_are_model_fits(verbose, capsys):
    x, y = regression_data(64)
    plain = compiled(mlp()).fit(x, y, batch_size=8, epochs=2, verbose=verbose).params
    looped = kfit.fit(compiled(mlp()), x, y, batch_size=8, epochs=2, verbose=verbose, seed=0).params
    assert plain == {"verbose": verbose, "epochs": 2, "steps": 8}
    assert looped == plain


@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit"])
def test_arrays_that_run_out_before_steps_per_epoch_are_reported_as_under_model_fit(loop):
    """Keras warns when the data ends before ``steps_per_epoch`` steps; kfit's loop hid its warning."""
    x, y = regression_data(200)
    extra = {} if loop == "model.fit" else {"seed": 0}
    model = compiled(mlp())
    with pytest.warns(UserWarning, match="Your input ran out of data"):
        kfit.fit(model, x, y, batch_size=32, steps_per_epoch=10, epochs=2, verbose=0, **extra)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 14  # each epoch one pass of 7 steps


@pytest.mark.parametrize("verbose", [1, 2])
def test_a_users_own_progbar_logger_is_the_only_progress_bar_as_in_model_fit(verbose, capsys):
    """Keras adds no progress bar next to a user's ProgbarLogger; kfit's loop added its own, printing every line
    twice."""
    x, y = regression_data(64)
    outputs = []
    for extra in ({}, {"seed": 0}):
        kfit.fit(compiled(mlp()), x, y, batch_size=32, epochs=2, verbose=verbose, shuffle=False,
                 callbacks=[keras.callbacks.ProgbarLogger()], **extra)
        outputs.append(capsys.readouterr().out)
    plain, looped = outputs
    assert looped.count("loss:") == plain.count("loss:") >= 2  # the user's bar alone: no second line per update
    assert "samples/s" not in looped


def test_a_learning_rate_scheduler_steps_once_in_the_epoch_a_run_resumes_in(tmp_path):
    """Keras's ``LearningRateScheduler`` steps the rate it reads at every epoch begin; model.fit begins the resumed
    epoch anew, and the restored rate (already stepped for it) was stepped a second time."""
    x, y = regression_data(64)

    def run(**options):
        model = compiled(mlp())
        scheduler = keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate * 0.5)
        history = kfit.fit(model, x, y, batch_size=8, epochs=3, shuffle=False, seed=0, verbose=0,
                           callbacks=[scheduler, *options.pop("callbacks", [])], **options)
        return model, history

    reference, expected = run()
    path = tmp_path / "run.ckpt"
    run(max_samples=88, callbacks=[kfit.callbacks.Checkpoint(path)])  # stops in the second epoch
    checkpoint = kfit.callbacks.Checkpoint(path)
    resumed, history = run(callbacks=[checkpoint])
    assert checkpoint.restored_from.samples == 88
    assert history.history["learning_rate"] == expected.history["learning_rate"]
    np.testing.assert_allclose(expected.history["learning_rate"], [0.025, 0.0125, 0.00625])
    assert_same_weights(reference, resumed)


class CrashAtStep(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step, self.steps = step, 0

    def on_train_batch_begin(self, batch, logs=None):
        if self.steps == self.step:
            raise RuntimeError("crash")
        self.steps += 1


@pytest.mark.parametrize("append", [False, True])
@pytest.mark.parametrize("crash_at", [11, 17])  # checkpoints every 40 samples: 88 resumes at 80; 136 (after an
# epoch end whose row was written) at 120
def test_keras_csv_logger_file_of_a_resumed_run_is_the_uninterrupted_runs(tmp_path, append, crash_at):
    """A checkpoint keeps what Keras's CSVLogger wrote: its file lost the rows before the resume (append=False
    empties it) or got the rows of the epochs run again (append=True)."""
    x, y = regression_data(64)

    def run(csv, *callbacks):
        logger = keras.callbacks.CSVLogger(str(csv), append=append)
        kfit.fit(compiled(mlp()), x, y, batch_size=8, epochs=3, shuffle=False, seed=0, verbose=0,
                 validation_data=(x[:16], y[:16]), callbacks=[logger, *callbacks])

    run(tmp_path / "uninterrupted.csv")
    path, csv = tmp_path / "run.ckpt", tmp_path / "resumed.csv"
    with pytest.raises(RuntimeError, match="crash"):
        run(csv, kfit.callbacks.Checkpoint(path, frequency=40, async_write=False), CrashAtStep(crash_at))
    checkpoint = kfit.callbacks.Checkpoint(path, frequency=40, async_write=False)
    run(csv, checkpoint)
    assert checkpoint.restored_from.samples == (80 if crash_at == 11 else 120)
    expected = (tmp_path / "uninterrupted.csv").read_text()
    assert [row.split(",")[0] for row in expected.splitlines()] == ["epoch", "0", "1", "2"]
    assert csv.read_text() == expected


def test_a_minibatch_size_schedule_on_a_stateful_layer_is_refused_before_training():
    """A stateful RNN keeps a state per row of its fixed batch size: JAX and PyTorch failed with Keras's error at
    the first step of another size (after training up to it), TensorFlow with an error that did not say why."""
    x = np.random.default_rng(0).normal(size=(64, 3, 2)).astype("float32")
    y = np.zeros((64, 1), "float32")
    inputs = keras.Input((3, 2), batch_size=16)
    model = compiled(keras.Model(inputs, keras.layers.Dense(1)(keras.layers.SimpleRNN(4, stateful=True)(inputs))))
    before = weights(model)
    with pytest.raises(ValueError, match="A minibatch-size schedule cannot train the stateful layer 'simple_rnn.*'"):
        kfit.fit(model, x, y, minibatch_size=kfit.schedules.minibatch_size([16, 32], epoch_size=64), epochs=2,
                 seed=0, verbose=0)
    for a, b in zip(before, weights(model)):
        np.testing.assert_array_equal(a, b)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 0
    kfit.fit(model, x, y, minibatch_size=16, epochs=1, seed=0, verbose=0)  # its own batch size trains
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 4


class BatchNumbers(keras.callbacks.Callback):
    """What a callback is told at each training batch: ``(hook, epoch, batch)``."""

    def __init__(self):
        super().__init__()
        self.epoch, self.seen = None, []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.seen.append(("begin", self.epoch, batch))

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(("end", self.epoch, batch))


@pytest.mark.parametrize("data", ["arrays", "minibatch-size schedule", "tf.data", "tf.data of unknown length",
                                  "tf.data read on across epochs"])
def test_callbacks_see_the_uninterrupted_runs_batch_numbers_in_the_epoch_a_run_resumes_in(tmp_path, data):
    """Keras numbers the steps of a ``fit`` call from 0: the epoch a run resumed in its middle numbered its steps
    from 0 again, and Keras's ModelCheckpoint wrote its ``{batch}`` files under other names than the uninterrupted
    run (and kfit's progress bar counted the resumed steps only). Now every callback sees the uninterrupted run's
    numbers: data kfit cuts (arrays, a schedule), a source it skips ahead in, one read on across epochs."""
    import tensorflow as tf

    x, y = regression_data(64)
    size: object = 8
    arguments: dict = {"epochs": 3}
    if data == "minibatch-size schedule":
        size = kfit.schedules.minibatch_size([8, 16], epoch_size=64)  # epoch 1: 8 steps of 8, then 4 of 16
    elif data == "tf.data":
        x, y, size = tf.data.Dataset.from_tensor_slices((x, y)).batch(8), None, None
    elif data == "tf.data of unknown length":  # (no cardinality: the batches' size tells the steps)
        x, y, size = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).filter(lambda *_: True), None, None
    elif data == "tf.data read on across epochs":
        x, y, size = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat(), None, None
        arguments["steps_per_epoch"] = 8
    stop_at = 96 if data == "minibatch-size schedule" else 88  # inside the second epoch: after its 2nd (3rd) step

    def train(folder, max_samples=None):
        keras.utils.set_random_seed(2)
        numbers = BatchNumbers()
        saver = keras.callbacks.ModelCheckpoint(str(folder / "w-{epoch}-{batch}.weights.h5"), save_weights_only=True,
                                                save_freq=3)
        kfit.fit(compiled(mlp()), x, y, minibatch_size=size, seed=0, verbose=0, max_samples=max_samples,
                 callbacks=[numbers, saver, kfit.callbacks.Checkpoint(folder / "run.ckpt")], **arguments)
        return numbers.seen

    reference = train(tmp_path / "once")
    stopped = train(tmp_path / "twice", max_samples=stop_at)
    resumed = train(tmp_path / "twice")

    assert resumed[0] == ("begin", 1, 2 if data == "minibatch-size schedule" else 3)
    assert stopped + resumed == reference
    assert sorted(p.name for p in (tmp_path / "twice").glob("w-*")) == sorted(p.name for p in (tmp_path / "once").glob("w-*"))


def test_the_progress_bar_of_the_epoch_a_run_resumes_in_counts_its_steps_from_the_epochs_start(tmp_path, capsys):
    """The resumed epoch's bar ends at the epoch's step count (8/8), as in the uninterrupted run, not at the steps
    this call ran (5/5)."""
    x, y = regression_data(64)
    path = tmp_path / "run.ckpt"
    kfit.fit(compiled(mlp()), x, y, minibatch_size=8, epochs=2, seed=0, verbose=0, max_samples=88,
             callbacks=[kfit.callbacks.Checkpoint(path)])
    capsys.readouterr()
    kfit.fit(compiled(mlp()), x, y, minibatch_size=8, epochs=2, seed=0, verbose=1,
             callbacks=[kfit.callbacks.Checkpoint(path)])
    shown = capsys.readouterr().out
    assert "Epoch 2/2" in shown and "8/8" in shown
    assert "5/5" not in shown


class SlowSteps(keras.callbacks.Callback):
    """Makes every step take at least ``seconds`` more."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


def _shown_seconds_per_step(shown):
    value, unit = re.findall(r"([\d.]+)(s|ms|us)/step", shown)[-1]
    return float(value) * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[unit]


@pytest.mark.parametrize("source", ["arrays", "generator"])
def test_the_progress_bar_of_the_epoch_a_run_resumes_in_shows_the_calls_own_time_per_step(tmp_path, capsys, source):
    """The bar counts the steps the epoch had run before the resume (28 of 32), but Keras's Progbar took the time per
    step as this call's time over every step counted: an eighth of the real time per step (and the ETA as short)."""
    x, y = regression_data(128)

    def data():
        if source == "arrays":
            return {"x": x, "y": y, "minibatch_size": 4}
        return {"x": ((x[i:i + 4], y[i:i + 4]) for _ in range(3) for i in range(0, 128, 4)), "steps_per_epoch": 32,
                "shuffle": False}

    path = tmp_path / "run.ckpt"
    kfit.fit(compiled(mlp()), epochs=2, seed=0, verbose=0, max_samples=112, callbacks=[kfit.callbacks.Checkpoint(path)],
             **data())
    capsys.readouterr()
    kfit.fit(compiled(mlp()), epochs=1, seed=0, verbose=1, callbacks=[kfit.callbacks.Checkpoint(path), SlowSteps(0.05)],
             **data())
    shown = capsys.readouterr().out
    assert "32/32" in shown
    assert _shown_seconds_per_step(shown) >= 0.045, shown[-300:]


class StopAtTrainBegin(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.model.stop_training = True


def test_a_callback_that_stops_training_in_on_train_begin_lets_one_step_run_as_in_model_fit():
    """``model.fit`` checks ``stop_training`` after each step: one step runs, and the History has its epoch. kfit's
    loop took the flag for a finished run and trained nothing."""
    x, y = regression_data(64)
    keras.utils.set_random_seed(1)
    plain = compiled(mlp())
    keras.utils.set_random_seed(1)
    looped = compiled(mlp())
    expected = plain.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, callbacks=[StopAtTrainBegin()])
    history = kfit.fit(looped, x, y, batch_size=8, epochs=3, shuffle=False, seed=0, verbose=0,
                       callbacks=[StopAtTrainBegin()])
    assert int(keras.ops.convert_to_numpy(looped.optimizer.iterations)) == 1
    assert history.epoch == expected.epoch == [0]
    assert history.history.keys() == expected.history.keys()
    assert history.history["loss"] == pytest.approx(expected.history["loss"])
    assert_same_weights(plain, looped)


@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit"])
def test_a_history_passed_in_callbacks_is_the_history_returned_as_in_model_fit(loop, tmp_path):
    """Keras returns the ``History`` its user passed, and makes it ``model.history``; kfit returned its own. It holds
    the run's record: after a resume, the restored epochs too."""
    x, y = regression_data(64)
    extra = {} if loop == "model.fit" else {"seed": 0}
    mine = keras.callbacks.History()
    model = compiled(mlp())
    history = kfit.fit(model, x, y, batch_size=8, epochs=2, verbose=0, callbacks=[mine], **extra)
    assert history is mine and model.history is mine
    assert mine.epoch == [0, 1] and mine.params == {"verbose": 0, "epochs": 2, "steps": 8}
    assert len(mine.history["loss"]) == 2 and [s.epoch for s in mine.epoch_summaries] == [0, 1]
    if loop == "kfit.fit":
        path = tmp_path / "run.ckpt"
        kfit.fit(compiled(mlp()), x, y, batch_size=8, epochs=3, verbose=0, max_samples=64 * 2,
                 callbacks=[kfit.callbacks.Checkpoint(path)], **extra)
        resumed = keras.callbacks.History()
        full = kfit.fit(compiled(mlp()), x, y, batch_size=8, epochs=3, verbose=0,
                        callbacks=[resumed, kfit.callbacks.Checkpoint(path)], **extra)
        assert full is resumed and resumed.epoch == [0, 1, 2] and len(resumed.history["loss"]) == 3


def test_a_run_that_fails_in_its_first_step_leaves_the_model_as_it_was():
    """A data error in the first step (sample weights of the wrong shape): on JAX, Keras had taken the values out of
    the variables for the step and none came back, so every later fit of the model (kfit's or model.fit) failed with
    "'NoneType' object is not callable". The model is left as it was and trains as a fresh one."""
    x, y = regression_data(64)
    keras.utils.set_random_seed(3)
    model = compiled(mlp(), optimizer=keras.optimizers.Adam(0.01))
    keras.utils.set_random_seed(3)
    fresh = compiled(mlp(), optimizer=keras.optimizers.Adam(0.01))
    before = weights(model)
    with pytest.raises((ValueError, RuntimeError)):  # (the backend's own error: PyTorch raises RuntimeError)
        kfit.fit(model, x, y, sample_weight=np.ones((64, 3), "float32"), batch_size=16, seed=0, verbose=0)
    for a, b in zip(before, weights(model)):
        np.testing.assert_array_equal(a, b)
    for trained in (model, fresh):
        kfit.fit(trained, x, y, batch_size=16, epochs=2, shuffle=False, seed=0, verbose=0)
    assert_same_weights(model, fresh)


def two_output_model():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(5, activation="relu")(inputs)
    model = keras.Model(inputs, [keras.layers.Dense(1, name="a")(hidden), keras.layers.Dense(1, name="b")(hidden)])
    return compiled(model, loss=["mse", "mse"])


@pytest.mark.parametrize("case", ["one array in a list for two outputs", "one array of two weights per sample",
                                  "a list of weights for a dict of targets"])
def test_sample_weights_that_do_not_fit_the_outputs_are_refused_with_keras_errors(case):
    """kfit's loop failed with an IndexError or a broadcasting error deep in the step, or trained where model.fit
    refuses; now Keras's own checks and words, before training."""
    x, y = regression_data(32)
    targets: object = [y, y]
    weights_ = np.ones(32, "float32")
    sample_weight: object = {"one array in a list for two outputs": [weights_],
                             "one array of two weights per sample": np.ones((32, 2), "float32"),
                             "a list of weights for a dict of targets": [weights_, weights_]}[case]
    if case == "a list of weights for a dict of targets":
        targets = {"a": y, "b": y}
    messages = []
    for loop in ("model.fit", "kfit.fit"):
        model = two_output_model()
        fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
        with pytest.raises(ValueError) as raised:
            fit(x, targets, sample_weight=sample_weight, batch_size=8, verbose=0)
        messages.append(str(raised.value).split(".")[0])
        assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 0
    assert messages[1] == messages[0]


def test_per_output_losses_of_a_resumed_epoch_are_the_uninterrupted_runs(tmp_path):
    """Keras weights each step's per-output loss mean by the static batch dimension (1 when unknown). On TensorFlow
    the call stopped at 48 samples declared it static (all its minibatches of 16) and the resumed call unknown (a
    remainder of 8 ends each epoch of 72): the resumed epoch's `a_loss`/`b_loss` were 0.03-0.19 off. Every call now
    declares what a call training the whole epoch does."""
    x, y = regression_data(72)

    def train(max_samples=None):
        keras.utils.set_random_seed(2)
        return kfit.fit(two_output_model(), x, [y, 2 * y], batch_size=16, epochs=3, shuffle=False, seed=0,
                        verbose=0, max_samples=max_samples, callbacks=[kfit.callbacks.Checkpoint(tmp_path / "r.ckpt")])

    reference = train().history
    (tmp_path / "r.ckpt").unlink()
    train(max_samples=48)
    resumed = train().history
    assert sorted(resumed) == sorted(reference) == ["a_loss", "b_loss", "loss"]
    for key in reference:
        np.testing.assert_allclose(resumed[key], reference[key], rtol=1e-6, err_msg=key)


@pytest.mark.skipif(tuple(int(p) for p in keras.__version__.split(".")[:2]) < (3, 12),
                    reason="model.fit itself fails on a None target before Keras 3.12 (tried: 3.10.0, 3.11.3)")
def test_a_none_target_for_an_output_without_a_loss_trains_as_in_model_fit():
    """``model.fit(x, [y, None])`` with ``loss=["mse", None]`` trains; kfit's TensorFlow pipeline failed converting
    the None to a tensor."""
    x, y = regression_data(64)
    runs = []
    for loop in ("model.fit", "kfit.fit"):
        keras.utils.set_random_seed(1)
        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(3)(inputs)
        model = compiled(keras.Model(inputs, [keras.layers.Dense(1)(hidden), keras.layers.Dense(1)(hidden)]),
                         loss=["mse", None])
        fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
        runs.append((model, fit(x, [y, None], batch_size=16, epochs=2, shuffle=False, verbose=0)))
    (a, history_a), (b, history_b) = runs
    assert history_b.history.keys() == history_a.history.keys()
    np.testing.assert_allclose(history_b.history["loss"], history_a.history["loss"], rtol=1e-6)
    assert_same_weights(a, b)


class ReshufflingDataset(keras.utils.PyDataset):
    """Reorders its rows in ``on_epoch_end`` from its own seeded random state, as the Keras guide's datasets do."""

    def __init__(self, x, y, batch_size):
        super().__init__()
        self.x, self.y, self.batch_size = x, y, batch_size
        self.order = np.arange(len(x))
        self.rng = np.random.default_rng(7)

    def __len__(self):
        return -(-len(self.x) // self.batch_size)

    def __getitem__(self, index):
        rows = self.order[index * self.batch_size:(index + 1) * self.batch_size]
        return self.x[rows], self.y[rows]

    def on_epoch_end(self):
        self.order = self.rng.permutation(len(self.x))


def test_a_pydataset_that_reshuffles_at_epoch_end_trains_as_in_model_fit_and_resumes_exactly(tmp_path):
    """kfit's loop never called a PyDataset's ``on_epoch_end``: a dataset that reorders itself there trained every
    epoch on the first order (weights 0.08 off model.fit's). It is now called as model.fit calls it (once before the
    first epoch too), and a resumed run replays the calls up to its epoch."""
    x, y = regression_data(64)

    def train(loop, **extra):
        keras.utils.set_random_seed(4)
        model = compiled(mlp())
        fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
        history = fit(ReshufflingDataset(x, y, 16), epochs=3, shuffle=False, verbose=0, **extra)
        return model, history

    expected, expected_history = train("model.fit")
    looped, history = train("kfit.fit")
    assert_same_weights(expected, looped)
    np.testing.assert_allclose(history.history["loss"], expected_history.history["loss"], rtol=1e-6)
    path = tmp_path / "run.ckpt"
    train("kfit.fit", max_samples=64 + 32, callbacks=[kfit.callbacks.Checkpoint(path)])
    resumed, resumed_history = train("kfit.fit", callbacks=[kfit.callbacks.Checkpoint(path)])
    assert_same_weights(expected, resumed)
    np.testing.assert_allclose(resumed_history.history["loss"], expected_history.history["loss"], rtol=1e-6)


class InOrder(ReshufflingDataset):
    def on_epoch_end(self):
        pass


@pytest.mark.parametrize("batch, steps_per_epoch", [(8, 3), (8, 4), (10, 5)])  # 6 batches a pass: two epochs a
# pass, a pass cut into 4 + 2; 5 batches (the last of 8 rows): an epoch a pass
def test_a_pydataset_read_on_across_epochs_with_steps_per_epoch_trains_as_in_model_fit_and_resumes(
        tmp_path, batch, steps_per_epoch):
    """``steps_per_epoch`` shorter than a PyDataset: model.fit reads on in the pass across epochs, ends an epoch early
    where the pass ends, and calls the dataset's ``on_epoch_end`` at every epoch's end. kfit's loop made every epoch
    ``steps_per_epoch`` batches across passes and called ``on_epoch_end`` once a pass: other batches, and weights up
    to 0.1 off. Now Keras's adapter reads it, as arrays whose epochs are not passes, and a resumed run (the pass it
    resumed in read again up to its step) ends that pass where it ended: the run's epoch after such a pass's end
    trained no step. With ``steps_per_epoch`` its length, an epoch is a pass: kfit's loop made it
    ``steps_per_epoch * batch`` samples, past a short last batch into the next pass. A resumed run did not call the
    dataset's ``on_epoch_end`` for the epochs before its own, so a dataset that reorders its rows there trained on
    other rows (loss 0.1-0.4 off): it now calls ``on_epoch_begin`` and ``on_epoch_end`` once for each of them, as
    model.fit did. (On TensorFlow model.fit's own tf.data prefetch reads a varying number of the next epoch's
    batches before ``on_epoch_end`` reorders the rows: two of its runs differ, so the dataset there keeps its order.)"""
    x, y = regression_data(48)
    reordering = InOrder if keras.backend.backend() == "tensorflow" else ReshufflingDataset

    def train(loop, dataset=reordering, **extra):
        keras.utils.set_random_seed(4)
        model = compiled(mlp())
        fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (Keras's "Your input ran out of data", where a pass ends an epoch)
            history = fit(dataset(x, y, batch), epochs=4, steps_per_epoch=steps_per_epoch, shuffle=False, verbose=0,
                          **extra)
        return model, history

    expected, expected_history = train("model.fit")
    looped, history = train("kfit.fit")
    assert_same_weights(expected, looped)
    assert history.history == expected_history.history
    for crash_at in (2, 3, 7):  # inside the first pass's first epoch; at its second epoch's start; in the second pass
        path = tmp_path / f"run{crash_at}.ckpt"
        with pytest.raises(RuntimeError, match="crash"):
            train("kfit.fit", callbacks=[kfit.callbacks.Checkpoint(path, frequency="1mb", async_write=False),
                                         CrashAtStep(crash_at)])
        resumed, resumed_history = train("kfit.fit", callbacks=[kfit.callbacks.Checkpoint(path)])
        assert_same_weights(expected, resumed)
        assert resumed_history.history == expected_history.history


def test_a_pydataset_read_on_across_epochs_that_changes_at_epoch_ends_says_on_tensorflow_that_it_resumes_inexactly(
        tmp_path):
    """On TensorFlow Keras's adapter reads a PyDataset through tf.data, whose prefetch reads a varying number of
    batches before the dataset's ``on_epoch_end`` reorders its rows (two uninterrupted kfit.fit runs differ, as two
    model.fit runs do): a run resumed on such a dataset with ``steps_per_epoch`` other than its length says once that
    it may not be exact. Elsewhere, where it is exact (the test above), and for a dataset without epoch hooks, nothing
    is said."""
    x, y = regression_data(48)

    def said_at_resume(dataset):
        path = tmp_path / f"{dataset.__name__}.ckpt"

        def train(**extra):
            kfit.fit(compiled(mlp()), dataset(x, y, 8), epochs=3, steps_per_epoch=4, shuffle=False, verbose=0, seed=0,
                     **extra)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            train(max_samples=40, callbacks=[kfit.callbacks.Checkpoint(path)])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train(callbacks=[kfit.callbacks.Checkpoint(path)])
        return [str(w.message) for w in caught if "resume may not be exact" in str(w.message)]

    said = said_at_resume(ReshufflingDataset)
    assert len(said) == (keras.backend.backend() == "tensorflow")
    assert all("on_epoch_end" in message and "steps_per_epoch equal to the dataset's length" in message for message in said)
    assert said_at_resume(WithoutEpochHooks) == []


class WithoutEpochHooks(keras.utils.PyDataset):
    def __init__(self, x, y, batch_size):
        super().__init__()
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return -(-len(self.x) // self.batch_size)

    def __getitem__(self, index):
        rows = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return self.x[rows], self.y[rows]


@pytest.mark.parametrize("data", ["arrays", "PyDataset"])
def test_a_checkpoint_where_a_pass_ends_an_epoch_early_resumes_with_that_epoch_in_the_history(tmp_path, data):
    """48 rows in batches of 8 with ``steps_per_epoch=4``: Keras's epochs are 4 and 2 steps (a pass ends the second
    early), read through Keras's own adapter. kfit's clock counted epochs of the first one's 32 samples, so a
    checkpoint at the last step of a 2-step epoch (step 6) was taken for one 16 samples into an epoch: the run resumed
    from it lacked that epoch in its History (the weights were right). With ``initial_epoch=1`` a resumed run counted
    its epochs from 0 and trained one epoch too many. Resumed runs now end with model.fit's weights and History
    (validation each epoch too)."""
    x, y = regression_data(48)
    validation = regression_data(20, seed=3)

    def train(loop, initial_epoch, **extra):
        keras.utils.set_random_seed(4)
        model = compiled(mlp())
        fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
        given = dict(x=x, y=y, batch_size=8) if data == "arrays" else dict(x=InOrder(x, y, 8))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (Keras's "Your input ran out of data", where a pass ends an epoch)
            history = fit(**given, epochs=initial_epoch + 4, initial_epoch=initial_epoch, steps_per_epoch=4,
                          shuffle=False, validation_data=validation, verbose=0, **extra)
        return model, history

    for initial_epoch, crash_at in ((0, 6), (1, 3), (1, 6)):
        expected, expected_history = train("model.fit", initial_epoch)
        path = tmp_path / f"run{initial_epoch}_{crash_at}.ckpt"
        with pytest.raises(RuntimeError, match="crash"):
            train("kfit.fit", initial_epoch, callbacks=[
                kfit.callbacks.Checkpoint(path, frequency="1mb", async_write=False), CrashAtStep(crash_at)])
        resumed, resumed_history = train("kfit.fit", initial_epoch, callbacks=[kfit.callbacks.Checkpoint(path)])
        assert_same_weights(expected, resumed)
        assert resumed_history.epoch == expected_history.epoch
        assert resumed_history.history == expected_history.history


def test_a_pydataset_that_keras_shuffles_read_on_across_epochs_resumes_in_its_pass_order(tmp_path):
    """``shuffle=True`` (the default) with ``steps_per_epoch`` other than a PyDataset's length: Keras's adapter orders
    each pass's batches with Python's random state as the pass begins. A run resumed inside a pass drew another order
    for it (weights off at every step checked). The checkpoint now holds Python's random state as the pass began, and
    the resumed run orders that pass again from it: model.fit's weights and History. (On TensorFlow, where model.fit
    reads no batch before training, kfit's look at the first batch drew an order of its own from that state: even the
    uninterrupted run trained other orders than model.fit; the look now leaves the state as it found it.)"""
    x, y = regression_data(48)

    def train(loop, **extra):
        keras.utils.set_random_seed(4)
        model = compiled(mlp())
        fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (Keras's "Your input ran out of data", where a pass ends an epoch)
            history = fit(InOrder(x, y, 8), epochs=4, steps_per_epoch=4, verbose=0, **extra)
        return model, history

    expected, expected_history = train("model.fit")
    looped, history = train("kfit.fit")
    assert_same_weights(expected, looped)
    assert history.history == expected_history.history
    for crash_at in (2, 6, 7):  # in the first pass; at its end (an epoch's too); in the second pass
        path = tmp_path / f"run{crash_at}.ckpt"
        with pytest.raises(RuntimeError, match="crash"):
            train("kfit.fit", callbacks=[kfit.callbacks.Checkpoint(path, frequency="1mb", async_write=False),
                                         CrashAtStep(crash_at)])
        resumed, resumed_history = train("kfit.fit", callbacks=[kfit.callbacks.Checkpoint(path)])
        assert_same_weights(expected, resumed)
        assert resumed_history.history == expected_history.history


def test_a_pydataset_given_a_batch_size_trains_in_its_own_batches_as_in_model_fit():
    """model.fit reads a PyDataset in its own batches whatever its ``batch_size`` (which then only sizes the
    validation's batches); kfit's loop cut the dataset anew at ``batch_size``: 3 steps of 16 where model.fit takes 6
    of 8, and other weights. ``minibatch_size`` (kfit's own name) still cuts it anew."""
    x, y = regression_data(48)
    validation = regression_data(20, seed=3)

    def train(loop, **size):
        keras.utils.set_random_seed(4)
        model = compiled(mlp())
        steps = ValidationSteps()
        fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
        history = fit(ReshufflingDataset(x, y, 8), epochs=2, shuffle=False, verbose=0, validation_data=validation,
                      callbacks=[steps], **size)
        return model, history, steps.steps

    expected, expected_history, expected_steps = train("model.fit", batch_size=16)
    looped, history, steps = train("kfit.fit", batch_size=16)
    assert history.params["steps"] == expected_history.params["steps"] == 6
    assert steps == expected_steps == [2, 2]  # the validation's 20 rows in batches of 16
    assert_same_weights(expected, looped)
    assert history.history == expected_history.history
    assert train("kfit.fit", minibatch_size=16)[1].params["steps"] == 3


class CurriculumDataset(keras.utils.PyDataset):
    """Serves its rows scaled by ``difficulty``, which a callback sets as each epoch begins; notes its epoch hooks."""

    def __init__(self, x, y, batch_size, events):
        super().__init__()
        self.x, self.y, self.batch_size, self.events = x, y, batch_size, events
        self.difficulty = 1.0

    def __len__(self):
        return len(self.x) // self.batch_size

    def __getitem__(self, index):
        rows = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return self.x[rows] * self.difficulty, self.y[rows]

    def on_epoch_begin(self):
        self.events.append("data begin")

    def on_epoch_end(self):
        self.events.append("data end")


class Curriculum(keras.callbacks.Callback):
    def __init__(self, dataset, events):
        super().__init__()
        self.dataset, self.events = dataset, events

    def on_epoch_begin(self, epoch, logs=None):
        self.dataset.difficulty = 1.0 + epoch
        self.events.append(f"epoch {epoch} begin")

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(f"epoch {epoch} end")


def test_a_callback_that_changes_a_pydataset_as_each_epoch_begins_trains_as_in_model_fit(tmp_path):
    """A curriculum: a callback sets the dataset's difficulty in ``on_epoch_begin``. kfit's loop read each next epoch
    ahead while the one before trained, before the callback had run (weights 0.04 off model.fit's on JAX, 0.2 on
    TensorFlow), and called the dataset's ``on_epoch_end`` at the next epoch's first read, after the callbacks'
    ``on_epoch_end`` (never after the last epoch). Now the batches, the weights and the order of the epoch hooks are
    model.fit's, and a run resumed in its second epoch ends as the uninterrupted one."""
    x, y = regression_data(64)

    def train(loop, **extra):
        keras.utils.set_random_seed(4)
        model = compiled(mlp())
        events = []
        dataset = CurriculumDataset(x, y, 16, events)
        fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
        history = fit(dataset, epochs=3, shuffle=False, verbose=0,
                      callbacks=[Curriculum(dataset, events), *extra.pop("callbacks", [])], **extra)
        return model, history, events

    expected, expected_history, expected_events = train("model.fit")
    looped, history, events = train("kfit.fit")
    assert_same_weights(expected, looped)
    np.testing.assert_allclose(history.history["loss"], expected_history.history["loss"], rtol=1e-6)
    # From the first epoch on (before it, model.fit on JAX and PyTorch also opens the dataset to build the model).
    assert events[events.index("epoch 0 begin"):] == expected_events[expected_events.index("epoch 0 begin"):]
    assert events[:events.index("epoch 0 begin")] == ["data end"]  # as model.fit resets its data (TensorFlow)
    assert events[-2:] == ["data end", "epoch 2 end"]  # the dataset's epoch ends before the callbacks' (validation)
    path = tmp_path / "run.ckpt"
    train("kfit.fit", max_samples=64 + 32, callbacks=[kfit.callbacks.Checkpoint(path)])
    resumed, resumed_history, _ = train("kfit.fit", callbacks=[kfit.callbacks.Checkpoint(path)])
    assert_same_weights(expected, resumed)
    np.testing.assert_allclose(resumed_history.history["loss"], expected_history.history["loss"], rtol=1e-6)


class SlowDataset(keras.utils.PyDataset):
    """Batches of 8 rows, each fetched in 5 ms (an image decoded, a file read); notes how many fetches overlap, across
    threads and worker processes (shared counters), and raises in ``__getitem__`` at ``fail_at``."""

    def __init__(self, x, y, fail_at=None, **kwargs):
        super().__init__(**kwargs)
        import multiprocessing

        self.x, self.y, self.fail_at = x, y, fail_at
        self.in_flight, self.most = multiprocessing.Value("i", 0), multiprocessing.Value("i", 0)

    def __len__(self):
        return len(self.x) // 8

    def __getitem__(self, index):
        with self.in_flight.get_lock():
            self.in_flight.value += 1
            self.most.value = max(self.most.value, self.in_flight.value)
        time.sleep(0.005)
        # With several workers, a fetch waits (up to 0.25 s) until two have overlapped once: fetches made concurrently
        # show it however busy the machine is (a 5 ms window alone missed it under load), while fetches made one at a
        # time wait in vain and the check below fails. (kfit reads the first and last items of its order alone, before
        # its workers start: those wait the full 0.25 s.)
        deadline = time.monotonic() + (0.25 if self.workers > 1 else 0.0)
        while self.most.value < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        with self.in_flight.get_lock():
            self.in_flight.value -= 1
        if index == self.fail_at:
            raise ValueError(f"cannot decode image {index}")
        return self.x[index * 8:(index + 1) * 8], self.y[index * 8:(index + 1) * 8]


def _helpers_left():
    """The threads of pools (multiprocessing's) and kfit's readers, and the child processes, alive now."""
    import multiprocessing
    import threading

    names = [t.name for t in threading.enumerate()]
    return {n for n in names if "(worker)" in n or "(_handle" in n or n.startswith("kfit")}, \
        {p.pid for p in multiprocessing.active_children()}


def _assert_no_helpers_left_beyond(before, grace=10.0):
    """kfit's run left no pool thread, reader thread or child process alive that was not there before it: those of
    the model.fit run before it may still be shutting down, and end meanwhile (a pool's handler threads end a moment
    after model.fit returns), so the check is that what is alive now is among what was. kfit's own reader threads must
    be gone when kfit.fit returns; the pools' threads and processes it ended are given ``grace`` seconds to exit."""
    assert not {n for n in _helpers_left()[0] if n.startswith("kfit")} - before[0]
    deadline = time.monotonic() + grace
    while True:
        threads, children = _helpers_left()
        if threads <= before[0] and children <= before[1]:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"kfit.fit left helpers alive: threads {sorted(threads - before[0])}, "
                                 f"child processes {sorted(children - before[1])}")
        time.sleep(0.1)


@pytest.mark.parametrize("use_multiprocessing", [False, True], ids=["threads", "processes"])
def test_a_pydatasets_workers_fetch_its_items_concurrently_in_kfits_loop_and_train_as_one_worker(
        use_multiprocessing, tmp_path):
    """kfit's loop read a PyDataset's items one at a time, its ``workers`` and ``use_multiprocessing`` unused: a
    dataset that loads its batches in parallel under model.fit became input-bound once a kfit feature (``seed=``) was
    added. Now kfit fetches the items it reads next on ``workers`` threads (processes with ``use_multiprocessing``),
    in its own order: fetches overlap, the History and weights are one worker's and model.fit's (model.fit with one
    worker: Keras's own enqueuer trains the first epoch's first batch last), a run resumed mid-epoch ends as the
    uninterrupted one, and no thread or process is left after fit."""
    x, y = regression_data(64)
    before = _helpers_left()

    def train(loop, workers, **extra):
        keras.utils.set_random_seed(4)
        model = compiled(mlp())
        dataset = SlowDataset(x, y, workers=workers, use_multiprocessing=use_multiprocessing and workers > 1)
        fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
        history = fit(dataset, epochs=3, verbose=0, **extra)
        assert (dataset.most.value > 1) == (workers > 1)  # fetches overlapped only with several workers
        return model, history.history

    expected, expected_history = train("model.fit", 1, shuffle=False)
    for workers in (1, 3):
        looped, history = train("kfit.fit", workers, shuffle=False)
        assert_same_weights(expected, looped)
        np.testing.assert_allclose(history["loss"], expected_history["loss"], rtol=1e-6)
    # kfit's own shuffle, minibatches cut across the dataset's batches, a checkpoint mid-epoch
    one, one_history = train("kfit.fit", 1, minibatch_size=12)
    path = tmp_path / "run.ckpt"
    train("kfit.fit", 3, minibatch_size=12, max_samples=64 + 36, callbacks=[kfit.callbacks.Checkpoint(path)])
    resumed, resumed_history = train("kfit.fit", 3, minibatch_size=12, callbacks=[kfit.callbacks.Checkpoint(path)])
    assert_same_weights(one, resumed)
    np.testing.assert_allclose(resumed_history["loss"], one_history["loss"], rtol=1e-6)
    _assert_no_helpers_left_beyond(before)


@pytest.mark.parametrize("use_multiprocessing", [False, True], ids=["threads", "processes"])
def test_an_error_in_a_pydatasets_getitem_on_its_workers_surfaces_from_kfit_fit(use_multiprocessing):
    """An exception raised in ``__getitem__`` on a worker thread or process reaches the caller of kfit.fit with its
    message, as the one model.fit raises (on TensorFlow both wrap it in tf.data's error), and the workers are ended."""
    x, y = regression_data(64)

    def train(loop):
        model = compiled(mlp())
        dataset = SlowDataset(x, y, fail_at=5, workers=3, use_multiprocessing=use_multiprocessing)
        fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
        with pytest.raises(Exception, match="cannot decode image 5") as raised:
            fit(dataset, epochs=2, verbose=0)
        return type(raised.value)

    expected = train("model.fit")
    before = _helpers_left()
    assert train("kfit.fit") is expected
    _assert_no_helpers_left_beyond(before)


def test_a_callback_that_changes_a_generator_as_each_epoch_begins_trains_as_in_model_fit(tmp_path):
    """A curriculum over a generator read on across epochs (``steps_per_epoch``): a callback sets the scale of the
    rows the generator yields as each epoch begins. kfit read each epoch's first batch ahead, before the callback had
    run (JAX, PyTorch: one batch, weights 0.017 and 0.03 off model.fit's; TensorFlow: three, through tf.data's
    prefetches, where model.fit's own prefetch reads one). Now every batch is made when model.fit makes it, relative to
    the callbacks (on TensorFlow: one ahead, where model.fit's AUTOTUNE prefetch reads one, or more on a busy machine),
    the weights are model.fit's, and a run resumed in its second epoch ends as the uninterrupted one
    (JAX, PyTorch; on TensorFlow, where model.fit's prefetch makes each epoch's first batch before the callbacks'
    ``on_epoch_begin``, the resumed run makes the batch after the epoch it resumed in after them: the README says so).
    """
    x, y = regression_data(64)

    def train(loop, **extra):
        keras.utils.set_random_seed(4)
        model = compiled(mlp())
        state = {"scale": 1.0, "events": []}

        def batches():
            for i in itertools.count():
                rows = slice(i % 4 * 16, i % 4 * 16 + 16)
                state["events"].append(("batch", i % 4, state["scale"]))
                yield x[rows] * state["scale"], y[rows]

        class Curriculum(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                state["scale"] = 1.0 + epoch
                state["events"].append(("epoch", epoch))

        fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
        history = fit(batches(), steps_per_epoch=4, epochs=3, verbose=0,
                      callbacks=[Curriculum(), *extra.pop("callbacks", [])], **extra)
        return model, history, state["events"]

    expected, expected_history, expected_events = train("model.fit")
    looped, history, events = train("kfit.fit")
    tensorflow = keras.backend.backend() == "tensorflow"
    ahead = [sum(e[0] == "batch" for e in events[:events.index(("epoch", epoch))]) - 4 * epoch for epoch in (1, 2)]
    expected_ahead = [sum(e[0] == "batch" for e in expected_events[:expected_events.index(("epoch", epoch))])
                      - 4 * epoch for epoch in (1, 2)]
    # model.fit reads none ahead on PyTorch, and on JAX where Keras's loop hands its step no batch read ahead (Keras 3.15
    # on CPU); one on JAX elsewhere (Keras 3.10-3.14, where kfit read two): kfit reads as many. On TensorFlow its
    # AUTOTUNE prefetch reads one, or more on a busy machine: kfit reads one there, never more than model.fit.
    assert ahead == ([1, 1] if tensorflow else expected_ahead), (ahead, expected_ahead)
    assert all(a <= b for a, b in zip(ahead, expected_ahead)), (ahead, expected_ahead)
    assert ("batch", 0, 2.0) in events  # (the callback's scale reached a batch)
    if events == expected_events or not tensorflow:
        assert events == expected_events
        assert_same_weights(expected, looped)
        np.testing.assert_allclose(history.history["loss"], expected_history.history["loss"], rtol=1e-6)
    path = tmp_path / "run.ckpt"
    train("kfit.fit", max_samples=64 + 32, callbacks=[kfit.callbacks.Checkpoint(path)])
    resumed, resumed_history, _ = train("kfit.fit", callbacks=[kfit.callbacks.Checkpoint(path)])
    np.testing.assert_allclose(resumed_history.history["loss"][:2], history.history["loss"][:2], rtol=1e-6)
    if tensorflow:
        return  # (the epoch after the resumed one begins on a batch made after the callback: see the docstring)
    assert_same_weights(looped, resumed)
    np.testing.assert_allclose(resumed_history.history["loss"], history.history["loss"], rtol=1e-6)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="string tensors are TensorFlow's (README)")
def test_validation_split_of_a_string_tensor_trains_as_in_model_fit():
    """``validation_split`` on a ``tf.string`` tensor (a model that vectorizes text itself): kfit converted the tensor
    to NumPy before it split it, and Keras's adapter refused the validation part, a NumPy object array ("Invalid dtype:
    object"), where model.fit trains. Now it is split as given: the same weights and history as model.fit's, also on
    kfit's route through Keras's own adapter (``steps_per_epoch``)."""
    import tensorflow as tf

    words = ["red", "green", "blue", "cyan"]
    rows = np.random.default_rng(0).integers(0, 4, size=(64, 2))
    x = tf.constant([[" ".join(words[i] for i in row)] for row in rows])
    y = (rows[:, :1] % 2).astype("float32")

    def train(loop, **options):
        keras.utils.set_random_seed(6)
        inputs = keras.Input((1,), dtype="string")
        hot = keras.layers.TextVectorization(vocabulary=words, output_mode="multi_hot")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(hot))
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy")
        fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
        history = fit(x, y, batch_size=16, epochs=2, shuffle=False, validation_split=0.25, verbose=0, **options)
        return model, history

    for options in ({}, {"steps_per_epoch": 2}):
        expected, expected_history = train("model.fit", **options)
        looped, history = train("kfit.fit", **options)
        assert_same_weights(expected, looped)
        assert history.history.keys() == expected_history.history.keys()
        for key, values in expected_history.history.items():
            np.testing.assert_allclose(history.history[key], values, rtol=1e-6)


@pytest.mark.parametrize("form", ["str 1-D", "str 2-D", "object of str 1-D", "object of str 2-D", "bytes 1-D"])
def test_text_as_numpy_arrays_trains_or_is_refused_as_in_model_fit(form):
    """Text in NumPy arrays, for a model that looks its words up itself: model.fit refuses every such array ("Invalid
    dtype: str32"), except on TensorFlow a 1-D object array of Python str (Keras makes it a tf.string tensor). kfit's
    own loop read them all on TensorFlow (training where model.fit refuses) and failed at the first step on JAX with
    JAX's TypeError. Now it trains to the same weights where model.fit trains and refuses with a ValueError naming
    Keras's reason where model.fit refuses."""
    words = np.array(["red", "green", "blue", "cyan"])[np.random.default_rng(0).integers(0, 4, size=24)]
    x = {"str": words, "object of str": words.astype(object), "bytes": words.astype(bytes)}[form.rsplit(" ", 1)[0]]
    x = x[:, None] if form.endswith("2-D") else x
    y = (words == "red").astype("float32")[:, None]

    def train(loop):
        keras.utils.set_random_seed(6)
        inputs = keras.Input(x.shape[1:], dtype="string")
        hot = keras.layers.StringLookup(vocabulary=["red", "green", "blue"], output_mode="one_hot")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(hot)))
        model.compile(optimizer="sgd", loss="mse")
        fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
        return model, fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)

    try:
        expected, expected_history = train("model.fit")
    except ValueError as refusal:
        assert str(refusal).startswith("Invalid dtype:")
        with pytest.raises(ValueError, match=f"Invalid value for argument `x`: .*\\({refusal}\\)"):
            train("kfit.fit")
        return
    assert keras.backend.backend() == "tensorflow" and form == "object of str 1-D"
    looped, history = train("kfit.fit")
    assert_same_weights(expected, looped)
    np.testing.assert_allclose(history.history["loss"], expected_history.history["loss"], rtol=1e-6)


class ValidationSteps(keras.callbacks.Callback):
    """Counts the steps of each validation."""

    def __init__(self):
        super().__init__()
        self.steps: list[int] = []

    def on_test_begin(self, logs=None):
        self.steps.append(0)

    def on_test_batch_end(self, batch, logs=None):
        self.steps[-1] += 1


@pytest.mark.parametrize("batch_size", [None, 8, "validation_batch_size"])
def test_validation_of_a_run_on_a_pydataset_takes_the_minibatch_size_model_fit_takes(batch_size):
    """``model.fit`` validates in ``validation_batch_size or batch_size`` (None: Keras's 32), never in the training
    PyDataset's own batch size: kfit's loop validated 70 rows in 9 steps of the dataset's 8 where model.fit takes 3
    steps of 32 (what every ``on_test_batch_*`` callback counts, and the validation losses' rounding)."""
    x, y = regression_data(48)
    validation = regression_data(70, seed=3)
    options = {"validation_batch_size": 20} if batch_size == "validation_batch_size" else {"batch_size": batch_size}

    def train(loop):
        keras.utils.set_random_seed(4)
        model = compiled(mlp())
        steps = ValidationSteps()
        fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
        history = fit(ReshufflingDataset(x, y, 8), epochs=2, shuffle=False, verbose=0, validation_data=validation,
                      callbacks=[steps], **options)
        return model, history, steps.steps

    expected, expected_history, expected_steps = train("model.fit")
    looped, history, steps = train("kfit.fit")
    assert steps == expected_steps == {None: [3, 3], 8: [9, 9], "validation_batch_size": [4, 4]}[batch_size]
    assert_same_weights(expected, looped)
    assert history.history == expected_history.history


@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit"])
def test_validation_data_that_runs_out_before_validation_steps_is_reported_as_under_model_fit(loop):
    """Keras warns "Your input ran out of data" when the validation data ends before ``validation_steps``: kfit's loop
    silenced that warning with its own (an epoch kfit ends early), so a user never learnt that each validation ran
    4 steps, not 10. Only the training iterator's is kfit's to silence."""
    x, y = regression_data(48)
    validation = regression_data(20, seed=3)
    keras.utils.set_random_seed(4)
    model = compiled(mlp())
    fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, validation_data=validation, validation_steps=10,
            validation_batch_size=5)
    assert sum("Your input ran out of data" in str(w.message) for w in caught) == 2  # one per validation


@pytest.mark.parametrize("stop_at", [24, 48])  # inside the first epoch; at its end
def test_an_unseeded_dropout_draws_what_it_draws_under_model_fit_also_after_a_resume(backend, tmp_path, stop_at):
    # On PyTorch an unseeded Dropout draws from torch's default generator, which Keras's loop also draws from as it
    # opens each pass over its DataLoader: kfit's stream makes the same draws (the masks differed before).
    x, y = regression_data(48)

    def model():
        keras.utils.set_random_seed(4)
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dropout(0.5), keras.layers.Dense(1)])
        return compiled(m)

    options = dict(batch_size=8, epochs=2, shuffle=False, verbose=0, validation_data=(x[:16], y[:16]))
    under_model_fit = model()
    expected = under_model_fit.fit(x, y, **options).history
    under_kfit = model()
    history = kfit.fit(under_kfit, x, y, seed=0, **options).history
    assert history.keys() == expected.keys()
    for key in expected:
        np.testing.assert_allclose(history[key], expected[key], rtol=1e-5, err_msg=key)
    assert_same_weights(under_model_fit, under_kfit)

    path = tmp_path / "run.ckpt"
    kfit.fit(model(), x, y, seed=0, max_samples=stop_at, callbacks=[kfit.callbacks.Checkpoint(path)], **options)
    resumed = model()
    if backend == "torch":
        import torch

        torch.rand(7)  # the resumed process has drawn from torch's generator before training: the checkpoint's counts
    kfit.fit(resumed, x, y, seed=0, callbacks=[kfit.callbacks.Checkpoint(path)], **options)
    assert_same_weights(under_model_fit, resumed)


def test_a_checkpoint_at_the_first_epochs_last_step_of_a_generator_keeps_that_epoch_in_the_resumed_history(tmp_path):
    # An endless generator with steps_per_epoch: kfit learns the epoch's samples only as it ends. A checkpoint at its
    # last step was written as one "48 samples into epoch 1", and the resumed run's History (and CSVLogger) lacked it.
    x, y = regression_data(48)

    def batches():
        while True:
            for i in range(0, 48, 16):
                yield x[i:i + 16], y[i:i + 16]

    def model():
        keras.utils.set_random_seed(1)
        return compiled(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]))

    class Crash(keras.callbacks.Callback):  # in the second epoch's first step, after the checkpoint at step 3
        steps = 0

        def on_train_batch_end(self, batch, logs=None):
            Crash.steps += 1
            if Crash.steps == 4:
                raise KeyboardInterrupt

    options = dict(steps_per_epoch=3, epochs=3, verbose=0)
    expected = kfit.fit(model(), batches(), max_samples=10**6, **options).history
    path, csv = tmp_path / "run.ckpt", tmp_path / "log.csv"
    with pytest.raises(KeyboardInterrupt):
        kfit.fit(model(), batches(), callbacks=[kfit.callbacks.Checkpoint(path, frequency="3mb"),
                                                keras.callbacks.CSVLogger(csv, append=True), Crash()], **options)
    history = kfit.fit(model(), batches(), callbacks=[kfit.callbacks.Checkpoint(path, frequency="3mb"),
                                                      keras.callbacks.CSVLogger(csv, append=True)], **options).history
    assert len(history["loss"]) == 3
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-6)
    assert [line.split(",")[0] for line in csv.read_text().splitlines()[1:]] == ["0", "1", "2"]


@pytest.mark.parametrize("optimizer", ["MomentumSGD", "Adam"])
def test_under_mixed_float16_kfits_schedules_set_the_wrapped_optimizer_and_a_resume_keeps_the_loss_scale(
        optimizer, tmp_path):
    """Under the ``mixed_float16`` policy ``model.compile`` wraps the optimizer in a ``LossScaleOptimizer``: kfit.fit
    trains as model.fit, a resume restores the loss scale (fallen from 2**15 here: without it the resumed run skips
    steps), and ``MomentumSchedule`` finds the inner optimizer's variable (it looked for ``beta_1`` on the wrapper,
    and refused ``kfit.optimizers.Adam`` as having no ``momentum``)."""
    x, y = regression_data(48)
    y = 30 * y  # gradients that overflow float16 at the first loss scales

    def model():
        keras.config.set_dtype_policy("mixed_float16")
        try:
            return compiled(mlp(), optimizer=getattr(kfit.optimizers, optimizer)(learning_rate=0.0))
        finally:
            keras.config.set_dtype_policy("float32")

    def schedules():
        return [kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(1e-4)),
                kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant([40, 100], epoch_size=48))]

    def fit(model, *callbacks, **options):
        kfit.fit(model, x, y, batch_size=8, epochs=3, shuffle=False, seed=0, verbose=0,
                 callbacks=[*schedules(), *callbacks], **options)
        return model

    under_model_fit = model()
    under_model_fit.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0,
                        callbacks=[kfit.callbacks.SampleClock(batch_size=8, num_samples=48), *schedules()])
    uninterrupted = fit(model())
    assert type(uninterrupted.optimizer).__name__ == "LossScaleOptimizer"
    assert_same_weights(under_model_fit, uninterrupted)
    inner = uninterrupted.optimizer.inner_optimizer
    momentum = inner.momentum if optimizer == "MomentumSGD" else inner.beta_1
    assert float(keras.ops.convert_to_numpy(momentum)) == pytest.approx(np.exp(-8 / 100))
    assert float(keras.ops.convert_to_numpy(uninterrupted.optimizer.dynamic_scale)) < 2.0**15
    path = tmp_path / "run.ckpt"
    with pytest.raises(RuntimeError, match="crash"):
        fit(model(), kfit.callbacks.Checkpoint(path, frequency=8, async_write=False), CrashAtStep(7))
    resumed = fit(model(), kfit.callbacks.Checkpoint(path, frequency=8, async_write=False))
    assert_same_weights(uninterrupted, resumed)
    for a, b in zip(uninterrupted.optimizer.variables, resumed.optimizer.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), err_msg=a.path)


def test_gradient_accumulation_trains_as_in_model_fit_and_resumes_exactly_mid_accumulation(tmp_path):
    """Keras's ``gradient_accumulation_steps=3`` over epochs of 5 steps: kfit's loop updates where model.fit does, and
    a run killed after its 7th step (one step into an accumulation) resumes with that step's gradients accumulated."""
    x, y = regression_data(40)

    def model():
        return compiled(mlp(), optimizer=keras.optimizers.SGD(0.05, momentum=0.9, gradient_accumulation_steps=3))

    def fit(model, *callbacks):
        kfit.fit(model, x, y, batch_size=8, epochs=3, shuffle=False, seed=0, verbose=0, callbacks=list(callbacks))
        return model

    under_model_fit = model()
    under_model_fit.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    uninterrupted = fit(model())
    assert_same_weights(under_model_fit, uninterrupted)
    path = tmp_path / "run.ckpt"
    with pytest.raises(RuntimeError, match="crash"):
        fit(model(), kfit.callbacks.Checkpoint(path, frequency=8, async_write=False), CrashAtStep(7))
    checkpoint = kfit.callbacks.Checkpoint(path, frequency=8, async_write=False)
    resumed = fit(model(), checkpoint)
    assert checkpoint.restored_from.samples == 56  # 7 steps: 2 updates, and 1 step accumulated
    assert_same_weights(uninterrupted, resumed)
    for a, b in zip(uninterrupted.optimizer.variables, resumed.optimizer.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), err_msg=a.path)
