"""Hyperparameters held in backend variables: create them, validate them, find them on any optimizer.

A hyperparameter that changes during training must be a variable of the optimizer (an entry of
``optimizer.variables``): on JAX the optimizer variables are the state passed into the jitted train step,
and on TensorFlow a Python float would be a constant of the traced graph. Keras keeps the learning rate in
a variable, but ``SGD.momentum`` and ``Adam.beta_1`` are Python floats, so changing them during training
is silently ignored there. This module finds the variable a schedule must assign, and refuses loudly,
saying what to use instead, where there is none.
"""

import numbers

import keras

HYPERPARAMETERS = ("learning_rate", "momentum", "beta_1", "minibatch_size")
"""The hyperparameters that kfit's schedules know how to set."""

# CNTK learner options (momentum_sgd, adam, ...) that kfit's optimizers do not take, and what to write instead:
# each is a function of the value received. CNTK's gradient is the sum over the minibatch (B samples), Keras's the
# mean: a per-sample threshold or weight on the sum is the same number on the mean.
_CNTK_OPTIONS = {
    "l2_regularization_weight": lambda w: (
        f"CNTK adds {w} * W per sample to the summed gradient, that is {w} * W to Keras's mean gradient: give the layers "
        f"kernel_regularizer=keras.regularizers.L2({w} / 2) (and bias_regularizer), or use weight_decay (decoupled)."),
    "l1_regularization_weight": lambda w: (
        "CNTK applies L1 as a proximal step after the update, which kfit does not; the nearest is "
        f"kernel_regularizer=keras.regularizers.L1({w}) on the layers."),
    "gradient_clipping_threshold_per_sample": lambda t: (
        f"CNTK clips the summed gradient at {t} * B, that is Keras's mean gradient at {t}: give clipvalue={t} (CNTK's "
        f"default gradient_clipping_with_truncation=True) or clipnorm={t} (gradient_clipping_with_truncation=False)."),
    "gradient_clipping_with_truncation": lambda v: (
        "Clip with clipvalue=t (truncation) or clipnorm=t (norm) instead, t being CNTK's "
        "gradient_clipping_threshold_per_sample."),
    "gaussian_noise_injection_std_dev": lambda v: "kfit does not add noise to the weights; leave it out.",
    "use_mean_gradient": lambda v: (
        "Keras's gradient is always the mean over the minibatch, and kfit's schedules carry the rate's unit "
        "(kfit.cntk.learning_parameter_schedule for a rate on the mean, learning_parameter_schedule_per_sample for a "
        "rate per sample): leave it out."),
    "variance_momentum": lambda m: (
        "Give beta_2, the variance momentum per minibatch: a per-sample value m_s (CNTK's default "
        "momentum_schedule_per_sample(0.9999986111120757)) is beta_2 = m_s ** B for minibatches of B samples."),
    "adamax": lambda v: "Use keras.optimizers.Adamax.",
}


def refuse_cntk_options(owner: str, given: dict, extra: dict | None = None) -> None:
    """Refuses CNTK learner options (``momentum_sgd(..., l2_regularization_weight=...)``) that ``owner`` does not
    take, naming the value and what to write instead; other unknown keywords are left to Keras."""
    options = {**_CNTK_OPTIONS, **(extra or {})}
    for name, value in given.items():
        if name in options:
            raise ValueError(f"{owner} has no argument `{name}` (a CNTK learner option). Received: {name}={value!r}. "
                             + options[name](value))


def checked_learning_rate(owner: str, learning_rate: object, given: dict, momentum: tuple[str, object],
                          cntk_options: dict | None = None) -> object:
    """``learning_rate`` for Keras's optimizer (an int as a float: Keras refuses one), after refusing CNTK learner
    options among the keywords ``given`` to ``owner`` and a schedule given as ``learning_rate`` or as the
    hyperparameter a ``MomentumSchedule`` sets (``momentum``: its name and value)."""
    refuse_cntk_options(owner, given, cntk_options)
    refuse_schedule(owner, "learning_rate", learning_rate, "LearningRateSchedule")
    refuse_schedule(owner, *momentum, "MomentumSchedule")
    return float(learning_rate) if isinstance(learning_rate, int) and not isinstance(learning_rate, bool) else learning_rate


def refuse_schedule(owner: str, name: str, value: object, callback: str) -> None:
    """Refuses a kfit (or CNTK-style) schedule given to an optimizer as a hyperparameter: a callback applies it."""
    from kfit.schedules import HyperparameterSchedule, Schedule

    if isinstance(value, (HyperparameterSchedule, Schedule)):
        raise ValueError(
            f"Invalid value for argument `{name}`: expected a number. Received: {name}={value!r}. {owner} takes the "
            f"initial value; a schedule (as CNTK's learners take) is applied by a callback: give "
            f"callbacks=[kfit.callbacks.{callback}(schedule)] to kfit.fit or model.fit.")


# Which kfit optimizer keeps each hyperparameter in a variable, for the error messages.
_KFIT_OPTIMIZER_FOR = {
    "momentum": "kfit.optimizers.MomentumSGD",
    "beta_1": "kfit.optimizers.Adam",
    "minibatch_size": "kfit.optimizers.MomentumSGD",
}


def hyperparameter_variable(optimizer: keras.optimizers.Optimizer, name: str) -> keras.Variable:
    """Return the backend variable that holds hyperparameter ``name`` of ``optimizer``.

    A callback changes the hyperparameter with ``variable.assign(value)``; the compiled train step reads
    the variable, so the change takes effect at the next step without recompiling. A
    ``keras.optimizers.LossScaleOptimizer`` is looked through to its inner optimizer.

    Args:
        optimizer: A Keras optimizer.
        name: ``"learning_rate"``, ``"momentum"``, ``"beta_1"``, ``"minibatch_size"``, or the name of
            any other attribute of ``optimizer`` that holds a scalar float variable.

    Returns:
        The ``keras.Variable`` (one of ``optimizer.variables``) that holds the hyperparameter.

    Raises:
        TypeError: If ``optimizer`` is not a Keras optimizer or ``name`` is not a string.
        ValueError: If the optimizer keeps the hyperparameter as a Python float (e.g.
            ``keras.optimizers.SGD`` and ``"momentum"``), if its learning rate is a
            ``LearningRateSchedule`` or a callable, or if it has no such hyperparameter; the message
            says what to use instead.

    Example:

    >>> import kfit
    >>> optimizer = kfit.optimizers.MomentumSGD(learning_rate=0.1, momentum=0.9)
    >>> momentum = kfit.optimizers.hyperparameter_variable(optimizer, "momentum")
    >>> _ = momentum.assign(0.5)
    >>> round(float(optimizer.momentum.numpy()), 6)
    0.5
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "Argument `optimizer` must be a keras.optimizers.Optimizer. "
            f"Received: optimizer={optimizer!r} of type {type(optimizer).__name__}"
        )
    if not isinstance(name, str):
        raise TypeError(f"Argument `name` must be a string. Received: name={name!r}")
    optimizer = unwrapped(optimizer)
    if name == "learning_rate":
        return _learning_rate_variable(optimizer)

    value = getattr(optimizer, name, None)
    if _is_float_scalar_variable(value):
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        raise ValueError(_python_float_message(optimizer, name))
    available = [n for n in HYPERPARAMETERS if _has_variable(optimizer, n)]
    message = (
        f"{_display_name(optimizer)} has no hyperparameter `{name}` held in a variable. "
        f"Hyperparameters held in variables on this optimizer: {available}."
    )
    if name in _KFIT_OPTIMIZER_FOR:
        message += f" {_KFIT_OPTIMIZER_FOR[name]} keeps `{name}` in a variable."
    raise ValueError(message)


def minibatch_size_variable(optimizer: keras.optimizers.Optimizer) -> keras.Variable | None:
    """Return the optimizer's ``minibatch_size`` variable, or ``None`` when it has none.

    kfit assigns the size of the next minibatch to this variable before each step where it changes
    (``kfit.optimizers.MomentumSGD`` needs it to sum the gradient over the minibatch, as CNTK does).

    Args:
        optimizer: A Keras optimizer (a ``LossScaleOptimizer`` is looked through).

    Returns:
        The ``keras.Variable`` named ``minibatch_size``, or ``None``.

    Example:

    >>> import keras, kfit
    >>> kfit.optimizers.minibatch_size_variable(keras.optimizers.SGD()) is None
    True
    >>> variable = kfit.optimizers.minibatch_size_variable(kfit.optimizers.MomentumSGD(minibatch_size=32))
    >>> float(variable.numpy())
    32.0
    """
    value = getattr(unwrapped(optimizer), "minibatch_size", None)
    return value if _is_float_scalar_variable(value) else None


def add_hyperparameter_variable(optimizer: keras.optimizers.Optimizer, name: str, value: float):
    """Create a scalar float32 variable that ``optimizer`` tracks in ``optimizer.variables``.

    Created with the optimizer's public ``add_variable`` (so it is saved and loaded with the optimizer,
    and is part of the state of the jitted train step on JAX), and aggregated like the learning rate.
    """
    return optimizer.add_variable(
        shape=(),
        initializer=keras.initializers.Constant(float(value)),
        dtype="float32",
        aggregation="only_first_replica",
        name=name,
    )



def unwrapped(optimizer):
    """The optimizer that holds the hyperparameters: a ``LossScaleOptimizer``'s (``mixed_float16``) inner one (it
    delegates the learning rate but keeps the other hyperparameters inside), else ``optimizer``."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def gradient_accumulation_steps(optimizer) -> int:
    """How many steps the optimizer averages into one update (Keras's ``gradient_accumulation_steps``; 1 without;
    a ``LossScaleOptimizer``'s is its inner optimizer's)."""
    steps = getattr(optimizer, "gradient_accumulation_steps", None) or getattr(
        unwrapped(optimizer), "gradient_accumulation_steps", None)
    return int(steps) if steps else 1


def _is_float_scalar_variable(value) -> bool:
    return (
        isinstance(value, keras.Variable)
        and tuple(value.shape) == ()
        and keras.backend.standardize_dtype(value.dtype).startswith(("float", "bfloat"))
    )


def _has_variable(optimizer, name: str) -> bool:
    if name == "learning_rate":
        return _is_float_scalar_variable(getattr(optimizer, "_learning_rate", None))
    return _is_float_scalar_variable(getattr(optimizer, name, None))


def _learning_rate_variable(optimizer):
    # `_learning_rate` is where BaseOptimizer keeps the variable, schedule or callable; reading the
    # public `learning_rate` property would evaluate a schedule.
    learning_rate = getattr(optimizer, "_learning_rate", None)
    if _is_float_scalar_variable(learning_rate):
        return learning_rate
    what = _display_name(optimizer)
    if isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        raise ValueError(
            f"This {what} was created with a keras.optimizers.schedules.LearningRateSchedule "
            f"({type(learning_rate).__name__}) as its `learning_rate`, so its learning rate is computed "
            "from the iteration count inside the train step and is not a variable that a schedule can "
            "set. Create the optimizer with a float `learning_rate` (e.g. learning_rate=0.01) and give "
            "the schedule to kfit instead."
        )
    raise ValueError(
        f"This {what} has a `learning_rate` of type {type(learning_rate).__name__} (e.g. a callable), "
        "not a variable, so a schedule cannot set it. Create the optimizer with a float `learning_rate` "
        "(e.g. learning_rate=0.01) and give the schedule to kfit instead."
    )


def _python_float_message(optimizer, name: str) -> str:
    what = _display_name(optimizer)
    message = (
        f"{what} keeps `{name}` as a Python float compiled into the train step, so a schedule cannot "
        "change it during training (TensorFlow and JAX would silently ignore the change). "
    )
    if name == "momentum" and isinstance(optimizer, keras.optimizers.SGD):
        return message + "Use kfit.optimizers.MomentumSGD(...) instead."
    if name == "beta_1" and isinstance(optimizer, keras.optimizers.AdamW):
        return message + "Use kfit.optimizers.Adam(weight_decay=...) instead (its weight decay is AdamW's)."
    if name == "beta_1" and isinstance(optimizer, keras.optimizers.Adam):
        return message + "Use kfit.optimizers.Adam(...) instead."
    if name in _KFIT_OPTIMIZER_FOR:
        return message + (
            f"{_KFIT_OPTIMIZER_FOR[name]}(...) keeps `{name}` in a variable; use it, or an optimizer that "
            f"keeps `{name}` in a keras.Variable."
        )
    return message + f"Use an optimizer that keeps `{name}` in a keras.Variable."


def _display_name(optimizer) -> str:
    """``keras.optimizers.SGD`` for Keras's own classes (also for their per-backend subclasses)."""
    cls = type(optimizer)
    if cls.__module__.startswith("kfit.optimizers"):
        return f"kfit.optimizers.{cls.__name__}"
    if not cls.__module__.startswith("keras"):
        return cls.__name__
    for base in cls.__mro__:
        if getattr(keras.optimizers, base.__name__, None) is base:
            return f"keras.optimizers.{base.__name__}"
    return cls.__name__
