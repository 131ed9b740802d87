"""A CSV history of every epoch, cross-validation and test, on the sample clock."""

from __future__ import annotations

import csv
import io
import os
import time
from typing import Any

from kfit import _checks, _files, distributed
from kfit.callbacks._base import KfitCallback
from kfit.callbacks._running_means import ScheduledValues, kfit_names, to_float
from kfit.clock import Clock

LEADING_COLUMNS = ("kind", "epoch", "samples", "minibatches")
TRAILING_COLUMNS = ("lr", "momentum", "minibatch_size", "time")
_KEPT = "The rows already in it are whole."


def _parse(text: str | None) -> float:
    try:
        return float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(float(value))


class CSVHistory(KfitCallback):
    """Appends one row per epoch, per cross-validation and per test to a CSV file.

    Columns: ``kind`` ("epoch", "cross_validation" or "test"), ``epoch`` (the clock in epochs:
    ``samples / epoch_size``), ``samples`` and ``minibatches`` (the clock), then the results in the order
    they first appear (``loss``, the metrics, ``val_*``, ``test_*``), then ``lr`` and ``momentum`` (the
    values per minibatch that schedules apply; an epoch's row has the values it trained with, its logs' where a
    callback logs them, the rate Keras's callbacks log as ``learning_rate`` included), ``minibatch_size`` (the
    scheduled size; the minibatches shortened to end an epoch are not counted as changes) and ``time`` (Unix
    time). A result that first appears later (a new metric) widens the file: it is rewritten with the union of
    the columns, earlier rows left empty there.

    The file is the state. A resumed run (the clock restored from a checkpoint) first drops the rows written after
    the checkpoint's state was taken (those past the restored clock, which it will train again, and those at it:
    the epoch that a run stopped in the middle of wrote its row after its last step was saved) and appends from
    there: no row is written twice, and the file is the uninterrupted run's (where Keras named the outputs of a model
    built again in one process anew, ``dense_4`` as ``dense_7``, their columns take the new names). A run that starts
    from 0 in an existing file therefore replaces that file's rows. Only the chief worker writes.

    A row that cannot be written (a full disk, a read-only file system) stops training with an ``OSError`` naming
    the file and the cause, before the epoch's checkpoint is written; the file keeps whole rows only, and the run
    resumed from its last checkpoint writes the rows after it. A folder removed during the run is made again.

    Args:
        path: the CSV file (created with its directory if missing).
        name: the key of this callback's state in checkpoints.

    Raises:
        ValueError: if ``path`` is not a path.

    Example:
        >>> import kfit
        >>> history = kfit.callbacks.CSVHistory("runs/history.csv")
        >>> # kfit.fit(model, x, y, minibatch_size=64, callbacks=[history]); then: kfit plot runs/history.csv
    """

    default_name = "csv_history"

    def __init__(self, path: str | os.PathLike, name: str | None = None):
        super().__init__(name=name)
        self.path = _checks.output_path("path", path, example="history.csv")
        self._columns: list[str] | None = None
        self._truncated = False
        self._rows: int | None = None  # the rows in the file (known once this run has read it)
        self._restored_rows: int | None = None  # the rows the file had when the restored checkpoint was taken
        self._scheduled = ScheduledValues()

    # -- the file --------------------------------------------------------------------------------
    def _read(self) -> tuple[list[str], list[dict[str, str]]]:
        if not os.path.exists(self.path) or os.path.getsize(self.path) == 0:
            return [], []
        with open(self.path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            return list(reader.fieldnames or []), list(reader)

    def _rewrite(self, columns: list[str], rows: list[dict[str, Any]]) -> None:
        directory = os.path.dirname(self.path)
        try:
            if directory:
                os.makedirs(directory, exist_ok=True)
        except OSError as cause:
            raise _files.WriteError("the CSV history", self.path, cause, _KEPT) from cause

        def write(temporary: str) -> None:
            with open(temporary, "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=columns, restval="", extrasaction="ignore")
                writer.writeheader()
                writer.writerows(rows)

        _files.replace(self.path, write, "the CSV history", _KEPT)
        self._columns = columns

    def _truncate_to(self, samples: int) -> None:
        """Keeps the rows at or before ``samples`` that the file had when a restored checkpoint was taken (those a
        resumed run will not write again)."""
        self._truncated = True
        restored, self._restored_rows = self._restored_rows, None
        columns, rows = self._read()
        self._rows = 0
        if not columns:
            return
        if "samples" not in columns:
            raise ValueError(f"{self.path} exists and is not a kfit CSV history (no `samples` column). Choose another path.")
        kept = [row for row in rows if _parse(row.get("samples")) <= samples][:restored]
        renamed = self.training_run.renamed_keys  # (Keras numbered the outputs anew: their columns go on)
        if renamed is not None and any(renamed(c) != c for c in columns):
            columns = [renamed(c) for c in columns]
            self._rewrite(columns, [{renamed(k): v for k, v in row.items()} for row in kept])
        elif len(kept) != len(rows):
            self._rewrite(columns, kept)
        self._columns = columns
        self._rows = len(kept)

    def write_row(self, kind: str, results: dict[str, Any]) -> None:
        """Appends one row of ``kind`` with the clock, ``results`` and the hyperparameters (chief only)."""
        if not distributed.is_chief():
            return
        clock = self.clock
        if not self._truncated:
            self._truncate_to(clock.samples)
        row: dict[str, Any] = {
            "kind": kind,
            "epoch": _number(round(clock.samples / clock.epoch_size, 6)) if clock.epoch_size else "",
            "samples": clock.samples,
            "minibatches": clock.minibatches,
        }
        # The results' own values come last: an epoch's logged rate is the one it trained with, also when a
        # ReduceLROnPlateau before this callback has just announced the next one.
        values = dict(self._scheduled.values)
        values.update((k, v) for k, v in ((k, to_float(v)) for k, v in kfit_names(results).items()) if v is not None)
        if self._scheduled.size is not None:
            values["minibatch_size"] = self._scheduled.size
        values["time"] = round(time.time(), 3)
        for key, value in values.items():
            row[key] = _number(value)
        columns = self._columns or []
        new = [k for k in row if k not in columns]
        if new:
            fixed = LEADING_COLUMNS + TRAILING_COLUMNS
            new_results = sorted((k for k in new if k not in fixed), key=lambda k: k != "loss")  # loss first
            results_columns = [c for c in columns if c not in fixed] + new_results
            _, rows = self._read()
            self._rewrite([*LEADING_COLUMNS, *results_columns, *TRAILING_COLUMNS], rows)
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=self._columns, restval="")
        if not os.path.exists(self.path):  # (its folder was removed during the run: the file starts again)
            writer.writeheader()
        writer.writerow(row)
        # Whole rows only: a full disk cuts the file back to its last row and raises an OSError naming it.
        _files.append(self.path, text.getvalue().encode("utf-8"), "the CSV history", _KEPT)
        self._rows = (self._rows or 0) + 1

    # -- hooks -----------------------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        # The clock is restored after every on_train_begin (the checkpoint comes last): truncate later.
        self._truncated = False
        self._rows = self._restored_rows = None
        self._scheduled.reset()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if not self._truncated and distributed.is_chief():
            self._truncate_to(self.clock.samples)

    def on_step_begin(self, clock: Clock) -> None:
        if not self._truncated and distributed.is_chief():
            self._truncate_to(clock.samples)
        self._scheduled.observe_size(clock, self.training_run.max_samples)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.write_row("epoch", dict(logs or {}))

    def on_cross_validation_end(self, index: int, logs: dict) -> None:
        self.write_row("cross_validation", {k: v for k, v in logs.items() if k != "samples"})

    def on_final_test_end(self, logs: dict) -> None:
        self.write_row("test", dict(logs))

    def on_hyperparameter_change(self, name: str, value: float, scheduled: float, unit: str) -> None:
        self._scheduled.observe(name, value, self.clock, self.training_run.max_samples)

    # -- state -----------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {} if self._rows is None else {"rows": self._rows}

    def set_state(self, state: dict[str, Any]) -> None:
        rows = state.get("rows")
        self._restored_rows = None if rows is None else int(rows)
        self._truncated = False  # (the clock was restored too: truncate at the next hook)
