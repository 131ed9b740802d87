"""What early stopping and learning-rate reduction share: a monitored value, its best, and time in units.

A controller observes one value per evaluation: a ``val_*`` value from each cross-validation
(``on_cross_validation_end``) when the run has a :class:`kfit.callbacks.CrossValidation`, else (and for
training values such as ``loss``) from the epoch-end logs, as Keras's callbacks do. Durations (patience, burn-in, cooldown) count evaluations, samples or epochs of the clock;
everything a decision depends on is in :meth:`MonitorCallback.get_state`, so a resumed run decides as an
uninterrupted one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kfit import _checks
from kfit.callbacks._base import KfitCallback
from kfit.interval import Interval

UNITS = ("evaluations", "samples", "epochs")
MODES = ("auto", "min", "max")
DELTA_MODES = ("absolute", "relative")

# Monitored names that grow as the model gets better (mode="auto" maximizes them).
_HIGHER_IS_BETTER = ("acc", "accuracy", "auc", "precision", "recall", "f1", "iou")


check_count = _checks.count

def check_real(name: str, value: Any, *, low: float = 0.0, allow_none: bool = False) -> float | None:
    """``value`` as a float after checking it is a finite number ``>= low`` (or None when allowed)."""
    return _checks.real(name, value, low=low, allow_none=allow_none)

check_choice = _checks.choice

# The units of Interval strings a controller's time can be counted in ("3ep", "6000sp").
_DURATION_UNITS = {"sp": "samples", "ep": "epochs"}


def resolve_durations(unit: str | None, **durations: Any) -> tuple[str, dict[str, int]]:
    """The unit of a controller's time, and its durations (patience, burn-in, cooldown) as counts of it.

    A duration is an int, counting ``unit`` (evaluations when ``unit`` is None), or, as every interval in kfit, a
    :class:`kfit.Interval` or its string: ``"6000sp"`` (samples) or ``"3ep"`` (epochs). A duration given so sets
    the unit of the callback's time: its durations given so, and ``unit`` when given, must agree, and its ints
    count that unit.

    Raises:
        InvalidArgumentError: a duration that is neither, one in minibatches, or durations in different units.

    Example:
        >>> resolve_durations(None, patience="3ep", burn_in=1)
        ('epochs', {'patience': 3, 'burn_in': 1})
    """
    if unit is not None:
        unit = check_choice("unit", unit, UNITS)
    counts: dict[str, int] = {}
    chosen: dict[str, str] = {}
    for name, value in durations.items():
        if _checks.is_integer(value):
            counts[name] = check_count(name, value)
            continue
        interval = Interval.parse(value, name=name)
        if interval.unit not in _DURATION_UNITS:
            raise _checks.InvalidArgumentError(
                f"Invalid value for argument `{name}`: a controller counts its time in evaluations, samples or "
                f"epochs, not minibatches. Received: {name}={value!r}. Give it in samples ('6000sp') or epochs ('3ep').")
        chosen[name], counts[name] = _DURATION_UNITS[interval.unit], interval.value
    units = set(chosen.values()) | ({unit} if unit is not None else set())
    if len(units) > 1:
        given = [f"{name}={durations[name]!r}" for name in chosen] + ([f"unit={unit!r}"] if unit is not None else [])
        raise _checks.InvalidArgumentError(
            f"The durations of one callback are counted in one unit. Received: {', '.join(given)}. Give them all in "
            "samples ('6000sp') or all in epochs ('3ep'), or as ints with `unit`.")
    return (units.pop() if units else "evaluations"), counts


def higher_is_better(monitor: str) -> bool:
    """Whether ``mode="auto"`` maximizes ``monitor`` (accuracies, AUC, precision, recall, F1, IoU)."""
    name = monitor.removeprefix("val_").removeprefix("test_")
    if name == "average_error":
        return False
    return name.endswith(_HIGHER_IS_BETTER)


class MonitorCallback(KfitCallback):
    """The base of kfit's controllers: watches ``monitor`` at every evaluation and tracks its best.

    Time is measured in ``unit``: ``"evaluations"`` (the number of evaluations observed, 1 for the first),
    ``"samples"`` (the clock) or ``"epochs"`` (``epoch_size`` samples of the clock). An evaluation at time
    ``t`` is in the burn-in while ``t <= burn_in``: it updates the best value but decides nothing.

    Args:
        monitor: the logged value to watch (``"val_loss"``, ``"val_average_error"``, ``"val_accuracy"``, ...);
            an epoch's value is averaged over the workers under plain ``model.fit`` on several workers.
        mode: ``"min"``, ``"max"``, or ``"auto"`` (``"max"`` for accuracies, AUC, precision, recall, F1, IoU;
            ``"min"`` otherwise).
        min_delta: the smallest change that counts as an improvement.
        min_delta_mode: ``"absolute"``: better than ``best -/+ min_delta``; ``"relative"``: better than
            ``best -/+ min_delta * |best|``.
        unit: the unit of the durations (patience, burn-in, cooldown): ``"evaluations"`` (the default),
            ``"samples"`` or ``"epochs"``; a duration given as an interval string (``"3ep"``) sets it.
        burn_in: the first ``burn_in`` units of time make no decision (an int in ``unit``, or ``"2ep"``,
            ``"6000sp"``).
        verbose: 1 prints the decisions (once per job: on rank 0 under data-parallel training).
        name: the key of this callback's state in checkpoints.
    """

    def __init__(
        self,
        monitor: str,
        *,
        mode: str = "auto",
        min_delta: float = 0.0,
        min_delta_mode: str = "absolute",
        unit: str | None = None,
        burn_in: int | str | Interval = 0,
        verbose: int = 0,
        name: str | None = None,
    ):
        super().__init__(name=name)
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"Invalid value for argument `monitor`: expected a non-empty string. Received: monitor={monitor!r}")
        self.monitor = monitor
        mode = check_choice("mode", mode, MODES)
        self.mode = ("max" if higher_is_better(monitor) else "min") if mode == "auto" else mode
        self.min_delta = check_real("min_delta", min_delta)
        self.min_delta_mode = check_choice("min_delta_mode", min_delta_mode, DELTA_MODES)
        self.unit, durations = resolve_durations(unit, burn_in=burn_in)
        self.burn_in = durations["burn_in"]
        self.verbose = check_count("verbose", verbose)
        self._source: str | None = None
        self._restored = False
        self._reset()

    # -- state -----------------------------------------------------------------------------------
    def _reset(self) -> None:
        self.evaluations = 0
        self.best: float | None = None
        self.best_evaluation = 0
        self.best_samples = 0
        self.wait = 0

    def get_state(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in ("evaluations", "best", "best_evaluation", "best_samples", "wait")}

    def set_state(self, state: dict[str, Any]) -> None:
        missing = {"evaluations", "best", "best_evaluation", "best_samples"} - set(state)
        if missing:
            raise ValueError(f"{type(self).__name__} state {self.name!r} is missing {sorted(missing)}. Received keys: {sorted(state)}")
        self.evaluations = int(state["evaluations"])
        self.best = None if state["best"] is None else float(state["best"])
        self.best_evaluation = int(state["best_evaluation"])
        self.best_samples = int(state["best_samples"])
        self.wait = int(state.get("wait", 0))
        # A state restored before training starts survives on_train_begin (which otherwise starts afresh).
        self._restored = True

    # -- time ------------------------------------------------------------------------------------
    def ticks(self, evaluation: int, samples: int) -> int:
        """The time of an evaluation in the callback's unit (epochs are counted in samples)."""
        return evaluation if self.unit == "evaluations" else samples

    def duration(self, value: int) -> int:
        """A duration in the callback's unit, in the units of :meth:`ticks`."""
        if self.unit != "epochs":
            return value
        epoch_size = self.clock.epoch_size
        if not epoch_size:
            raise RuntimeError(
                f"{type(self).__name__}(unit='epochs') needs the clock's epoch size, which this run does not know. "
                "Train with kfit.fit, give SampleClock(num_samples=...), or use unit='samples'."
            )
        return value * epoch_size

    def in_burn_in(self, now: int) -> bool:
        return now <= self.duration(self.burn_in)

    # -- observing -------------------------------------------------------------------------------
    def is_improvement(self, value: float) -> bool:
        """Whether ``value`` beats the best so far by more than ``min_delta`` (ties do not)."""
        if self.best is None:
            return not math.isnan(value)
        delta = self.min_delta if self.min_delta_mode == "absolute" else self.min_delta * abs(self.best)
        if self.mode == "min":
            return value < self.best - delta
        return value > self.best + delta

    def on_train_begin(self, logs: dict | None = None) -> None:
        from kfit.callbacks._cross_validation import CrossValidation

        has_cv = any(isinstance(p, CrossValidation) for p in self.peers())
        self._source = "cross_validation" if has_cv and self.monitor.startswith("val_") else "epoch"
        if not self._restored:
            self._reset()
        self._restored = False

    def on_train_end(self, logs: dict | None = None) -> None:
        self._restored = False

    def on_cross_validation_end(self, index: int, logs: dict) -> None:
        if self._source == "cross_validation":
            if self.monitor not in logs:
                raise ValueError(
                    f"{type(self).__name__}: the monitored value {self.monitor!r} is not among the cross-validation "
                    f"results {sorted(k for k in logs if k.startswith('val_'))}. Set `monitor` to one of them."
                )
            self._observe(float(logs[self.monitor]))

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._source != "epoch":
            return
        logs = logs or {}
        if self.monitor not in logs:
            if self.monitor.startswith("val_") and not any(k.startswith("val_") for k in logs):
                return  # no validation at this epoch (validation_freq): nothing to observe
            raise ValueError(
                f"{type(self).__name__}: the monitored value {self.monitor!r} is not in the epoch's logs "
                f"{sorted(logs)}. Set `monitor` to one of them, or add kfit.callbacks.CrossValidation."
            )
        self._observe(self._agreed_value(float(np.asarray(logs[self.monitor]))))

    def _agreed_value(self, value: float) -> float:
        """The epoch's monitored ``value``, the same on every worker: under plain ``model.fit`` on several workers
        each worker's epoch logs are its own (unless ``MetricAverageCallback`` averaged them first), so the value is
        averaged over the workers, each counting once, as Horovod's ``MetricAverageCallback`` does (one allreduce at
        each epoch end). A stop decided on one worker alone ended its ``model.fit`` while the others waited for it in
        the next step's gradient allreduce; a rate reduced on some workers only would train them apart. kfit.fit's
        logs are averaged already (weighted by samples)."""
        from kfit import distributed

        if self.training_run.logs_averaged or distributed.size() <= 1:
            return value
        from kfit.distributed import _state

        return float(_state.average_logs({self.monitor: value}, 1.0)[self.monitor])

    def _observe(self, value: float) -> None:
        self.evaluations += 1
        samples = self.clock.samples
        now = self.ticks(self.evaluations, samples)
        improved = self.is_improvement(value)
        if improved:
            self.best = value
            self.best_evaluation = self.evaluations
            self.best_samples = samples
            self.wait = 0
            self.on_improvement(value)
        self.decide(value, improved, now)

    def since(self, now: int, *references: int) -> int:
        """Time elapsed from the latest of the best, the end of the burn-in and ``references``."""
        start = max(self.ticks(self.best_evaluation, self.best_samples), self.duration(self.burn_in), *references)
        return now - start

    def on_improvement(self, value: float) -> None:
        """Called when ``value`` is a new best."""

    def decide(self, value: float, improved: bool, now: int) -> None:
        """Called after each observation, ``now`` being its time in :meth:`ticks` units."""
        raise NotImplementedError

    def say(self, message: str) -> None:
        """Prints a decision with ``verbose``: once per job (on rank 0), as every worker decides the same."""
        from kfit import distributed

        if self.verbose and distributed.is_chief():
            print(f"Samples {self.clock.samples}: {type(self).__name__}: {message}")
