"""What the horovodrun scripts and tests/test_distributed.py share: threads, data, models, references.

Imported by the workers (before any backend) and by the test process, so that the single-process
references are computed from exactly the same data, models and initial weights.
"""

from __future__ import annotations

import json
import os

for _name, _value in (
    ("OMP_NUM_THREADS", "1"),
    ("TF_NUM_INTRAOP_THREADS", "1"),
    ("TF_NUM_INTEROP_THREADS", "1"),
    ("TF_CPP_MIN_LOG_LEVEL", "2"),
    ("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"),
):
    os.environ.setdefault(_name, _value)

import keras  # noqa: E402
import numpy as np  # noqa: E402

if keras.backend.backend() == "torch":
    import torch

    torch.set_num_threads(1)

FEATURES, OUTPUTS = 5, 2

# Scenario "fit": kfit.fit data-parallel. The global minibatch is 15 (shares 8 and 7) for the first 150
# samples, then 22 (11 and 11); epochs of 120 samples over 100 training samples, so minibatches span sweeps
# and epoch ends cut them (one global minibatch of 2: shares 1 and 1).
FIT = dict(num_samples=100, epoch_size=120, max_samples=300, sizes=[15, 22], size_epoch=150, seed=3, lr=0.05, momentum=0.9)
# Scenario "model_fit": plain model.fit with Horovod's API; each worker holds 32 samples, minibatches of 8.
MODEL_FIT = dict(per_worker=32, batch_size=8, epochs=3, lr=0.05, warmup_epochs=2, val_sizes=(20, 12))
# Scenario "load_model": plain model.fit with Adam on each worker's half x[rank::2] of 2 * per_worker samples, a
# ModelCheckpoint on rank 0; then hvd.load_model on every worker and training on for `epochs` more.
LOAD_MODEL = dict(per_worker=16, batch_size=4, epochs=2, lr=0.01, seed=6)
# Scenario "resume": kfit.fit with checkpoints every 40 samples; the killed job dies after step KILL_STEP.
RESUME = dict(num_samples=120, minibatch_size=10, max_samples=200, frequency=40, kill_step=6, seed=5, lr=0.05, momentum=0.9)
# Scenario "preempt": kfit.fit for 3 epochs of 60 samples, a checkpoint at each epoch end and on preemption; SIGTERM
# reaches rank 1 alone after the step that ends at sample AT (in the second epoch, between the epoch-end checkpoints).
PREEMPT = dict(num_samples=60, minibatch_size=10, epochs=3, at=100, seed=9)


def data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    w = rng.normal(size=(FEATURES, OUTPUTS)).astype("float32")
    y = np.tanh(x @ w).astype("float32") + 0.1 * rng.normal(size=(n, OUTPUTS)).astype("float32")
    return x, y


def model(init_seed: int) -> keras.Model:
    """A small MLP whose initial weights come from NumPy's ``init_seed`` (independent of Keras's RNG)."""
    net = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(OUTPUTS)]
    )
    rng = np.random.default_rng(1000 + init_seed)
    net.set_weights([(0.5 * rng.normal(size=w.shape)).astype("float32") for w in net.get_weights()])
    return net


def fit_model(init_seed: int) -> keras.Model:
    import kfit

    net = model(init_seed)
    net.compile(
        optimizer=kfit.optimizers.MomentumSGD(FIT["lr"], momentum=FIT["momentum"]), loss="mse", metrics=["mae"]
    )
    return net


def fit_kwargs() -> dict:
    import kfit

    return dict(
        minibatch_size=kfit.schedules.minibatch_size(FIT["sizes"], epoch_size=FIT["size_epoch"]),
        epoch_size=FIT["epoch_size"],
        max_samples=FIT["max_samples"],
        seed=FIT["seed"],
        verbose=0,
    )


# Scenario "fit", its second run: a binary classifier with sample weights whose training metrics keep states that
# are sums over samples but whose results are no mean of the workers' results (AUC; an accuracy weighted by the
# sample weights), validated every second epoch (the first and third epochs end without validation).
METRICS = dict(num_samples=90, validation=30, minibatch_size=15, epochs=3, validation_freq=2, seed=4, lr=0.1)


def metrics_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, _ = data(METRICS["num_samples"], seed=11)
    rng = np.random.default_rng(12)
    labels = (x[:, :1] + 0.7 * rng.normal(size=(len(x), 1)) > 0).astype("float32")
    return x, labels, rng.uniform(0.2, 3.0, size=len(x)).astype("float32")


def metrics_model() -> keras.Model:
    import kfit

    net = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(4, activation="tanh"),
                            keras.layers.Dense(1, activation="sigmoid")])
    rng = np.random.default_rng(3000)
    net.set_weights([(0.5 * rng.normal(size=w.shape)).astype("float32") for w in net.get_weights()])
    net.compile(optimizer=kfit.optimizers.MomentumSGD(METRICS["lr"], momentum=0.9), loss="binary_crossentropy",
                metrics=[keras.metrics.AUC(name="auc")],
                weighted_metrics=[keras.metrics.BinaryAccuracy(name="weighted_accuracy")])
    return net


def metrics_fit(net: keras.Model) -> dict:
    """Trains ``net`` (:func:`metrics_model`) on the classifier's data; returns the history."""
    import kfit

    m = METRICS
    x, y, weights = metrics_data()
    n = m["validation"]
    history = kfit.fit(net, x[n:], y[n:], sample_weight=weights[n:], minibatch_size=m["minibatch_size"],
                       epochs=m["epochs"], validation_data=(x[:n], y[:n]), validation_freq=m["validation_freq"],
                       seed=m["seed"], verbose=0)
    return history.history


def resume_model() -> keras.Model:
    import kfit

    net = model(7)
    net.compile(optimizer=kfit.optimizers.MomentumSGD(RESUME["lr"], momentum=RESUME["momentum"]), loss="mse",
                metrics=["mae"])
    return net


def history(h) -> dict[str, list[float]]:
    """A ``History``'s values as JSON (exact: floats round-trip)."""
    return {key: [float(v) for v in values] for key, values in h.history.items()}


def warmup_lr(epoch: int, batch: int, size: int) -> float | None:
    """Horovod's warm-up rate before step ``batch`` of ``epoch`` (None: left alone after the warm-up)."""
    m = MODEL_FIT
    if epoch >= m["warmup_epochs"]:
        return None
    steps = m["per_worker"] // m["batch_size"]
    progress = (epoch + (batch + 1) / steps) / m["warmup_epochs"]
    initial_lr = m["lr"] * size
    return initial_lr / size * (1 + (size - 1) * progress)


def weights(net: keras.Model) -> list[np.ndarray]:
    return [np.asarray(keras.ops.convert_to_numpy(v.value)) for v in net.weights]


def save(path: str, arrays: dict, info: dict) -> None:
    np.savez(path + ".npz", **arrays)
    with open(path + ".json", "w") as f:
        json.dump(info, f)


def load(path: str) -> tuple[dict, dict]:
    with np.load(path + ".npz") as archive:
        arrays = {k: archive[k] for k in archive.files}
    with open(path + ".json") as f:
        return arrays, json.load(f)


# Scenario "evaluation" (tests/engine_scripts/evaluation.py): sharded evaluation. Every evaluation set has an
# odd size (two workers get unequal shares) and sample weights; kfit.fit trains 2 epochs of 64 samples in
# global minibatches of 15 (shares 8 and 7; the epoch's last minibatch 4: 2 and 2).
EVALUATION = dict(train=64, train_batch=15, validation=53, cv=101, source=45, test=77, cv_batch=16, source_batch=8, test_batch=10,
                  val_batch=12, epochs=2, seed=11, lr=0.05, momentum=0.9)
CLASSES = 3


def classification_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, labels, sample_weight)``: labels from a random linear map, weights in [0.5, 2)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    w = rng.normal(size=(FEATURES, CLASSES)).astype("float32")
    labels = np.argmax(x @ w + 0.5 * rng.normal(size=(n, CLASSES)), axis=-1).astype("int64")
    return x, labels, rng.uniform(0.5, 2.0, size=n).astype("float32")


def classifier(init_seed: int) -> keras.Model:
    """A small softmax classifier, compiled with an unweighted and a weighted accuracy."""
    import kfit

    e = EVALUATION
    net = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"),
                            keras.layers.Dense(CLASSES, activation="softmax")])
    rng = np.random.default_rng(2000 + init_seed)
    net.set_weights([(0.5 * rng.normal(size=w.shape)).astype("float32") for w in net.get_weights()])
    net.compile(optimizer=kfit.optimizers.MomentumSGD(e["lr"], momentum=e["momentum"]),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="weighted_accuracy")])
    return net


# Scenario "uneven" (tests/engine_scripts/uneven.py): global minibatches of 9 over sweeps of 41 samples (shares 5
# and 4; each epoch, one sweep, ends with a remainder minibatch of 5: shares 3 and 2), with sample weights, an
# unweighted and a weighted metric whose states are sums over samples, and one whose state is not (LastMean).
UNEVEN = dict(num_samples=41, minibatch_size=9, epochs=3, seed=13, lr=0.05, momentum=0.9)


def uneven_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, y = data(UNEVEN["num_samples"], seed=8)
    weights = np.random.default_rng(9).uniform(0.5, 2.0, size=UNEVEN["num_samples"]).astype("float32")
    return x, y, weights


class LastMean(keras.metrics.Metric):
    """A metric whose state is not a sum over samples: the mean prediction of the last batch."""

    def __init__(self, name: str = "last_mean", **kwargs):
        super().__init__(name=name, **kwargs)
        self.value_ = self.add_weight(name="value", shape=(), initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.value_.assign(keras.ops.mean(y_pred))

    def result(self):
        return self.value_ * 1.0


def uneven_model() -> keras.Model:
    import kfit

    net = model(3)
    net.compile(optimizer=kfit.optimizers.MomentumSGD(UNEVEN["lr"], momentum=UNEVEN["momentum"]), loss="mse",
                metrics=["mae", LastMean()],
                weighted_metrics=[keras.metrics.MeanSquaredError(name="weighted_mse")])
    return net


def uneven_kwargs() -> dict:
    u = UNEVEN
    return dict(minibatch_size=u["minibatch_size"], epochs=u["epochs"], seed=u["seed"], verbose=0)


#: Global minibatches of fewer samples than the 2 workers: the first ``REMAINDER["num_samples"]`` samples of
#: ``uneven_data()`` in minibatches of 9 end each epoch with 1 sample (37 = 4 * 9 + 1), and ``max_samples`` cuts the
#: second epoch's third minibatch to 1 sample (56 = 37 + 2 * 9 + 1): the worker with no sample trains a padding row.
REMAINDER = dict(num_samples=37, epochs=2, max_samples=56)


def remainder_kwargs() -> dict:
    return {**uneven_kwargs(), "epochs": REMAINDER["epochs"], "max_samples": REMAINDER["max_samples"]}
