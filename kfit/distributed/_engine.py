"""The interface every distributed engine implements (Horovod, ``torch.distributed``, ``jax.distributed``).

An engine is what kfit needs from a collective-communication library, and nothing else:

* who this worker is: :meth:`Engine.rank`, :meth:`Engine.size`, :meth:`Engine.local_rank`,
  :meth:`Engine.local_size`;
* the gradient sum inside the train step: :meth:`Engine.step_sum` (backend tensors, traced on TensorFlow
  and JAX);
* host operations on NumPy arrays: :meth:`Engine.host_sum` (stop flag, metric averaging) and
  :meth:`Engine.host_broadcast` (initial state), with :meth:`Engine.broadcast_bytes` built on it.

Every worker must call the same collectives in the same order with the same shapes and dtypes (the
``name`` arguments label them; Horovod also matches them by name, the native engines by order).
``kfit.distributed._state`` and ``kfit.distributed._optimizer`` are written once against this interface.
"""

from __future__ import annotations

import abc
import threading
from typing import Any

import numpy as np

#: What the train step being traced knows about this worker's share (set by an engine whose step pads the
#: shares to one shape, see :meth:`Engine.train_step_function`, and by ``kfit.fit(pad_remainders=True)``'s step,
#: ``kfit.training._padding``): ``real``, the number of real samples of the share, and ``padding``, the number of
#: padding rows after them (traced scalars), or None for neither.
STEP = threading.local()


def step_real_count() -> Any:
    """The real samples of this worker's share in the step being traced, or None (no padding engine)."""
    return getattr(STEP, "real", None)


def step_padding() -> Any:
    """The padding rows at the end of this worker's share in the step being traced, or None."""
    return getattr(STEP, "padding", None)


class WorkerLostError(RuntimeError):
    """A collective of a native engine failed: a peer died, hung past the timeout, or its connection broke.

    The message names the collective, this worker's rank and the timeout (``KFIT_COLLECTIVE_TIMEOUT``).
    """

    @classmethod
    def of(cls, collective: str, rank: int, size: int, engine: str, timeout: str, detail: str) -> WorkerLostError:
        """The error of ``collective`` failing on worker ``rank`` of ``size`` (``engine``: which native engine), with
        the usual causes and what to do; ``detail``: the engine's own message."""
        return cls(
            f"kfit.distributed: the collective {collective!r} failed on rank {rank} of {size} ({engine}): another "
            f"worker died, or left training before the others (under plain model.fit, a callback that set "
            f"model.stop_training on that worker alone: list kfit.distributed.AgreedStopCallback() last in "
            f"model.fit's callbacks, and every worker stops at the same step), or did not answer within {timeout} "
            f"seconds. Check the other workers' logs; rerun with a kfit.callbacks.Checkpoint(restore=True) to resume. "
            f"({detail})")


class Engine(abc.ABC):
    """One process's handle on a started collective-communication engine."""

    #: The engine's name, as ``KFIT_ENGINE`` spells it: ``"horovod"`` or ``"native"``.
    name: str = ""

    @abc.abstractmethod
    def rank(self) -> int:
        """This worker's rank, 0 to ``size() - 1``."""

    @abc.abstractmethod
    def size(self) -> int:
        """The number of workers."""

    @abc.abstractmethod
    def local_rank(self) -> int:
        """This worker's rank among the workers of its machine."""

    @abc.abstractmethod
    def local_size(self) -> int:
        """The number of workers on this machine."""

    @abc.abstractmethod
    def host_sum(self, arrays: list[np.ndarray], name: str) -> list[np.ndarray]:
        """The sums over all workers of NumPy ``arrays`` (new arrays, same shapes and dtypes)."""

    @abc.abstractmethod
    def host_broadcast(self, array: np.ndarray, root_rank: int, name: str) -> np.ndarray:
        """Rank ``root_rank``'s ``array`` on every worker (same shape and dtype on every worker)."""

    @abc.abstractmethod
    def step_sum(self, tensors: list, name: str, average: bool = False) -> list:
        """Sums (or averages) backend tensors over all workers inside the train step.

        Args:
            tensors: backend tensors (traced on TensorFlow and JAX), same shapes and dtypes on every worker.
            name: the collective's name, the same on every worker.
            average: divide the sums by the number of workers.
        """

    def trains_in_step(self) -> bool:
        """True when the engine builds kfit.fit's train step itself (:meth:`train_step_function`)."""
        return False

    def train_step_function(self, model: Any, train_step: Any) -> Any:
        """The function ``step(state, data) -> (logs, state)`` that trains one step of ``model`` on this engine,
        or None to let Keras compile ``train_step`` as usual (every engine but the JAX in-step one)."""
        return None

    def check_step_compilable(self) -> None:  # noqa: B027 - most engines have nothing to refuse
        """Raises ValueError when the step being traced is compiled in a way the engine cannot run in."""

    def leave(self, where: str) -> None:  # noqa: B027 - the native engines' collectives fail by themselves
        """Called when this worker's ``model.fit`` ended at a stop before its last step (``where`` says which): the
        Horovod engine joins (the others' next step, short of this worker, fails with the cause) and waits there."""

    def before_host_collective(self) -> None:  # noqa: B027 - most engines need no barrier
        """Called before the per-step host collective (the stop flag), e.g. to wait for the step's own."""

    def broadcast_bytes(self, payload: bytes | None, root_rank: int, name: str) -> bytes:
        """Rank ``root_rank``'s ``payload`` on every worker (the others pass anything, e.g. None)."""
        length = np.array([len(payload) if payload is not None else 0], dtype=np.int64)
        length = int(self.host_broadcast(length, root_rank, f"{name}.length")[0])
        if length == 0:
            return b""
        if payload is not None and len(payload) == length:
            buffer = np.frombuffer(payload, dtype=np.uint8)
        else:
            buffer = np.zeros(length, np.uint8)
        return self.host_broadcast(buffer, root_rank, name).tobytes()
