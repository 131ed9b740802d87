"""Per-epoch summaries of a run (CNTK's ``progress.epoch_summaries``)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from kfit import _checks
from kfit.callbacks._base import KfitCallback
from kfit.callbacks._cross_validation import average_error
from kfit.callbacks._running_means import HYPERPARAMETER_KEYS


@dataclass
class EpochSummary:
    """What one epoch did.

    Attributes:
        epoch: the epoch's index (0-based).
        loss: the mean training loss over the epoch.
        metrics: the other training metrics (and validation results, ``val_*``).
        samples: samples trained in the epoch (global).
        seconds: wall time of the epoch.
        samples_per_second: ``samples / seconds``.
        metric: CNTK's ``epoch_summaries[i].metric`` (a property): the epoch's first compiled training metric,
            an accuracy given as CNTK's error ``1 - accuracy``; None when the model compiled no metric.
    """

    epoch: int
    loss: float | None
    metrics: dict[str, float] = field(default_factory=dict)
    samples: int = 0
    seconds: float = 0.0
    samples_per_second: float = 0.0

    @property
    def metric(self) -> float | None:
        for key, value in self.metrics.items():
            if not key.startswith(("val_", "test_")) and key not in HYPERPARAMETER_KEYS and key != "samples":
                return average_error(key, value)
        return None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_float = _checks.log_float


class EpochSummaries(KfitCallback):
    """Records an :class:`EpochSummary` per epoch and attaches the list to the run's ``History``."""

    default_name = "epoch_summaries"
    order = 90

    def __init__(self, history: Any = None):
        super().__init__()
        self.summaries: list[EpochSummary] = []
        self.history = history
        self._start_time = 0.0
        self._start_samples = 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._start_time = time.perf_counter()
        self._start_samples = self.clock.samples

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = dict(logs or {})
        seconds = time.perf_counter() - self._start_time
        samples = self.clock.samples - self._start_samples
        loss = _float(logs.pop("loss", None))
        metrics = {k: v for k, v in ((k, _float(v)) for k, v in logs.items()) if v is not None}
        self.summaries.append(
            EpochSummary(epoch, loss, metrics, samples, seconds, samples / seconds if seconds > 0 else 0.0)
        )
        if self.history is not None:
            self.history.epoch_summaries = self.summaries

    def _clock_restored(self, samples: int, minibatches: int) -> None:
        """``kfit.load_checkpoint`` from a callback of the run moved the clock from ``samples``: the epoch in progress
        is summed as trained."""
        self._start_samples += self.clock.samples - samples

    def get_state(self) -> dict[str, Any]:
        return {"summaries": [s.as_dict() for s in self.summaries]}

    def renamed_state(self, state: dict[str, Any], renamed: Any) -> dict[str, Any]:
        """``state`` with each epoch's metrics under this model's log keys (a restore's ``renamed``)."""
        return {"summaries": [dict(s, metrics={renamed(k): v for k, v in s["metrics"].items()})
                              for s in state.get("summaries", [])]}

    def set_state(self, state: dict[str, Any]) -> None:
        self.summaries = [EpochSummary(**s) for s in state.get("summaries", [])]
        if self.history is not None:
            self.history.epoch_summaries = self.summaries
