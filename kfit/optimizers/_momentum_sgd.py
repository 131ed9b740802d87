"""SGD with momentum whose momentum and minibatch size are variables: CNTK's update, or Keras's."""

import keras
from keras import ops

from kfit import _checks

from ._hyperparameters import add_hyperparameter_variable, checked_learning_rate

_VARIANTS = ("cntk", "keras")


@keras.saving.register_keras_serializable(package="kfit")
class MomentumSGD(keras.optimizers.Optimizer):
    """Momentum SGD whose momentum can change during training without recompiling the train step.

    ``momentum`` and ``minibatch_size`` are non-trainable float32 variables in ``optimizer.variables``
    (like ``learning_rate``), so ``optimizer.momentum.assign(0.5)`` takes effect at the next step on every
    backend; ``keras.optimizers.SGD`` compiles its momentum into the step as a constant.

    With ``g`` the mean gradient of the minibatch (what Keras computes), ``mu = momentum``,
    ``B = minibatch_size``, ``G = B * g`` (the gradient summed over the minibatch) and
    ``lr_s = learning_rate / B``, ``variant="cntk"`` is CNTK's ``momentum_sgd``::

        s = mu * s + (1 - mu) * G          # unit_gain=True (CNTK's default)
        s = mu * s + G                     # unit_gain=False
        w = w - lr_s * s                   # nesterov=False
        w = w - lr_s * (mu * s + (1 - mu) * G)   # nesterov=True, unit gain
        w = w - lr_s * (mu * s + G)              # nesterov=True, no unit gain

    The buffer ``s`` holds summed gradients, so a change of ``B``, of the rate or of ``mu`` does not
    rescale the past. For a constant ``B`` the value of ``minibatch_size`` cancels out, so the default 1
    gives the usual unit-gain momentum ``s = mu*s + (1-mu)*g; w -= learning_rate*s``. kfit assigns the
    size of each minibatch to ``minibatch_size`` before the step when it changes.

    ``variant="keras"`` is ``keras.optimizers.SGD``'s classic momentum (``unit_gain`` and
    ``minibatch_size`` play no part)::

        v = mu * v - learning_rate * g
        w = w + v                                # nesterov=False
        w = w + mu * v - learning_rate * g       # nesterov=True

    Weight decay is decoupled, as in Keras: ``w -= learning_rate * weight_decay * w`` before the update.

    Args:
        learning_rate: The rate per minibatch, applied to the mean gradient ``g`` (a float, a
            ``LearningRateSchedule`` or a callable, as in Keras). For a per-sample rate ``lr_s``
            kfit's schedules assign ``lr_s * B``.
        momentum: The initial momentum per minibatch, a float in ``[0, 1)``.
        nesterov: Whether to apply Nesterov momentum.
        unit_gain: Whether the gradient enters the buffer scaled by ``1 - mu`` (CNTK's default).
            Only used by ``variant="cntk"``.
        variant: ``"cntk"`` or ``"keras"``, the update rule above.
        minibatch_size: The initial value of the ``minibatch_size`` variable, a positive float.
        name: The optimizer's name; defaults to ``"momentum_sgd"`` (made unique by Keras).
        **kwargs: The other arguments of ``keras.optimizers.Optimizer`` (``weight_decay``,
            ``clipnorm``, ``clipvalue``, ``global_clipnorm``, ``use_ema``, ``ema_momentum``,
            ``ema_overwrite_frequency``, ``loss_scale_factor``, ``gradient_accumulation_steps``).

    Raises:
        ValueError: If ``momentum`` is outside ``[0, 1)``, ``minibatch_size`` is not positive, or
            ``variant`` is unknown; if a rate or momentum is a schedule (a callback applies it: the message
            says which), or a CNTK learner option is given (``l2_regularization_weight``,
            ``gradient_clipping_threshold_per_sample``, ...: the message says what to write instead).
        TypeError: If ``nesterov`` or ``unit_gain`` is not a bool, ``variant`` is not a string, or a
            number is not a number.

    Example:

    >>> import kfit
    >>> optimizer = kfit.optimizers.MomentumSGD(learning_rate=0.1, momentum=0.9)
    >>> _ = optimizer.momentum.assign(0.99)      # takes effect at the next step
    >>> round(float(optimizer.momentum.numpy()), 6)
    0.99
    >>> float(optimizer.minibatch_size.numpy())
    1.0
    """

    def __init__(
        self,
        learning_rate=0.01,
        momentum: float = 0.0,
        nesterov: bool = False,
        unit_gain: bool = True,
        variant: str = "cntk",
        minibatch_size: float = 1,
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
        **kwargs,
    ):
        learning_rate = checked_learning_rate("MomentumSGD", learning_rate, kwargs, ("momentum", momentum))
        momentum = _checks.real("momentum", momentum, low=0.0, high=1.0, high_inclusive=False)
        minibatch_size = _checks.real("minibatch_size", minibatch_size, low=0.0, low_inclusive=False)
        _checks.boolean("nesterov", nesterov)
        _checks.boolean("unit_gain", unit_gain)
        variant = _checks.choice("variant", variant, _VARIANTS)
        super().__init__(
            learning_rate=learning_rate, weight_decay=weight_decay, clipnorm=clipnorm, clipvalue=clipvalue,
            global_clipnorm=global_clipnorm, use_ema=use_ema, ema_momentum=ema_momentum,
            ema_overwrite_frequency=ema_overwrite_frequency, loss_scale_factor=loss_scale_factor,
            gradient_accumulation_steps=gradient_accumulation_steps, name=name, **kwargs)
        self.nesterov = nesterov
        self.unit_gain = unit_gain
        self.variant = variant
        # Tracked in `self.variables` right after `iteration` and `learning_rate`.
        self._momentum = add_hyperparameter_variable(self, "momentum", momentum)
        self._minibatch_size = add_hyperparameter_variable(self, "minibatch_size", minibatch_size)

    @property
    def momentum(self) -> keras.Variable:
        """The momentum per minibatch ``mu``, a float32 variable: change it with ``.assign(value)``."""
        return self._momentum

    @property
    def minibatch_size(self) -> keras.Variable:
        """The size ``B`` of the current minibatch, a float32 variable that kfit assigns."""
        return self._minibatch_size

    def build(self, variables):
        """Create one momentum buffer per model variable (always: the momentum may become nonzero)."""
        if self.built:
            return
        super().build(variables)
        self._buffers = self.add_optimizer_variables(variables, "momentum")

    def update_step(self, gradient, variable, learning_rate):
        """Update ``variable`` and its buffer for one minibatch, by the rule of ``self.variant``."""
        dtype = variable.dtype
        lr = ops.cast(learning_rate, dtype)
        g = ops.cast(gradient, dtype)
        mu = ops.cast(self._momentum, dtype)
        s = self._buffers[self._get_variable_index(variable)]

        if self.variant == "keras":
            s_new = ops.subtract(ops.multiply(mu, s), ops.multiply(lr, g))
            self.assign(s, s_new)
            if self.nesterov:
                self.assign_add(variable, ops.subtract(ops.multiply(mu, s_new), ops.multiply(lr, g)))
            else:
                self.assign_add(variable, s_new)
            return

        batch = ops.cast(self._minibatch_size, dtype)
        summed = ops.multiply(batch, g)  # G: CNTK's gradient, summed over the minibatch
        fresh = ops.multiply(ops.subtract(1.0, mu), summed) if self.unit_gain else summed
        s_new = ops.add(ops.multiply(mu, s), fresh)
        self.assign(s, s_new)
        direction = ops.add(ops.multiply(mu, s_new), fresh) if self.nesterov else s_new
        self.assign_sub(variable, ops.multiply(ops.divide(lr, batch), direction))

    def get_config(self) -> dict:
        """Return the constructor arguments, with the current momentum and minibatch size as floats."""
        config = super().get_config()
        config.update(
            {
                "momentum": float(ops.convert_to_numpy(self._momentum)),
                "nesterov": self.nesterov,
                "unit_gain": self.unit_gain,
                "variant": self.variant,
                "minibatch_size": float(ops.convert_to_numpy(self._minibatch_size)),
            }
        )
        return config
