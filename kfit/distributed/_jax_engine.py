"""The native engine of the JAX backend, for now: ``torch.distributed`` (Gloo) through the host.

Started from the same launcher environment as the PyTorch engine (``torchrun``: ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``), so ``torchrun --nproc_per_node 2 script.py`` trains data-parallel on JAX
without Horovod. It needs PyTorch installed (which ``torchrun`` is part of).

The gradients leave the jitted step as Horovod's JAX path does: an ordered ``jax.experimental.io_callback``
hands them to the host, where one ``all_reduce`` per dtype sums them, and the step goes on with the result.
That is a device → host → device round trip per step. The collective inside the compiled step (a ``psum``
over ``jax.distributed``'s devices, no round trip) is not what this engine does: a multi-process JAX program
is one SPMD program, in which every process's share of the minibatch must have the same shape, while kfit's
shares differ by one sample when the global minibatch does not divide evenly among the workers (Keras's own
``keras.distribution.DataParallel`` then trains silently on wrong gradients, checked on JAX 0.10.2 and
Keras 3.15.1). It needs equal shares (padding with masked samples in kfit's data path), not done yet.

Host operations (stop flag, metrics, broadcast) first wait for the steps already dispatched
(``jax.effects_barrier``): the workers' collectives then run in the same order on every worker, the step's
from JAX's callback thread and the host's from the main thread never interleaving.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from kfit.distributed._torch_engine import TorchEngine


class JaxEngine(TorchEngine):
    """``torch.distributed`` on the host behind :class:`kfit.distributed._engine.Engine` (JAX backend)."""

    def host_sum(self, arrays: list[np.ndarray], name: str) -> list[np.ndarray]:
        _barrier()
        return super().host_sum(arrays, name)

    def host_broadcast(self, array: np.ndarray, root_rank: int, name: str) -> np.ndarray:
        _barrier()
        return super().host_broadcast(array, root_rank, name)

    def step_sum(self, tensors: list, name: str, average: bool = False) -> list:
        import jax
        from jax.experimental import io_callback

        shapes = [jax.ShapeDtypeStruct(t.shape, t.dtype) for t in tensors]
        reduce = super().step_sum

        def reduce_on_host(*arrays: Any) -> list[np.ndarray]:
            import torch

            # The callback's arguments are read-only views of XLA's buffers, valid until it returns.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # torch warns about read-only arrays
                host = [torch.from_numpy(np.ascontiguousarray(np.asarray(a))) for a in arrays]
            return [np.asarray(o.numpy()) for o in reduce(host, name, average)]

        return list(io_callback(reduce_on_host, shapes, *tensors, ordered=True))


def _barrier() -> None:
    import jax

    jax.effects_barrier()
