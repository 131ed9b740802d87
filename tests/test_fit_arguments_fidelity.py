"""Each of ``model.fit``'s arguments keeps its meaning under ``kfit.fit(..., seed=0)`` with a ``Checkpoint``, and a run
killed and resumed from that checkpoint ends as the uninterrupted one.

A Keras user adds ``seed=0`` and a ``kfit.callbacks.Checkpoint`` to a working ``model.fit`` call; with
``shuffle=False`` kfit's stream reads the minibatches ``model.fit`` reads, so the History (keys and values, the
``val_`` ones and the per-output losses included) and the weights must be ``model.fit``'s, also after a kill:
between two training steps, or in the middle of an epoch's validation (the checkpoint then holds the epoch's last
step, and the resumed run validates that epoch again).
"""

import functools

import keras
import numpy as np
import pytest
from helpers import Kill, assert_same_weights

import kfit

N, STEPS = 60, 5  # minibatches of 8: 7 and a remainder of 4 an epoch
rng = np.random.default_rng(0)
X = rng.normal(size=(N, 4)).astype("float32")
Y = (X @ rng.normal(size=(4, 1))).astype("float32")
LABELS = X[:, :3].argmax(axis=1)
WEIGHTS = rng.uniform(0.2, 2.0, size=N).astype("float32")
SEQUENCES = rng.integers(1, 9, size=(N, STEPS))
SEQUENCES[:, 3:][rng.uniform(size=(N, 2)) < 0.5] = 0  # padded tails, masked by the Embedding
X_VAL, Y_VAL = X[:20] + 0.5, Y[:20] - 0.5
VAL_WEIGHTS = WEIGHTS[::-1][:20].copy()


def mlp(outputs=1, activation=None, **compile_options):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(outputs, activation=activation)])
    model.compile(**{"optimizer": keras.optimizers.SGD(0.05, momentum=0.9), "loss": "mse", **compile_options})
    return model


def two_outputs():
    keras.utils.set_random_seed(1)
    a, b = keras.Input((4,), name="a"), keras.Input((2,), name="b")
    hidden = keras.layers.Dense(6, activation="tanh")(keras.layers.Concatenate()([a, b]))
    outputs = {"value": keras.layers.Dense(1, name="value")(hidden),
               "label": keras.layers.Dense(3, activation="softmax", name="label")(hidden)}
    model = keras.Model({"a": a, "b": b}, outputs)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss={"value": "mse", "label": "sparse_categorical_crossentropy"},
                  metrics={"value": ["mae"], "label": ["accuracy"]}, loss_weights={"value": 0.3, "label": 2.0})
    return model


def masked_gru():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((STEPS,)), keras.layers.Embedding(10, 4, mask_zero=True),
                              keras.layers.GRU(3), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return model


class ActivityPenalty(keras.layers.Layer):
    def call(self, x):
        self.add_loss(0.01 * keras.ops.mean(keras.ops.square(x)))
        return x


def with_add_loss():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), ActivityPenalty(),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse", metrics=["mae"],
                  weighted_metrics=["mse"])
    return model


class ValidationSet(keras.utils.PyDataset):
    def __init__(self, batch_size=6):
        super().__init__()
        self.batch_size = batch_size

    def __len__(self):
        return -(-len(X_VAL) // self.batch_size)

    def __getitem__(self, index):
        rows = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return X_VAL[rows], Y_VAL[rows], VAL_WEIGHTS[rows]


CASES = {  # name: (model, model.fit's arguments); every case validates at the end of the first epoch
    "validation_data (x, y, sample_weight), validation_freq": (mlp, dict(
        epochs=4, validation_data=(X_VAL, Y_VAL, VAL_WEIGHTS), validation_freq=2, validation_batch_size=6)),
    "validation_split, sample_weight": (with_add_loss, dict(validation_split=0.25, sample_weight=WEIGHTS)),
    "class_weight, validation_split": (functools.partial(mlp, 3, "softmax", loss="sparse_categorical_crossentropy",
                                                        metrics=["accuracy"]),
                                       dict(y=LABELS, class_weight={0: 0.5, 1: 2.0}, validation_split=0.25)),
    "dict x and y, loss_weights": (two_outputs, dict(
        x={"a": X, "b": X[:, :2]}, y={"value": Y, "label": LABELS},
        validation_data=({"a": X_VAL, "b": X_VAL[:, :2]}, {"value": Y_VAL, "label": LABELS[:20]}))),
    "masked GRU, PyDataset validation_data, validation_steps": (masked_gru, dict(
        x=SEQUENCES, validation_data=ValidationSet, validation_steps=2)),
    # Epochs of 20 rows in sweeps of 60: model.fit's epoch 1 reads from the first row, kfit's stream read from row 20
    # (its clock's sample) before 2026-12-07 (loss [2.54, 1.45, 1.56, 1.02] for model.fit's [2.47, 1.26, 2.11, 2.35]).
    "initial_epoch, steps_per_epoch": (mlp, dict(
        epochs=5, initial_epoch=1, batch_size=4, steps_per_epoch=5, validation_data=(X_VAL, Y_VAL))),
}


def train(case, loop, path=None, kill=None):
    build, options = CASES[case]
    options = {"x": X, "y": Y, "batch_size": 8, "epochs": 3, **options}
    if isinstance(options.get("validation_data"), type):
        options["validation_data"] = options["validation_data"]()
    model = build()
    callbacks = [] if path is None else [kfit.callbacks.Checkpoint(path, frequency="1mb", async_write=False)]
    callbacks += [] if kill is None else [Kill(*kill)]
    fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
    return model, fit(shuffle=False, verbose=0, callbacks=callbacks, **options)


@pytest.mark.parametrize("kill", [("on_train_batch_begin", 10), ("on_test_batch_begin", 1)],
                         ids=["between steps of the second epoch", "in the first epoch's validation"])
@pytest.mark.parametrize("case", list(CASES))
def test_kfit_fit_with_a_checkpoint_trains_as_model_fit_and_a_killed_run_resumes_to_it(case, kill, tmp_path):
    expected, expected_history = train(case, "model.fit")
    with pytest.raises(RuntimeError, match="killed"):
        train(case, "kfit.fit", tmp_path / "run.ckpt", kill)
    resumed, history = train(case, "kfit.fit", tmp_path / "run.ckpt")
    assert history.epoch == expected_history.epoch
    assert sorted(history.history) == sorted(expected_history.history)
    assert any(key.startswith("val_") for key in history.history)
    assert history.history == expected_history.history
    assert_same_weights(expected, resumed)
