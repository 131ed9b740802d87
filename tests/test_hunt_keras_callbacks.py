"""Keras's compile options and Keras's own callbacks under kfit's loop: what ``model.fit`` gives, ``kfit.fit(...,
seed=0)`` with a ``Checkpoint`` gives (History, weights, the callbacks' calls, files, what they print), and a run
killed in the middle of an epoch and resumed from its checkpoint ends as the uninterrupted one, bit for bit.

Checked exact on TensorFlow, JAX and PyTorch when this file was written: ``run_eagerly=True``, ``jit_compile=False``,
``steps_per_execution=2``; a two-output model with dict losses, ``loss_weights``, per-output ``metrics`` and
``weighted_metrics`` and sample weights; ``ModelCheckpoint(save_freq=<batches>)``, ``TensorBoard(update_freq=<batches>)``
and ``EarlyStopping(restore_best_weights=True, start_from_epoch=...)`` across a kill; ``validation_freq=[1, 3]``; the
returned History is ``model.history``; ``model.stop_training`` after the run. Found different: the resumed epoch's
replayed ``on_epoch_begin`` had ``LearningRateScheduler(verbose=1)`` print a rate it did not keep; a checkpoint written at
an epoch's end with ``SwapEMAWeights(swap_on_epoch=True)`` resumed from the moving averages as the trained weights.
"""

import contextlib
import functools
import io

import keras
import numpy as np
import pytest
from helpers import Kill, assert_same_weights, mlp, regression_data

import kfit

x, y = regression_data(40)  # minibatches of 8: 5 an epoch
VALIDATION = regression_data(16, seed=3)
LABELS = np.random.default_rng(0).integers(0, 3, size=40)
WEIGHTS = np.random.default_rng(1).uniform(0.2, 2.0, size=40).astype("float32")


class Calls(keras.callbacks.Callback):
    """Records every hook called, with its batch or epoch and the keys of its logs."""

    def __init__(self):
        super().__init__()
        self.calls = []
        for hook in ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_test_begin",
                     "on_test_end", "on_train_batch_begin", "on_train_batch_end", "on_test_batch_begin",
                     "on_test_batch_end"):
            setattr(self, hook, functools.partial(self._record, hook))

    def _record(self, hook, *args, logs=None):
        *number, logs = args if args and isinstance(args[-1], dict) else (*args, logs)
        self.calls.append((hook, *number, sorted(logs or {})))


def build(**compile_options):
    model = mlp()
    model.compile(**{"optimizer": keras.optimizers.SGD(0.05, momentum=0.9), "loss": "mse", "metrics": ["mae"],
                     **compile_options})
    return model


def two_outputs(**compile_options):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(6, activation="tanh")(inputs)
    model = keras.Model(inputs, {"value": keras.layers.Dense(1, name="value")(hidden),
                                 "label": keras.layers.Dense(3, activation="softmax", name="label")(hidden)})
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss={"value": "mse", "label": "sparse_categorical_crossentropy"},
                  metrics={"value": ["mae"], "label": ["accuracy"]},
                  weighted_metrics={"value": ["mse"], "label": ["accuracy"]}, loss_weights={"value": 0.3, "label": 2.0}, **compile_options)
    return model


def train(model, loop, callbacks=(), checkpoint=None, kill=None, frequency="1mb", **options):
    """``model.fit`` or ``kfit.fit(..., seed=0)`` (with a ``Checkpoint`` every minibatch at ``checkpoint``) on the same
    minibatches; None when killed."""
    callbacks = list(callbacks)
    if checkpoint is not None:
        callbacks.append(kfit.callbacks.Checkpoint(checkpoint, frequency=frequency, async_write=False))
    if kill is not None:
        callbacks.append(Kill(*kill))
    options = {"x": x, "y": y, "batch_size": 8, "epochs": 3, "shuffle": False, "verbose": 0,
               "validation_data": VALIDATION, "callbacks": callbacks, **options}
    fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
    try:
        return fit(**options)
    except RuntimeError as error:
        if str(error) != "killed":
            raise
        return None


@pytest.mark.parametrize("compile_options", [{"run_eagerly": True}, {"jit_compile": False},
                                             {"steps_per_execution": 2}], ids=str)
def test_compile_options_train_as_in_model_fit_with_the_same_callback_calls(compile_options, backend):
    if backend == "torch" and "steps_per_execution" in compile_options:
        pytest.skip("Keras's PyTorch trainer refuses steps_per_execution")
    runs = {}
    for loop in ("model.fit", "kfit.fit"):
        model, calls = build(**compile_options), Calls()
        history = train(model, loop, [calls], validation_freq=[1, 3])
        runs[loop] = model, history, calls.calls
    (expected, expected_history, expected_calls), (model, history, calls) = runs.values()
    assert history.history == expected_history.history
    assert [len(values) for values in history.history.values()] == [3, 3, 2, 2]  # val_ in epochs 1 and 3
    assert history.params == expected_history.params
    assert calls == expected_calls
    assert_same_weights(expected, model)
    assert history is model.history and model.stop_training is False


@pytest.mark.parametrize("compile_options", [{}, {"steps_per_execution": 2}], ids=str)
def test_two_outputs_with_loss_weights_and_weighted_metrics_resume_to_model_fits_run(compile_options, backend,
                                                                                     tmp_path):
    if backend == "torch" and compile_options:
        pytest.skip("Keras's PyTorch trainer refuses steps_per_execution")

    def run(loop, **options):
        model = two_outputs(**compile_options)
        history = train(model, loop, y={"value": y, "label": LABELS}, sample_weight=WEIGHTS,
                        validation_data=(VALIDATION[0], {"value": VALIDATION[1], "label": LABELS[:16]}, WEIGHTS[:16]),
                        **options)
        return model, history

    expected, expected_history = run("model.fit")
    assert run("kfit.fit", checkpoint=tmp_path / "run.ckpt", kill=("on_train_batch_begin", 7))[1] is None
    resumed, history = run("kfit.fit", checkpoint=tmp_path / "run.ckpt")
    assert history.history == expected_history.history
    assert {"value_loss", "label_loss", "val_value_loss", "val_label_loss"} <= set(history.history)
    assert_same_weights(expected, resumed)


def _files(folder):
    import h5py

    def datasets(path):
        with h5py.File(path) as file:
            found = []
            file.visititems(lambda name, o: found.append((name, np.asarray(o).tobytes()))
                            if isinstance(o, h5py.Dataset) else None)
            return found
    return {path.name: datasets(path) for path in sorted(folder.glob("*.weights.h5"))}


def _batch_scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    accumulator = EventAccumulator(str(folder / "train"), size_guidance={"tensors": 0})
    accumulator.Reload()
    return {tag: sorted((event.step, float(make_ndarray(event.tensor_proto))) for event in accumulator.Tensors(tag))
            for tag in accumulator.Tags()["tensors"]}  # (sorted: the order of two runs' event files is the names')


@pytest.mark.parametrize("kill", [("on_train_batch_begin", 13), ("on_test_batch_begin", 3)],
                         ids=["in the third epoch", "in the second epoch's validation"])
def test_keras_checkpoint_tensorboard_and_early_stopping_of_a_resumed_run_are_model_fits(kill, tmp_path):
    """``ModelCheckpoint`` every 3 batches (files named by epoch and batch), ``TensorBoard`` every 3 batches,
    ``EarlyStopping`` restoring the best weights from the third epoch on: the files, the event steps, the stop and
    the weights of a run killed and resumed are those of ``model.fit``'s uninterrupted run."""

    def run(folder, loop, **options):
        folder.mkdir(exist_ok=True)
        model = build()
        history = train(model, loop, [
            keras.callbacks.ModelCheckpoint(str(folder / "w-{epoch}-{batch}.weights.h5"), save_weights_only=True,
                                            save_freq=3),
            keras.callbacks.TensorBoard(str(folder / "tb"), update_freq=3, write_graph=False),
            keras.callbacks.EarlyStopping("val_loss", patience=1, min_delta=0.05, restore_best_weights=True,
                                          start_from_epoch=2)], epochs=8, **options)
        return model, history

    expected, expected_history = run(tmp_path / "model.fit", "model.fit")
    assert len(expected_history.epoch) < 8 and expected.stop_training  # EarlyStopping stopped it
    assert run(tmp_path / "kfit", "kfit.fit", checkpoint=tmp_path / "run.ckpt", kill=kill)[1] is None
    resumed, history = run(tmp_path / "kfit", "kfit.fit", checkpoint=tmp_path / "run.ckpt")
    assert history.history == expected_history.history
    assert resumed.stop_training and history is resumed.history
    assert_same_weights(expected, resumed)
    assert _files(tmp_path / "kfit") == _files(tmp_path / "model.fit") != {}
    scalars = _batch_scalars(tmp_path / "model.fit" / "tb")
    assert [step for step, _ in scalars["batch_loss"]] == list(range(3, 5 * len(history.epoch) + 1, 3))
    assert _batch_scalars(tmp_path / "kfit" / "tb") == scalars


def test_a_verbose_learning_rate_scheduler_prints_in_a_resumed_run_what_the_uninterrupted_run_printed_after_it(
        tmp_path):
    """A run resumed in the middle of its third epoch begins that epoch again: Keras's ``LearningRateScheduler``
    steps the restored rate (already stepped for that epoch) a second time, and kfit puts the restored rate back.
    With ``verbose=1`` it printed ``Epoch 3: LearningRateScheduler setting learning rate to 0.0328...``, a rate the
    run never trained with (the uninterrupted run printed 0.03645 there, before the checkpoint): now it prints, as
    the uninterrupted run does after the checkpoint, only the fourth epoch's line."""

    def run(**options):
        model = build()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            history = train(model, "kfit.fit", [keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate * 0.9,
                                                                                      verbose=1)], epochs=4, **options)
        return model, history, [line for line in out.getvalue().splitlines() if line]

    expected, expected_history, expected_lines = run()
    assert run(checkpoint=tmp_path / "run.ckpt", kill=("on_train_batch_begin", 13))[1] is None
    resumed, history, lines = run(checkpoint=tmp_path / "run.ckpt")
    assert [line.split(" to ")[0] for line in expected_lines] == [
        f"Epoch {epoch}: LearningRateScheduler setting learning rate" for epoch in range(1, 5)]
    assert lines == expected_lines[3:]
    assert history.history == expected_history.history
    assert_same_weights(expected, resumed)


@pytest.mark.parametrize("frequency", ["1ep", "1mb"])
@pytest.mark.parametrize("kill", [("on_epoch_begin", 2), ("on_train_batch_begin", 7)],
                         ids=["as the third epoch begins", "in the second epoch"])
def test_swap_ema_weights_on_epoch_resumes_to_model_fits_run(kill, frequency, tmp_path):
    """``SwapEMAWeights(swap_on_epoch=True)`` swaps the moving averages into the model at each epoch's end and back at
    the next epoch's begin. A checkpoint written at an epoch's end after it (``frequency="1ep"``, or a kill as the next
    epoch begins) held the averages as the model's weights and the trained weights as the averages; the resumed run
    did not swap them back (a new callback thinks the trained weights are in the model) and trained on from the
    averages. The checkpoint now keeps where the averages are."""

    def run(loop, **options):
        model = mlp()
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9, use_ema=True, ema_momentum=0.5), loss="mse")
        return model, train(model, loop, [keras.callbacks.SwapEMAWeights(swap_on_epoch=True)], epochs=4,
                            frequency=frequency, **options)

    expected, expected_history = run("model.fit")
    assert run("kfit.fit", checkpoint=tmp_path / "run.ckpt", kill=kill)[1] is None
    resumed, history = run("kfit.fit", checkpoint=tmp_path / "run.ckpt")
    assert history.history == expected_history.history
    assert_same_weights(expected, resumed)
