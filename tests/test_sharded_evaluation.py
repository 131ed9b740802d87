"""Sharded evaluation: under two workers, each evaluates its contiguous share and the results are exactly one process's.

``tests/engine_scripts/evaluation.py`` runs as two workers (the native engine under ``torchrun`` on PyTorch and
JAX; Horovod under ``horovodrun`` on TensorFlow, with the ``horovod`` marker). Its ``validation_data``,
``CrossValidation`` (arrays, a ``PyDataset``, h5py datasets) and ``Test`` sets have odd sizes and sample weights. The test
evaluates the same sets here, in one process, with the workers' final weights, and checks the workers'
results against it (1e-6), that both workers hold the same results, and how many samples each evaluated.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from conftest import BACKEND

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS / "horovod_scripts"))

import common  # noqa: E402
import test_distributed  # noqa: E402  (its horovodrun helper)
import test_engines  # noqa: E402  (its torchrun helper)

E = common.EVALUATION
TOLERANCE = dict(rtol=1e-6, atol=1e-6)
SCRIPT = TESTS / "engine_scripts" / "evaluation.py"


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> Path:
    if BACKEND not in test_engines.NATIVE_BACKENDS:
        pytest.skip(f"kfit's native engine covers the {', '.join(test_engines.NATIVE_BACKENDS)} backends; "
                    f"{BACKEND} is checked under horovodrun (test_sharded_evaluation_under_horovod)")
    out = tmp_path_factory.mktemp(f"sharded_{BACKEND}")
    rc, output = test_engines._torchrun(SCRIPT, str(out))
    if rc != 0:
        pytest.fail(f"engine_scripts/evaluation.py failed under torchrun (exit {rc}):\n{output[-6000:]}")
    return out


def _workers(out: Path, scenario: str) -> list[tuple[dict, dict]]:
    return [common.load(str(out / f"{scenario}.rank{r}")) for r in (0, 1)]


def _reference(weights: list[np.ndarray], data: tuple, batch_size: int, prefix: str) -> dict:
    """One process: the model with ``weights`` evaluated on the whole of ``data``."""
    net = common.classifier(init_seed=0)
    net.set_weights(weights)
    x, y, sample_weight = data
    results = net.evaluate(x, y, sample_weight=sample_weight, batch_size=batch_size, verbose=0, return_dict=True)
    return {f"{prefix}{k}": float(v) for k, v in results.items()}


def _close(worker: dict, reference: dict) -> None:
    for key, value in reference.items():
        np.testing.assert_allclose(worker[key], value, **TOLERANCE, err_msg=key)


def _check(out: Path) -> None:
    (arrays0, info0), (arrays1, info1) = _workers(out, "evaluation")
    # Both workers end with the same weights and the same results of every evaluation.
    for key in arrays0:
        np.testing.assert_array_equal(arrays0[key], arrays1[key], err_msg=key)
    for key in ("cv", "source", "h5", "test", "epoch_logs"):
        assert info0[key] == info1[key], key
    weights = [arrays0[f"w{i}"] for i in range(len(arrays0))]

    # Each worker evaluated only its contiguous share (shares of an odd size: n // 2 and n - n // 2).
    for key, n in (("cv_evaluated", E["cv"]), ("source_evaluated", E["source"]), ("h5_evaluated", E["cv"]),
                   ("test_evaluated", E["test"])):
        assert [info0[key], info1[key]] == [n // 2, n - n // 2], key
    half = E["validation"] // 2
    assert info0["validated"] == [half] * E["epochs"]
    assert info1["validated"] == [E["validation"] - half] * E["epochs"]

    # The training logs are the workers' combined: means over the samples each worker trained (34 and 30 per
    # epoch), taken before Keras's validation resets the metrics, and the weighted accuracy's over the sum of
    # each worker's sample weights (its metric's states summed, as one process would have them).
    for epoch in range(E["epochs"]):
        local = [info0["local_logs"][epoch], info1["local_logs"][epoch]]
        assert [w["trained"] for w in local] == [34, 30]
        assert local[0]["weights"] != local[1]["weights"] * 34 / 30  # (weights no mean of the samples')
        for key, by in (("loss", "trained"), ("accuracy", "trained"), ("weighted_accuracy", "weights")):
            mean = (local[0][by] * local[0][key] + local[1][by] * local[1][key]) / (local[0][by] + local[1][by])
            np.testing.assert_allclose(info0["epoch_logs"][epoch][key], mean, **TOLERANCE, err_msg=key)

    # ... and reports exactly what one process reports on the whole set (the last evaluations ran on the
    # final weights: the last epoch ends training).
    cv = _reference(weights, common.classification_data(E["cv"], seed=3), E["cv_batch"], "val_")
    _close(info0["cv"][-1], cv)
    _close(info0["h5"][-1], cv)  # the same set, read from h5py datasets minibatch by minibatch
    last = info0["cv"][-1]
    assert last["val_samples"] == E["cv"] and last["val_minibatches"] == math.ceil(E["cv"] / E["cv_batch"])
    np.testing.assert_allclose(last["val_average_error"], 1.0 - cv["val_accuracy"], **TOLERANCE)
    source = _reference(weights, common.classification_data(E["source"], seed=4), E["source_batch"], "val_")
    _close(info0["source"][-1], source)
    assert info0["source"][-1]["val_minibatches"] == math.ceil(E["source"] / E["source_batch"])
    test = _reference(weights, common.classification_data(E["test"], seed=5), E["test_batch"], "test_")
    _close(info0["test"], test)
    assert info0["test"]["test_samples"] == E["test"]
    assert info0["test"]["test_minibatches"] == math.ceil(E["test"] / E["test_batch"])
    validation = _reference(weights, common.classification_data(E["validation"], seed=2), E["val_batch"], "val_")
    _close(info0["epoch_logs"][-1], validation)

    # A metric whose state is not a sum: every worker evaluates the whole set, with the same results.
    (_, fallback0), (_, fallback1) = _workers(out, "fallback")
    assert fallback0["evaluated"] == fallback1["evaluated"] == E["cv"]
    assert fallback0["results"] == fallback1["results"]
    assert "peak" in fallback0["why"]


@pytest.mark.slow
def test_sharded_evaluation_under_the_native_engine(native):
    _check(native)


@pytest.mark.slow
@pytest.mark.horovod
def test_sharded_evaluation_under_horovod(tmp_path):
    rc, output, _ = test_distributed._run(str(SCRIPT), tmp_path)  # an absolute path: not under its SCRIPTS
    if rc != 0:
        pytest.fail(f"engine_scripts/evaluation.py failed under horovodrun (exit {rc}):\n{output[-6000:]}")
    _check(tmp_path)


def test_one_worker_is_not_sharded():
    """Without a launcher the callbacks evaluate the whole set, as before."""
    import kfit
    from kfit.callbacks._cross_validation import EvaluationData, evaluate

    net = common.classifier(init_seed=0)
    data = EvaluationData(common.classification_data(E["cv"], seed=3), "test")
    batches = data.minibatches(E["cv_batch"])
    results = evaluate(net, batches)
    assert kfit.distributed.size() == 1
    assert (batches.lo, batches.hi, batches.local_samples) == (0, E["cv"], E["cv"])
    x, y, sample_weight = common.classification_data(E["cv"], seed=3)
    expected = net.evaluate(x, y, sample_weight=sample_weight, batch_size=E["cv_batch"], verbose=0, return_dict=True)
    for key, value in expected.items():
        np.testing.assert_allclose(results[key], float(keras.ops.convert_to_numpy(value)), **TOLERANCE)


def test_shares_are_contiguous_and_cover_every_row():
    from kfit.distributed._evaluation import share

    for n in (1, 2, 5, 53, 101):
        for size in (1, 2, 3, 8):
            bounds = [share(n, r, size) for r in range(size)]
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1
