"""What one training run shares with the callbacks that need more than the clock (checkpoints)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kfit.clock import Clock

CONTEXT_ATTRIBUTE = "_kfit_context"


@dataclass
class TrainingContext:
    """The parts of a run that a full-state checkpoint saves and restores.

    Attributes:
        clock: the sample clock.
        stream: the training data stream (None under plain ``model.fit``).
        callbacks: every callback of the run, in order.
        history: the run's ``keras.callbacks.History``.
        kfit_fit: True under :func:`kfit.fit` with kfit's stream (exact mid-epoch resume is possible).
        epochs, max_samples: the bounds of the run.
    """

    clock: Clock
    stream: Any = None
    callbacks: list = field(default_factory=list)
    history: Any = None
    kfit_fit: bool = False
    epochs: int | None = None
    max_samples: int | None = None
    #: Set by a restore: the epoch's training-metric state was restored and must not be reset.
    resumed_mid_epoch: bool = False


def attach_context(model: Any, context: TrainingContext | None) -> None:
    object.__setattr__(model, CONTEXT_ATTRIBUTE, context)


def get_context(model: Any) -> TrainingContext | None:
    """The context of the run ``model`` is in, or None (plain ``model.fit``)."""
    return getattr(model, CONTEXT_ATTRIBUTE, None)
