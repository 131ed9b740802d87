"""kfit.optimizers: momentum and beta_1 held in variables, checked against NumPy references on every backend.

Training runs through the real `model.fit` / `train_on_batch` of the backend that KERAS_BACKEND selects;
on JAX a callback must read `self.model` (which syncs the fit loop's state into the variables) before
assigning a hyperparameter, so that the next step reads the new value.
"""

import keras
import numpy as np
import pytest
from reference_momentum_sgd import AdamReference, MomentumSGDReference

import kfit.cntk
from kfit.optimizers import Adam, MomentumSGD, hyperparameter_variable, minibatch_size_variable

TRUE_KERNEL = np.array([[1.0], [-2.0], [0.5], [3.0]])


def _data(n=32):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x @ TRUE_KERNEL + 0.3 + 0.1 * rng.normal(size=(n, 1))).astype("float32")
    return x, y


def _model(optimizer, weights=None):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    if weights is not None:
        model.set_weights(weights)
    model.compile(optimizer=optimizer, loss="mse")
    return model


class _Assign(keras.callbacks.Callback):
    """Assigns `optimizer.<name>` to `values[batch]` before each training batch."""

    def __init__(self, name, values):
        super().__init__()
        self.name = name
        self.values = values

    def on_train_batch_begin(self, batch, logs=None):
        model = self.model  # on JAX: syncs the fit loop's state into the variables first
        getattr(model.optimizer, self.name).assign(self.values[batch])


def _assert_weights(model, expected, atol):
    for actual, want in zip(model.get_weights(), expected, strict=True):
        np.testing.assert_allclose(actual, want, rtol=0, atol=atol)


# --- MomentumSGD, CNTK variant --------------------------------------------------------------------

# (minibatch size, learning rate per minibatch, momentum): the rate, the momentum and B all change.
STEPS = [(4, 0.05, 0.0), (4, 0.05, 0.9), (8, 0.02, 0.9), (2, 0.02, 0.5), (8, 0.1, 0.95), (4, 0.01, 0.95)]


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("unit_gain", [True, False])
def test_cntk_variant_matches_reference_across_changes(nesterov, unit_gain):
    x, y = _data()
    optimizer = MomentumSGD(learning_rate=0.05, nesterov=nesterov, unit_gain=unit_gain)
    model = _model(optimizer)
    reference = MomentumSGDReference(model.get_weights(), nesterov=nesterov, unit_gain=unit_gain)
    start = 0
    for batch, lr, mu in STEPS:
        optimizer.learning_rate = lr
        optimizer.momentum.assign(mu)
        optimizer.minibatch_size.assign(batch)
        xb, yb = x[start : start + batch], y[start : start + batch]
        start += batch
        model.train_on_batch(xb, yb)
        expected = reference.step(xb, yb, learning_rate=lr, momentum=mu)
        _assert_weights(model, expected, atol=1e-5)


def test_minibatch_size_cancels_for_a_constant_batch():
    x, y = _data()
    runs = []
    for minibatch_size in (1, 8):
        model = _model(MomentumSGD(learning_rate=0.05, momentum=0.9, minibatch_size=minibatch_size))
        if runs:
            model.set_weights(runs[0][0])
        start = model.get_weights()
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        runs.append((start, model.get_weights()))
    for a, b in zip(runs[0][1], runs[1][1], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_momentum_change_in_fit_changes_the_trajectory():
    x, y = _data()
    schedules = ([0.0, 0.9, 0.9, 0.9], [0.0, 0.5, 0.99, 0.1])
    finals = []
    initial = None
    for momenta in schedules:
        model = _model(MomentumSGD(learning_rate=0.05, momentum=0.0, minibatch_size=8))
        if initial is None:
            initial = model.get_weights()
        model.set_weights(initial)
        model.fit(
            x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[_Assign("momentum", momenta)]
        )
        reference = MomentumSGDReference(initial)
        for i, mu in enumerate(momenta):
            expected = reference.step(
                x[8 * i : 8 * i + 8], y[8 * i : 8 * i + 8], learning_rate=0.05, momentum=mu
            )
        _assert_weights(model, expected, atol=1e-5)
        finals.append(model.get_weights()[0])
    assert np.max(np.abs(finals[0] - finals[1])) > 1e-3


# --- MomentumSGD, Keras variant -------------------------------------------------------------------


@pytest.mark.parametrize("nesterov, weight_decay", [(False, None), (True, 0.01)])
def test_keras_variant_equals_keras_sgd(nesterov, weight_decay):
    x, y = _data()
    kwargs = dict(learning_rate=0.02, momentum=0.9, nesterov=nesterov, weight_decay=weight_decay)
    ours = _model(MomentumSGD(variant="keras", **kwargs))
    theirs = _model(keras.optimizers.SGD(**kwargs), weights=ours.get_weights())
    for model in (ours, theirs):
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    _assert_weights(ours, theirs.get_weights(), atol=1e-6)


def test_keras_variant_follows_a_momentum_change():
    x, y = _data()
    momenta = [0.9, 0.0, 0.5, 0.99]
    model = _model(MomentumSGD(learning_rate=0.02, momentum=0.9, nesterov=True, variant="keras"))
    reference = MomentumSGDReference(model.get_weights(), nesterov=True, variant="keras")
    model.fit(
        x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[_Assign("momentum", momenta)]
    )
    for i, mu in enumerate(momenta):
        expected = reference.step(x[8 * i : 8 * i + 8], y[8 * i : 8 * i + 8], learning_rate=0.02, momentum=mu)
    _assert_weights(model, expected, atol=1e-5)


# --- Adam -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("amsgrad, accumulation", [(False, None), (True, None), (False, 2)])
def test_adam_with_constant_beta_1_equals_keras_adam(amsgrad, accumulation):
    x, y = _data()
    kwargs = dict(learning_rate=0.05, beta_1=0.8, amsgrad=amsgrad, gradient_accumulation_steps=accumulation)
    ours = _model(Adam(**kwargs))
    theirs = _model(keras.optimizers.Adam(**kwargs), weights=ours.get_weights())
    for model in (ours, theirs):
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    _assert_weights(ours, theirs.get_weights(), atol=1e-6)
    updates = 8 // (accumulation or 1)
    np.testing.assert_allclose(float(ours.optimizer.beta_1_power.numpy()), 0.8**updates, rtol=1e-5)


def test_adam_takes_cntks_unit_gain_true_and_refuses_false():
    # CNTK's adam(..., unit_gain=True), its default, is m = b1 * m + (1 - b1) * g: kfit's (and Keras's) Adam.
    x, y = _data()
    ours = _model(Adam(learning_rate=0.05, beta_1=0.8, unit_gain=True))
    theirs = _model(keras.optimizers.Adam(learning_rate=0.05, beta_1=0.8), weights=ours.get_weights())
    for model in (ours, theirs):
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    _assert_weights(ours, theirs.get_weights(), atol=1e-6)
    with pytest.raises(ValueError, match=r"`unit_gain`.*unit_gain=False \(m = beta_1 \* m \+ g\) has no counterpart"
                       r".*Received: unit_gain=False"):
        Adam(unit_gain=False)
    with pytest.raises(TypeError, match=r"`unit_gain`.*unit_gain='yes'"):
        Adam(unit_gain="yes")


def test_adam_beta_1_change_uses_the_product_in_the_bias_correction():
    x, y = _data()
    betas = [0.9, 0.5, 0.8, 0.99]
    initial = None
    finals = []
    for schedule in (betas, [0.9] * 4):
        model = _model(Adam(learning_rate=0.05, beta_1=0.9))
        initial = initial if initial is not None else model.get_weights()
        model.set_weights(initial)
        model.fit(
            x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[_Assign("beta_1", schedule)]
        )
        reference = AdamReference(initial)
        for i, beta_1 in enumerate(schedule):
            expected = reference.step(
                x[8 * i : 8 * i + 8], y[8 * i : 8 * i + 8], learning_rate=0.05, beta_1=beta_1
            )
        _assert_weights(model, expected, atol=1e-5)
        np.testing.assert_allclose(float(model.optimizer.beta_1_power.numpy()), np.prod(schedule), rtol=1e-5)
        finals.append(model.get_weights()[0])
    assert np.max(np.abs(finals[0] - finals[1])) > 1e-3


# --- hyperparameter_variable ----------------------------------------------------------------------


def test_hyperparameter_variable_finds_the_variables():
    sgd = MomentumSGD(learning_rate=0.1, momentum=0.9, minibatch_size=16)
    adam = Adam()
    tracked = [id(v) for v in sgd.variables] + [id(v) for v in adam.variables]
    for optimizer, name, attribute in [
        (sgd, "learning_rate", sgd.learning_rate),
        (sgd, "momentum", sgd.momentum),
        (sgd, "minibatch_size", sgd.minibatch_size),
        (adam, "learning_rate", adam.learning_rate),
        (adam, "beta_1", adam.beta_1),
    ]:
        variable = hyperparameter_variable(optimizer, name)
        assert variable is attribute
        assert id(variable) in tracked
    assert minibatch_size_variable(sgd) is sgd.minibatch_size
    assert minibatch_size_variable(adam) is None
    assert minibatch_size_variable(keras.optimizers.SGD()) is None
    wrapped = keras.optimizers.LossScaleOptimizer(MomentumSGD(momentum=0.5))
    assert hyperparameter_variable(wrapped, "momentum") is wrapped.inner_optimizer.momentum


def _assert_raises(label, error, match, function, *args, **kwargs):
    """`pytest.raises` that names the failing case of a table."""
    try:
        with pytest.raises(error, match=match):
            function(*args, **kwargs)
    except (AssertionError, pytest.fail.Exception) as failure:
        raise AssertionError(f"{label}: {failure}") from None


def _schedule_lr():
    return keras.optimizers.SGD(learning_rate=keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9))


# (optimizer factory, name, error, message pattern)
REFUSALS = [
    (
        lambda: keras.optimizers.SGD(momentum=0.9),
        "momentum",
        ValueError,
        r"keras.optimizers.SGD keeps `momentum` as a Python float.*Use kfit.optimizers.MomentumSGD\(...\)",
    ),
    (
        keras.optimizers.Adam,
        "beta_1",
        ValueError,
        r"keras.optimizers.Adam keeps `beta_1` as a Python float.*Use kfit.optimizers.Adam\(...\)",
    ),
    (_schedule_lr, "learning_rate", ValueError, r"LearningRateSchedule \(ExponentialDecay\).*not a variable"),
    (
        MomentumSGD,
        "rho",
        ValueError,
        r"no hyperparameter `rho`.*\['learning_rate', 'momentum', 'minibatch_size'\]",
    ),
    (
        keras.optimizers.SGD,
        "minibatch_size",
        ValueError,
        r"no hyperparameter `minibatch_size`.*\['learning_rate'\].*kfit.optimizers.MomentumSGD",
    ),
    (
        lambda: keras.optimizers.RMSprop(momentum=0.5),
        "momentum",
        ValueError,
        r"RMSprop keeps `momentum` as a Python",
    ),
    (MomentumSGD, 3, TypeError, r"`name`"),
    (lambda: "sgd", "momentum", TypeError, r"`optimizer`"),
]


def test_hyperparameter_variable_refuses_what_a_schedule_cannot_set():
    for make, name, error, match in REFUSALS:
        optimizer = make()
        _assert_raises(f"{optimizer!r}, {name!r}", error, match, hyperparameter_variable, optimizer, name)


# (class, constructor arguments, error, message pattern): the message names the argument and its value.
BAD_ARGUMENTS = [
    (MomentumSGD, {"momentum": 1.0}, ValueError, r"`momentum`.*momentum=1.0"),
    (MomentumSGD, {"momentum": -0.1}, ValueError, r"`momentum`.*momentum=-0.1"),
    (MomentumSGD, {"momentum": "0.9"}, TypeError, r"`momentum`.*momentum='0.9'"),
    (MomentumSGD, {"minibatch_size": 0}, ValueError, r"`minibatch_size`.*minibatch_size=0$"),
    (MomentumSGD, {"minibatch_size": float("nan")}, ValueError, r"`minibatch_size`.*minibatch_size=nan"),
    (MomentumSGD, {"variant": "torch"}, ValueError, r"`variant`.*variant='torch'"),
    (MomentumSGD, {"variant": None}, TypeError, r"`variant`.*variant=None"),
    (MomentumSGD, {"nesterov": 1}, TypeError, r"`nesterov`.*nesterov=1"),
    (MomentumSGD, {"unit_gain": "yes"}, TypeError, r"`unit_gain`.*unit_gain='yes'"),
    (MomentumSGD, {"foo": 1}, ValueError, r"foo"),
    (Adam, {"beta_1": 1.0}, ValueError, r"`beta_1`.*beta_1=1.0"),
    (Adam, {"beta_2": -0.5}, ValueError, r"`beta_2`.*beta_2=-0.5"),
    (Adam, {"epsilon": -1e-7}, ValueError, r"`epsilon`.*epsilon=-1e-07$"),
    (Adam, {"amsgrad": None}, TypeError, r"`amsgrad`.*amsgrad=None"),
    # CNTK learner options: refused naming the value and what to write instead.
    (MomentumSGD, {"l2_regularization_weight": 1e-4}, ValueError,
     r"`l2_regularization_weight`.*=0.0001.*keras.regularizers.L2\(0.0001 / 2\)"),
    (MomentumSGD, {"l1_regularization_weight": 1e-4}, ValueError, r"l1_regularization_weight=0.0001.*L1"),
    (MomentumSGD, {"gradient_clipping_threshold_per_sample": 2.3}, ValueError,
     r"gradient_clipping_threshold_per_sample=2.3.*clipvalue=2.3.*clipnorm=2.3"),
    (MomentumSGD, {"gradient_clipping_with_truncation": False}, ValueError, r"with_truncation=False.*clipnorm"),
    (MomentumSGD, {"gaussian_noise_injection_std_dev": 0.1}, ValueError, r"std_dev=0.1.*leave it out"),
    (MomentumSGD, {"use_mean_gradient": True}, ValueError, r"use_mean_gradient=True.*mean"),
    (Adam, {"variance_momentum": 0.9999}, ValueError, r"variance_momentum=0.9999.*beta_2 = m_s \*\* B"),
    (Adam, {"momentum": 0.9}, ValueError, r"`momentum`.*momentum=0.9.*beta_1.*MomentumSchedule"),
    (Adam, {"adamax": True}, ValueError, r"adamax=True.*keras.optimizers.Adamax"),
    # A schedule given where CNTK's learners take one: a callback applies it.
    (MomentumSGD, {"learning_rate": kfit.cntk.learning_parameter_schedule_per_sample(0.001)}, ValueError,
     r"`learning_rate`.*kfit.callbacks.LearningRateSchedule\(schedule\)"),
    (MomentumSGD, {"momentum": kfit.cntk.momentum_as_time_constant_schedule(1024)}, ValueError,
     r"`momentum`.*kfit.callbacks.MomentumSchedule\(schedule\)"),
    (Adam, {"beta_1": kfit.cntk.momentum_schedule(0.9)}, ValueError, r"`beta_1`.*MomentumSchedule"),
]


def test_bad_constructor_arguments():
    for cls, kwargs, error, match in BAD_ARGUMENTS:
        _assert_raises(f"{cls.__name__}(**{kwargs})", error, match, cls, **kwargs)


# --- configuration and saving ---------------------------------------------------------------------


def test_config_round_trip():
    cases = [
        (MomentumSGD(0.1, momentum=0.9, nesterov=True, unit_gain=False, minibatch_size=32), "momentum", 0.7),
        (MomentumSGD(0.1, variant="keras"), "minibatch_size", 64.0),
        (Adam(0.01, beta_1=0.8, amsgrad=True), "beta_1", 0.95),
    ]
    for optimizer, name, value in cases:
        getattr(optimizer, name).assign(value)
        config = optimizer.get_config()
        assert config[name] == pytest.approx(value)
        for clone in (
            type(optimizer).from_config(config),
            keras.optimizers.deserialize(keras.optimizers.serialize(optimizer)),
        ):
            assert type(clone) is type(optimizer)
            assert clone.get_config() == config
            assert float(getattr(clone, name).numpy()) == pytest.approx(value)


@pytest.mark.parametrize(
    "optimizer, names",
    [
        (
            lambda: MomentumSGD(0.05, momentum=0.9, nesterov=True, minibatch_size=8),
            ("momentum", "minibatch_size"),
        ),
        (lambda: Adam(0.01, beta_1=0.9), ("beta_1", "beta_1_power")),
    ],
)
def test_saved_model_keeps_optimizer_state(tmp_path, optimizer, names):
    x, y = _data()
    model = _model(optimizer())
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    getattr(model.optimizer, names[0]).assign(0.5)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is type(model.optimizer)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    saved = [v.numpy() for v in model.optimizer.variables]
    restored = [v.numpy() for v in loaded.optimizer.variables]
    assert len(saved) == len(restored)
    for a, b in zip(saved, restored, strict=True):
        np.testing.assert_array_equal(a, b)
    for name in names:
        assert float(getattr(loaded.optimizer, name).numpy()) == float(getattr(model.optimizer, name).numpy())
    # Both continue the same way.
    for m in (model, loaded):
        m.train_on_batch(x[:8], y[:8])
    _assert_weights(loaded, model.get_weights(), atol=0)
