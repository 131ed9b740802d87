"""Per-interval means from Keras's running epoch means, shared by the progress callbacks.

Keras's train step logs the mean of each metric over the epoch so far, ``m_k`` after ``n_k`` samples. The
mean over the samples between two readings ``a`` and ``b`` (CNTK's "loss over minibatches 11-20") is::

    (m_b * n_b - m_a * n_a) / (n_b - n_a)

so only the readings at interval boundaries need converting (each conversion is a device sync). The
formula is exact for sample-weighted means (the loss and Keras's built-in metrics); in float32 it loses
about ``n_b / (n_b - n_a)`` times float32's relative precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras

from kfit import _checks
from kfit.clock import Clock

#: Keys of the epoch logs that are hyperparameters, not metrics (``learning_rate``: Keras's name for ``lr``).
HYPERPARAMETER_KEYS = ("lr", "learning_rate", "momentum", "minibatch_size")


def kfit_names(logs: dict) -> dict:
    """``logs`` with the learning rate under kfit's name: Keras's callbacks (and kfit's, for them) log it as
    ``learning_rate``, kfit's files (CSV history, TensorBoard) as ``lr``, one column or tag whoever logged it."""
    if "learning_rate" not in logs:
        return logs
    logs = dict(logs)
    rate = logs.pop("learning_rate")
    logs.setdefault("lr", rate)
    return logs


to_float = _checks.log_float


def without_step_end(callback: Any) -> None:
    """Gives ``callback`` Keras's default (empty) batch-end hook, for a progress callback with nothing to
    do after each step: Keras then keeps its asynchronous dispatch under plain ``model.fit`` instead of
    converting the logs (a device sync) after every step for it."""
    callback.on_train_batch_end = keras.callbacks.Callback.on_train_batch_end.__get__(callback)


def is_due(index: int, freq: int | None, first: int = 0) -> bool:
    """Whether the ``index``-th minibatch of an epoch (1-based) ends a progress interval.

    ``freq`` > 0: every ``freq`` minibatches; ``freq == 0``: after minibatches 1, 3, 7, 15, ... (CNTK's
    geometric schedule: intervals of 1, 2, 4, 8, ... minibatches); None: never. The first ``first``
    minibatches always end one.
    """
    if index <= first:
        return True
    if freq is None:
        return False
    if freq == 0:
        return (index + 1) & index == 0
    return index % freq == 0


def samples_in_epoch(clock: Clock) -> int:
    """Samples already trained in the current epoch (0 when the clock has no epoch size)."""
    return clock.samples_in_epoch if clock.epoch_size else 0


def is_cut(clock: Clock, size: int, previous: int | None, max_samples: int | None = None) -> bool:
    """True when ``size`` is a minibatch shortened to end at the epoch end (or ``max_samples``) rather than
    a change of the scheduled size."""
    if previous is None or size >= previous:
        return False
    end = clock.samples + size
    return end == clock.epoch_end() or end == max_samples


@dataclass
class Interval:
    """The minibatches ``first``..``last`` of an epoch (1-based), ``samples`` samples, and their means."""

    first: int
    last: int
    samples: int
    means: dict[str, float]


class IntervalMeans:
    """Follows one epoch's intervals: where the last one ended, and the running means there.

    Its state (``get_state``) lets a run resumed mid-epoch continue the interval it was in.
    """

    def __init__(self) -> None:
        self.epoch_start_samples = 0
        self.epoch_start_minibatches = 0
        self.last_minibatch = 0
        self.last_samples = 0
        self.last_means: dict[str, float] = {}
        self._restored: dict[str, Any] | None = None

    def begin_epoch(self, clock: Clock, run: Any = None) -> bool:
        """Starts an epoch at the clock's reading (a resumed run may start in the middle of one). False when the
        epoch's minibatches that ran before the reading are not counted yet: :func:`kfit.fit` counts them as it plans
        the epoch, before its first step, and a ``kfit.load_checkpoint`` at the previous epoch's end came after the
        count it makes for a resume; call :meth:`count_steps_run` then (:func:`begin_intervals` does)."""
        done = samples_in_epoch(clock)
        start = clock.samples - done
        restored, self._restored = self._restored, None
        if done and restored is not None and restored.get("epoch_start_samples") == start:
            self._load(restored)
            return True
        # Resumed mid-epoch without our state: the restored metric state is the baseline, and the epoch's minibatches
        # that ran before the resume (kfit.fit's batch_offset) are counted. Keras has just reset the metrics: kfit.fit
        # puts the restored state back after every on_epoch_begin, and holds it until then (run.restored_values).
        self.last_means = _current_means(run.model, run.restored_values) if done and run is not None else {}
        self.last_minibatch = run.batch_offset if self.last_means else 0
        self.epoch_start_samples = start
        self.epoch_start_minibatches = clock.minibatches - self.last_minibatch
        self.last_samples = done if self.last_means else 0  # no baseline: the first interval reports the running mean
        return not (self.last_means and run.kfit_fit and not run.batch_offset)

    def count_steps_run(self, run: Any) -> None:
        """Numbers the epoch's minibatches from its start with the steps ``run`` counted before the clock's reading
        (``run.batch_offset``), once kfit.fit has counted them (see :meth:`begin_epoch`)."""
        self.last_minibatch += run.batch_offset
        self.epoch_start_minibatches -= run.batch_offset

    def index(self, clock: Clock) -> int:
        """The 1-based index, within the epoch, of the minibatch the clock has just counted."""
        return clock.minibatches - self.epoch_start_minibatches

    def first_index(self, clock: Clock) -> int:
        """The 1-based index, within the epoch, of the first minibatch the clock has just counted: the last one, or
        the first of a call of several steps (``steps_per_execution``)."""
        if clock.counted_from is None:
            return self.index(clock)
        return clock.counted_from[1] - self.epoch_start_minibatches + 1

    def due(self, clock: Clock, freq: int | None, first: int = 0) -> bool:
        """Whether a minibatch the clock has just counted ends a progress interval (:func:`is_due`)."""
        index = self.index(clock)
        if clock.counted_from is None:
            return is_due(index, freq, first)
        return any(is_due(i, freq, first) for i in range(self.first_index(clock), index + 1))

    def samples(self, clock: Clock) -> int:
        """Samples of the current epoch counted by the clock."""
        return clock.samples - self.epoch_start_samples

    def interval(self, clock: Clock, logs: dict | None, keys: Any = None) -> Interval:
        """Closes the interval at the clock's reading; ``logs`` are the running means there."""
        logs = logs or {}
        n_b = self.samples(clock)
        n_a = self.last_samples
        values = {key: to_float(logs[key]) for key in (keys if keys is not None else logs) if key in logs}
        current = {key: value for key, value in values.items() if value is not None}
        means = {}
        count = n_b - n_a
        for key, m_b in current.items():
            m_a = self.last_means.get(key, 0.0)
            means[key] = (m_b * n_b - m_a * n_a) / count if count > 0 else m_b
        interval = Interval(self.last_minibatch + 1, self.index(clock), count, means)
        self.last_minibatch = interval.last
        self.last_samples = n_b
        self.last_means = current
        return interval

    def get_state(self) -> dict[str, Any]:
        return {
            "epoch_start_samples": self.epoch_start_samples,
            "epoch_start_minibatches": self.epoch_start_minibatches,
            "last_minibatch": self.last_minibatch,
            "last_samples": self.last_samples,
            "last_means": dict(self.last_means),
        }

    @staticmethod
    def renamed_state(state: dict[str, Any] | None, renamed: Any) -> dict[str, Any] | None:
        """``state`` with its means under this model's log keys (``renamed``: a restore's map of the checkpointed
        model's log keys to this model's, where Keras numbered its outputs or metrics anew)."""
        return state and dict(state, last_means={renamed(k): v for k, v in state.get("last_means", {}).items()})

    def set_state(self, state: dict[str, Any]) -> None:
        # Applied at the next begin_epoch, once the clock is restored, if it is the same epoch.
        self._restored = dict(state) if state else None

    def _load(self, state: dict[str, Any]) -> None:
        self.epoch_start_samples = int(state["epoch_start_samples"])
        self.epoch_start_minibatches = int(state["epoch_start_minibatches"])
        self.last_minibatch = int(state["last_minibatch"])
        self.last_samples = int(state["last_samples"])
        self.last_means = {k: float(v) for k, v in state.get("last_means", {}).items()}


def begin_intervals(callback: Any, intervals: IntervalMeans, clock: Clock) -> None:
    """``intervals.begin_epoch`` for a progress callback's ``on_epoch_begin``; where the epoch's minibatches before the
    clock are counted later, the callback's next ``on_step_begin`` (once, not at every step) counts them first."""
    callback.__dict__.pop("on_step_begin", None)  # (one left by an epoch that ran no step)
    run = callback.training_run
    if intervals.begin_epoch(clock, run):
        return

    def first_step(clock: Clock) -> None:
        del callback.on_step_begin
        intervals.count_steps_run(run)
        callback.on_step_begin(clock)

    callback.on_step_begin = first_step


def _current_means(model: Any, values: list) -> dict[str, float]:
    """The model's metric results, with ``values`` (``(variable, value)`` pairs) read in place of those variables."""
    try:
        with keras.StatelessScope(state_mapping=values):
            results = model.get_metrics_result()
    except Exception:  # noqa: BLE001 - a baseline is a nicety; without one the interval starts at 0
        return {}
    return {k: v for k, v in ((k, to_float(v)) for k, v in results.items()) if v is not None}


class ScheduledValues:
    """The minibatch size and the hyperparameters as scheduled, ignoring the minibatches shortened to end
    an epoch (or ``max_samples``) and what a schedule applies to them (e.g. ``lr_s * B`` for a smaller
    ``B``)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.size: int | None = None
        self.values: dict[str, float] = {}

    def get_state(self) -> dict[str, Any]:
        return {"size": self.size, "values": dict(self.values)}

    def set_state(self, state: dict[str, Any]) -> None:
        self.size = None if state.get("size") is None else int(state["size"])
        self.values = {str(k): float(v) for k, v in state.get("values", {}).items()}

    def is_cut_step(self, clock: Clock, max_samples: int | None) -> bool:
        """True when the minibatch about to be trained is shortened to end an epoch (or the run)."""
        size = clock.minibatch_size
        return size is not None and is_cut(clock, size, self.size, max_samples)

    def observe_size(self, clock: Clock, max_samples: int | None) -> bool:
        """Notes the size of the minibatch about to be trained; True when the scheduled size changed (a minibatch
        cut short at the epoch end or at the run's ``max_samples`` is no change)."""
        size = clock.minibatch_size
        if size is None or size == self.size or self.is_cut_step(clock, max_samples):
            return False
        self.size = size
        return True

    def observe(self, name: str, value: float, clock: Clock, max_samples: int | None) -> bool:
        """Notes a hyperparameter change; True when it is a change of the scheduled value."""
        if self.values.get(name) == value or self.is_cut_step(clock, max_samples):
            return False
        self.values[name] = float(value)
        return True
