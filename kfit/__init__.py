"""kfit: CNTK-style training for Keras 3 on TensorFlow, JAX and PyTorch.

One sample clock drives every schedule and trigger; learning rates per sample and momentum as a time
constant mean the same thing at any minibatch size; minibatch sizes can follow a schedule; checkpoints
resume a run exactly; cross-validation steers training; Horovod runs it data-parallel.

Submodules and names are imported on first use (PEP 562), so ``import kfit`` alone does not import Keras
or a backend: the ``kfit`` command line starts in a fraction of a second.

Example:
    >>> import kfit
    >>> kfit.schedules.momentum_as_time_constant(1024).per_sample_momentum(0)
    0.9990239141819757
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_SUBMODULES = ("callbacks", "checkpoint", "cli", "cntk", "data", "distributed", "interval", "optimizers", "plotting",
               "schedules", "training")
# name -> the module that defines it
_NAMES = {
    "Clock": "kfit.clock",
    "get_clock": "kfit.clock",
    "Interval": "kfit.interval",
    "Run": "kfit.training",
    "EpochSummary": "kfit.training",
    "fit": "kfit.training",
    "get_context": "kfit.training",
    "save_checkpoint": "kfit.checkpoint",
    "load_checkpoint": "kfit.checkpoint",
}

if TYPE_CHECKING:  # for type checkers and IDEs; at run time these come from __getattr__
    from kfit import callbacks, checkpoint, data, distributed, optimizers, schedules  # noqa: F401
    from kfit.checkpoint import load_checkpoint, save_checkpoint  # noqa: F401
    from kfit.clock import Clock, get_clock  # noqa: F401
    from kfit.interval import Interval  # noqa: F401
    from kfit.training import EpochSummary, Run, fit, get_context  # noqa: F401


def _start_native_jax_engine_early() -> None:
    """Under a torchrun-style launcher on the JAX backend, the native engine starts ``jax.distributed``, which
    must happen before JAX runs anything (before a model is built): kfit starts it when it is imported. Without
    a launcher (no ``RANK``/``WORLD_SIZE`` of several workers) nothing is imported here."""
    import os

    if "RANK" not in os.environ or os.environ.get("WORLD_SIZE", "1").strip() in ("", "1"):
        return
    if os.environ.get("KERAS_BACKEND", "jax").strip().lower() != "jax":
        return  # (the backend may also come from keras.json: _select.start_early checks the one Keras uses)
    if os.environ.get("KFIT_ENGINE", "").strip().lower() not in ("", "native"):
        return
    from kfit.distributed import _select

    _select.start_early()


_start_native_jax_engine_early()


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"kfit.{name}")
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module 'kfit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SUBMODULES) | set(_NAMES))


__all__ = [
    "Clock",
    "EpochSummary",
    "Interval",
    "Run",
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
