"""kfit's callbacks: Keras callbacks that follow the sample clock and keep their state in checkpoints."""

from kfit.callbacks._base import KfitCallback
from kfit.callbacks._hyperparameter_schedules import LearningRateSchedule, MomentumSchedule
from kfit.callbacks._minibatch_size_schedule import MinibatchSizeSchedule
from kfit.callbacks._sample_clock import SampleClock

__all__ = [
    "KfitCallback",
    "LearningRateSchedule",
    "MinibatchSizeSchedule",
    "MomentumSchedule",
    "SampleClock",
]
