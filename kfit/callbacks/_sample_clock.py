"""The sample clock under plain ``model.fit`` (its driver: ``kfit.callbacks._model_fit.FitDriver``)."""

from __future__ import annotations

import math
from typing import Any

from kfit import _backend, _checks, distributed
from kfit.callbacks._base import KfitCallback
from kfit.callbacks._model_fit import FitDriver
from kfit.clock import Clock


class SampleClock(KfitCallback):
    """Keeps kfit's sample clock under plain ``model.fit``.

    ``model.fit`` does not tell its callbacks how many samples a step consumes; this callback does.
    Add it to ``model.fit``'s callbacks with the ``batch_size`` you give ``model.fit``, and with
    ``num_samples=len(x)`` so that the last, smaller minibatch of each epoch is counted exactly. Under
    :func:`kfit.fit` it is not needed (the clock is kept by the training loop). With
    ``compile(steps_per_execution=N)`` Keras calls the batch hooks once per call of up to ``N`` steps; the clock
    counts every one of them (values set by schedules change between calls, as Keras allows). A ``batch_size``
    that is not ``model.fit``'s is refused with an error: as training begins where, with ``num_samples``, it gives
    another number of steps per epoch than ``model.fit`` runs, else at the second step (where the model trains with
    Keras's own ``train_step``, on one worker: its loss tracker counts the samples each step held). On data of unknown
    length (a generator, a filtered ``tf.data`` pipeline) the step Keras begins past the end of an epoch's data is not
    counted, nor, without ``num_samples``, the steps that the epoch's last call of ``N`` did not run (the clock
    corrects itself as the epoch ends). Give it once: a second ``SampleClock`` in the same ``model.fit`` is refused as training begins.
    A Keras callback that reads :func:`kfit.get_clock` finds every step that has run counted, wherever it stands in the
    list (at a step's batch end the step is counted); ``minibatch_size``, the size of the step about to run, is set at
    the first kfit callback's ``on_train_batch_begin``: list the ``SampleClock`` first for callbacks that read it there.

    Args:
        batch_size: the ``batch_size`` given to ``model.fit``.
        num_samples: the number of training samples (after ``validation_split``). Without it every step
            is counted as ``batch_size`` samples, and an epoch as ``steps * batch_size``.

    Example:
        >>> import kfit
        >>> clock = kfit.callbacks.SampleClock(batch_size=32, num_samples=1000)
        >>> # model.fit(x, y, batch_size=32, callbacks=[clock, kfit.callbacks.LearningRateSchedule(...)])
    """

    default_name = "sample_clock"
    order = -100

    def __init__(self, batch_size: int, num_samples: int | None = None):
        super().__init__()
        self.batch_size = _checks.count("batch_size", batch_size, low=1)
        self.num_samples = _checks.count("num_samples", num_samples, low=1, allow_none=True)
        self._steps_per_epoch: int | None = None  # model.fit's steps per epoch, known at on_train_begin
        self._epoch_start: int | None = None  # the clock at the first epoch's start, until its first step is checked
        self._unknown_length = False  # model.fit does not know how many steps an epoch has (one worker)

    def set_model(self, model: Any) -> None:
        super().set_model(model)
        run = self.training_run
        if run.driver is None or isinstance(run.driver, FitDriver):  # under kfit.fit, its loop keeps the clock
            run.clock = run.clock or Clock()
            run.driver = FitDriver(model, self.batch_size, self.num_samples)

    def on_train_begin(self, logs: dict | None = None) -> None:
        clocks = [c for c in self.training_run.members() if isinstance(c, SampleClock)]
        if len(clocks) > 1:
            # (the last one handed the model would drive the clock, and the others' checks would blame themselves)
            raise ValueError(
                "model.fit's callbacks hold more than one kfit.callbacks.SampleClock: "
                f"{', '.join(f'SampleClock(batch_size={c.batch_size}, num_samples={c.num_samples})' for c in clocks)}. "
                "Give it once, with model.fit's batch_size."
            )
        clock = self.clock
        steps = (self.params or {}).get("steps")
        if self.num_samples is not None:
            expected = math.ceil(self.num_samples / self.batch_size)
            if steps is not None and steps != expected:
                raise ValueError(
                    f"SampleClock(batch_size={self.batch_size}, num_samples={self.num_samples}) expects "
                    f"{expected} step{'s' * (expected != 1)} per epoch, but model.fit runs {steps}. Pass the batch_size and the "
                    "number of training samples that model.fit uses (after validation_split)."
                )
            clock.epoch_size, steps = self.num_samples, expected
        elif steps:
            clock.epoch_size = steps * self.batch_size
        self._steps_per_epoch = steps
        self._epoch_start = None
        self._unknown_length = steps is None and distributed.size() == 1  # (see FitDriver.epoch_ends)
        driver = self.training_run.driver
        if isinstance(driver, FitDriver):
            # (Keras begins a step past the end of data of unknown length: see FitDriver.batch_begin)
            driver.unknown_length_epoch = None if (self.params or {}).get("steps") else self.num_samples
            if getattr(self.training_model, "train_function", None) is not None:
                self._release_train_function = _backend.after_each_train_call(self.training_model, driver.step_ran)
            if distributed.size() == 1:
                self.on_train_batch_begin = self._check_first_step  # (this run's first epoch only; see there)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        """``model.fit(initial_epoch=e)`` starts at epoch ``e`` (to resume a run): a new clock starts at that epoch's
        first sample too, as kfit.fit's stream path starts it, so that schedules go on where the run was."""
        clock = self.clock
        if epoch > 0 and clock.samples == 0 and clock.minibatches == 0 and clock.epoch_size:
            steps = self._steps_per_epoch or math.ceil(clock.epoch_size / self.batch_size)
            clock.samples, clock.minibatches = epoch * clock.epoch_size, epoch * steps
        driver = self.training_run.driver
        if isinstance(driver, FitDriver):
            driver.epoch_start = clock.samples if self._unknown_length else None
            driver.epoch_began = clock.samples
        if self.__dict__.get("on_train_batch_begin") is not None:
            if self._epoch_start is None:
                self._epoch_start = clock.samples
            else:  # the first epoch ended within its first call of the train function: nothing to compare
                del self.on_train_batch_begin

    def _check_first_step(self, batch: int, logs: dict | None = None) -> None:
        """``on_train_batch_begin`` until the run's first step has been counted: then the samples Keras's own
        ``train_step`` counted in it (its loss tracker) must be the ones this clock counted, else the
        ``batch_size`` given here is not ``model.fit``'s and every schedule would run on a wrong clock, silently.
        Checked once, at the second step (a state sync on JAX, once); on data of unknown length, whose short last
        step the clock counts as ``batch_size``, at the first step where the counts can mean one thing only. A model
        with its own ``train_step`` is not checked."""
        KfitCallback.on_train_batch_begin(self, batch, logs)
        if batch == 0 or self._epoch_start is None:
            return
        counted = self.clock.samples - self._epoch_start
        trained = _backend.samples_counted_by_keras(self.model)
        if (self._unknown_length and _backend.BACKEND != "torch" and trained
                and counted - self.batch_size < trained < counted):
            # Data of unknown length: Keras's JAX and TensorFlow loops begin one step past the data's end, so the
            # steps counted may end with the data's short last one, counted as batch_size (its size is not known
            # then); or batch_size is not model.fit's. A step that follows in this epoch tells (the check goes on
            # there); the epoch's end (on_epoch_begin) accepts it.
            return
        del self.on_train_batch_begin  # checked: the hot path is the base's again
        if trained and trained != counted:
            raise ValueError(
                f"SampleClock(batch_size={self.batch_size}) counted {counted} samples in model.fit's first "
                f"{'step' if batch == 1 else f'{batch} steps'}, but model.fit trained {trained}: give SampleClock "
                "the batch_size given to model.fit (model.fit(..., batch_size=B) and SampleClock(batch_size=B); "
                "model.fit's default is 32)."
            )

    def _clock_restored(self, samples: int, minibatches: int) -> None:
        """``kfit.load_checkpoint`` from a callback of the run moved the clock from ``samples``: the readings taken as
        the epoch began move with it (a load as an epoch begins, after this callback's ``on_epoch_begin``: the epoch's
        end compared Keras's count of its samples with the steps counted since the reading before the load)."""
        moved = self.clock.samples - samples
        driver = self.training_run.driver
        if self._epoch_start is not None:
            self._epoch_start += moved
        if isinstance(driver, FitDriver):
            driver.epoch_start, driver.epoch_began = (
                None if start is None else start + moved for start in (driver.epoch_start, driver.epoch_began))

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Counts the epoch's last step (the flush happens in the hook wrapper)."""

    def on_train_end(self, logs: dict | None = None) -> None:
        """Counts the run's last step (the flush happens in the hook wrapper)."""

    def _run_ended(self) -> None:
        self.__dict__.pop("_release_train_function", lambda: None)()
