"""Adding kfit's callbacks to a plain ``model.fit`` changes nothing Keras did beyond what they add: the History
(keys, values, ``params``, ``epoch``), the weights, ``model.evaluate`` / ``model.predict`` afterwards, a second
``model.fit`` with the same callback objects, Keras's own callbacks, and the warnings Keras gives.

Every minibatch is full (48 rows in minibatches of 8, or 36 after ``validation_split`` in minibatches of 6), so that
a constant per-sample rate of the optimizer's rate / minibatch size keeps the weights exactly Keras's."""

import warnings

import keras
import numpy as np
import pytest

import kfit

N, LR = 48, 0.05
rng = np.random.default_rng(0)
X = rng.normal(size=(N, 4)).astype("float32")
Y = (X @ rng.normal(size=(4, 1))).astype("float32")
LABELS = X[:, :3].argmax(axis=1)
WEIGHTS = rng.uniform(0.2, 2.0, size=N).astype("float32")
X_VAL, Y_VAL = X[:16] + 0.5, Y[:16] - 0.5


class Batches(keras.utils.PyDataset):
    def __len__(self):
        return N // 8

    def __getitem__(self, index):
        return X[index * 8:(index + 1) * 8], Y[index * 8:(index + 1) * 8]


CASES = {  # name: model.fit's arguments (batch_size 8, 2 epochs, shuffle=False unless given)
    "plain": {},
    "validation_split": dict(validation_split=0.25, batch_size=6),
    "validation_freq=2": dict(validation_data=(X_VAL, Y_VAL), validation_freq=2, epochs=4),
    "class_weight": dict(y=LABELS, class_weight={0: 0.5, 1: 2.0, 2: 1.0}),
    "sample_weight": dict(sample_weight=WEIGHTS),
    "initial_epoch=1": dict(initial_epoch=1, epochs=4),
    "steps_per_epoch": dict(steps_per_epoch=3, epochs=3),
    "shuffle": dict(shuffle=True),
    "PyDataset": dict(x=Batches(), y=None, batch_size=None),
    "keras EarlyStopping": dict(validation_data=(X_VAL, Y_VAL), epochs=6, early_stop=True),
}
KFIT = ["ProgressPrinter", "CSVHistory", "TensorBoardProgressWriter", "EarlyStopping", "ReduceLROnPlateau"]


def train(case, tmp_path, kfit_callbacks):
    options = {"x": X, "y": Y, "batch_size": 8, "epochs": 2, "shuffle": False, **CASES[case]}
    early_stop = options.pop("early_stop", False)
    keras.utils.set_random_seed(1)
    labels = options["y"] is LABELS
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(3 if labels else 1, activation="softmax" if labels else None)])
    model.compile(optimizer=keras.optimizers.SGD(LR), metrics=["accuracy" if labels else "mae"],
                  loss="sparse_categorical_crossentropy" if labels else "mse")
    callbacks = [keras.callbacks.CSVLogger(str(tmp_path / f"keras{kfit_callbacks is None}.csv"))]
    callbacks += [keras.callbacks.EarlyStopping(min_delta=10, patience=1)] if early_stop else []
    if kfit_callbacks is not None:
        size = options["batch_size"] or 8
        steps = options.get("steps_per_epoch")
        samples = steps * size if steps else int(N * (1 - options.get("validation_split", 0)))
        callbacks = [kfit.callbacks.SampleClock(batch_size=size, num_samples=samples),
                     kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(LR / size))] + [
            {"ProgressPrinter": lambda: kfit.callbacks.ProgressPrinter(freq=2),
             "CSVHistory": lambda: kfit.callbacks.CSVHistory(tmp_path / "kfit.csv"),
             "TensorBoardProgressWriter": lambda: kfit.callbacks.TensorBoardProgressWriter(tmp_path / "tb"),
             "EarlyStopping": lambda: kfit.callbacks.EarlyStopping(monitor="loss", patience=100),
             "ReduceLROnPlateau": lambda: kfit.callbacks.ReduceLROnPlateau(monitor="loss", patience=100),
             }[name]() for name in kfit_callbacks] + callbacks
    if options["shuffle"]:
        keras.utils.set_random_seed(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = [model.fit(callbacks=callbacks, verbose=0, **options) for _ in range(2)]
        evaluated = model.evaluate(X_VAL, Y_VAL if not labels else LABELS[:16], verbose=0)
        predicted = model.predict(X_VAL, verbose=0)
    return dict(histories=[(r.epoch, r.params, r.history) for r in runs], returned=runs[-1] is model.history,
                stop=model.stop_training, weights=model.get_weights(), evaluated=evaluated, predicted=predicted,
                warnings=sorted({f"{w.category.__name__}: {w.message}" for w in caught}),
                csv=open(tmp_path / f"keras{kfit_callbacks is None}.csv").read())


@pytest.mark.parametrize("case", list(CASES))
def test_kfit_callbacks_change_nothing_model_fit_did(case, tmp_path, capsys):
    expected = train(case, tmp_path, None)
    got = train(case, tmp_path, KFIT if case in ("plain", "validation_split", "initial_epoch=1") else [])
    for (epoch, params, history), (want_epoch, want_params, want_history) in zip(got["histories"],
                                                                               expected["histories"]):
        assert (epoch, params) == (want_epoch, want_params)
        assert set(history) - set(want_history) == {"lr", "learning_rate"}  # what the schedule adds
        for key, values in want_history.items():
            np.testing.assert_allclose(history[key], values, rtol=1e-5, atol=1e-7, err_msg=key)
    assert (got["returned"], got["stop"]) == (expected["returned"], expected["stop"])
    for a, b in zip(got["weights"], expected["weights"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got["evaluated"], expected["evaluated"], rtol=1e-5)
    np.testing.assert_allclose(got["predicted"], expected["predicted"], rtol=1e-5, atol=1e-7)
    assert got["warnings"] == expected["warnings"]
    # Keras's CSVLogger: the same rows, with the schedule's columns added
    rows = [line.split(",") for line in got["csv"].splitlines()]
    want = [line.split(",") for line in expected["csv"].splitlines()]
    kept = [rows[0].index(name) for name in want[0]]
    assert [[r[i] for i in kept] for r in rows] == want


def test_cross_validation_under_model_fit_gives_the_warnings_keras_validation_gives():
    """kfit's CrossValidation saves the training metrics' state around its evaluation: its reads of Keras variables
    gave NumPy 2's DeprecationWarning (``__array__`` without ``copy=``) on TensorFlow and JAX, which validation by
    model.fit does not."""

    def warnings_of(callbacks, **validation):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse", metrics=["mae"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = model.fit(X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=callbacks,
                                **validation)
        return sorted({f"{w.category.__name__}: {w.message}" for w in caught}), history.history["val_loss"]

    expected, expected_loss = warnings_of([], validation_data=(X_VAL, Y_VAL))
    got, loss = warnings_of([kfit.callbacks.SampleClock(batch_size=8, num_samples=N),
                             kfit.callbacks.CrossValidation((X_VAL, Y_VAL), frequency="1ep")])
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
    assert got == expected
