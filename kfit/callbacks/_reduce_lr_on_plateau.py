"""Learning-rate reduction on a plateau of the cross-validation results, with a floor and a stop."""

from __future__ import annotations

from typing import Any

import numpy as np

from kfit import _backend, _checks
from kfit.callbacks._monitor import MonitorCallback, check_count, check_real, resolve_durations
from kfit.interval import Interval


class ReduceLROnPlateau(MonitorCallback):
    """Multiplies the learning rate by ``factor`` when the monitored value stops improving.

    A ``val_*`` monitor reads the results of every :class:`kfit.callbacks.CrossValidation` of the run;
    without one, or for a training value, the epoch-end logs (see :class:`EarlyStopping`). A reduction is due at an evaluation that does not
    improve (by more than ``min_delta``), that is past the burn-in (time ``> burn_in``) and past the
    cooldown (time ``> last reduction + cooldown``; evaluations in the cooldown count towards nothing), and
    that comes ``patience`` or more after the latest of: the last improvement, the end of the burn-in, the
    end of the cooldown. Time is counted in ``unit`` (evaluations, samples or epochs), as in Keras's and
    pydrobert's controllers.

    When a reduction is due:

    * after ``max_reductions`` reductions, training stops instead (CNTK's 6-3 sample: six cuts, then the
      seventh insufficient evaluation ends training);
    * the new rate is ``max(lr * factor, min_lr)``; if it would change the rate by ``min_lr_change`` or
      less (the rate is at the floor), nothing changes, and with ``stop_at_floor`` training stops.

    The rate changed is the one the run's :class:`kfit.callbacks.LearningRateSchedule` gives, read with
    ``learning_rate()`` in the schedule's unit (per sample for a per-sample schedule) and replaced with
    ``reset_learning_rate``: a constant from now on, as CNTK's ``learner.reset_learning_rate`` does (the
    rest of the schedule no longer applies), and it survives the schedule re-applying itself at every
    step. ``min_lr`` and ``min_lr_change`` are in that unit. Without a schedule it is the optimizer's
    ``learning_rate`` variable (per minibatch), which this callback tells the run's other callbacks (the rate
    line of :class:`kfit.callbacks.ProgressPrinter`) as each epoch begins, after ``kfit.load_checkpoint`` from a
    callback and at each reduction. A stop takes effect after the current step. At each epoch end
    the optimizer's rate (before a reduction) is logged as ``learning_rate``, as Keras's ReduceLROnPlateau logs it. The counters
    and the number of reductions are in :meth:`get_state`; the new schedule is in the schedule callback's.

    Args:
        monitor: the value to watch (see :class:`EarlyStopping`).
        factor: the factor of a reduction, ``0 < factor < 1``.
        patience: how long without improvement before a reduction: an int in ``unit``, or an interval string,
            ``"3ep"`` (epochs) or ``"6000sp"`` (samples), which sets ``unit``.
        unit: ``"evaluations"`` (the default), ``"samples"`` or ``"epochs"``: the unit of ``patience``,
            ``cooldown`` and ``burn_in``, one for all three.
        cooldown: after a reduction, this long without decisions (as ``patience``).
        burn_in: no decision during the first ``burn_in`` of time (as ``patience``).
        min_lr: the floor of the learning rate.
        min_lr_change: a reduction that would change the rate by this much or less is not made
            (torch's ``eps``, pydrobert's ``reduce_lr_log10_epsilon`` as ``10 ** epsilon``).
        min_delta: the smallest change of the monitored value that counts as an improvement.
        min_delta_mode: ``"absolute"`` or ``"relative"`` (a fraction of ``|best|``).
        mode: ``"min"``, ``"max"`` or ``"auto"``.
        stop_at_floor: stop training when a reduction is due and the rate is at the floor.
        max_reductions: stop training when a reduction is due after this many (None: never).
        verbose: 1 prints the decisions (once per job: on rank 0 under data-parallel training).
        name: the key of this callback's state in checkpoints.

    Raises:
        ValueError: an argument out of range, named with the value received; when training begins, an optimizer
            whose ``learning_rate`` is a ``keras.optimizers.schedules.LearningRateSchedule`` or a callable (a rate
            it cannot set) in a run without a ``LearningRateSchedule``.

    Example:
        >>> import kfit
        >>> reduce = kfit.callbacks.ReduceLROnPlateau("val_average_error", factor=0.5, patience=2,
        ...                                           cooldown=1, min_lr=1e-5, max_reductions=6)
        >>> reduce.factor, reduce.max_reductions
        (0.5, 6)
    """

    default_name = "reduce_lr_on_plateau"

    def __init__(
        self,
        monitor: str = "val_loss",
        *,
        factor: float = 0.1,
        patience: int | str | Interval = 10,
        unit: str | None = None,
        cooldown: int | str | Interval = 0,
        burn_in: int | str | Interval = 0,
        min_lr: float = 0.0,
        min_lr_change: float = 0.0,
        min_delta: float = 1e-4,
        min_delta_mode: str = "absolute",
        mode: str = "auto",
        stop_at_floor: bool = False,
        max_reductions: int | None = None,
        verbose: int = 0,
        name: str | None = None,
    ):
        self.factor = _checks.real("factor", factor, low=0.0, high=1.0, low_inclusive=False, high_inclusive=False)
        unit, durations = resolve_durations(unit, patience=patience, cooldown=cooldown, burn_in=burn_in)
        self.patience, self.cooldown = durations["patience"], durations["cooldown"]
        self.min_lr = check_real("min_lr", min_lr)
        self.min_lr_change = check_real("min_lr_change", min_lr_change)
        self.stop_at_floor = _checks.boolean("stop_at_floor", stop_at_floor)
        self.max_reductions = check_count("max_reductions", max_reductions, allow_none=True)
        super().__init__(
            monitor, mode=mode, min_delta=min_delta, min_delta_mode=min_delta_mode, unit=unit,
            burn_in=durations["burn_in"], verbose=verbose, name=name,
        )

    def _reset(self) -> None:
        super()._reset()
        self.reductions = 0
        self.reduced_evaluation: int | None = None
        self.reduced_samples: int | None = None
        self.stopped_samples: int | None = None
        self._rate_before: tuple[int, float] | None = None  # (clock samples, rate) at this callback's last reduction

    @property
    def stopped(self) -> bool:
        """Whether this callback stopped training."""
        return self.stopped_samples is not None

    # -- the learning rate -----------------------------------------------------------------------
    def _schedule_callback(self) -> Any:
        from kfit.callbacks._hyperparameter_schedules import LearningRateSchedule

        for peer in self.peers():
            if isinstance(peer, LearningRateSchedule):
                return peer
        return None

    def _optimizer_variable(self) -> Any:
        from kfit.optimizers import hyperparameter_variable

        optimizer = getattr(self.training_model, "optimizer", None)
        if optimizer is None:
            raise ValueError("ReduceLROnPlateau needs a compiled model with an optimizer.")
        return hyperparameter_variable(optimizer, "learning_rate")

    def learning_rate(self) -> float:
        """The learning rate this callback reduces: the schedule's current value, or the optimizer's."""
        schedule = self._schedule_callback()
        if schedule is not None:
            return float(schedule.learning_rate())
        return float(np.asarray(_backend.read_variable(self.training_model, self._optimizer_variable())))

    def _set_learning_rate(self, value: float) -> None:
        schedule = self._schedule_callback()
        if schedule is not None:
            schedule.reset_learning_rate(value)  # applied, and announced, at the next step
            return
        self._rate_before = (self.clock.samples, self.learning_rate())  # the rate the steps so far trained with
        _backend.set_variable(self.training_model, self._optimizer_variable(), value)
        self.publish("on_hyperparameter_change", "lr", value, value, "per_minibatch")

    def _announce_rate(self) -> None:
        """Tells the run's callbacks (a ProgressPrinter's rate line) the optimizer's rate, where no schedule does: each
        repeats only a change."""
        if self._schedule_callback() is None:
            rate = self.learning_rate()
            self.publish("on_hyperparameter_change", "lr", rate, rate, "per_minibatch")

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._announce_rate()  # the starting rate, a resumed one (once per epoch: no step reads the model)

    def _clock_restored(self, samples: int, minibatches: int) -> None:
        self._announce_rate()  # kfit.load_checkpoint from a callback: the file's rate, also in the middle of an epoch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None and self._schedule_callback() is None:  # (a schedule logs it itself)
            # The optimizer's rate the epoch trained with, before any reduction, as Keras's ReduceLROnPlateau logs it
            # (a CrossValidation at the epoch's end has reduced it already, with no step since).
            before = self._rate_before
            logs["learning_rate"] = (before[1] if before is not None and before[0] == self.clock.samples else
                                     float(np.asarray(_backend.read_variable(self.training_model, self._optimizer_variable()))))
        super().on_epoch_end(epoch, logs)

    # -- decisions -------------------------------------------------------------------------------
    def decide(self, value: float, improved: bool, now: int) -> None:
        if improved or self.stopped or self.in_burn_in(now):
            return
        cooldown_end = None
        if self.reduced_evaluation is not None:
            cooldown_end = self.ticks(self.reduced_evaluation, self.reduced_samples) + self.duration(self.cooldown)
            if now <= cooldown_end:
                return
        self.wait += 1
        references = () if cooldown_end is None else (cooldown_end,)
        if self.since(now, *references) < self.duration(self.patience):
            return
        if self.max_reductions is not None and self.reductions >= self.max_reductions:
            self._stop(f"{self.reductions} reductions made (max_reductions={self.max_reductions}): stopping.")
            return
        old = self.learning_rate()
        new = max(old * self.factor, self.min_lr)
        # A change below a millionth of the rate is float32 rounding of a rate already at the floor.
        if old - new <= max(self.min_lr_change, 1e-6 * old):
            if self.stop_at_floor:
                self._stop(f"the learning rate {old:.6g} is at its floor (min_lr={self.min_lr}): stopping.")
            return
        self._set_learning_rate(new)
        self.reductions += 1
        self.reduced_evaluation = self.evaluations
        self.reduced_samples = self.clock.samples
        self.wait = 0
        self.say(f"{self.monitor} = {value:.6g} has not improved on {self.best}: learning rate {old:.6g} -> {new:.6g}.")

    def _stop(self, message: str) -> None:
        self.stopped_samples = self.clock.samples
        self.training_model.stop_training = True
        self.say(message)

    def on_train_begin(self, logs: dict | None = None) -> None:
        super().on_train_begin(logs)
        if self._schedule_callback() is None:
            try:  # refused now, not at the first epoch's end (a schedule callback refuses such an optimizer itself)
                self._optimizer_variable()
            except ValueError as error:
                raise ValueError(
                    "kfit.callbacks.ReduceLROnPlateau sets the optimizer's learning rate and cannot set this one, so it "
                    f"is refused before training. {error} (as kfit.callbacks.LearningRateSchedule: a reduction then "
                    "scales its rate)") from None
        if self.stopped:
            self.training_model.stop_training = True

    # -- state -----------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        added = ("reductions", "reduced_evaluation", "reduced_samples", "stopped_samples")
        return {**super().get_state(), **{key: getattr(self, key) for key in added}}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self.reductions = int(state.get("reductions", 0))
        for key in ("reduced_evaluation", "reduced_samples", "stopped_samples"):
            value = state.get(key)
            setattr(self, key, None if value is None else int(value))
        if self.stopped and getattr(self, "_model", None) is not None:
            self._model.stop_training = True
