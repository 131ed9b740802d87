"""kfit's training loop: :func:`kfit.fit` and what a run shares with its callbacks."""

from kfit._run import Run
from kfit._run import current_run as get_context
from kfit.training._fit import fit
from kfit.training._summaries import EpochSummary

#: The former name of :class:`Run`.
TrainingContext = Run

__all__ = ["EpochSummary", "Run", "TrainingContext", "fit", "get_context"]
