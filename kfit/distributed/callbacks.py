"""Horovod-Keras's ``hvd.callbacks`` namespace: ``kfit.distributed.callbacks.<Name>`` is ``kfit.distributed.<Name>``.

A script that wrote ``hvd.callbacks.BroadcastGlobalVariablesCallback(0)`` with ``import horovod.keras as hvd``
ports by changing the import to ``import kfit.distributed as hvd``.

Example:
    >>> import kfit.distributed as hvd
    >>> hvd.callbacks.MetricAverageCallback is hvd.MetricAverageCallback
    True
"""

from kfit.distributed._callbacks import (
    AgreedStopCallback,
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
)

__all__ = [
    "AgreedStopCallback",
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]
