"""kfit: CNTK-style training for Keras 3 on TensorFlow, JAX and PyTorch.

One sample clock drives every schedule and trigger; learning rates per sample and momentum as a time
constant mean the same thing at any minibatch size; minibatch sizes can follow a schedule; checkpoints
resume a run exactly; cross-validation steers training; Horovod runs it data-parallel.

Example:
    >>> import kfit
    >>> kfit.schedules.momentum_as_time_constant(1024).per_sample_momentum(0)
    0.9990239141819757
"""

__version__ = "0.1.0"

from kfit import callbacks, data, distributed, optimizers, schedules  # noqa: E402
from kfit.clock import Clock, get_clock  # noqa: E402
from kfit.training import EpochSummary, fit, get_context  # noqa: E402


def __getattr__(name: str):
    # Checkpoint functions import h5py writers on first use.
    if name in ("save_checkpoint", "load_checkpoint"):
        from kfit import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'kfit' has no attribute {name!r}")


__all__ = [
    "Clock",
    "EpochSummary",
    "__version__",
    "callbacks",
    "data",
    "distributed",
    "fit",
    "get_clock",
    "get_context",
    "load_checkpoint",
    "save_checkpoint",
    "optimizers",
    "schedules",
]
