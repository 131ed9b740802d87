"""kfit.distributed.load_model (Horovod's hvd.load_model) in one process: a model compiled with DistributedOptimizer
saves (.keras, .h5), and loads back with its optimizer distributed and its state whole, training on as the model that
was saved. The two-worker run is the ``load_model`` scenario of tests/test_distributed.py."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from helpers import mlp, regression_data, weights

import kfit
import kfit.distributed as hvd
from kfit.distributed import _optimizer


def _arrays(variables) -> list[np.ndarray]:
    return [keras.ops.convert_to_numpy(v.value if hasattr(v, "value") else v) for v in variables]


def _trained(optimizer: keras.optimizers.Optimizer) -> tuple[keras.Model, np.ndarray, np.ndarray]:
    x, y = regression_data(32)
    model = mlp()
    model.compile(optimizer=hvd.DistributedOptimizer(optimizer), loss=keras.losses.MeanSquaredError())
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return model, x, y


OPTIMIZERS = {
    "kfit MomentumSGD": lambda: kfit.optimizers.MomentumSGD(0.05, momentum=0.9),  # registered, package "kfit"
    "keras Adam": lambda: keras.optimizers.Adam(0.01),
}


def _assert_same_state(a: keras.Model, b: keras.Model) -> None:
    for x, y in zip(weights(a) + _arrays(a.optimizer.variables), weights(b) + _arrays(b.optimizer.variables), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("make", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_a_saved_distributed_model_loads_distributed_and_trains_on_as_the_saved_one(tmp_path, make):
    model, x, y = _trained(make())
    model.save(tmp_path / "model.keras")
    loaded = hvd.load_model(tmp_path / "model.keras")
    assert hvd.is_distributed(loaded.optimizer) and isinstance(loaded.optimizer, type(make()))
    assert int(keras.ops.convert_to_numpy(loaded.optimizer.iterations)) == 4
    assert len(loaded.optimizer.variables) > 2  # iterations, learning rate and slot variables (momentum, Adam's moments)
    _assert_same_state(model, loaded)
    for net in (model, loaded):
        net.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    _assert_same_state(model, loaded)


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
@pytest.mark.parametrize("make", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_the_file_loads_as_keras_loads_it_with_the_optimizer_made_distributed(tmp_path, make, suffix):
    """The file holds the plain optimizer: keras.models.load_model reads it (it could not read a kfit optimizer made
    distributed), and kfit.distributed.load_model gives the same model and state, distributed. (Keras 3.15's legacy
    .h5 format keeps the optimizer's iterations but not its slot variables, and the optimizer it loads cannot train:
    model.fit fails after it, with or without kfit. Training on is checked from the .keras file.)"""
    model, x, y = _trained(make())
    path = str(tmp_path / f"model{suffix}")
    model.save(path)
    plain = keras.models.load_model(path)
    assert type(plain.optimizer) is type(make()) and not hvd.is_distributed(plain.optimizer)
    loaded = hvd.load_model(path)
    assert hvd.is_distributed(loaded.optimizer) and isinstance(loaded.optimizer, type(make()))
    _assert_same_state(plain, loaded)
    if suffix == ".keras":
        for net in (plain, loaded):
            net.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        _assert_same_state(plain, loaded)


def test_the_distributed_optimizers_arguments_reach_the_loaded_optimizer(tmp_path):
    model, _, _ = _trained(keras.optimizers.SGD(0.1))
    model.save(tmp_path / "model.keras")
    loaded = hvd.load_model(tmp_path / "model.keras", compression=hvd.Compression.fp16, op=hvd.Sum, num_groups=2,
                            name="resumed", device_dense="")
    assert loaded.optimizer._kfit_horovod_options == _optimizer.make_options(
        name="resumed", compression=hvd.Compression.fp16, op=hvd.Sum, num_groups=2)


class Unregistered(keras.optimizers.SGD):
    """An optimizer Keras cannot find by its name alone: Horovod's custom_optimizers (or custom_objects) names it."""


def test_custom_optimizers_name_classes_keras_cannot_find(tmp_path):
    x, y = regression_data(16)
    model = mlp()
    model.compile(optimizer=Unregistered(0.1), loss="mse")
    model.fit(x, y, batch_size=8, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    with pytest.raises(TypeError, match="Could not locate class 'Unregistered'"):
        hvd.load_model(path)
    for kwargs in (dict(custom_optimizers=[Unregistered]), dict(custom_objects={"Unregistered": Unregistered})):
        loaded = hvd.load_model(path, **kwargs)
        assert isinstance(loaded.optimizer, Unregistered) and hvd.is_distributed(loaded.optimizer)


def test_a_model_saved_without_an_optimizer_comes_back_as_it_is(tmp_path):
    model = mlp()
    model.save(tmp_path / "model.keras")
    loaded = hvd.load_model(tmp_path / "model.keras")
    assert getattr(loaded, "optimizer", None) is None
    for a, b in zip(weights(model), weights(loaded), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(custom_optimizers=keras.optimizers.SGD), TypeError, "custom_optimizers"),
        (dict(custom_optimizers=[keras.optimizers.SGD()]), TypeError, "custom_optimizers"),
        (dict(custom_objects=[("a", 1)]), TypeError, "custom_objects"),
        (dict(legacy_opts=True), ValueError, "legacy_opts.*Keras 3 has no legacy optimizers"),
        (dict(safe_mode="yes"), ValueError, "safe_mode"),
        (dict(compression="bf16"), ValueError, "compression"),
        (dict(op=hvd.Adasum), ValueError, "Adasum"),
        (dict(backward_passes_per_step=2), ValueError, "gradient_accumulation_steps=2"),
        (dict(learning_rate=0.1), TypeError, r"unexpected keyword argument\(s\) 'learning_rate'.*DistributedOptimizer"),
    ],
)
def test_bad_arguments_are_refused_before_the_file_is_read(tmp_path, kwargs, error, match):
    # The file does not exist: each argument is refused first, with its own message.
    with pytest.raises(error, match=match):
        hvd.load_model(str(tmp_path / "missing.keras"), **kwargs)


def test_a_missing_file_is_keras_own_error(tmp_path):
    with pytest.raises(ValueError, match="missing.keras"):
        hvd.load_model(str(tmp_path / "missing.keras"))
