"""Adam whose ``beta_1`` is a variable: Keras's update with the bias correction a changing ``beta_1`` needs, or CNTK's."""

import keras
from keras import ops

from kfit import _checks

from ._hyperparameters import add_hyperparameter_variable, checked_learning_rate

_VARIANTS = ("keras", "cntk")


@keras.saving.register_keras_serializable(package="kfit")
class Adam(keras.optimizers.Optimizer):
    """Adam whose ``beta_1`` can change during training (e.g. follow a momentum time constant).

    ``beta_1`` is a non-trainable float32 variable in ``optimizer.variables``, changed with
    ``optimizer.beta_1.assign(value)`` without recompiling the train step; ``keras.optimizers.Adam``
    compiles it into the step as a constant. At step ``t`` with gradient ``g`` (the mean over the
    minibatch, as Keras computes it), using the ``beta_1`` in force at that step (``b1_t``),
    ``variant="keras"`` (the default) is::

        P = P * b1_t                            # beta_1_power: product of the beta_1 values used
        m = m + (1 - b1_t) * (g - m)
        v = v + (1 - beta_2) * (g**2 - v)
        v_hat = max(v_hat, v)                   # amsgrad only; then v_hat replaces v below
        w = w - learning_rate * sqrt(1 - beta_2**t) / (1 - P) * m / (sqrt(v) + epsilon)

    For a constant ``beta_1``, ``P = beta_1**t`` and this is ``keras.optimizers.Adam``. ``P`` is one
    variable, ``beta_1_power``, multiplied by ``beta_1`` once per optimizer step (in
    ``_backend_update_step``, before the per-variable updates; with gradient accumulation only on the
    steps that update the weights), so it is saved and restored with the other optimizer variables.

    ``variant="cntk"`` is CNTK's ``adam`` learner (``LearnerAdam``, ``CPUMatrix::Adam``), tested step by step
    against a NumPy transcription of CNTK's C++. With ``B = minibatch_size`` (kfit assigns the size of each
    minibatch), ``G = B * g`` (CNTK's gradient, summed over the minibatch), ``lr_s = learning_rate / B``,
    ``b2_t = beta_2 ** (B / beta_2_minibatch_size)`` (``beta_2`` itself when ``beta_2_minibatch_size`` is None)
    and ``t`` the number of updates so far, this one included::

        m = b1_t * m + (1 - b1_t) * G           # unit_gain=True (CNTK's default)
        m = b1_t * m + G                        # unit_gain=False
        v = b2_t * v + (1 - b2_t) * G**2
        w = w - lr_s * sqrt(1 - b2_t**t) / (1 - b1_t**t) * m / (sqrt(v) + epsilon)

    The moments hold summed gradients and the bias correction raises the momenta in force to the power ``t``,
    as CNTK does. kfit's per-sample learning rates assign ``learning_rate = lr_s * B``, so ``lr_s`` is CNTK's rate
    per sample; ``beta_2_minibatch_size=1`` makes ``beta_2`` per sample, as CNTK's default ``variance_momentum``
    (``momentum_schedule_per_sample(0.9999986111120757)``). CNTK's ``epsilon`` defaults to 1e-8.

    Args:
        learning_rate: A float, a ``LearningRateSchedule`` or a callable, as in Keras; with ``variant="cntk"``
            the rate per minibatch on the mean gradient (kfit's schedules assign ``lr_s * B`` for a per-sample
            rate ``lr_s``).
        beta_1: The initial decay rate of the first moment per minibatch, a float in ``[0, 1)``.
        beta_2: The decay rate of the second moment, a float in ``[0, 1)`` (a constant): per minibatch, or per
            ``beta_2_minibatch_size`` samples.
        epsilon: The small constant added to ``sqrt(v)``, a float >= 0.
        amsgrad: Whether to use the AMSGrad variant, as ``keras.optimizers.Adam`` does (``variant="keras"`` only).
        name: The optimizer's name; defaults to ``"adam"`` (made unique by Keras).
        unit_gain: CNTK's ``adam`` option: whether the gradient enters the first moment scaled by ``1 - b1_t``.
            ``variant="keras"`` is unit-gain and refuses ``False``; ``variant="cntk"`` takes both.
        variant: ``"keras"`` or ``"cntk"``, the update rule above.
        minibatch_size: The initial value of the ``minibatch_size`` variable (``variant="cntk"`` only), a positive
            float; kfit assigns the size of each minibatch.
        beta_2_minibatch_size: The number of samples ``beta_2`` is the decay for (``variant="cntk"`` only): None
            (per minibatch, CNTK's ``momentum_schedule(v)``), 1 (per sample, CNTK's
            ``momentum_schedule_per_sample(v)``) or ``B_ref`` (CNTK's ``momentum_schedule(v, minibatch_size=B_ref)``).
        **kwargs: The other arguments of ``keras.optimizers.Optimizer`` (``weight_decay``,
            ``clipnorm``, ``clipvalue``, ``global_clipnorm``, ``use_ema``, ``ema_momentum``,
            ``ema_overwrite_frequency``, ``loss_scale_factor``, ``gradient_accumulation_steps``).

    Raises:
        ValueError: If ``beta_1`` or ``beta_2`` is outside ``[0, 1)``, ``epsilon`` is negative, ``variant`` is
            unknown, ``minibatch_size`` or ``beta_2_minibatch_size`` is not positive; if ``variant="keras"`` is
            given ``unit_gain=False``, ``minibatch_size`` or ``beta_2_minibatch_size``, or ``variant="cntk"``
            ``amsgrad=True``; if a rate or ``beta_1`` is a schedule (a callback applies it: the message says
            which), or a CNTK learner option is given (``momentum``, ``variance_momentum``,
            ``l2_regularization_weight``, ...: the message says what to write instead).
        TypeError: If ``amsgrad`` or ``unit_gain`` is not a bool or a number is not a number.

    Example:

    >>> import kfit
    >>> optimizer = kfit.optimizers.Adam(learning_rate=1e-3, beta_1=0.9)
    >>> _ = optimizer.beta_1.assign(0.95)        # takes effect at the next step
    >>> round(float(optimizer.beta_1.numpy()), 6)
    0.95
    >>> float(optimizer.beta_1_power.numpy())   # no step taken yet
    1.0
    >>> cntk = kfit.optimizers.Adam(variant="cntk", epsilon=1e-8, beta_2=0.9999986111120757, beta_2_minibatch_size=1)
    >>> float(cntk.minibatch_size.numpy())      # kfit assigns the size of each minibatch
    1.0
    """

    def __init__(
        self,
        learning_rate=0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        amsgrad: bool = False,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        loss_scale_factor=None,
        gradient_accumulation_steps=None,
        name=None,
        *,
        unit_gain: bool = True,
        variant: str = "keras",
        minibatch_size: float | None = None,
        beta_2_minibatch_size: float | None = None,
        **kwargs,
    ):
        learning_rate = checked_learning_rate("Adam", learning_rate, kwargs, ("beta_1", beta_1), {
            "momentum": lambda m: (
                "CNTK's adam momentum is beta_1 here (per minibatch): give beta_1, or apply a momentum schedule "
                "(momentum_as_time_constant, ...) with callbacks=[kfit.callbacks.MomentumSchedule(schedule)], which "
                "sets beta_1."),
            "variance_momentum": lambda m: (
                "CNTK's variance_momentum is beta_2 here: with variant='cntk', a per-sample value m_s (CNTK's default "
                "momentum_schedule_per_sample(0.9999986111120757)) is beta_2=m_s, beta_2_minibatch_size=1; a value "
                "per minibatch is beta_2 alone (variant='keras' takes beta_2 = m_s ** B, exact only for a constant minibatch "
                "size B)."),
            "adamax": lambda v: (
                "kfit's Adam has no adamax variant; keras.optimizers.Adamax is Keras's (on the mean gradient, not "
                "tested against CNTK's adamax=True)."),
        })
        beta_1 = _checks.real("beta_1", beta_1, low=0.0, high=1.0, high_inclusive=False)
        beta_2 = _checks.real("beta_2", beta_2, low=0.0, high=1.0, high_inclusive=False)
        epsilon = _checks.real("epsilon", epsilon, low=0.0)
        _checks.boolean("amsgrad", amsgrad)
        _checks.boolean("unit_gain", unit_gain)
        variant = _checks.choice("variant", variant, _VARIANTS)
        minibatch_size = _checks.real("minibatch_size", minibatch_size, low=0.0, low_inclusive=False, allow_none=True)
        beta_2_minibatch_size = _checks.real(
            "beta_2_minibatch_size", beta_2_minibatch_size, low=0.0, low_inclusive=False, allow_none=True)
        if variant == "keras":
            _refuse_cntk_only(unit_gain, minibatch_size, beta_2_minibatch_size)
        elif amsgrad:
            raise ValueError(
                "Invalid value for argument `amsgrad`: CNTK's adam has no AMSGrad; variant='cntk' is CNTK's update. "
                "Received: amsgrad=True with variant='cntk'. Leave amsgrad out, or use variant='keras'.")
        super().__init__(
            learning_rate=learning_rate, weight_decay=weight_decay, clipnorm=clipnorm, clipvalue=clipvalue,
            global_clipnorm=global_clipnorm, use_ema=use_ema, ema_momentum=ema_momentum,
            ema_overwrite_frequency=ema_overwrite_frequency, loss_scale_factor=loss_scale_factor,
            gradient_accumulation_steps=gradient_accumulation_steps, name=name, **kwargs)
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.amsgrad = amsgrad
        self.unit_gain = unit_gain
        self.variant = variant
        self.beta_2_minibatch_size = beta_2_minibatch_size
        # Tracked in `self.variables` right after `iteration` and `learning_rate`. The CNTK variant's two more come
        # after them, so a Keras-variant Adam keeps the variables (and checkpoints) it had.
        self._beta_1 = add_hyperparameter_variable(self, "beta_1", beta_1)
        self._beta_1_power = add_hyperparameter_variable(self, "beta_1_power", 1.0)
        if variant == "cntk":
            self._minibatch_size = add_hyperparameter_variable(self, "minibatch_size", minibatch_size or 1.0)
            self._update_count = add_hyperparameter_variable(self, "update_count", 0.0)

    @property
    def beta_1(self) -> keras.Variable:
        """The decay rate of the first moment, a float32 variable: change it with ``.assign(value)``."""
        return self._beta_1

    @property
    def beta_1_power(self) -> keras.Variable:
        """The product of the ``beta_1`` values used so far (1 before the first step), a variable."""
        return self._beta_1_power

    @property
    def minibatch_size(self) -> keras.Variable | None:
        """``variant="cntk"``: the size ``B`` of the current minibatch, a float32 variable that kfit assigns; None
        for ``variant="keras"``, whose update does not depend on it."""
        return getattr(self, "_minibatch_size", None)

    def build(self, variables):
        """Create the first and second moments (and ``v_hat`` with amsgrad) for each model variable."""
        if self.built:
            return
        super().build(variables)
        self._momentums, self._velocities = self.add_optimizer_variables(variables, ["momentum", "velocity"])
        if self.amsgrad:
            self._velocity_hats = self.add_optimizer_variables(variables, "velocity_hat")

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        # The one place that runs once per optimizer step, just before the per-variable updates, and
        # only on the steps that update the weights (Keras wraps it in the gradient-accumulation cond).
        self.assign(self._beta_1_power, ops.multiply(self._beta_1_power, self._beta_1))
        if self.variant == "cntk":
            self.assign_add(self._update_count, ops.ones((), dtype=self._update_count.dtype))
        super()._backend_update_step(grads, trainable_variables, learning_rate)

    def update_step(self, gradient, variable, learning_rate):
        """Update ``variable`` and its moments for one step (``beta_1_power`` is already updated)."""
        if self.variant == "cntk":
            self._cntk_update_step(gradient, variable, learning_rate)
            return
        dtype = variable.dtype
        lr = ops.cast(learning_rate, dtype)
        g = ops.cast(gradient, dtype)
        beta_1 = ops.cast(self._beta_1, dtype)
        beta_1_power = ops.cast(self._beta_1_power, dtype)
        local_step = ops.cast(self.iterations + 1, dtype)
        beta_2_power = ops.power(ops.cast(self.beta_2, dtype), local_step)

        index = self._get_variable_index(variable)
        m = self._momentums[index]
        v = self._velocities[index]
        alpha = lr * ops.sqrt(1 - beta_2_power) / (1 - beta_1_power)

        self.assign_add(m, ops.multiply(ops.subtract(g, m), 1 - beta_1))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(g), v), 1 - self.beta_2))
        if self.amsgrad:
            v_hat = self._velocity_hats[index]
            self.assign(v_hat, ops.maximum(v_hat, v))
            v = v_hat
        self.assign_sub(variable, ops.divide(ops.multiply(m, alpha), ops.add(ops.sqrt(v), self.epsilon)))

    def _cntk_update_step(self, gradient, variable, learning_rate):
        # CNTK's LearnerAdam::Update -> Matrix::AdamUpdate -> CPUMatrix::Adam, on G = B * g.
        dtype = variable.dtype
        batch = ops.cast(self._minibatch_size, dtype)
        lr_per_sample = ops.divide(ops.cast(learning_rate, dtype), batch)
        summed = ops.multiply(batch, ops.cast(gradient, dtype))
        mu = ops.cast(self._beta_1, dtype)
        var_mu = ops.cast(self.beta_2, dtype)
        if self.beta_2_minibatch_size is not None:
            var_mu = ops.power(var_mu, ops.divide(batch, self.beta_2_minibatch_size))
        t = ops.cast(self._update_count, dtype)
        bias_correction = ops.divide(ops.sqrt(1 - ops.power(var_mu, t)), 1 - ops.power(mu, t))

        index = self._get_variable_index(variable)
        m = self._momentums[index]
        v = self._velocities[index]
        v_new = ops.add(ops.multiply(var_mu, v), ops.multiply(1 - var_mu, ops.square(summed)))
        self.assign(v, v_new)
        fresh = ops.multiply(1 - mu, summed) if self.unit_gain else summed
        m_new = ops.add(ops.multiply(mu, m), fresh)
        self.assign(m, m_new)
        scale = ops.divide(bias_correction, ops.add(ops.sqrt(v_new), self.epsilon))
        self.assign_sub(variable, ops.multiply(ops.multiply(m_new, scale), lr_per_sample))

    def get_config(self) -> dict:
        """Return the constructor arguments, with the current ``beta_1`` (and minibatch size) as floats."""
        config = super().get_config()
        config.update(
            {
                "beta_1": float(ops.convert_to_numpy(self._beta_1)),
                "beta_2": self.beta_2,
                "epsilon": self.epsilon,
                "amsgrad": self.amsgrad,
            }
        )
        if self.variant == "cntk":  # (the Keras variant's configuration is the one it had before the CNTK variant)
            config.update({
                "unit_gain": self.unit_gain,
                "variant": self.variant,
                "minibatch_size": float(ops.convert_to_numpy(self._minibatch_size)),
                "beta_2_minibatch_size": self.beta_2_minibatch_size,
            })
        return config


def _refuse_cntk_only(unit_gain: bool, minibatch_size: float | None, beta_2_minibatch_size: float | None) -> None:
    """Refuses, for ``variant="keras"``, the arguments only CNTK's update reads, saying to give ``variant="cntk"``."""
    if not unit_gain:
        raise ValueError(
            "Invalid value for argument `unit_gain`: variant='keras' is unit-gain (m += (1 - beta_1) * (g - m)); "
            "CNTK's unit_gain=False (m = beta_1 * m + g) has no counterpart in it: it is variant='cntk' (CNTK's "
            "update). Received: unit_gain=False. Give variant='cntk', or leave unit_gain out.")
    for name, value in (("minibatch_size", minibatch_size), ("beta_2_minibatch_size", beta_2_minibatch_size)):
        if value is not None:
            raise ValueError(
                f"Invalid value for argument `{name}`: only variant='cntk' (CNTK's update on the gradient summed over "
                f"the minibatch) reads it. Received: {name}={value!r} with variant='keras'. Give variant='cntk', or "
                f"leave {name} out.")
