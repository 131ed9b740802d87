"""Callbacks that set the optimizer's learning rate and momentum from the clock at every step."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kfit import _backend
from kfit.callbacks._base import KfitCallback
from kfit.callbacks._model_fit import FitDriver, wake
from kfit.callbacks._running_means import is_cut
from kfit.clock import Clock
from kfit.optimizers._hyperparameters import gradient_accumulation_steps, unwrapped


def _as_hyperparameter_schedule(schedule: Any, kind: str, default_factory: Any, argument: str) -> Any:
    from kfit import schedules

    if isinstance(schedule, schedules.HyperparameterSchedule):
        if schedule.kind != kind:
            raise ValueError(
                f"Invalid value for argument `{argument}`: expected a {kind} schedule (e.g. "
                f"kfit.schedules.{default_factory.__name__}(...)). Received a {schedule.kind} schedule: {schedule!r}"
            )
        return schedule
    # A bare value, list or callable keeps the plain Keras meaning (per minibatch).
    return default_factory(schedule)


def _config(schedule: Any) -> dict | None:
    """The schedule's configuration; None for one built from a Python callable (it cannot be described as data)."""
    try:
        return schedule.get_config()
    except TypeError:
        return None


class _HyperparameterSchedule(KfitCallback):
    """Sets one optimizer hyperparameter before every step from a schedule and the minibatch size."""

    kind = ""
    log_key = ""
    reset_method = ""  # the public name of reset()

    def __init__(self, schedule: Any, name: str | None = None, verbose: int = 0):
        super().__init__(name=name)
        self.schedule = self._coerce(schedule, "schedule")
        self.verbose = verbose
        self._variable = None
        self._accumulation = 1  # the optimizer's gradient_accumulation_steps (read when training begins)
        self._published: tuple | None = None  # the (value, scheduled value) published last
        # Cache of on_step_begin: the last (schedule, scheduled value, minibatch size, value for the optimizer).
        self._converted: tuple | None = None
        self._set([], (None, None))

    def _coerce(self, schedule: Any, argument: str) -> Any:
        from kfit import schedules

        default_factory = getattr(schedules, f"{self.kind}_per_minibatch")
        return _as_hyperparameter_schedule(schedule, self.kind, default_factory, argument)

    def _target_variable(self, optimizer: Any) -> Any:
        from kfit.optimizers import hyperparameter_variable

        return hyperparameter_variable(optimizer, self.kind)

    @property
    def scheduled_variable(self) -> Any:
        """The optimizer variable this callback sets before every step (None until training begins): what the code
        set it to plays no part in a run, nor in a resume (``kfit.checkpoint._state.set_before_steps``)."""
        return self._variable

    def active_schedule(self, samples: int) -> tuple[Any, int, int]:
        """The schedule in force at ``samples`` and the clock reading it counts from."""
        schedule, start_samples, start_minibatches = self.schedule, 0, 0
        for at_samples, at_minibatches, reset in self._resets:
            if samples >= at_samples:
                schedule, start_samples, start_minibatches = reset, at_samples, at_minibatches
        return schedule, start_samples, start_minibatches

    def value(self, samples: int | None = None, minibatches: int | None = None) -> float:
        """The scheduled value in the schedule's own unit (per-sample rate, time constant, ...)."""
        clock = self.clock
        samples = clock.samples if samples is None else samples
        minibatches = clock.minibatches if minibatches is None else minibatches
        schedule, s0, m0 = self.active_schedule(samples)
        return schedule.value(samples - s0, minibatches - m0)

    def reset(self, values: Any) -> None:
        """Replaces the schedule from the current clock reading on (the new schedule counts from here).

        Args:
            values: a schedule of this kind, or values/a list in the unit of the current schedule.

        Raises:
            TypeError: the new schedule is built from a Python callable and the run writes checkpoints (a checkpoint
                holds the schedule in force, and a callable cannot be saved).
        """
        from kfit import schedules

        schedule = values if isinstance(values, schedules.HyperparameterSchedule) else self.schedule.with_schedule(values)
        if schedule.kind != self.schedule.kind:
            raise ValueError(f"Invalid value for argument `values`: expected a {self.schedule.kind} schedule. Received: {schedule!r}")
        if _config(schedule) is None and any(getattr(c, "writes_checkpoints", False) for c in self.training_run.callbacks):
            raise TypeError(
                f"Invalid value for argument `values` of {self.reset_method}: a schedule built from a Python callable "
                f"cannot be saved, and this run writes checkpoints, which hold the schedule in force (a resumed run "
                f"goes on with it). Received: values={values!r}. Give a value, a list of values, or a schedule built "
                "from kfit.schedules shapes (piecewise_constant, linear_warmup, cosine_decay, join, ...).")
        clock = self.clock
        resets = [r for r in self._resets if r[0] < clock.samples] + [(clock.samples, clock.minibatches, schedule)]
        self._set(resets, (self._logged, self._logged_size))  # applied at the next step even if the value is equal
        self._published = None

    def _reapply(self) -> None:
        """Applies the value again at the next step: the one applied may not have reached the optimizer (on JAX,
        Keras's sync at the end of an epoch of unknown length undoes what was set for its step past the end)."""
        self._applied = None
        self._unchanged = None
        wake(self)

    def on_train_begin(self, logs: dict | None = None) -> None:
        wake(self)  # a run that ended without on_train_end may have left the hook asleep
        optimizer = getattr(self._model, "optimizer", None)
        if optimizer is None:
            raise ValueError(f"{type(self).__name__} needs a compiled model with an optimizer.")
        self._variable = self._target_variable(optimizer)
        self._accumulation = gradient_accumulation_steps(optimizer)
        # A run starts from the schedule given (a resumed one gets its resets from the checkpoint).
        self._set([], (None, None))
        self._published = None

    def samples_per_update(self, minibatch_size: int) -> int:
        """The samples of the optimizer's update that ends a step of ``minibatch_size`` samples: the minibatch,
        times the optimizer's ``gradient_accumulation_steps`` (Keras then averages that many steps' gradients in one
        update). A per-sample rate or a time constant is converted for that many samples; exact when the
        accumulated steps have one size (an epoch's shorter last step makes that update approximate)."""
        return minibatch_size * self._accumulation

    def _segment_at(self, samples: int, minibatches: int) -> tuple:
        """The schedule in force at this reading, its value, and the readings ``[samples, until)`` and
        ``[minibatches, until)`` over which that value holds (so that most steps read no schedule)."""
        schedule, s0, m0 = self.active_schedule(samples)
        scheduled = float(schedule.value(samples - s0, minibatches - m0))
        until_s, until_m = schedule.holds_until(samples - s0, minibatches - m0)
        next_reset = min((r[0] for r in self._resets if r[0] > samples), default=math.inf)
        return samples, min(until_s + s0, next_reset), minibatches, until_m + m0, schedule, scheduled

    def set_model(self, model: Any) -> None:
        super().set_model(model)
        # The batch hook below skips on_step_begin where the value holds, unless a subclass has its own.
        self._skips_steps = (getattr(self.on_step_begin, "__func__", None) is _HyperparameterSchedule.on_step_begin
                             and not self._legacy_batch_begin)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        # Most steps, when another kfit callback (the clock's) has planned the step: on_step_begin's first test
        # made here, saving a call at every step; under plain model.fit the hook then sleeps until the value can
        # change (FitDriver.sleep), and Keras calls a no-op instead.
        unchanged, run = self._unchanged, self._run
        driver = run.driver
        if unchanged is not None and self._skips_steps and driver is not None and driver.pending_batch == batch:
            clock = run.clock
            if (clock.minibatch_size == unchanged[0] and unchanged[1] <= clock.samples < unchanged[2]
                    and unchanged[3] <= clock.minibatches < unchanged[4]):
                if isinstance(driver, FitDriver):
                    driver.sleep(self, unchanged[0], unchanged[2], unchanged[4])
                return
        super().on_train_batch_begin(batch, logs)

    def on_step_begin(self, clock: Clock) -> None:
        size, samples, minibatches = clock.minibatch_size, clock.samples, clock.minibatches
        unchanged = self._unchanged
        if (unchanged is not None and size == unchanged[0] and unchanged[1] <= samples < unchanged[2]
                and unchanged[3] <= minibatches < unchanged[4]):
            return  # most steps: the value, the minibatch size and what was applied and logged are the last step's
        if size is None:
            raise RuntimeError(f"{type(self).__name__}: the clock does not know the size of the next minibatch.")
        segment = self._segment
        if segment is None or not (segment[0] <= samples < segment[1] and segment[2] <= minibatches < segment[3]):
            segment = self._segment = self._segment_at(samples, minibatches)
        schedule, scheduled = segment[4], segment[5]
        converted = self._converted
        if converted is None or converted[0] is not schedule or converted[1] != scheduled or converted[2] != size:
            converted = self._converted = (schedule, scheduled, size, float(schedule.convert(scheduled, size * self._accumulation)))
        value = converted[3]
        if value != self._applied:
            _backend.set_variable(self._model, self._variable, value)
            self._applied = value
        if self._logged is None or not (
                size < self._logged_size and is_cut(clock, size, self._logged_size, self.training_run.max_samples)):
            self._logged, self._logged_size = value, size
        published = self._published
        if published is None or published[0] != value or published[1] != scheduled:
            # Published when either the applied or the scheduled value changes (a per-sample rate can
            # halve exactly when the minibatch doubles, leaving the applied rate unchanged).
            self._published = (value, scheduled)
            self.publish("on_hyperparameter_change", self.log_key, value, scheduled, schedule.unit)
        # A step of the same size in the same segment repeats this one, unless this one was logged apart (cut).
        logged_here = self._logged == value and self._logged_size == size
        self._unchanged = (size, segment[0], segment[1], segment[2], segment[3]) if logged_here else None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None and self._logged is not None:
            logs[self.log_key] = self._logged

    def on_train_end(self, logs: dict | None = None) -> None:
        wake(self)

    def get_state(self) -> dict[str, Any]:
        """The resets (their schedules' configurations), the value logged last and the schedule in code.

        Raises:
            TypeError: a reset gave a schedule built from a Python callable (a run that writes no checkpoint takes
                one, and ``kfit.save_checkpoint`` is then called): a checkpoint holds the schedule in force.
        """
        for samples, _, schedule in self._resets:
            if _config(schedule) is None:
                raise TypeError(
                    f"{type(self).__name__} {self.name!r} cannot be saved: {self.reset_method}(values) at sample "
                    f"{samples} gave it a schedule built from a Python callable, {schedule!r}, and a checkpoint holds "
                    f"the schedule in force (a resumed run goes on with it). Give {self.reset_method} a value, a list "
                    "of values, or a schedule built from kfit.schedules shapes (piecewise_constant, linear_warmup, "
                    "cosine_decay, join, ...).")
        return {
            "resets": [
                {"samples": s, "minibatches": m, "schedule": schedule.get_config()} for s, m, schedule in self._resets
            ],
            "logged": None if self._logged is None else [self._logged, self._logged_size],
            "schedule": _config(self.schedule),  # (for restore_note only: a resumed run uses the code's)
        }

    def restore_note(self, state: dict[str, Any], file: str) -> str | None:
        """What a restore of ``state`` from ``file`` tells the user: that this callback's schedule in code differs
        from the one of the run that wrote the checkpoint, and which one the resumed run follows (None: the same
        schedule, or one that cannot be compared, built from a Python callable)."""
        from kfit import schedules

        resets = state.get("resets") or []
        try:
            saved = None if state.get("schedule") is None else schedules.from_config(state["schedule"])
            in_force = schedules.from_config(resets[-1]["schedule"]) if resets else None
        except (TypeError, ValueError, KeyError):  # (a configuration this kfit cannot read: set_state will say)
            return None
        if saved is None or _config(self.schedule) is None or saved == self.schedule:
            return None
        reset = self.reset_method
        said = (f"This code gives {type(self).__name__} {self.name!r} the schedule {self.schedule!r}; the run that "
                f"wrote the checkpoint {file!r} had {saved!r}. ")
        if in_force is not None:
            return said + (
                f"That run replaced it at sample {resets[-1]['samples']} (by {reset}"
                + (", which kfit's ReduceLROnPlateau calls" if self.kind == "learning_rate" else "")
                + f") with {in_force!r}, which stays in force: the new schedule is not used. To train with it, call "
                f"{reset}(schedule) once the run has resumed (e.g. in a callback's on_epoch_begin; it then counts "
                "from there), or start over (restore=False).")
        return said + (
            "The new schedule is used from here on, read at the restored clock as if it had held from the run's start. "
            "To go on with the checkpoint's schedule, give the callback that schedule again; to train with the new one "
            "from the start, start over (restore=False).")

    def set_state(self, state: dict[str, Any]) -> None:
        from kfit import schedules

        logged = state.get("logged")
        self._set([(int(r["samples"]), int(r["minibatches"]), schedules.from_config(r["schedule"]))
                   for r in state.get("resets", [])], (None, None) if logged is None else (float(logged[0]), int(logged[1])))

    def _put_back(self) -> Any:
        """What puts this callback's state back as it is now, a reset to a Python callable included (which
        :meth:`get_state` refuses): a load into a run in progress undoes with it if another part refuses its state."""
        resets, logged = list(self._resets), (self._logged, self._logged_size)
        return lambda: self._set(resets, logged)

    def _set(self, resets: list, logged: tuple) -> None:
        """Sets the resets and the value logged last, and forgets what was applied: the next step applies its value.

        ``resets``: ``(samples, minibatches, schedule)`` from which a new schedule holds, relative to its start.
        ``logged``: the value of the last full minibatch, and its size: what the epoch's logs report (a minibatch
        shortened to end an epoch gets a smaller per-minibatch rate, which is not the rate in force). Also forgotten:
        on_step_begin's caches of the value's segment of the clock (see _segment_at) and of the steps on which it has
        nothing to do, ``_unchanged``: (size, samples from, samples until, minibatches from, minibatches until).
        """
        self._resets: list[tuple[int, int, Any]] = resets
        self._logged, self._logged_size = logged
        self._applied: float | None = None
        self._segment: tuple | None = None
        self._unchanged: tuple | None = None
        wake(self)


class LearningRateSchedule(_HyperparameterSchedule):
    """Sets the optimizer's learning rate before every step from a schedule of the sample clock.

    The schedule's unit decides what the optimizer gets for a minibatch of ``B`` samples:
    ``kfit.schedules.learning_rate_per_sample(lr_s)`` gives ``lr_s * B``;
    ``learning_rate_per_minibatch(lr, reference_minibatch_size=B_ref)`` gives ``lr * B / B_ref``; a plain
    value, list or callable is a per-minibatch rate used as is. The applied rate is logged as ``lr``; at each
    epoch end the optimizer's rate is also logged as ``learning_rate``, as Keras's ``LearningRateScheduler`` logs it.

    Like CNTK's learner, it can read and reset the rate while training runs (e.g. from a
    cross-validation callback): :meth:`learning_rate` and :meth:`reset_learning_rate`.

    Args:
        schedule: a learning-rate schedule (see :mod:`kfit.schedules`).
        name: the key of this callback's state in checkpoints.

    Example:
        >>> import kfit
        >>> lr = kfit.callbacks.LearningRateSchedule(
        ...     kfit.schedules.learning_rate_per_sample([0.001] * 2 + [0.0005], epoch_size=1000))
        >>> # kfit.fit(model, x, y, minibatch_size=64, callbacks=[lr])
    """

    default_name = "learning_rate_schedule"
    kind = "learning_rate"
    log_key = "lr"
    reset_method = "reset_learning_rate"

    def learning_rate(self) -> float:
        """The learning rate in force now, in the schedule's unit (per sample for a per-sample schedule)."""
        return self.value()

    def reset_learning_rate(self, values: Any) -> None:
        """Sets a new learning-rate schedule from now on (CNTK's ``learner.reset_learning_rate``).

        Args:
            values: a learning-rate schedule, or a value/list in the unit of the current schedule (a Python
                callable only in a run without a checkpoint: a checkpoint saves the schedule in force).

        Raises:
            TypeError: ``values`` is built from a Python callable and the run writes checkpoints.
        """
        self.reset(values)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_begin(epoch, logs)
        applied = self._applied
        if applied is None:  # nothing applied yet, or to be applied again at the next step
            return
        # Once an epoch (one read; Keras syncs the state at the epoch's end anyway): the rate set is still there,
        # unless another callback changed it (Keras's ReduceLROnPlateau or LearningRateScheduler): the schedule would
        # then undo the change at its next value or minibatch size and keep it until then, a run no one can predict.
        found = float(np.asarray(_backend.read_variable(self._model, self._variable)))
        if not math.isclose(found, applied, rel_tol=1e-6, abs_tol=1e-12):
            raise ValueError(
                f"The optimizer's learning rate was changed from {applied:g} (set by kfit's LearningRateSchedule) to "
                f"{found:g} by another callback before epoch {epoch + 1} began, e.g. keras.callbacks.ReduceLROnPlateau or "
                "LearningRateScheduler. The schedule sets the rate before each step and would keep or undo that change "
                "depending on the minibatch size. To reduce the rate on a plateau use kfit.callbacks.ReduceLROnPlateau "
                "(it scales the schedule's rate); to change the rate from a callback call the schedule's "
                "reset_learning_rate(values); or leave the LearningRateSchedule out.")

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        if logs is not None:  # the optimizer's rate now, as Keras's LearningRateScheduler logs it
            rate = self._applied  # (None after a reset since the last step)
            logs["learning_rate"] = float(np.asarray(_backend.read_variable(self._model, self._variable))) if rate is None else rate


class MomentumSchedule(_HyperparameterSchedule):
    """Sets the optimizer's momentum before every step from a schedule of the sample clock.

    ``kfit.schedules.momentum_as_time_constant(tau)`` gives ``exp(-B / tau)`` for a minibatch of ``B``
    samples, ``momentum_per_sample(m_s)`` gives ``m_s ** B``; a plain value is per minibatch. The target
    is ``momentum`` of :class:`kfit.optimizers.MomentumSGD` or ``beta_1`` of :class:`kfit.optimizers.Adam`;
    Keras's own SGD and Adam keep these as Python floats compiled into the step and are refused.
    The applied value is logged as ``momentum``.

    Example:
        >>> import kfit
        >>> mom = kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant([0] * 5 + [1024], epoch_size=1000))
    """

    default_name = "momentum_schedule"
    kind = "momentum"
    log_key = "momentum"
    reset_method = "reset_momentum"

    def _target_variable(self, optimizer: Any) -> Any:
        from kfit.optimizers import hyperparameter_variable

        inner = unwrapped(optimizer)
        name = "beta_1" if hasattr(inner, "beta_1") and not hasattr(inner, "momentum") else "momentum"
        return hyperparameter_variable(optimizer, name)

    def momentum(self) -> float:
        """The momentum in force now, in the schedule's unit."""
        return self.value()

    def reset_momentum(self, values: Any) -> None:
        """Sets a new momentum schedule from now on.

        Args:
            values: a momentum schedule, or a value/list in the unit of the current schedule (a Python callable
                only in a run without a checkpoint: a checkpoint saves the schedule in force).

        Raises:
            TypeError: ``values`` is built from a Python callable and the run writes checkpoints.
        """
        self.reset(values)
