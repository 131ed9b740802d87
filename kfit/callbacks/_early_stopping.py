"""Early stopping on the cross-validation results: patience, burn-in, a minimum training length, best weights."""

from __future__ import annotations

from typing import Any

import numpy as np

from kfit import _checks
from kfit.callbacks._monitor import MonitorCallback, check_count, check_real, resolve_durations
from kfit.interval import Interval


class EarlyStopping(MonitorCallback):
    """Stops training when the monitored value has not improved for ``patience``.

    A ``val_*`` monitor reads the results of every :class:`kfit.callbacks.CrossValidation` of the run
    (through ``on_cross_validation_end``, so it reacts in the step where the evaluation ran); in a run
    without one, or for a training value such as ``"loss"``, it reads the epoch-end logs, as Keras's
    ``EarlyStopping`` does (``validation_data`` gives them ``val_*`` values; epochs without validation
    results are skipped).

    An evaluation improves when it beats the best value so far by more than ``min_delta`` (absolute, or
    relative to ``|best|``); ties do not. Time is counted in ``unit``: evaluations (``patience=2`` stops
    at the second evaluation in a row without improvement, as Keras counts epochs), samples, or epochs
    of the clock. Training stops at the first evaluation that

    * is not in the burn-in (time ``> burn_in``: during the burn-in the best value is kept but nothing
      is decided; pydrobert's ``early_stopping_burnin``, Keras's ``start_from_epoch``),
    * does not improve, ``patience`` or more after the later of the last improvement and the end of the
      burn-in (Lasagne's ``val_improve_num_epochs``), and
    * comes after ``min_duration`` of training (Lasagne's ``min_epochs``).

    The stop takes effect after the current step. Every counter, the best value and the best weights are
    in :meth:`get_state`: a run resumed from a checkpoint stops where the uninterrupted run stops (and a
    run restored after its stop trains no further).

    Args:
        monitor: the value to watch: ``"val_loss"``, ``"val_average_error"`` (CNTK's classification error
            when the metric is an accuracy), ``"val_<metric>"``, or a training log such as ``"loss"``. Under
            plain ``model.fit`` on several workers, an epoch's value is averaged over the workers (each worker's
            logs are its own there), so that every worker decides alike.
        patience: how long without improvement before stopping: an int in ``unit``, or an interval string,
            ``"3ep"`` (epochs) or ``"6000sp"`` (samples), which sets ``unit``.
        unit: ``"evaluations"`` (the default), ``"samples"`` or ``"epochs"``: the unit of ``patience`` and
            ``burn_in``, one for both.
        burn_in: no decision during the first ``burn_in`` of time (as ``patience``).
        min_duration: never stop before this much training: a :class:`kfit.Interval` or its string (``"10ep"``,
            ``"50000sp"``, ``"1000mb"``), or an int of samples (None: no minimum).
        min_samples: ``min_duration`` in samples, by the name Lasagne's and CNTK's users know (with
            ``min_epochs``, both minimums hold).
        min_epochs: ``min_duration`` in epochs.
        min_delta: the smallest change that counts as an improvement (>= 0).
        min_delta_mode: ``"absolute"`` or ``"relative"`` (a fraction of ``|best|``).
        mode: ``"min"``, ``"max"`` or ``"auto"`` (``"max"`` for accuracies and the like, else ``"min"``).
        baseline: a value to beat: until an evaluation beats it, patience counts from the start.
        restore_best_weights: when training ends, set the model's weights to those of the best evaluation
            (copied to host memory at every improvement).
        verbose: 1 prints the decisions (once per job: on rank 0 under data-parallel training).
        name: the key of this callback's state in checkpoints.

    Raises:
        ValueError: an argument out of range, named with the value received.

    Example:
        >>> import kfit
        >>> stop = kfit.callbacks.EarlyStopping("val_average_error", patience=3, burn_in=2,
        ...                                     min_duration="10ep", restore_best_weights=True)
        >>> stop.mode, stop.patience, stop.min_epochs
        ('min', 3, 10)
        >>> stop = kfit.callbacks.EarlyStopping("val_accuracy", patience="6000sp")
        >>> stop.mode, stop.patience, stop.unit
        ('max', 6000, 'samples')
    """

    default_name = "early_stopping"

    def __init__(
        self,
        monitor: str = "val_loss",
        *,
        patience: int | str | Interval = 0,
        unit: str | None = None,
        burn_in: int | str | Interval = 0,
        min_duration: int | str | Interval | None = None,
        min_samples: int | None = None,
        min_epochs: int | None = None,
        min_delta: float = 0.0,
        min_delta_mode: str = "absolute",
        mode: str = "auto",
        baseline: float | None = None,
        restore_best_weights: bool = False,
        verbose: int = 0,
        name: str | None = None,
    ):
        unit, durations = resolve_durations(unit, patience=patience, burn_in=burn_in)
        self.patience = durations["patience"]
        self.min_samples = check_count("min_samples", min_samples, allow_none=True)
        self.min_epochs = check_count("min_epochs", min_epochs, allow_none=True)
        #: The minimum training length in minibatches (``min_duration="1000mb"``).
        self.min_minibatches: int | None = None
        if min_duration is not None:
            if min_samples is not None or min_epochs is not None:
                raise _checks.InvalidArgumentError(
                    "Give the minimum training length once: min_duration, or min_samples/min_epochs (its names in "
                    f"samples and epochs). Received: min_duration={min_duration!r}, min_samples={min_samples!r}, "
                    f"min_epochs={min_epochs!r}.")
            minimum = Interval.parse(min_duration, name="min_duration")
            attribute = {"sp": "min_samples", "ep": "min_epochs", "mb": "min_minibatches"}[minimum.unit]
            setattr(self, attribute, minimum.value)
        self.baseline = check_real("baseline", baseline, low=-float("inf"), allow_none=True)
        _checks.boolean("restore_best_weights", restore_best_weights)
        self.restore_best_weights = restore_best_weights
        super().__init__(
            monitor, mode=mode, min_delta=min_delta, min_delta_mode=min_delta_mode, unit=unit,
            burn_in=durations["burn_in"], verbose=verbose, name=name,
        )

    def _reset(self) -> None:
        super()._reset()
        self.best = self.baseline
        self.best_weights: list[np.ndarray] | None = None
        self.stopped_samples: int | None = None
        self.stopped_evaluation: int | None = None

    @property
    def stopped(self) -> bool:
        """Whether this callback stopped training."""
        return self.stopped_samples is not None

    # -- decisions -------------------------------------------------------------------------------
    def on_improvement(self, value: float) -> None:
        if self.restore_best_weights:
            self.best_weights = [np.array(w) for w in self.model.get_weights()]

    def long_enough(self) -> bool:
        """Whether training has reached its minimum length (``min_duration``, ``min_samples``, ``min_epochs``)."""
        samples = self.clock.samples
        if self.min_samples is not None and samples < self.min_samples:
            return False
        if self.min_minibatches is not None and self.clock.minibatches < self.min_minibatches:
            return False
        if self.min_epochs is not None:
            epoch_size = self.clock.epoch_size
            if not epoch_size:
                raise RuntimeError(
                    "EarlyStopping(min_epochs=...) needs the clock's epoch size, which this run does not know. "
                    "Train with kfit.fit, give SampleClock(num_samples=...), or give min_duration in samples."
                )
            if samples < self.min_epochs * epoch_size:
                return False
        return True

    def decide(self, value: float, improved: bool, now: int) -> None:
        if improved or self.stopped or self.in_burn_in(now):
            return
        self.wait += 1
        if self.since(now) < self.duration(self.patience) or not self.long_enough():
            return
        self.stopped_samples = self.clock.samples
        self.stopped_evaluation = self.evaluations
        self.training_model.stop_training = True
        self.say(f"{self.monitor} = {value:.6g} has not improved on {self.best} for {self.wait} evaluations: stopping.")

    def on_train_begin(self, logs: dict | None = None) -> None:
        super().on_train_begin(logs)
        if self.stopped:
            self.training_model.stop_training = True

    def on_train_end(self, logs: dict | None = None) -> None:
        super().on_train_end(logs)
        if self.restore_best_weights and self.best_weights is not None:
            self.model.set_weights(self.best_weights)
            self.say(f"restored the weights of the evaluation at {self.best_samples} samples ({self.monitor} = {self.best:.6g}).")

    # -- state -----------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        best_weights = None if self.best_weights is None else list(self.best_weights)
        return {**super().get_state(), "stopped_samples": self.stopped_samples,
                "stopped_evaluation": self.stopped_evaluation, "best_weights": best_weights}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        stopped = state.get("stopped_samples")
        self.stopped_samples = None if stopped is None else int(stopped)
        evaluation = state.get("stopped_evaluation")
        self.stopped_evaluation = None if evaluation is None else int(evaluation)
        weights = state.get("best_weights")
        self.best_weights = None if weights is None else [np.array(w) for w in weights]
        if self.stopped and getattr(self, "_model", None) is not None:
            self._model.stop_training = True
