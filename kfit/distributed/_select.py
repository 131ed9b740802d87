"""The engine of this process: chosen once, from ``KFIT_ENGINE`` and the launcher's environment.

================  =====================  ================================================================
``KFIT_ENGINE``   launcher               engine
================  =====================  ================================================================
unset             ``horovodrun``         Horovod (``horovod.tensorflow`` / ``horovod.torch``)
unset             ``torchrun``, SLURM    native: ``torch.distributed`` (PyTorch), ``jax.distributed`` (JAX)
unset             none                   none: one worker, nothing imported
``horovod``       any                    Horovod
``native``        ``torchrun``, SLURM    native (TensorFlow has none: Horovod is its engine)
``none``          any                    none: every process trains alone
================  =====================  ================================================================
"""

from __future__ import annotations

import os

import keras

from kfit.distributed import _launch
from kfit.distributed._engine import Engine

_engine: Engine | None = None
_chosen: str | None = None

TENSORFLOW_HAS_NO_NATIVE_ENGINE = (
    "kfit has no native engine for the TensorFlow backend: Horovod is the TensorFlow engine. Launch with "
    "`horovodrun -np N python script.py` (Horovod: `bash scripts/install_horovod.sh`), or use the PyTorch or JAX "
    "backend under torchrun (KERAS_BACKEND=torch or jax). Keras 3's own multi-worker support on TensorFlow "
    "(tf.distribute.MultiWorkerMirroredStrategy) does not drive Keras 3's model.fit."
)


def chosen() -> str:
    """``"horovod"``, ``"native"`` or ``"none"``: the engine this process uses (not started by this call).

    Raises:
        ValueError: a bad ``KFIT_ENGINE``.
    """
    global _chosen
    if _chosen is None:
        _chosen = _launch.requested_engine()
    return _chosen


def current() -> Engine | None:
    """The started engine of this process (started on the first call), or None for one worker.

    Raises:
        ValueError: a bad ``KFIT_ENGINE`` or launcher environment, or the native engine on TensorFlow.
        ImportError: the chosen engine is not installed.
    """
    global _engine
    if _engine is not None:
        return _engine
    engine = chosen()
    if engine == "none":
        return None
    if engine == "horovod":
        from kfit.distributed._horovod import HorovodEngine

        _engine = HorovodEngine()
        return _engine
    _engine = _native(_launch.launch_environment())
    return _engine


def start_early() -> None:
    """Starts the native JAX engine now if the launcher's environment asks for it (called by ``import kfit``).

    ``jax.distributed`` must start before JAX runs anything. A launcher environment that is incomplete or
    invalid, or another engine or backend, is left to the first real call (which raises the clear error).
    """
    if _engine is not None or keras.backend.backend() != "jax":
        return
    try:
        if chosen() != "native":
            return
        from kfit.distributed import _jax_engine

        if _jax_engine.collectives_mode() != "step":
            return
        _launch.launch_environment()
    except ValueError:
        return
    current()


def _native(environment: _launch.LaunchEnvironment) -> Engine:
    backend = keras.backend.backend()
    if backend == "torch":
        from kfit.distributed._torch_engine import TorchEngine

        return TorchEngine(environment)
    if backend == "jax":
        from kfit.distributed._jax_engine import JaxEngine

        return JaxEngine(environment)
    if backend == "tensorflow":
        variable = _launch.ENGINE_VARIABLE
        source = (f"{variable}={os.environ[variable]!r}" if os.environ.get(variable, "").strip()
                  else "the launcher's RANK and WORLD_SIZE")
        raise ValueError(f"{TENSORFLOW_HAS_NO_NATIVE_ENGINE} (the native engine was selected by {source}; set "
                         f"{variable}=none to train each process alone)")
    raise ValueError(f"kfit has no native engine for the Keras backend {backend!r}: use Horovod (horovodrun).")
