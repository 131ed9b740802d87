"""Adam whose ``beta_1`` is a variable, with the bias correction that a changing ``beta_1`` needs."""

import keras
from keras import ops

from kfit import _checks

from ._hyperparameters import add_hyperparameter_variable, refuse_cntk_options, refuse_schedule


@keras.saving.register_keras_serializable(package="kfit")
class Adam(keras.optimizers.Optimizer):
    """Adam whose ``beta_1`` can change during training (e.g. follow a momentum time constant).

    ``beta_1`` is a non-trainable float32 variable in ``optimizer.variables``, changed with
    ``optimizer.beta_1.assign(value)`` without recompiling the train step; ``keras.optimizers.Adam``
    compiles it into the step as a constant. At step ``t`` with gradient ``g``, using the ``beta_1``
    in force at that step (``b1_t``)::

        P = P * b1_t                            # beta_1_power: product of the beta_1 values used
        m = m + (1 - b1_t) * (g - m)
        v = v + (1 - beta_2) * (g**2 - v)
        v_hat = max(v_hat, v)                   # amsgrad only; then v_hat replaces v below
        w = w - learning_rate * sqrt(1 - beta_2**t) / (1 - P) * m / (sqrt(v) + epsilon)

    For a constant ``beta_1``, ``P = beta_1**t`` and this is ``keras.optimizers.Adam``. ``P`` is one
    variable, ``beta_1_power``, multiplied by ``beta_1`` once per optimizer step (in
    ``_backend_update_step``, before the per-variable updates; with gradient accumulation only on the
    steps that update the weights), so it is saved and restored with the other optimizer variables.

    Args:
        learning_rate: A float, a ``LearningRateSchedule`` or a callable, as in Keras.
        beta_1: The initial decay rate of the first moment, a float in ``[0, 1)``.
        beta_2: The decay rate of the second moment, a float in ``[0, 1)`` (a constant).
        epsilon: The small constant added to ``sqrt(v)``, a float >= 0.
        amsgrad: Whether to use the AMSGrad variant, as ``keras.optimizers.Adam`` does.
        name: The optimizer's name; defaults to ``"adam"`` (made unique by Keras).
        unit_gain: CNTK's ``adam`` option, accepted as ``True`` only: the update above is CNTK's unit-gain form
            (``m = b1_t * m + (1 - b1_t) * g``, its default); ``unit_gain=False`` (``m = b1_t * m + g``) has no
            counterpart and is refused.
        **kwargs: The other arguments of ``keras.optimizers.Optimizer`` (``weight_decay``,
            ``clipnorm``, ``clipvalue``, ``global_clipnorm``, ``use_ema``, ``ema_momentum``,
            ``ema_overwrite_frequency``, ``loss_scale_factor``, ``gradient_accumulation_steps``).

    Raises:
        ValueError: If ``beta_1`` or ``beta_2`` is outside ``[0, 1)``, ``epsilon`` is negative or ``unit_gain`` is
            False; if a rate or ``beta_1`` is a schedule (a callback applies it: the message says which), or a CNTK
            learner option is given (``momentum``, ``variance_momentum``, ``l2_regularization_weight``, ...: the
            message says what to write instead).
        TypeError: If ``amsgrad`` or ``unit_gain`` is not a bool or a number is not a number.

    Example:

    >>> import kfit
    >>> optimizer = kfit.optimizers.Adam(learning_rate=1e-3, beta_1=0.9)
    >>> _ = optimizer.beta_1.assign(0.95)        # takes effect at the next step
    >>> round(float(optimizer.beta_1.numpy()), 6)
    0.95
    >>> float(optimizer.beta_1_power.numpy())   # no step taken yet
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
        **kwargs,
    ):
        refuse_cntk_options("Adam", kwargs, {"momentum": lambda m: (
            "CNTK's adam momentum is beta_1 here (per minibatch): give beta_1, or apply a momentum schedule "
            "(momentum_as_time_constant, ...) with callbacks=[kfit.callbacks.MomentumSchedule(schedule)], which sets "
            "beta_1.")})
        refuse_schedule("Adam", "learning_rate", learning_rate, "LearningRateSchedule")
        refuse_schedule("Adam", "beta_1", beta_1, "MomentumSchedule")
        beta_1 = _checks.real("beta_1", beta_1, low=0.0, high=1.0, high_inclusive=False)
        beta_2 = _checks.real("beta_2", beta_2, low=0.0, high=1.0, high_inclusive=False)
        epsilon = _checks.real("epsilon", epsilon, low=0.0)
        _checks.boolean("amsgrad", amsgrad)
        _checks.boolean("unit_gain", unit_gain)
        if not unit_gain:
            raise ValueError(
                "Invalid value for argument `unit_gain`: kfit's Adam is unit-gain (CNTK's default, m += (1 - beta_1) * "
                "(g - m)); CNTK's unit_gain=False (m = beta_1 * m + g) has no counterpart. Received: unit_gain=False. "
                "Leave unit_gain out (or give unit_gain=True).")
        if isinstance(learning_rate, int) and not isinstance(learning_rate, bool):
            learning_rate = float(learning_rate)  # Keras refuses an int rate
        super().__init__(
            learning_rate=learning_rate,
            weight_decay=weight_decay,
            clipnorm=clipnorm,
            clipvalue=clipvalue,
            global_clipnorm=global_clipnorm,
            use_ema=use_ema,
            ema_momentum=ema_momentum,
            ema_overwrite_frequency=ema_overwrite_frequency,
            loss_scale_factor=loss_scale_factor,
            gradient_accumulation_steps=gradient_accumulation_steps,
            name=name,
            **kwargs,
        )
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.amsgrad = amsgrad
        # Tracked in `self.variables` right after `iteration` and `learning_rate`.
        self._beta_1 = add_hyperparameter_variable(self, "beta_1", beta_1)
        self._beta_1_power = add_hyperparameter_variable(self, "beta_1_power", 1.0)

    @property
    def beta_1(self) -> keras.Variable:
        """The decay rate of the first moment, a float32 variable: change it with ``.assign(value)``."""
        return self._beta_1

    @property
    def beta_1_power(self) -> keras.Variable:
        """The product of the ``beta_1`` values used so far (1 before the first step), a variable."""
        return self._beta_1_power

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
        super()._backend_update_step(grads, trainable_variables, learning_rate)

    def update_step(self, gradient, variable, learning_rate):
        """Update ``variable`` and its moments for one step (``beta_1_power`` is already updated)."""
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

    def get_config(self) -> dict:
        """Return the constructor arguments, with the current ``beta_1`` as a float."""
        config = super().get_config()
        config.update(
            {
                "beta_1": float(ops.convert_to_numpy(self._beta_1)),
                "beta_2": self.beta_2,
                "epsilon": self.epsilon,
                "amsgrad": self.amsgrad,
            }
        )
        return config
