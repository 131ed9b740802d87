"""Keras's progress bar for ``kfit.fit``: each epoch's own number of steps, and samples per second."""

from __future__ import annotations

import itertools
import time
from typing import Any

import keras

from kfit import _backend

SAMPLES_PER_SECOND = "samples/s"


class ProgressBar(keras.callbacks.ProgbarLogger):
    """Keras's ``ProgbarLogger``, told each epoch's steps by the plan, with the epoch's samples per second.

    Keras draws it as under ``model.fit``; kfit's epochs can hold different numbers of steps (a
    minibatch-size schedule, a resumed epoch, ``max_samples``), so the bar's target follows the plan.
    """

    #: Safe to run on Keras's asynchronous batch-end thread: it reads only what :meth:`plan_epoch` set.
    async_safe = True

    def __init__(self) -> None:
        super().__init__()
        self._cumulative: list[int] = []
        self._done = 0
        self._started = 0.0

    def plan_epoch(self, sizes: list[int], done: int = 0) -> None:
        """Called before the epoch's first step with the sizes of the minibatches this ``model.fit`` call trains in
        it, after the ``done`` steps of the epoch a run resumes in (the bar counts them, its rate does not)."""
        self._cumulative = list(itertools.accumulate(sizes))
        self._done = done
        self.target = done + len(sizes)
        if self.progbar is not None:
            self.progbar.target = self.target

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_begin(epoch, logs)
        _backend.average_in_progbar(self.progbar, SAMPLES_PER_SECOND)
        self._started = time.perf_counter()

    def _with_rate(self, batches: int, logs: dict | None) -> dict[str, Any]:
        """``logs`` with the samples per second of the epoch's first ``batches`` batches (counting its ``done``)."""
        logs, steps = dict(logs or {}), batches - self._done
        seconds = time.perf_counter() - self._started
        if self._cumulative and steps > 0 and seconds > 0:
            logs[SAMPLES_PER_SECOND] = self._cumulative[min(steps, len(self._cumulative)) - 1] / seconds
        return logs

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._update_progbar(batch, self._with_rate(batch + 1, logs))

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = self._with_rate(self.target or self.seen, logs)
        if self.progbar is not None:  # after the validation logs, which the bar first sees now (as with verbose=2)
            _backend.show_last_in_progbar(self.progbar, SAMPLES_PER_SECOND, list(logs))
        self._finalize_progbar(logs)
