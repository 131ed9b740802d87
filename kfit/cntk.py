"""CNTK's schedule functions under their CNTK names, so that a CNTK script ports by changing its imports.

======================================================  =========================================================
CNTK                                                    kfit.schedules
======================================================  =========================================================
`learning_parameter_schedule_per_sample(s, e)`          `learning_rate_per_sample(s, e)`
`learning_parameter_schedule(s, minibatch_size=B, e)`   `learning_rate_per_minibatch(s, e, reference_minibatch_size=B)`
`learning_rate_schedule(s, UnitType.sample, e)`         `learning_rate_per_sample(s, e)`
`learning_rate_schedule(s, UnitType.minibatch, e)`      `learning_rate_per_minibatch(s, e)`
`training_parameter_schedule(s, unit, e)`               `learning_rate_schedule(s, unit, e)`, unit minibatch by default
`momentum_as_time_constant_schedule(m, e)`              `momentum_as_time_constant(m, e)`
`momentum_schedule_per_sample(m, e)`                    `momentum_per_sample(m, e)`
`momentum_schedule(m, e, minibatch_size=B)`             `momentum_per_minibatch(m, e, reference_minibatch_size=B)`
`minibatch_size_schedule(s, e=1)`                       `minibatch_size(s, e)`, a list per sample by default
======================================================  =========================================================

A minibatch size of `IGNORE` (0) or None means "no reference size": the value is used as is, as in CNTK.

`minibatch_size_schedule` takes CNTK's default `epoch_size=1`: a list gives one entry per SAMPLE, so
`minibatch_size_schedule([32, 64, 128])` is 32 for the first minibatch and 128 from the second on (drawn at
sample 32), as in CNTK. (kfit's own `kfit.schedules.minibatch_size` list without `epoch_size` is one entry per
minibatch.)

One difference: in CNTK 2.2 and later a learning-rate or momentum list given without `epoch_size` changes
value once per data sweep; in kfit it changes once per minibatch (CNTK's older rule). Give `epoch_size`
explicitly (one sweep is `len(x_train)` samples) to keep CNTK 2.2's meaning. `epoch_size=FULL_DATA_SWEEP`
(CNTK's "one sweep of the data") is refused with that advice: a kfit schedule is fixed before it meets the
data, so it cannot learn the size of a sweep.

Example:
    >>> from kfit.cntk import UnitType, learning_rate_schedule
    >>> lrs = learning_rate_schedule([0.001] * 12 + [0.0005], UnitType.sample, epoch_size=60000)
    >>> lrs[0], lrs[12 * 60000]
    (0.001, 0.0005)
"""

from __future__ import annotations

import enum
from typing import Any, NoReturn

from kfit import _checks, schedules
from kfit.interval import FULL_DATA_SWEEP as _FULL_DATA_SWEEP
from kfit.schedules import HyperparameterSchedule

__all__ = [
    "FULL_DATA_SWEEP",
    "DataUnit",
    "IGNORE",
    "UnitType",
    "adam",
    "learning_parameter_schedule",
    "learning_parameter_schedule_per_sample",
    "learning_rate_schedule",
    "minibatch_size_schedule",
    "momentum_as_time_constant_schedule",
    "momentum_sgd",
    "momentum_schedule",
    "momentum_schedule_per_sample",
    "nesterov",
    "sgd",
    "training_parameter_schedule",
]

IGNORE = 0
"""CNTK's `cntk.learners.IGNORE`: as a `minibatch_size`, use the values as they are (no reference size)."""


FULL_DATA_SWEEP = _FULL_DATA_SWEEP
"""CNTK's `cntk.io.FULL_DATA_SWEEP`: one sweep of the data as the unit.

As the `epoch_size` of a `kfit.cntk` schedule it is refused, saying what to pass: a kfit schedule is a
function of the sample clock fixed before it meets the data, so it cannot know how many samples one sweep
holds. Give `epoch_size=len(x_train)` (the samples in one sweep of the training data, over all workers). For
`kfit.fit`, one sweep is already the default epoch: leave `epoch_size` out. As
`kfit.callbacks.CrossValidation(max_samples=FULL_DATA_SWEEP)` it means all of the data, as None.
"""


class DataUnit(enum.Enum):
    """CNTK 2.7's `cntk.train.DataUnit`, the unit of a `(frequency, unit)` pair.

    kfit's callbacks that take a frequency (`Checkpoint`, `CrossValidation`) read `(n, DataUnit.sample)` as
    `"{n}sp"` and `(n, DataUnit.minibatch)` as `"{n}mb"`; `(n, DataUnit.sweep)` is refused, saying to give
    `"{n}ep"` (an epoch is one sweep unless `kfit.fit`'s `epoch_size` says otherwise).
    """

    sample = "sample"
    minibatch = "minibatch"
    sweep = "sweep"


class UnitType(enum.Enum):
    """Whether a learning rate is given per sample or per minibatch (CNTK's `cntk.learners.UnitType`)."""

    sample = "sample"
    minibatch = "minibatch"


def _reference(minibatch_size: Any) -> Any:
    # CNTK's IGNORE (0) means the same as None. Anything else goes to kfit's check as given.
    if minibatch_size is None or (_checks.is_integer(minibatch_size) and minibatch_size == IGNORE):
        return None
    return minibatch_size


def learning_parameter_schedule_per_sample(
    schedule: Any, epoch_size: int | None = None
) -> HyperparameterSchedule:
    """A learning rate per sample: a minibatch of `B` samples uses `lr * B`.

    Args:
        schedule: the rates, in any form `kfit.schedules.as_schedule` accepts.
        epoch_size: samples per list entry, or None (a list is then per minibatch); not `FULL_DATA_SWEEP`.

    Returns:
        `kfit.schedules.learning_rate_per_sample(schedule, epoch_size)`.

    Raises:
        ValueError: if a rate is negative or an argument is invalid.

    Example:
        >>> learning_parameter_schedule_per_sample(0.001).for_minibatch(0, 0, 100)
        0.1
    """
    return schedules.learning_rate_per_sample(schedule, epoch_size)


def learning_parameter_schedule(
    schedule: Any, minibatch_size: int | None = None, epoch_size: int | None = None
) -> HyperparameterSchedule:
    """A learning rate per minibatch, tuned for `minibatch_size`: a minibatch of `B` uses `lr * B / minibatch_size`.

    Args:
        schedule: the rates, in any form `kfit.schedules.as_schedule` accepts.
        minibatch_size: the reference minibatch size; None or `IGNORE` uses the rate as is.
        epoch_size: samples per list entry, or None (a list is then per minibatch); not `FULL_DATA_SWEEP`.

    Returns:
        `kfit.schedules.learning_rate_per_minibatch(schedule, epoch_size, reference_minibatch_size=...)`.

    Raises:
        ValueError: if a rate is negative or an argument is invalid.

    Example:
        >>> learning_parameter_schedule(0.1, minibatch_size=32).for_minibatch(0, 0, 64)
        0.2
    """
    return schedules.learning_rate_per_minibatch(
        schedule, epoch_size, reference_minibatch_size=_reference(minibatch_size)
    )


def learning_rate_schedule(
    schedule: Any, unit: UnitType | str, epoch_size: int | None = None
) -> HyperparameterSchedule:
    """A learning rate per sample or per minibatch (CNTK's deprecated form with a `UnitType`).

    Args:
        schedule: the rates, in any form `kfit.schedules.as_schedule` accepts.
        unit: `UnitType.sample` (per sample: `lr * B`) or `UnitType.minibatch` (used as is).
        epoch_size: samples per list entry, or None (a list is then per minibatch); not `FULL_DATA_SWEEP`.

    Returns:
        `learning_rate_per_sample` or `learning_rate_per_minibatch` of `schedule`.

    Raises:
        ValueError: if `unit` is not a `UnitType`, a rate is negative or an argument is invalid.

    Example:
        >>> learning_rate_schedule(0.1, UnitType.minibatch).for_minibatch(0, 0, 64)
        0.1
    """
    try:
        unit = UnitType(unit)
    except ValueError:
        raise ValueError(
            f"Invalid value for argument `unit`: expected UnitType.sample or UnitType.minibatch. Received: unit={unit!r}"
        ) from None
    if unit is UnitType.sample:
        return schedules.learning_rate_per_sample(schedule, epoch_size)
    return schedules.learning_rate_per_minibatch(schedule, epoch_size)


def training_parameter_schedule(
    schedule: Any, unit: UnitType | str = UnitType.minibatch, epoch_size: int | None = None
) -> HyperparameterSchedule:
    """A learning rate per minibatch (the default) or per sample: CNTK's deprecated `training_parameter_schedule`.

    The same as :func:`learning_rate_schedule`, with CNTK's default unit, `UnitType.minibatch`.

    Args:
        schedule: the rates, in any form `kfit.schedules.as_schedule` accepts.
        unit: `UnitType.minibatch` (used as is) or `UnitType.sample` (per sample: `lr * B`).
        epoch_size: samples per list entry, or None (a list is then per minibatch); not `FULL_DATA_SWEEP`.

    Returns:
        `learning_rate_per_minibatch` or `learning_rate_per_sample` of `schedule`.

    Raises:
        ValueError: if `unit` is not a `UnitType`, a rate is negative or an argument is invalid.

    Example:
        >>> s = training_parameter_schedule([(12, 0.1), (15, 0.01), (1, 0.001)], epoch_size=100)
        >>> s[0], s[1199], s[1200], s[2699], s[2700], s[5000]
        (0.1, 0.1, 0.01, 0.01, 0.001, 0.001)
    """
    return learning_rate_schedule(schedule, unit, epoch_size)


def momentum_as_time_constant_schedule(
    momentum: Any, epoch_size: int | None = None
) -> HyperparameterSchedule:
    """A momentum as a time constant `tau` in samples: a minibatch of `B` uses `exp(-B / tau)`.

    Args:
        momentum: the time constants, in any form `kfit.schedules.as_schedule` accepts; 0 means no momentum.
        epoch_size: samples per list entry, or None (a list is then per minibatch); not `FULL_DATA_SWEEP`.

    Returns:
        `kfit.schedules.momentum_as_time_constant(momentum, epoch_size)`.

    Raises:
        ValueError: if a time constant is negative or not finite, or an argument is invalid.

    Example:
        >>> momentum_as_time_constant_schedule(1024).per_sample_momentum(0)
        0.9990239141819757
    """
    return schedules.momentum_as_time_constant(momentum, epoch_size)


def momentum_schedule_per_sample(momentum: Any, epoch_size: int | None = None) -> HyperparameterSchedule:
    """A momentum per sample `m`: a minibatch of `B` samples uses `m ** B`.

    Args:
        momentum: the momenta, in any form `kfit.schedules.as_schedule` accepts; in `[0, 1)`.
        epoch_size: samples per list entry, or None (a list is then per minibatch); not `FULL_DATA_SWEEP`.

    Returns:
        `kfit.schedules.momentum_per_sample(momentum, epoch_size)`.

    Raises:
        ValueError: if a momentum is outside `[0, 1)` or an argument is invalid.

    Example:
        >>> momentum_schedule_per_sample(0.5).for_minibatch(0, 0, 2)
        0.25
    """
    return schedules.momentum_per_sample(momentum, epoch_size)


def momentum_schedule(
    momentum: Any, epoch_size: int | None = None, minibatch_size: int | None = None
) -> HyperparameterSchedule:
    """A momentum per minibatch, used as is; tuned for `minibatch_size` `B_ref`, a minibatch of `B` uses `m ** (B / B_ref)`.

    Args:
        momentum: the momenta, in any form `kfit.schedules.as_schedule` accepts; in `[0, 1)`.
        epoch_size: samples per list entry, or None (a list is then per minibatch); not `FULL_DATA_SWEEP`.
        minibatch_size: the reference minibatch size; None or `IGNORE` uses the momentum as is.

    Returns:
        `kfit.schedules.momentum_per_minibatch(momentum, epoch_size, reference_minibatch_size=...)`.

    Raises:
        ValueError: if a momentum is outside `[0, 1)` or an argument is invalid.

    Example:
        >>> m = momentum_schedule([0.99, 0.9], 1000)
        >>> m[0], m[999], m[1000], m[1001]
        (0.99, 0.99, 0.9, 0.9)
    """
    return schedules.momentum_per_minibatch(
        momentum, epoch_size, reference_minibatch_size=_reference(minibatch_size)
    )


def minibatch_size_schedule(schedule: Any, epoch_size: int | None = 1) -> HyperparameterSchedule:
    """The size of the next minibatch, read at the sample count when it is drawn.

    As CNTK's, a list gives one entry per `epoch_size` samples, by default ONE sample: `[32, 64, 128]` is 32
    for the minibatch drawn at sample 0, 64 for one drawn at sample 1, and 128 from sample 2 on (so the
    second minibatch, drawn at sample 32, has 128). kfit's `kfit.schedules.minibatch_size` without
    `epoch_size` counts minibatches instead; `epoch_size=None` here means that too.

    Args:
        schedule: the sizes, in any form `kfit.schedules.as_schedule` accepts; positive integers.
        epoch_size: samples per list entry (CNTK's default: 1), or None (a list is then per minibatch).
            `FULL_DATA_SWEEP` is refused, saying what to give.

    Returns:
        `kfit.schedules.minibatch_size(schedule, epoch_size)`.

    Raises:
        ValueError: if a size is not a positive integer or an argument is invalid.

    Example:
        >>> mb = minibatch_size_schedule([256] * 6 + [512], epoch_size=60000)
        >>> mb[6 * 60000 - 1], mb[6 * 60000]
        (256, 512)
        >>> mb = minibatch_size_schedule([32, 64, 128])  # per sample, as in CNTK
        >>> mb[0], mb[1], mb[32]
        (32, 64, 128)
    """
    return schedules.minibatch_size(schedule, epoch_size)


def _no_learner(name: str, optimizer: str, schedules: str, options: dict, also: str = "") -> NoReturn:
    raise TypeError(
        f"kfit.cntk.{name}: kfit has no CNTK learner object. Give the optimizer to the model and the schedules "
        f"to kfit.fit: model.compile(optimizer={optimizer}, loss=..., metrics=[...]) and kfit.fit(model, x, y, ..., "
        f"callbacks=[{schedules}]); leave the parameters out (the optimizer updates the model's trainable weights)"
        + also + (f"; CNTK's {', '.join(sorted(options))}: see {optimizer.split('(')[0]}, which says what to write "
                  "for each" if options else "") + "."
    )


_SGD_SCHEDULES = "kfit.callbacks.LearningRateSchedule(lr), kfit.callbacks.MomentumSchedule(momentum)"


def momentum_sgd(parameters: Any = None, lr: Any = None, momentum: Any = None, unit_gain: bool = True,
                 **options: Any) -> NoReturn:
    """CNTK's ``momentum_sgd`` learner, which has no one-object counterpart in kfit: raises a TypeError saying
    what to write.

    A kfit optimizer is Keras's, given to ``model.compile``, and a schedule is a callback that sets its
    hyperparameter at the sample clock. CNTK's ``momentum_sgd(params, lr, momentum, unit_gain=g)`` becomes
    ``model.compile(optimizer=kfit.optimizers.MomentumSGD(unit_gain=g), ...)`` (the same update, tested against
    a NumPy reference) and ``callbacks=[kfit.callbacks.LearningRateSchedule(lr),
    kfit.callbacks.MomentumSchedule(momentum)]`` in ``kfit.fit``, with the schedules of this module. CNTK's
    other options are refused by ``MomentumSGD``, each saying what to write (``l2_regularization_weight``: a
    kernel regularizer; ``gradient_clipping_threshold_per_sample``: ``clipvalue``). :func:`sgd`, :func:`nesterov`
    and :func:`adam` do the same for CNTK's other learners of that name.

    Raises:
        TypeError: always, with the lines to write.
    """
    _no_learner("momentum_sgd", f"kfit.optimizers.MomentumSGD(unit_gain={unit_gain!r})", _SGD_SCHEDULES, options)


def nesterov(parameters: Any = None, lr: Any = None, momentum: Any = None, unit_gain: bool = True,
             **options: Any) -> NoReturn:
    """CNTK's ``nesterov`` learner: raises a TypeError saying what to write (as :func:`momentum_sgd`), with
    ``kfit.optimizers.MomentumSGD(nesterov=True, unit_gain=g)``.

    Raises:
        TypeError: always, with the lines to write.
    """
    _no_learner("nesterov", f"kfit.optimizers.MomentumSGD(nesterov=True, unit_gain={unit_gain!r})", _SGD_SCHEDULES,
                options)


def sgd(parameters: Any = None, lr: Any = None, **options: Any) -> NoReturn:
    """CNTK's ``sgd`` learner: raises a TypeError saying what to write (as :func:`momentum_sgd`), with
    ``kfit.optimizers.MomentumSGD(momentum=0.0)`` (CNTK's ``w -= lr_s * G``, ``G`` the summed gradient) and a
    ``LearningRateSchedule``.

    Raises:
        TypeError: always, with the lines to write.
    """
    _no_learner("sgd", "kfit.optimizers.MomentumSGD(momentum=0.0)", "kfit.callbacks.LearningRateSchedule(lr)", options)


def adam(parameters: Any = None, lr: Any = None, momentum: Any = None, unit_gain: bool = True,
         variance_momentum: Any = None, **options: Any) -> NoReturn:
    """CNTK's ``adam`` learner: raises a TypeError saying what to write (as :func:`momentum_sgd`), with
    ``kfit.optimizers.Adam(variant="cntk", ...)``, CNTK's update (tested step by step against a NumPy transcription
    of CNTK's C++), whose ``beta_1`` a ``MomentumSchedule`` sets. The line written carries ``unit_gain``, CNTK's
    ``epsilon`` (1e-8 unless given) and CNTK's default ``variance_momentum``
    (``momentum_schedule_per_sample(0.9999986111120757)``: ``beta_2=0.9999986111120757, beta_2_minibatch_size=1``);
    a ``variance_momentum`` given is described instead.

    Raises:
        TypeError: always, with the lines to write.
    """
    epsilon = options.pop("epsilon", 1e-8)
    beta_2 = ", beta_2=0.9999986111120757, beta_2_minibatch_size=1" if variance_momentum is None else ""
    also = "" if variance_momentum is None else (
        "; variance_momentum is beta_2: a per-sample m_s (momentum_schedule_per_sample(m_s)) is beta_2=m_s, "
        "beta_2_minibatch_size=1; a value per minibatch is beta_2 alone")
    optimizer = f"kfit.optimizers.Adam(variant='cntk', unit_gain={unit_gain!r}, epsilon={epsilon!r}{beta_2})"
    _no_learner("adam", optimizer, _SGD_SCHEDULES + " (it sets beta_1)", options, also)
