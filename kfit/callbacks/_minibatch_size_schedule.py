"""Minibatch sizes that follow the sample clock."""

from __future__ import annotations

from typing import Any

from kfit.callbacks._base import KfitCallback


class MinibatchSizeSchedule(KfitCallback):
    """Draws each minibatch with the size that a schedule gives at the clock's value when it is drawn.

    Sizes are global (summed over Horovod workers). Learning-rate and momentum schedules follow the new
    size automatically: a per-sample rate gives ``lr_s * B``, a time constant ``exp(-B / tau)``. Needs
    :func:`kfit.fit` (plain ``model.fit`` batches its data itself); ``kfit.fit(minibatch_size=schedule)``
    is the same thing.

    Args:
        schedule: a ``kfit.schedules.minibatch_size(...)`` schedule, or values it accepts.

    Example:
        >>> import kfit
        >>> sizes = kfit.callbacks.MinibatchSizeSchedule([256] * 6 + [512] * 9 + [1024], epoch_size=60000)
        >>> sizes.size_at(0), sizes.size_at(6 * 60000)
        (256, 512)
    """

    default_name = "minibatch_size_schedule"
    needs_stream = True

    def __init__(self, schedule: Any, epoch_size: int | None = None, name: str | None = None):
        super().__init__(name=name)
        from kfit import schedules

        if isinstance(schedule, schedules.HyperparameterSchedule):
            if schedule.kind != "minibatch_size":
                raise ValueError(
                    "Invalid value for argument `schedule`: expected a minibatch-size schedule "
                    f"(kfit.schedules.minibatch_size(...)). Received a {schedule.kind} schedule: {schedule!r}"
                )
            if epoch_size is not None:
                raise ValueError("Argument `epoch_size` applies to raw values only; the schedule given already has one.")
            self.schedule = schedule
        else:
            self.schedule = schedules.minibatch_size(schedule, epoch_size=epoch_size)

    def size_at(self, samples: int, minibatches: int = 0) -> int:
        """The scheduled (global) minibatch size at a clock reading."""
        return int(self.schedule.value(samples, minibatches))

    def on_train_begin(self, logs: dict | None = None) -> None:
        run = self.training_run
        # (no driver and no clock attached by hand: plain model.fit without a SampleClock)
        if (run.driver is None and not run.manual) or (run.driver is not None and not run.driver.plans_sizes):
            raise RuntimeError(
                "MinibatchSizeSchedule needs kfit.fit: plain model.fit draws minibatches of one fixed size. "
                "Replace model.fit(x, y, ...) with kfit.fit(model, x, y, ...)."
            )
