"""Small models and data shared by the tests."""

from __future__ import annotations

import keras
import numpy as np


def regression_data(n: int = 64, features: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    w = rng.normal(size=(features, 1)).astype("float32")
    y = (x @ w + 0.1 * rng.normal(size=(n, 1))).astype("float32")
    return x, y


def classification_data(n: int = 64, features: int = 4, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    y = (x[:, :classes].argmax(axis=1)).astype("int64")
    return x, y


def mlp(features: int = 4, outputs: int = 1, hidden: int = 8, dropout: float = 0.0, seed: int = 1) -> keras.Model:
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((features,)), keras.layers.Dense(hidden, activation="tanh")]
    if dropout:
        layers.append(keras.layers.Dropout(dropout, seed=seed))
    layers.append(keras.layers.Dense(outputs))
    return keras.Sequential(layers)


def weights(model: keras.Model) -> list[np.ndarray]:
    return [keras.ops.convert_to_numpy(v) for v in model.weights]


def assert_same_weights(a: keras.Model, b: keras.Model) -> None:
    wa, wb = weights(a), weights(b)
    assert len(wa) == len(wb)
    for x, y in zip(wa, wb):
        np.testing.assert_array_equal(x, y)


class BatchSamples(keras.metrics.Metric):
    """Counts the samples the compiled train step actually received (its running total per epoch)."""

    def __init__(self, name: str = "batch_samples", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(keras.ops.sum(keras.ops.ones_like(keras.ops.cast(y_pred[:, 0], "float32"))))

    def result(self):
        return keras.ops.convert_to_tensor(self.total)


class StepRecorder(keras.callbacks.Callback):
    """Records, after every step, the optimizer's hyperparameters and the samples the step trained."""

    def __init__(self, names=("learning_rate",)):
        super().__init__()
        self.names = names
        self.rows: list[dict] = []
        self._last_total = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._last_total = 0.0

    def on_train_batch_end(self, batch, logs=None):
        model = self.model  # syncs the state on JAX: fine in a test
        row = {name: float(keras.ops.convert_to_numpy(getattr(model.optimizer, name))) for name in self.names}
        if logs and "batch_samples" in logs:
            total = float(keras.ops.convert_to_numpy(logs["batch_samples"]))
            row["size"] = int(round(total - self._last_total))
            self._last_total = total
        self.rows.append(row)


class Kill(keras.callbacks.Callback):
    """Raises the ``at``-th time ``hook`` is called (counted from 0)."""

    def __init__(self, hook: str, at: int):
        super().__init__()
        self.at, self.calls = at, 0
        setattr(self, hook, self._count)

    def _count(self, *args, **kwargs):
        if self.calls == self.at:
            raise RuntimeError("killed")
        self.calls += 1
