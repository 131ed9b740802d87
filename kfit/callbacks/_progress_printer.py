"""CNTK's progress lines: minibatch intervals, epoch summaries, evaluations and hyperparameter changes."""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

import numpy as np

from kfit import _checks, _files, distributed
from kfit.callbacks._base import KfitCallback
from kfit.callbacks._running_means import (
    HYPERPARAMETER_KEYS,
    IntervalMeans,
    ScheduledValues,
    begin_intervals,
    to_float,
    without_step_end,
)
from kfit.clock import Clock
from kfit.interval import Interval

_EVALUATION_COUNTS = ("samples", "minibatches", "index", "average_error")


def _is_accuracy(key: str) -> bool:
    for prefix in ("val_", "test_"):
        if key.startswith(prefix):
            key = key[len(prefix):]
    return key == "acc" or key.endswith("accuracy")


def training_keys(logs: Any) -> list[str]:
    """The values a training line shows, in Keras's order: the loss first, then every compiled metric
    (not the validation results, the hyperparameters or the counts)."""
    keys = [k for k in logs if not k.startswith(("val_", "test_")) and k not in HYPERPARAMETER_KEYS and k != "samples"]
    return sorted(keys, key=lambda k: k != "loss")


def _shown(value: float) -> str:
    """``value`` as printed: a float32 (what an optimizer variable holds) by its shortest decimal (``0.05``, not
    ``0.05000000074505806``), which reads back as the same float32; any other float by its own repr."""
    as_float32 = np.float32(value)
    return str(as_float32) if float(as_float32) == float(value) else repr(float(value))


def hyperparameter_line(name: str, value: float, scheduled: float, unit: str) -> str:
    """CNTK's line for a hyperparameter change: per sample when the schedule is, else per minibatch."""
    if name == "lr":
        if unit == "per_sample":
            return f"Learning rate per 1 samples: {scheduled}"
        return f"Learning rate per minibatch: {_shown(value)}"
    if name == "momentum":
        if unit == "time_constant":
            return f"Momentum per 1 samples: {0.0 if scheduled == 0 else math.exp(-1.0 / scheduled)}"
        if unit == "per_sample":
            return f"Momentum per 1 samples: {scheduled}"
        return f"Momentum per minibatch: {_shown(value)}"
    return f"{name}: {value}"


# CNTK ProgressPrinter options with no counterpart, each with its default and what to do instead.
_CNTK_ONLY = {
    "gen_heartbeat": (False, "kfit prints no heartbeat lines: leave gen_heartbeat out."),
    "test_freq": (None, "kfit prints one line per evaluation ('Finished Evaluation', 'Finished Test'), none per "
                        "evaluation minibatch: leave test_freq out."),
    "test_first": (0, "kfit prints one line per evaluation, none per evaluation minibatch: leave test_first out."),
    "distributed_freq": (None, "kfit has no worker synchronization lines: leave distributed_freq out."),
    "distributed_first": (0, "kfit has no worker synchronization lines: leave distributed_first out."),
}


def _refuse_cntk_options(**given: Any) -> None:
    for name, value in given.items():
        default, fix = _CNTK_ONLY[name]
        if value is not default and value != default:
            raise ValueError(f"Invalid value for argument `{name}`: expected {default!r} (CNTK's option has no "
                             f"counterpart in kfit). Received: {name}={value!r}. {fix}")


class ProgressPrinter(KfitCallback):
    """Prints CNTK's progress lines to stderr or to a file.

    Lines, as CNTK writes them, with every value named as Keras names it::

        Learning rate per 1 samples: 0.001
        Momentum per 1 samples: 0.9990239141819757
        Minibatch size: 64
        Minibatch[   1-  10]: loss = 0.352425 * 640, 1 - accuracy = 35.24%;
        Finished Epoch[3]: loss = 0.089973 * 54000, 1 - accuracy = 2.62%, mae = 0.101234 2.329s (23185.9 samples/s);
        Finished Evaluation [val_index=0]: Minibatch[1-32]: val_loss = 0.260011 * 1024, 1 - val_accuracy = 8.11%;
        Finished Test: Minibatch[1-313]: test_loss = 0.020153 * 10000, 1 - test_accuracy = 0.58%;

    A ``Minibatch[a-b]`` line gives the means over minibatches ``a`` to ``b`` of the epoch (numbered from 1
    in each epoch), computed from Keras's running means at the interval's ends: only those steps
    convert the logs (a device sync). ``Finished Epoch[k]`` (1-based, as Keras's progress bar counts) gives
    the epoch's means, the samples the clock counted in it, its wall time and the samples trained per
    second. After :func:`kfit.load_checkpoint` from a callback, the epochs that follow are numbered from the
    restored clock, as a resume of that file numbers them. The first minibatch of a run (fresh or resumed)
    compiles the train step; when the epoch has more, samples/s is measured after it and the line says how
    long it took (``(23185.9 samples/s; the first minibatch, compiling, took 1.912s)``). ``Finished Evaluation
    [val_index=k]`` follows each cross-validation (``k`` counts from 0, as ``val_index`` in the logs and
    the CSV history and ``index`` in the cross-validation callback); ``Finished Test`` the final test. The
    learning rate, momentum and minibatch size get a line whenever they change (a minibatch shortened to
    end an epoch is not a change).

    Every value is labelled with its Keras name: the loss, then each compiled metric. With
    ``metric_is_pct`` an accuracy metric is shown as CNTK's classification error, labelled
    ``1 - accuracy`` (in %); any other metric, or any metric with ``metric_is_pct=False``, is shown as is
    with six decimals. Only the chief worker prints.

    The arguments are CNTK's, in CNTK's order, so that a positional CNTK call means what it meant there:
    ``ProgressPrinter(freq, first, tag, log_to_file, rank, gen_heartbeat, num_epochs, test_freq, test_first,
    metric_is_pct, distributed_freq, distributed_first)``; ``name`` is kfit's, by keyword only.

    Args:
        freq: a ``Minibatch`` line every ``freq`` minibatches of an epoch (CNTK's meaning); 0: at geometrically
            growing intervals of 1, 2, 4, 8, ... minibatches (after minibatches 1, 3, 7, 15, ..., as CNTK); None
            (CNTK's default): epoch lines only. Or a :class:`kfit.Interval` on the clock, or its string: a line
            whenever a step crosses a multiple of ``"5000sp"`` (samples: the same lines whatever the minibatch
            size), ``"100mb"`` (steps since the run began) or ``"1ep"``.
        first: the first ``first`` minibatches of each epoch get a line each.
        tag: printed as ``[tag] `` before every line.
        log_to_file: a file the lines are appended to (a restarted run appends, never truncates), instead
            of stderr. "Redirecting log to file PATH" is printed to stderr once. A line that cannot be written (a
            full disk, a read-only file system) stops training with an ``OSError`` naming the file and the cause;
            the lines before it stay whole. A folder removed during the run is made again.
        rank: CNTK's worker rank (``rank=kfit.distributed.rank()``), or None: with ``log_to_file``, the lines
            go to ``f"{log_to_file}rank{rank}"``, CNTK's file name; without it, nothing changes. As always, only the
            chief prints (CNTK wrote a file on every worker; kfit's lines already count all workers' samples).
        gen_heartbeat: CNTK's option with no counterpart: accepted at its CNTK default (False) only; any other
            value is refused, saying what to do.
        num_epochs: CNTK's metadata, accepted and kept as :attr:`num_epochs` (no line shows it).
        test_freq, test_first: as ``gen_heartbeat`` (defaults None, 0).
        metric_is_pct: show an accuracy metric as CNTK's error percentage.
        distributed_freq, distributed_first: as ``gen_heartbeat`` (defaults None, 0).
        name: the key of this callback's state in checkpoints (keyword only).

    Raises:
        ValueError: if ``freq`` is not a count, an Interval or its string, if ``first`` is negative or not an
            integer, or if another argument is invalid.

    Example:
        >>> import kfit
        >>> printer = kfit.callbacks.ProgressPrinter(freq=100, first=5, tag="mnist")
        >>> printer.freq, printer.first
        (100, 5)
        >>> kfit.callbacks.ProgressPrinter(freq="5000sp").freq
        Interval(5000, 'sp')
        >>> # kfit.fit(model, x, y, minibatch_size=64, callbacks=[printer])
    """

    default_name = "progress_printer"

    def __init__(
        self,
        freq: int | str | Interval | None = None,
        first: int = 0,
        tag: str = "",
        log_to_file: str | os.PathLike | None = None,
        rank: int | None = None,
        gen_heartbeat: bool = False,
        num_epochs: int | None = None,
        test_freq: int | None = None,
        test_first: int = 0,
        metric_is_pct: bool = True,
        distributed_freq: int | None = None,
        distributed_first: int = 0,
        *,
        name: str | None = None,
    ):
        super().__init__(name=name)
        if isinstance(rank, bool):  # kfit's earlier order had metric_is_pct fifth
            raise ValueError(
                f"Invalid value for argument `rank`: expected a worker's rank or None. Received: rank={rank!r}. "
                "ProgressPrinter's fifth argument is CNTK's `rank` (ProgressPrinter(freq, first, tag, log_to_file, "
                "rank, gen_heartbeat, num_epochs, test_freq, test_first, metric_is_pct, ...)): give metric_is_pct=... "
                "by keyword.")
        #: CNTK's worker rank: with ``log_to_file``, the lines go to ``f"{log_to_file}rank{rank}"``, as in CNTK.
        self.rank = _checks.count("rank", rank, allow_none=True)
        _refuse_cntk_options(gen_heartbeat=gen_heartbeat, test_freq=test_freq, test_first=test_first,
                             distributed_freq=distributed_freq, distributed_first=distributed_first)
        #: CNTK's metadata (the number of epochs to train), accepted and kept; it changes no line.
        self.num_epochs = _checks.count("num_epochs", num_epochs, low=1, allow_none=True)
        if isinstance(freq, (str, Interval)):
            freq = Interval.parse(freq, name="freq", default_unit="mb")  # on the clock
        else:
            freq = _checks.count("freq", freq, allow_none=True)  # 0: geometric intervals; None: epoch lines only
        first = _checks.count("first", first)
        if not isinstance(tag, str):
            raise ValueError(f"Invalid value for argument `tag`: expected a string. Received: tag={tag!r}")
        if log_to_file is not None:
            log_to_file = _checks.output_path("log_to_file", log_to_file, example="log.txt")
            log_to_file += "" if rank is None else f"rank{rank}"
        _checks.boolean("metric_is_pct", metric_is_pct)
        self.freq = freq
        self.first = first
        #: Whether the step just counted ends a ``Minibatch`` line (chosen once: the per-step path only calls it).
        self._due = self._due_on_clock if isinstance(freq, Interval) else self._due_in_epoch
        self.tag = tag
        self.log_to_file = None if log_to_file is None else os.fspath(log_to_file)
        self.metric_is_pct = metric_is_pct
        self._intervals = IntervalMeans()
        self._evaluations = 0
        self._keys: list[str] | None = None
        self._first_step: tuple[float, int] | None = None  # (time, samples) when the run's first step ended
        self._steps = 0
        self._announced = False
        self._shown: dict[str, str] = {}
        self._scheduled = ScheduledValues()
        self._epoch_time = 0.0
        self._epoch_samples = 0
        self._epoch_offset = 0  # printed epoch number - Keras's epoch - 1 (nonzero after a load into the run)
        self._renumber = False  # a load moved the clock: the next epoch is numbered from it
        if freq is None and first == 0:
            without_step_end(self)  # epoch lines only: no per-step work, no per-step sync

    # -- output ----------------------------------------------------------------------------------
    def log(self, message: str) -> None:
        """Writes one line (prefixed by the tag) where the progress lines go; only on the chief."""
        if not distributed.is_chief():
            return
        line = (f"[{self.tag}] " if self.tag else "") + message
        if self.log_to_file is None:
            print(line, file=sys.stderr, flush=True)
        else:
            # Whole lines only: a full disk cuts the file back to its last line and raises an OSError naming it.
            _files.append(self.log_to_file, (line + "\n").encode("utf-8"), "the progress log",
                          "Its lines up to this one are whole.")

    def _value(self, key: str, value: float) -> str:
        if self.metric_is_pct and _is_accuracy(key):
            # (+ 0.0: a mean a hair above 1 from float rounding shows 0.00%, not -0.00%)
            return f"1 - {key} = {round((1.0 - value) * 100.0, 2) + 0.0:.2f}%"
        return f"{key} = {value:.6f}"

    def _summary(self, means: dict[str, float], count: int | None, keys: list[str]) -> str:
        """``loss = 0.35 * 640, 1 - accuracy = 35.24%, mae = 0.101234``: the count once, after the first value."""
        parts = [self._value(k, means[k]) for k in keys if k in means]
        if parts and count is not None:
            parts[0] += f" * {count}"
        return ", ".join(parts)

    # -- hooks -----------------------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.log_to_file is not None and distributed.is_chief():
            directory = os.path.dirname(self.log_to_file)
            if directory:
                os.makedirs(directory, exist_ok=True)
            if not self._announced:
                print(f"Redirecting log to file {self.log_to_file}", file=sys.stderr, flush=True)
                self._announced = True
        self._shown = {}
        self._evaluations = 0
        self._scheduled.reset()
        self._first_step = None
        self._steps = 0
        self._epoch_offset = 0  # (a load in another callback's on_train_begin has set _renumber: kept)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        clock = self.clock
        if self._renumber and (clock.epoch_size or clock.epoch_start is not None):
            self._epoch_offset = clock.epoch - epoch  # (a resume of the file loaded starts Keras's count there)
        self._renumber = False
        begin_intervals(self, self._intervals, clock)
        self._epoch_time = time.perf_counter()
        self._epoch_samples = clock.samples

    def on_step_begin(self, clock: Clock) -> None:
        self._steps += 1
        if self._steps == 2:  # the run's first step, which compiled the train step, has returned
            self._first_step = (time.perf_counter(), clock.samples)
        if self._scheduled.observe_size(clock, self.training_run.max_samples):
            self.log(f"Minibatch size: {clock.minibatch_size}")

    def _due_in_epoch(self, clock: Clock) -> bool:
        return self._intervals.due(clock, self.freq, self.first)

    def _due_on_clock(self, clock: Clock) -> bool:
        return clock.crossed(self.freq) or self._intervals.first_index(clock) <= self.first

    def on_step_end(self, clock: Clock, logs: dict | None) -> None:
        if not self._due(clock) or not distributed.is_chief():
            return
        if self._keys is None and logs:
            self._keys = training_keys(logs)
        interval = self._intervals.interval(clock, logs, self._keys or ["loss"])
        self.log(f"Minibatch[{interval.first:4d}-{interval.last:4d}]: {self._summary(interval.means, interval.samples, self._keys or ['loss'])};")

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = logs or {}
        if self._keys is None:
            self._keys = training_keys(logs)
        clock = self.clock
        now = time.perf_counter()
        seconds = now - self._epoch_time
        speed = (clock.samples - self._epoch_samples) / seconds if seconds > 0 else 0.0
        note = ""
        if self._first_step is not None and self._first_step[0] >= self._epoch_time:
            # The run's first step (compiling) is in this epoch: measure the speed after it.
            start_time, start_samples = self._first_step
            if now > start_time and clock.samples > start_samples:
                speed = (clock.samples - start_samples) / (now - start_time)
                note = f"; the first minibatch, compiling, took {start_time - self._epoch_time:.3f}s"
        means = {k: v for k, v in ((k, to_float(v)) for k, v in logs.items()) if v is not None}
        summary = self._summary(means, self._intervals.samples(clock), self._keys)
        self.log(f"Finished Epoch[{epoch + 1 + self._epoch_offset}]: {summary + ' ' if summary else ''}{seconds:.3f}s ({speed:5.1f} samples/s{note});")

    def _evaluation(self, prefix: str, logs: dict, title: str) -> None:
        self._evaluations += 1
        samples, minibatches = logs.get(f"{prefix}samples"), logs.get(f"{prefix}minibatches")
        count = None if samples is None else int(samples)
        counts = {prefix + k for k in _EVALUATION_COUNTS}
        keys = [k for k in logs if k.startswith(prefix) and k not in counts]
        keys = sorted(keys, key=lambda k: k != f"{prefix}loss")
        means = {k: v for k, v in ((k, to_float(logs[k])) for k in keys) if v is not None}
        if not means and f"{prefix}average_error" in logs:  # nothing else to show
            keys = [f"{prefix}average_error"]
            means = {keys[0]: to_float(logs[keys[0]])}
        summary = self._summary(means, count, keys) or "no results"
        span = "" if minibatches is None else f"Minibatch[1-{int(minibatches)}]: "
        self.log(f"{title}: {span}{summary};")

    def on_cross_validation_end(self, index: int, logs: dict) -> None:
        self._evaluation("val_", logs, f"Finished Evaluation [val_index={index}]")

    def on_final_test_end(self, logs: dict) -> None:
        self._evaluation("test_", logs, "Finished Test")

    def on_hyperparameter_change(self, name: str, value: float, scheduled: float, unit: str) -> None:
        if self._scheduled.is_cut_step(self.clock, self.training_run.max_samples):
            return
        line = hyperparameter_line(name, value, scheduled, unit)
        if self._shown.get(name) != line:
            self._shown[name] = line
            self.log(line)

    def _clock_restored(self, samples: int, minibatches: int) -> None:
        """``kfit.load_checkpoint`` from a callback of the run moved the clock from ``samples`` and ``minibatches``: the
        epoch in progress is summed as trained (its baselines move with the clock), and the next epoch is numbered
        from the restored clock, as a resume of the same file numbers it."""
        clock = self.clock
        moved = clock.samples - samples
        self._epoch_samples += moved
        self._intervals.epoch_start_samples += moved
        self._intervals.epoch_start_minibatches += clock.minibatches - minibatches
        if self._first_step is not None:
            self._first_step = (self._first_step[0], self._first_step[1] + moved)
        self._renumber = True

    # -- state -----------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {"intervals": self._intervals.get_state(), "evaluations": self._evaluations}

    def renamed_state(self, state: dict[str, Any], renamed: Any) -> dict[str, Any]:
        """``state`` with its running means under this model's log keys (a restore's ``renamed``)."""
        return dict(state, intervals=IntervalMeans.renamed_state(state.get("intervals"), renamed))

    def set_state(self, state: dict[str, Any]) -> None:
        self._intervals.set_state(state.get("intervals"))
        self._evaluations = int(state.get("evaluations", 0))

