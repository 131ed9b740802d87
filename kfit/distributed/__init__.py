"""Data-parallel training on TensorFlow, JAX and PyTorch, over Horovod or the backend's native engine.

Run the same script as several workers with a launcher::

    horovodrun -np 2 -H localhost:2 python train.py              # Horovod, one machine, two workers
    horovodrun -np 8 -H host1:4,host2:4 python train.py          # Horovod, two machines, four workers each
    torchrun --standalone --nproc_per_node 2 train.py            # native engine (PyTorch, JAX backends)

and :func:`kfit.fit` trains data-parallel: each worker reads its own share of every global minibatch,
the gradients are averaged in every step, rank 0's initial state is broadcast, the epoch metrics are
combined (their states summed where they add up, else averaged weighted by samples), only rank 0 writes files, and a stop decided on any worker ends training
on all of them after the same step. Evaluation is sharded: ``kfit.fit``'s ``validation_data`` (arrays),
``kfit.callbacks.CrossValidation`` and ``kfit.callbacks.Test`` evaluate each worker's contiguous share and sum
the metrics' states over the workers, giving every worker the single-process results (metrics whose state is
not a sum over samples are evaluated whole on every worker). Without a launcher the same script is one
worker (``rank() == 0``, ``size() == 1``) and no engine is imported.

Engines (see :func:`engine`): ``horovodrun`` (or ``mpirun``) selects Horovod (every backend); ``torchrun``'s
environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, also set by SLURM-style wrappers)
selects the native engine: ``torch.distributed`` (Gloo on CPU, NCCL for CUDA tensors) on PyTorch, and on
JAX ``jax.distributed`` (started by ``import kfit``), with ``kfit.fit``'s gradient sum a ``psum`` inside the
compiled step (shares of a global minibatch that does not divide are padded to one shape) and the host operations
over ``torch.distributed``; plain ``model.fit`` with :func:`DistributedOptimizer` on JAX sums through the host
(``io_callback``, as with Horovod). TensorFlow has no native engine: Horovod is its engine. ``KFIT_ENGINE=horovod|native|none``
overrides the launcher's choice.

For plain ``model.fit``, this module ports Horovod's Keras API to Keras 3 under the same names:
:func:`DistributedOptimizer`, :class:`BroadcastGlobalVariablesCallback`, :class:`MetricAverageCallback`,
:class:`LearningRateWarmupCallback`, :class:`LearningRateScheduleCallback` (also as ``callbacks.<Name>``, as
``hvd.callbacks.<Name>``), and :func:`load_model` (a saved model back with a distributed optimizer), so a
Horovod-Keras script ports by changing its imports (``import kfit.distributed as hvd``), and runs under either
engine; ``hvd.allreduce``, ``hvd.allgather`` and ``hvd.broadcast`` work on values (numbers, NumPy arrays, tensors)
over the host. Horovod's elastic mode (Horovod only): :class:`ElasticState` and ``@elastic.run``.

Failures. When a worker dies, ``horovodrun`` ends the job: on one machine it sees the process exit and
terminates the others at once ("Horovod detected that one or more processes exited with non-zero status
... Process name: 1, Exit code: 137"); across machines the others' next collective fails as the dead
peer's connections close. A worker that hangs without dying is detected by Gloo's timeout,
``HOROVOD_GLOO_TIMEOUT_SECONDS`` (30 s by default), after which the job fails the same way. A stop that one worker
decides alone under plain ``model.fit`` (``model.stop_training`` set there only) makes it join Horovod when
:class:`BroadcastGlobalVariablesCallback` or :class:`MetricAverageCallback` is listed: the others' next train step
fails, saying so and naming :class:`AgreedStopCallback`, which agrees on such stops. Under the native
engine, the others' next collective fails at once when a peer dies (``WorkerLostError``, which names the
collective and the rank; ``torchrun`` also stops the remaining workers), and a hung peer fails it after
``KFIT_COLLECTIVE_TIMEOUT`` seconds (120 by default). Run the same command again with a
``kfit.callbacks.Checkpoint`` (``restore=True``) to resume from the last checkpoint, on any number of workers;
only rank 0 needs the file (it is the only one that writes it): rank 0 reads it and sends its bytes to the others,
so every worker restores the same model, optimizer, clock, stream position and callback states, with no shared
file system.

Example:
    >>> import kfit
    >>> kfit.distributed.init()          # optional: kfit starts the engine when it first needs it
    >>> kfit.distributed.rank(), kfit.distributed.size(), kfit.distributed.is_chief()
    (0, 1, True)
"""

from __future__ import annotations

import importlib
from typing import Any

from kfit.distributed import _select
from kfit.distributed._engine import WorkerLostError
from kfit.distributed._load_model import load_model
from kfit.distributed._optimizer import (
    Adasum,
    Average,
    Compression,
    DistributedOptimizer,
    Sum,
    is_distributed,
)


def init() -> None:
    """Starts this process's engine: Horovod under ``horovodrun``, the native one under ``torchrun``.

    Calling it is optional (kfit starts the engine on first use), but a Horovod script calls ``hvd.init()``
    first, and the ported one may keep the call. On a CUDA machine under the native PyTorch engine, call it
    before building the model: it makes ``cuda:LOCAL_RANK`` this process's GPU. On JAX the native engine starts
    when kfit is imported (``jax.distributed`` must start before JAX runs anything): import kfit before building
    the model. Without a launcher (and with ``KFIT_ENGINE=none``) it does nothing.

    Raises:
        ImportError: the chosen engine is not installed (Horovod: run ``bash scripts/install_horovod.sh``).
        ValueError: a bad ``KFIT_ENGINE`` or launcher environment, or the native engine on TensorFlow (the
            message says which variable and how to fix it).
    """
    _select.current()


def engine() -> str:
    """The engine of this process: ``"horovod"``, ``"native"`` or ``"none"`` (one worker).

    Chosen from ``KFIT_ENGINE`` (``horovod``, ``native`` or ``none``) when set, else from the launcher:
    ``horovodrun`` (or ``mpirun``) selects Horovod, ``torchrun``'s environment (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``) the backend's native engine, no launcher ``"none"``.

    Raises:
        ValueError: ``KFIT_ENGINE`` holds another value (the message names it).

    Example:
        >>> import kfit
        >>> kfit.distributed.engine()
        'none'
    """
    return _select.chosen()


def rank() -> int:
    """This worker's rank, 0 to ``size() - 1`` (0 without a launcher)."""
    current = _select.current()
    return current.rank() if current is not None else 0


def size() -> int:
    """The number of workers (1 without a launcher)."""
    current = _select.current()
    return current.size() if current is not None else 1


def local_rank() -> int:
    """This worker's rank among the workers of its machine (0 without a launcher)."""
    current = _select.current()
    return current.local_rank() if current is not None else 0


def local_size() -> int:
    """The number of workers on this machine (1 without a launcher)."""
    current = _select.current()
    return current.local_size() if current is not None else 1


def is_chief() -> bool:
    """True on the worker that writes checkpoints, logs and TensorBoard files (rank 0)."""
    return rank() == 0


def any_true(flag: bool) -> bool:
    """True on every worker when ``flag`` is True on any worker.

    One allreduce of one integer over the engine (every worker must call it); ``bool(flag)`` for one worker.
    Data-parallel ``kfit.fit`` (and plain ``model.fit`` with :class:`AgreedStopCallback` last) agrees likewise after
    every step and at every epoch end on ``model.stop_training``, so that a stop decided on one worker
    (cross-validation, early stopping, a user's callback) ends training on all of them after the same step, and no
    worker is left waiting in an allreduce alone.

    Example:
        >>> import kfit
        >>> kfit.distributed.any_true(False)
        False
    """
    if size() == 1:
        return bool(flag)
    from kfit.distributed import _state

    return _state.any_true(flag)


def broadcast_training_state(model: Any, root_rank: int = 0) -> None:
    """Makes every worker hold rank ``root_rank``'s state (a no-op for one worker).

    The model's variables (weights, non-trainable state, seed generators) and its optimizer's travel bit
    for bit in one broadcast; the sample clock and the stream position follow. ``kfit.fit`` calls it after
    ``on_train_begin`` (after a checkpoint is restored), before the first step.

    Args:
        model: a built, compiled Keras model.
        root_rank: the worker whose state is kept.

    Raises:
        ValueError: ``root_rank`` is not a rank.
        RuntimeError: the workers' models and optimizers differ in size.
    """
    _check_rank(root_rank)
    if size() == 1:
        return
    from kfit.distributed import _state

    _state.broadcast_training_state(model, root_rank)


def prepare_model(model: Any) -> None:
    """Prepares a compiled model for ``kfit.fit``'s data-parallel steps (a no-op for one worker).

    Makes its optimizer a :func:`DistributedOptimizer` and its train step tell the allreduce how many
    samples the worker's share holds. ``kfit.fit`` calls it before building the train step.
    """
    if size() == 1:
        return
    from kfit.distributed import _optimizer

    _optimizer.prepare_model(model)


def average_metrics(logs: dict, model: Any) -> dict:
    """The epoch's training ``logs``, averaged over the workers weighted by their samples.

    Each worker's weight is the number of samples it trained on since the metrics were reset (its loss
    tracker's count), so a mean metric equals the one a single worker would compute on all the samples.
    Returns ``logs`` unchanged for one worker.
    """
    if size() == 1:
        return dict(logs)
    from kfit.distributed import _state

    return _state.average_metrics(logs, model)


def _check_rank(root_rank: Any) -> None:
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or not 0 <= root_rank < size():
        raise ValueError(
            f"Invalid value for argument `root_rank`: expected an integer in [0, {size()}). Received: root_rank={root_rank!r}"
        )


_LAZY = {
    "AgreedStopCallback": "kfit.distributed._callbacks",
    "BroadcastGlobalVariablesCallback": "kfit.distributed._callbacks",
    "MetricAverageCallback": "kfit.distributed._callbacks",
    "LearningRateWarmupCallback": "kfit.distributed._callbacks",
    "LearningRateScheduleCallback": "kfit.distributed._callbacks",
    # Horovod's collective operations on values (over the host, on every engine).
    "allreduce": "kfit.distributed._ops",
    "allgather": "kfit.distributed._ops",
    "broadcast": "kfit.distributed._ops",
    # Horovod's elastic mode (imports Horovod: use it under horovodrun only).
    "ElasticState": "kfit.distributed._elastic",
}


def _import_elastic() -> Any:
    """``kfit.distributed._elastic``, built on Horovod's elastic state: a clear error where Horovod is missing."""
    try:
        return importlib.import_module("kfit.distributed._elastic")
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] != "horovod":
            raise
        from kfit.distributed._horovod import INSTALL_HINT

        raise ImportError(
            "Horovod's elastic mode (kfit.distributed.ElasticState, @kfit.distributed.elastic.run) needs the Horovod "
            f"engine, and Horovod is not installed here. {INSTALL_HINT} Without Horovod, resume from a "
            "kfit.callbacks.Checkpoint after a restart instead.") from error


def __getattr__(name: str) -> Any:
    if name == "elastic":  # ``@kfit.distributed.elastic.run``, as ``@hvd.elastic.run``
        return _import_elastic()
    if name == "callbacks":  # ``hvd.callbacks.BroadcastGlobalVariablesCallback(0)``, as in Horovod-Keras
        return importlib.import_module("kfit.distributed.callbacks")
    if name in _LAZY and _LAZY[name] == "kfit.distributed._elastic":
        return getattr(_import_elastic(), name)
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kfit.distributed' has no attribute {name!r}")


__all__ = [
    "Adasum",
    "AgreedStopCallback",
    "Average",
    "BroadcastGlobalVariablesCallback",
    "Compression",
    "DistributedOptimizer",
    "ElasticState",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
    "Sum",
    "WorkerLostError",
    "allgather",
    "allreduce",
    "any_true",
    "average_metrics",
    "broadcast",
    "broadcast_training_state",
    "callbacks",
    "elastic",
    "engine",
    "init",
    "is_chief",
    "is_distributed",
    "load_model",
    "local_rank",
    "local_size",
    "prepare_model",
    "rank",
    "size",
]
