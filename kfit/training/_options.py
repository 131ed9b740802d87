"""``kfit.fit``'s options, validated once into a frozen object, whichever loop then trains.

Both ways ``kfit.fit`` trains (``model.fit`` itself when no kfit-only feature is asked for, and ``model.fit`` on
kfit's stream otherwise) read the same :class:`FitOptions`, so a bad argument gets the same error on both.

Example:
    >>> options = FitOptions.from_arguments(minibatch_size=64, epochs=2)
    >>> options.minibatch_size, options.epochs, options.kfit_only
    (64, 2, False)
    >>> FitOptions.from_arguments(validation_split=-0.1)
    Traceback (most recent call last):
    ...
    kfit._checks.InvalidArgumentError: Invalid value for argument `validation_split`: expected a number in [0, 1]. Received: validation_split=-0.1
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from kfit import _checks

_VERBOSE = ("auto", 0, 1, 2)
_SHUFFLE = (True, False, "batch")


@dataclass(frozen=True)
class FitOptions:
    """Every argument of :func:`kfit.fit` but the data, the model and the callbacks, checked.

    ``minibatch_size`` is an int, a ``kfit.schedules.minibatch_size`` schedule, or None (Keras's default, 32);
    ``batch_size`` and a ``MinibatchSizeSchedule`` callback are folded into it.
    """

    minibatch_size: Any = None
    epochs: int | None = None
    verbose: Any = "auto"
    validation_split: float = 0.0
    shuffle: Any = True
    class_weight: dict | None = None
    initial_epoch: int = 0
    steps_per_epoch: int | None = None
    validation_steps: int | None = None
    validation_batch_size: int | None = None
    validation_freq: Any = 1
    epoch_size: int | None = None
    max_samples: int | None = None
    seed: int | None = None
    prefetch: int | None = None
    pad_remainders: bool = False
    #: The minibatch size was given as ``batch_size`` (model.fit's name), which ``model.fit`` does not apply to a
    #: ``PyDataset`` (it batches itself): kfit's stream reads such a dataset in its own batches too.
    from_batch_size: bool = False

    @classmethod
    def from_arguments(cls, *, batch_size: Any = None, callbacks: list | None = None, sample_weight: Any = None,
                       num_samples: int | None = None, **arguments: Any) -> FitOptions:
        """Checks ``kfit.fit``'s arguments (named as there) and returns them as options.

        ``num_samples`` is the length of ``x`` where ``x`` is arrays (None otherwise): ``validation_split`` is checked
        against it as ``model.fit`` checks it, with ``model.fit``'s error.

        Raises:
            InvalidArgumentError: an argument is not what ``kfit.fit`` accepts (the message names it and the
                value received).
        """
        options = cls(**arguments)
        minibatch_size = options.minibatch_size
        if batch_size is not None and minibatch_size is not None and batch_size != minibatch_size:
            raise _checks.InvalidArgumentError(
                "Arguments `batch_size` and `minibatch_size` are aliases; give one. Received: "
                f"batch_size={batch_size!r}, minibatch_size={minibatch_size!r}")
        minibatch_size = minibatch_size if minibatch_size is not None else batch_size
        from kfit.callbacks._minibatch_size_schedule import MinibatchSizeSchedule

        size_callbacks = [c for c in callbacks or [] if isinstance(c, MinibatchSizeSchedule)]
        if len(size_callbacks) > 1:
            raise _checks.InvalidArgumentError("Give at most one MinibatchSizeSchedule callback.")
        if size_callbacks:
            if minibatch_size is not None:
                raise _checks.InvalidArgumentError(
                    "Give the minibatch size either as `minibatch_size=` or as a MinibatchSizeSchedule callback, not both.")
            minibatch_size = size_callbacks[0].schedule
        # (kept as the checks convert them: a NumPy integer becomes Python's, which a checkpoint's JSON can hold)
        checked: dict[str, Any] = {
            name: _checks.count(name, getattr(options, name), low=1, allow_none=True)
            for name in ("steps_per_epoch", "validation_steps", "validation_batch_size", "epoch_size", "max_samples")}
        checked["epochs"] = _checks.count("epochs", options.epochs, allow_none=True)  # 0 trains nothing, as model.fit
        checked["seed"] = _checks.count("seed", options.seed, allow_none=True)
        checked["initial_epoch"] = _checks.count("initial_epoch", options.initial_epoch)
        checked["prefetch"] = _checks.count("prefetch", options.prefetch, allow_none=True)
        _checks.boolean("pad_remainders", options.pad_remainders)
        checked["validation_split"] = _checks.real("validation_split", options.validation_split, low=0.0, high=1.0)
        if checked["validation_split"] and num_samples is not None:
            training_rows(num_samples, options.validation_split)
        options = dataclasses.replace(options, **checked)
        _checks.choice("verbose", options.verbose, _VERBOSE)
        _checks.choice("shuffle", options.shuffle, _SHUFFLE)
        _check_validation_freq(options.validation_freq)
        if options.class_weight is not None:
            if not isinstance(options.class_weight, dict):
                raise _checks.InvalidArgumentError(
                    "Invalid value for argument `class_weight`: expected a dict of class index to weight. Received: "
                    f"class_weight={options.class_weight!r}")
            if sample_weight is not None:  # (model.fit's error)
                raise _checks.InvalidArgumentError(
                    "You cannot `class_weight` and `sample_weight` at the same time. Give one of them (e.g. multiply "
                    f"the class weights into the sample weights). Received: class_weight={options.class_weight!r}")
        minibatch_size = _check_minibatch_size(minibatch_size)
        return dataclasses.replace(options, minibatch_size=minibatch_size, from_batch_size=batch_size is not None
                                   and options.minibatch_size is None and isinstance(minibatch_size, int))

    @property
    def fixed_minibatch_size(self) -> int | None:
        """The minibatch size when it does not change (None for a schedule)."""
        return self.minibatch_size if isinstance(self.minibatch_size, int) else None

    @property
    def kfit_only(self) -> bool:
        """Some option only kfit's stream gives (``model.fit`` itself cannot train with it)."""
        return (self.minibatch_size is not None and not isinstance(self.minibatch_size, int)) or any(
            value is not None for value in (self.epoch_size, self.max_samples, self.seed)) or self.pad_remainders


def training_rows(num_samples: int, validation_split: float) -> int:
    """The rows ``validation_split`` leaves for training, as Keras cuts them (the first ones); a split that leaves no
    training or no validation row is refused with ``model.fit``'s error."""
    rows = int(math.floor(num_samples * (1.0 - validation_split)))
    if rows in (0, num_samples):
        raise _checks.InvalidArgumentError(
            f"Training data contains {num_samples} samples, which is not sufficient to split it into a validation and "
            f"training set as specified by `validation_split={validation_split}`. Either provide more data, or a "
            "different value for the `validation_split` argument.")
    return rows


def _check_minibatch_size(value: Any) -> Any:
    """An int, a ``kfit.schedules.minibatch_size`` schedule (lists and callables become one), or None."""
    if value is None:
        return None
    from kfit import schedules

    if isinstance(value, schedules.HyperparameterSchedule):
        if value.kind != "minibatch_size":
            raise _checks.InvalidArgumentError(
                "Invalid value for argument `minibatch_size`: expected an int or kfit.schedules.minibatch_size(...). "
                f"Received a {value.kind} schedule: {value!r}")
        return value
    if isinstance(value, (list, tuple)) or callable(value):
        return schedules.minibatch_size(value)
    return _checks.count("minibatch_size", value, low=1)


def _check_validation_freq(validation_freq: Any) -> None:
    valid = _checks.is_integer(validation_freq) and validation_freq >= 1
    if not valid and isinstance(validation_freq, (list, tuple, set, range)):
        valid = bool(validation_freq) and all(_checks.is_integer(e) and e >= 1 for e in validation_freq)
    if not valid:
        raise _checks.InvalidArgumentError(
            "Invalid value for argument `validation_freq`: expected a positive integer (validate every N epochs) or "
            f"a collection of epoch numbers counted from 1. Received: validation_freq={validation_freq!r}")


def size_function(minibatch_size: Any) -> Any:
    """``size_at(samples, minibatches)`` for a checked ``minibatch_size`` (None: Keras's default, 32)."""
    if minibatch_size is None or isinstance(minibatch_size, int):
        size = 32 if minibatch_size is None else minibatch_size
        return lambda s, m: size
    return lambda s, m: int(minibatch_size.value(s, m))


__all__ = ["FitOptions"]


# CNTK's Function.train keywords that kfit.fit names otherwise, with what to write instead.
_CNTK_TRAIN = {
    "max_epochs": "CNTK's Function.train name of `epochs`: give epochs={value!r}",
    "parameter_learners": "CNTK's Function.train learners: give the optimizer to model.compile(optimizer=...) before "
                          "kfit.fit (CNTK's momentum_sgd is kfit.optimizers.MomentumSGD; its learning-rate and momentum "
                          "schedules go in callbacks as kfit.callbacks.LearningRateSchedule and MomentumSchedule)",
    "minibatch_source": "CNTK's Function.train data: give it as x (and y), as to model.fit",
    "model_inputs_to_streams": "CNTK's stream map: kfit reads (x, y) in the model's input order (or a dict keyed "
                               "by the input names): leave it out",
    "streams": "CNTK's stream map: kfit reads (x, y) in the model's input order: leave it out",
    "progress_frequency": "CNTK's Function.train progress period: give callbacks=[kfit.callbacks.ProgressPrinter("
                          "freq)] (a line every freq minibatches)",
}


def refuse_unknown_keywords(function: str, given: dict[str, Any], known: list[str]) -> None:
    """Raises a TypeError for the first of ``given`` (keywords ``function`` does not take): for CNTK's
    ``Function.train`` names it says what to write; for another name, the closest known one, if any."""
    import difflib

    if not given:
        return
    name, value = next(iter(given.items()))
    text = repr(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    if name in _CNTK_TRAIN:
        fix = _CNTK_TRAIN[name].format(value=value) + "."
    else:
        close = difflib.get_close_matches(name, known, n=1)
        fix = f"did you mean `{close[0]}`?" if close else f"{function} takes model.fit's arguments and " + ", ".join(
            f"`{k}`" for k in known[known.index("minibatch_size"):]) + "."
    raise TypeError(f"{function}() got an unexpected keyword argument `{name}`: {fix} Received: {name}={text}")
