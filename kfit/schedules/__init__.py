"""Schedules: pure functions of the training clock (samples seen), with units for hyperparameters.

A schedule maps the sample count `S` to a value. `as_schedule` accepts the forms users write (a number, a
list with `epoch_size`, `(count, value)` pairs, a list per minibatch, a callable); the shapes (`linear_warmup`,
`cosine_decay`, ...) and `join` build the rest. `HyperparameterSchedule` adds a unit: what a learning rate,
momentum or minibatch size means for a minibatch of `B` samples.

Example:
    >>> from kfit.schedules import learning_rate_per_sample
    >>> lr = learning_rate_per_sample([0.001] * 12 + [0.0005], epoch_size=60000)
    >>> lr[12 * 60000 - 1], lr[12 * 60000]
    (0.001, 0.0005)
"""

from kfit.schedules._schedule import (
    Constant,
    FromCallable,
    PiecewiseConstant,
    Schedule,
    as_schedule,
    from_config,
    piecewise_constant,
)
from kfit.schedules._shapes import (
    CosineDecay,
    ExponentialDecay,
    Join,
    LinearWarmup,
    StepDecay,
    constant,
    cosine_decay,
    exponential_decay,
    join,
    linear_warmup,
    step_decay,
    warmup_cosine,
)
from kfit.schedules._units import (
    HyperparameterSchedule,
    learning_rate_per_minibatch,
    learning_rate_per_sample,
    minibatch_size,
    momentum_as_time_constant,
    momentum_per_minibatch,
    momentum_per_sample,
)

__all__ = [
    "Constant",
    "CosineDecay",
    "ExponentialDecay",
    "FromCallable",
    "HyperparameterSchedule",
    "Join",
    "LinearWarmup",
    "PiecewiseConstant",
    "Schedule",
    "StepDecay",
    "as_schedule",
    "constant",
    "cosine_decay",
    "exponential_decay",
    "from_config",
    "join",
    "learning_rate_per_minibatch",
    "learning_rate_per_sample",
    "linear_warmup",
    "minibatch_size",
    "momentum_as_time_constant",
    "momentum_per_minibatch",
    "momentum_per_sample",
    "piecewise_constant",
    "step_decay",
    "warmup_cosine",
]
