"""kfit's training loop: :func:`kfit.fit` and what a run shares with its callbacks."""

from kfit.training._context import TrainingContext, get_context
from kfit.training._fit import fit
from kfit.training._summaries import EpochSummary

__all__ = ["EpochSummary", "TrainingContext", "fit", "get_context"]
