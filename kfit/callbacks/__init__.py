"""kfit's callbacks: Keras callbacks that follow the sample clock and keep their state in checkpoints.

Every callback works in :func:`kfit.fit` and, with a :class:`SampleClock`, in plain ``model.fit``
(except :class:`MinibatchSizeSchedule` and exact mid-epoch resumption, which need ``kfit.fit``).
"""

import importlib

from kfit.callbacks._base import KfitCallback
from kfit.callbacks._hyperparameter_schedules import LearningRateSchedule, MomentumSchedule
from kfit.callbacks._minibatch_size_schedule import MinibatchSizeSchedule
from kfit.callbacks._sample_clock import SampleClock

# Imported on first use: these modules pull in h5py writers, TensorBoard and evaluation code.
_LAZY = {
    "Checkpoint": "kfit.callbacks._checkpoint",
    "CrossValidation": "kfit.callbacks._cross_validation",
    "EarlyStopping": "kfit.callbacks._early_stopping",
    "ReduceLROnPlateau": "kfit.callbacks._reduce_lr_on_plateau",
    "Test": "kfit.callbacks._test",
    "ProgressPrinter": "kfit.callbacks._progress_printer",
    "TensorBoardProgressWriter": "kfit.callbacks._tensorboard",
    "CSVHistory": "kfit.callbacks._csv_history",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kfit.callbacks' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(__all__)


__all__ = [
    "KfitCallback",
    "LearningRateSchedule",
    "MinibatchSizeSchedule",
    "MomentumSchedule",
    "SampleClock",
    *_LAZY,
]
