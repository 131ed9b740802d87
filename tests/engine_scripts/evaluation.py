"""Sharded evaluation on two workers (tests/test_sharded_evaluation.py), under any launcher:

    torchrun --standalone --nproc_per_node 2 tests/engine_scripts/evaluation.py OUT_DIR
    horovodrun --gloo -np 2 -H localhost:2 python tests/engine_scripts/evaluation.py OUT_DIR

``kfit.fit`` trains ``common.classifier`` data-parallel (from different initial weights per worker: rank 0's
are broadcast) with ``validation_data``, a ``CrossValidation`` on arrays, one on a ``keras.utils.PyDataset``,
one on h5py datasets and a ``Test``, every set of odd size with sample weights. Each worker writes ``OUT_DIR/evaluation.rank<r>``:
its final weights, every result, and how many samples it evaluated. Then a model with a metric whose state
is not a sum (a running maximum) is evaluated on every worker (``OUT_DIR/fallback.rank<r>``).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "horovod_scripts"))

import common  # noqa: E402  (sets one thread per worker before the backend loads)
import h5py  # noqa: E402
import keras  # noqa: E402

import kfit  # noqa: E402
import kfit.distributed as hvd  # noqa: E402
from kfit.callbacks._cross_validation import EvaluationData, evaluate  # noqa: E402
from kfit.distributed import _evaluation, _state  # noqa: E402

OUT = sys.argv[1]
hvd.init()
RANK = hvd.rank()
E = common.EVALUATION


class Batches(keras.utils.PyDataset):
    """Arrays in minibatches of ``batch_size``, with their sample weights."""

    def __init__(self, arrays: tuple, batch_size: int):
        super().__init__()
        self.arrays, self.batch_size = arrays, batch_size

    def __len__(self) -> int:
        return -(-len(self.arrays[0]) // self.batch_size)

    def __getitem__(self, index: int) -> tuple:
        return tuple(a[index * self.batch_size:(index + 1) * self.batch_size] for a in self.arrays)


class Record(keras.callbacks.Callback):
    """The epoch logs after the validation results are combined, before cross-validation adds its own
    ``val_*``; and the samples this worker validated (its loss tracker's count when validation ends)."""

    order = -500

    def __init__(self):
        super().__init__()
        self.logs: list = []
        self.validated: list = []

    def on_test_end(self, logs=None):
        self.validated.append(_state.local_sample_count(self.model))

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append({k: float(v) for k, v in logs.items()})


class RecordLocal(keras.callbacks.Callback):
    """This worker's own training logs at the epoch end, before they are combined over the workers, the samples it
    trained in the epoch and the sum of their sample weights (the weighted accuracy's count)."""

    order = -2000

    def __init__(self):
        super().__init__()
        self.logs: list = []

    def on_test_begin(self, logs=None):
        self.trained = _state.local_sample_count(self.model)  # before the validation resets the metrics
        weighted = next(m for m in _evaluation.leaf_metrics(self.model) if m.name == "weighted_accuracy")
        self.weights = float(keras.ops.convert_to_numpy(weighted.count.value))

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append({k: float(v) for k, v in logs.items() if not k.startswith("val_")})
        self.logs[-1].update(trained=self.trained, weights=self.weights)


def scenario_evaluation() -> None:
    net = common.classifier(init_seed=RANK)
    train = common.classification_data(E["train"], seed=1)
    validation = common.classification_data(E["validation"], seed=2)
    cv = kfit.callbacks.CrossValidation(common.classification_data(E["cv"], seed=3), minibatch_size=E["cv_batch"])
    source = kfit.callbacks.CrossValidation(Batches(common.classification_data(E["source"], seed=4), E["source_batch"]),
                                            name="cv_source")
    with h5py.File(os.path.join(OUT, f"cv_data.rank{RANK}.h5"), "w") as f:  # read by minibatch: never whole
        for name, array in zip("xyw", common.classification_data(E["cv"], seed=3)):
            f[name] = array
    h5 = h5py.File(os.path.join(OUT, f"cv_data.rank{RANK}.h5"), "r")
    on_disk = kfit.callbacks.CrossValidation((h5["x"], h5["y"], h5["w"]), minibatch_size=E["cv_batch"], name="cv_h5")
    test = kfit.callbacks.Test(common.classification_data(E["test"], seed=5), minibatch_size=E["test_batch"], verbose=0)
    record, local = Record(), RecordLocal()
    kfit.fit(net, train[0], train[1], sample_weight=train[2], minibatch_size=E["train_batch"], epoch_size=E["train"],
             epochs=E["epochs"], seed=E["seed"], verbose=0, validation_data=validation,
             validation_batch_size=E["val_batch"], callbacks=[cv, source, on_disk, test, record, local])
    h5.close()
    arrays = {f"w{i}": w for i, w in enumerate(common.weights(net))}
    common.save(os.path.join(OUT, f"evaluation.rank{RANK}"), arrays, {
        "rank": RANK, "size": hvd.size(),
        "cv": cv.results, "cv_evaluated": cv.evaluated_samples,
        "source": source.results, "source_evaluated": source.evaluated_samples,
        "h5": on_disk.results, "h5_evaluated": on_disk.evaluated_samples,
        "test": test.results, "test_evaluated": test.evaluated_samples,
        "epoch_logs": record.logs, "validated": record.validated, "local_logs": local.logs,
    })


class Peak(keras.metrics.Metric):
    """The largest predicted probability seen: a state that is not a sum over samples."""

    def __init__(self, name="peak"):
        super().__init__(name=name)
        self.peak = self.add_variable(shape=(), initializer="zeros", name="peak")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.peak.assign(keras.ops.maximum(self.peak.value, keras.ops.max(y_pred)))

    def result(self):
        return self.peak.value


def scenario_fallback() -> None:
    net = common.classifier(init_seed=0)
    net.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=[Peak()])
    data = EvaluationData(common.classification_data(E["cv"], seed=3), "the fallback scenario")
    data.check_model(net)  # builds the compiled metrics, as CrossValidation does when training begins
    batches = data.minibatches(E["cv_batch"])
    results = evaluate(net, batches)
    common.save(os.path.join(OUT, f"fallback.rank{RANK}"), {}, {
        "results": results, "evaluated": batches.local_samples, "why": _evaluation.why_not_sharded(net),
    })


for scenario in sys.argv[2:] or ["evaluation", "fallback"]:
    globals()[f"scenario_{scenario}"]()
