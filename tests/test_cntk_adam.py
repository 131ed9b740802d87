"""kfit.optimizers.Adam(variant="cntk") against a NumPy transcription of CNTK's adam learner, step by step.

CNTK cannot be installed here, so the reference below transcribes CNTK's C++ (github.com/microsoft/CNTK) in float64:

* ``bindings/python/cntk/learners/__init__.py`` (``adam``, ``_infer_learning_rate_schedule_and_ref_minibatch_size``,
  ``learning_parameter_schedule_per_sample`` = ``learning_parameter_schedule(s, minibatch_size=1)``,
  ``momentum_schedule_per_sample``; CNTK 2.2+, the version with ``epsilon=1e-8, adamax=False, minibatch_size=None``):
  a per-sample rate or momentum is a schedule whose reference minibatch size is 1, and the learner is given that
  size (``additional_options.dict_options[Learner._MINIBATCH_SIZE]``), so it sums the gradient over the minibatch
  (not "compatible mode", which would divide it by ``B`` in ``LearnerBase::PreProcess``);
* ``Source/CNTKv2LibraryDll/Learner.h`` (``LearnerBase::LearningRate``: ``lr / ref_mbsize``, the rate per sample;
  ``LearnerMomentumSGD::UnitGainFactor``: ``1 - momentum`` with the momentum for this minibatch, or 1) and
  ``Learner.cpp`` (``LearnerMomentumSGD::MomentumValueForMB``: ``momentum ** (B / ref_mbsize)``, as is for a
  reference size of IGNORE; ``LearnerAdam::UpdateOnMinibatch``: ``m_smoothedCount += 1`` once per minibatch;
  ``LearnerAdam::Update``: ``AdamUpdate(gradient, parameter, m_smoothedCount, LearningRate(B), MomentumValueForMB(B),
  VarianceMomentumValueForMB(B), epsilon, UnitGainFactor(B), adamax)``; ``MomentumAsTimeConstantSchedule`` holds the
  per-sample momentum ``exp(-1 / tau)``);
* ``Source/Math/Matrix.cpp`` (``Matrix<ElemType>::AdamUpdate``, at commit 0d35e04f0a413ab54be7e4f80de1f1909f65ce36:
  ``biasCorrection = sqrt(1 - pow(varMomentum, smoothedCount)) / (1 - pow(meanMomentum, smoothedCount))``, the
  momenta IN FORCE raised to the count, not a product of the past ones) passed as ``adaMul`` to
* ``Source/Math/CPUMatrixImpl.h`` (``CPUMatrix<ElemType>::Adam``, at commit 00994fdbbc01123ff61355995b6e625dd6b9a955;
  the GPU kernel is the same per element)::

      adaSqr = adaWeight * smoothAda[i] + (1 - adaWeight) * g * g;  smoothAda[i] = adaSqr;  ada = sqrt(adaSqr)
      w = adaMul * (1.0 / (ada + epsilon))
      g = momentum * smoothMom[i] + unitGainFactor * g;  smoothMom[i] = g
      val[i] -= g * w * learnRatePerSample

  with ``g`` the gradient summed over the minibatch. (``adamax=True``, ``ada = max(adaWeight * smoothAda, |g|)``, has
  no counterpart in kfit: its Adam refuses ``adamax``.)

kfit's Adam(variant="keras") (the default) is Keras's update on the mean gradient with its learning rate as is. As the
migration guide had it (``Adam`` + a per-sample ``LearningRateSchedule``), its steps were ``B`` times CNTK's, its
moments were not the summed gradient's, and its bias correction used the product of the past ``beta_1`` and a
constant ``beta_2``; see test_the_keras_variant_is_not_cntks_update.
"""

import math

import keras
import numpy as np
import pytest

import kfit
from kfit.optimizers import Adam

UNITS = 2
KERNEL = np.array([[0.5, -1.0], [2.0, 0.3], [-0.7, 1.5]])


def _data(n=48):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(n, 3)).astype("float32")
    y = (x @ KERNEL + 0.2 + 0.3 * rng.normal(size=(n, UNITS))).astype("float32")
    return x, y


def _model(optimizer):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(UNITS)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _per_sample_value(value, reference, batch):
    """CNTK's ``MomentumValueForMB``: ``value ** (B / reference)``, or ``value`` as is when reference is None (IGNORE)."""
    return value if reference is None else value ** (batch / reference)


class CNTKAdamReference:
    """CNTK's ``adam`` learner (``LearnerAdam``), not in compatible mode, in float64; see the module docstring.

    The model is ``y = x @ W + b``; CNTK's criterion per sample is Keras's ``"mse"`` for one sample (the mean over
    the units), and CNTK's gradient is its sum over the minibatch's samples.
    """

    def __init__(self, weights, *, unit_gain, epsilon, variance_momentum, variance_reference):
        self.weights = [np.array(w, dtype=np.float64) for w in weights]
        self.smooth_ada = [np.zeros_like(w) for w in self.weights]
        self.smooth_mom = [np.zeros_like(w) for w in self.weights]
        self.unit_gain = unit_gain
        self.epsilon = epsilon
        self.variance_momentum = variance_momentum
        self.variance_reference = variance_reference
        self.smoothed_count = 0.0

    def summed_gradients(self, x, y):
        kernel, bias = self.weights
        error = x @ kernel + bias - y  # (B, units); d/dpred of mean_u (pred - y)**2 per sample is 2 * error / units
        per_sample = 2.0 / UNITS * error
        return [x.T @ per_sample, per_sample.sum(axis=0)]

    def step(self, x, y, *, learning_rate, learning_rate_reference, momentum, momentum_reference):
        """One ``Learner::Update`` on the minibatch ``(x, y)``; return the new weights."""
        x = np.asarray(x, np.float64)
        y = np.asarray(y, np.float64)
        batch = len(x)
        # LearnerBase::LearningRate, not in compatible mode: per sample for a reference size, else divided by B.
        lr = learning_rate / (learning_rate_reference if learning_rate_reference is not None else batch)
        mean_momentum = _per_sample_value(momentum, momentum_reference, batch)
        var_momentum = _per_sample_value(self.variance_momentum, self.variance_reference, batch)
        unit_gain_factor = 1.0 - mean_momentum if self.unit_gain else 1.0
        self.smoothed_count += 1.0  # LearnerAdam::UpdateOnMinibatch
        ada_mul = math.sqrt(1 - var_momentum**self.smoothed_count) / (1 - mean_momentum**self.smoothed_count)
        for w, ada_state, mom, g in zip(self.weights, self.smooth_ada, self.smooth_mom,
                                        self.summed_gradients(x, y), strict=True):
            ada_state[...] = var_momentum * ada_state + (1.0 - var_momentum) * g * g
            scale = ada_mul * (1.0 / (np.sqrt(ada_state) + self.epsilon))
            mom[...] = mean_momentum * mom + unit_gain_factor * g
            w -= mom * scale * lr
        return [w.copy() for w in self.weights]


# Minibatch sizes, per-sample rates and momentum time constants (tau = 0: no momentum) for each minibatch: the size,
# the rate and the momentum all change.
SIZES = [4, 8, 2, 6, 8, 4, 16]
RATES = [0.01, 0.01, 0.004, 0.02, 0.02, 0.01, 0.005]
TAUS = [0.0, 20.0, 20.0, 50.0, 5.0, 30.0, 30.0]
CNTK_VARIANCE = 0.9999986111120757  # CNTK's default variance_momentum, per sample


def _momentum_per_sample(tau):
    return 0.0 if tau == 0 else math.exp(-1.0 / tau)


def _assert_close(actual, expected):
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_allclose(a, e, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("unit_gain", [True, False])
@pytest.mark.parametrize("variance_momentum, variance_reference", [(CNTK_VARIANCE, 1), (0.9, None), (0.99, 4)])
def test_cntk_variant_equals_cntks_adam_step_by_step(unit_gain, variance_momentum, variance_reference):
    """Each minibatch, kfit's optimizer gets what kfit's schedules assign (rate ``lr_s * B``, ``beta_1 =
    exp(-B / tau)``, ``minibatch_size = B``); its weights equal CNTK's after every step."""
    x, y = _data()
    optimizer = Adam(variant="cntk", unit_gain=unit_gain, epsilon=1e-8, beta_2=variance_momentum,
                     beta_2_minibatch_size=variance_reference)
    model = _model(optimizer)
    reference = CNTKAdamReference(model.get_weights(), unit_gain=unit_gain, epsilon=1e-8,
                                  variance_momentum=variance_momentum, variance_reference=variance_reference)
    start = 0
    for batch, rate, tau in zip(SIZES, RATES, TAUS, strict=True):
        xb, yb = x[start:start + batch], y[start:start + batch]
        start += batch
        optimizer.learning_rate = kfit.schedules.learning_rate_per_sample(rate).for_minibatch(0, 0, batch)
        optimizer.beta_1.assign(kfit.schedules.momentum_as_time_constant(tau).for_minibatch(0, 0, batch))
        optimizer.minibatch_size.assign(batch)
        model.train_on_batch(xb, yb)
        expected = reference.step(xb, yb, learning_rate=rate, learning_rate_reference=1,
                                  momentum=_momentum_per_sample(tau), momentum_reference=1)
        _assert_close(model.get_weights(), expected)


def test_kfit_fit_with_cntks_schedules_trains_as_cntk():
    """The ported script: kfit.fit with kfit.cntk's schedules (a minibatch-size schedule, a per-sample rate, a
    momentum time constant) and the optimizer kfit.cntk.adam writes; the weights equal CNTK's after the sweep."""
    x, y = _data()
    with pytest.raises(TypeError) as raised:
        kfit.cntk.adam([], kfit.cntk.learning_parameter_schedule_per_sample(RATES),
                       kfit.cntk.momentum_as_time_constant_schedule(TAUS), unit_gain=False)
    written = str(raised.value).split("optimizer=", 1)[1].split(", loss=", 1)[0]
    model = _model(eval(written, {"kfit": kfit}))
    reference = CNTKAdamReference(model.get_weights(), unit_gain=False, epsilon=1e-8,
                                  variance_momentum=CNTK_VARIANCE, variance_reference=1)
    kfit.fit(model, x, y, minibatch_size=kfit.schedules.minibatch_size(SIZES), epoch_size=len(x), epochs=1,
             shuffle=False, verbose=0,
             callbacks=[kfit.callbacks.LearningRateSchedule(kfit.cntk.learning_parameter_schedule_per_sample(RATES)),
                        kfit.callbacks.MomentumSchedule(kfit.cntk.momentum_as_time_constant_schedule(TAUS))])
    assert kfit.get_clock(model).samples == len(x)
    start = 0
    for batch, rate, tau in zip(SIZES, RATES, TAUS, strict=True):
        expected = reference.step(x[start:start + batch], y[start:start + batch], learning_rate=rate,
                                  learning_rate_reference=1, momentum=_momentum_per_sample(tau), momentum_reference=1)
        start += batch
    _assert_close(model.get_weights(), expected)


def test_a_rate_per_minibatch_is_cntks_ignore_rate():
    """CNTK's ``adam(params, lr=0.05, ...)`` (a float: reference size IGNORE) uses ``lr / B`` on the summed gradient
    (``LearnerBase::LearningRate``); kfit's ``learning_rate_per_minibatch`` rate, as is, does the same."""
    x, y = _data()
    optimizer = Adam(learning_rate=0.05, beta_1=0.8, variant="cntk", epsilon=1e-8, beta_2=0.95)
    model = _model(optimizer)
    reference = CNTKAdamReference(model.get_weights(), unit_gain=True, epsilon=1e-8, variance_momentum=0.95,
                                  variance_reference=None)
    start = 0
    for batch in SIZES:
        optimizer.minibatch_size.assign(batch)
        model.train_on_batch(x[start:start + batch], y[start:start + batch])
        expected = reference.step(x[start:start + batch], y[start:start + batch], learning_rate=0.05,
                                  learning_rate_reference=None, momentum=0.8, momentum_reference=None)
        start += batch
        _assert_close(model.get_weights(), expected)


def test_the_keras_variant_is_not_cntks_update():
    """What the migration guide wrote before the CNTK variant (``Adam()`` with the same schedules) is Keras's update:
    with minibatches of 8 and a per-sample rate its first step is ``B`` = 8 times CNTK's."""
    x, y = _data()
    optimizer = Adam(epsilon=1e-8, beta_2=CNTK_VARIANCE**8)
    model = _model(optimizer)
    initial = model.get_weights()
    reference = CNTKAdamReference(initial, unit_gain=True, epsilon=1e-8, variance_momentum=CNTK_VARIANCE,
                                  variance_reference=1)
    optimizer.learning_rate = 0.001 * 8
    optimizer.beta_1.assign(math.exp(-8 / 100))
    model.train_on_batch(x[:8], y[:8])
    expected = reference.step(x[:8], y[:8], learning_rate=0.001, learning_rate_reference=1,
                              momentum=math.exp(-1 / 100), momentum_reference=1)
    kfit_step = np.abs(model.get_weights()[0] - initial[0])
    cntk_step = np.abs(expected[0] - initial[0])
    np.testing.assert_allclose(kfit_step / cntk_step, 8.0, rtol=5e-3)  # float32's 1 - beta_2 in Keras's form


def test_keras_only_and_cntk_only_arguments_are_refused_with_the_way_out():
    with pytest.raises(ValueError, match=r"`unit_gain`.*variant='cntk'.*Received: unit_gain=False"):
        Adam(unit_gain=False)
    with pytest.raises(ValueError, match=r"`beta_2_minibatch_size`.*only variant='cntk'.*Received: "
                                         r"beta_2_minibatch_size=1.0 with variant='keras'"):
        Adam(beta_2_minibatch_size=1)
    with pytest.raises(ValueError, match=r"`amsgrad`.*CNTK's adam has no AMSGrad.*variant='keras'"):
        Adam(variant="cntk", amsgrad=True)
    with pytest.raises(ValueError, match=r"`variant`.*\['keras', 'cntk'\].*'CNTK'"):
        Adam(variant="CNTK")
    with pytest.raises(ValueError, match=r"`minibatch_size`.*Received: minibatch_size=0"):
        Adam(variant="cntk", minibatch_size=0)
    with pytest.raises(ValueError, match=r"variance_momentum.*beta_2=m_s, beta_2_minibatch_size=1"):
        Adam(variant="cntk", variance_momentum=0.9)
    assert Adam().minibatch_size is None  # the Keras variant keeps the variables (and checkpoints) it had
    assert [v.name for v in Adam().variables] == ["iteration", "learning_rate", "beta_1", "beta_1_power"]


def test_cntk_variant_round_trips_its_config():
    optimizer = Adam(variant="cntk", unit_gain=False, beta_2=0.99, beta_2_minibatch_size=1, minibatch_size=16)
    restored = Adam.from_config(optimizer.get_config())
    assert (restored.variant, restored.unit_gain, restored.beta_2_minibatch_size) == ("cntk", False, 1.0)
    assert float(restored.minibatch_size.numpy()) == 16.0


def _fit_cntk_adam(x, y, checkpoint=None, **options):
    model = _model(Adam(variant="cntk", epsilon=1e-8, beta_2=CNTK_VARIANCE, beta_2_minibatch_size=1))
    callbacks = [kfit.callbacks.LearningRateSchedule(kfit.cntk.learning_parameter_schedule_per_sample(RATES)),
                 kfit.callbacks.MomentumSchedule(kfit.cntk.momentum_as_time_constant_schedule(TAUS))]
    if checkpoint is not None:
        callbacks.append(kfit.callbacks.Checkpoint(checkpoint, "20sp"))
    kfit.fit(model, x, y, minibatch_size=kfit.schedules.minibatch_size(SIZES), epoch_size=len(x), epochs=1,
             shuffle=False, verbose=0, callbacks=callbacks, **options)
    return model, callbacks[-1]


def test_a_run_resumed_from_a_checkpoint_goes_on_as_cntks(tmp_path):
    """The CNTK variant's update count and minibatch size are optimizer variables: a run stopped after 20 samples
    (4 minibatches) and resumed from its checkpoint ends with the uninterrupted run's weights and optimizer state."""
    x, y = _data()
    whole, _ = _fit_cntk_adam(x, y)
    path = tmp_path / "run.ckpt"
    stopped, _ = _fit_cntk_adam(x, y, checkpoint=path, max_samples=20)
    assert float(stopped.optimizer._update_count.numpy()) == 4
    resumed, checkpoint = _fit_cntk_adam(x, y, checkpoint=path)
    assert checkpoint.restored_from.samples == 20
    assert float(resumed.optimizer._update_count.numpy()) == len(SIZES)
    for a, b in zip(whole.variables + whole.optimizer.variables, resumed.variables + resumed.optimizer.variables,
                    strict=True):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(a.value), keras.ops.convert_to_numpy(b.value),
                                   rtol=1e-6, atol=1e-7, err_msg=a.path)
