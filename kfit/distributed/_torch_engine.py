"""The native engine of the PyTorch backend: ``torch.distributed`` (Gloo on CPU, NCCL for CUDA tensors).

Started from the launcher's environment (``torchrun``: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``, ``LOCAL_RANK``) with ``init_method="env://"``. On a machine with CUDA the process group has
both backends (``"cpu:gloo,cuda:nccl"``): the gradients, on the GPU, go through NCCL, and the small host
operations (stop flag, metrics, broadcast) through Gloo, and this worker's GPU is ``cuda:LOCAL_RANK``.

The gradient sum runs in Keras's eager PyTorch train step, on the gradients' own device: one flat buffer per
dtype, one ``all_reduce`` each. Collectives are matched by order, not by name: kfit calls them in the same
order on every worker. A collective that waits longer than ``KFIT_COLLECTIVE_TIMEOUT`` seconds (120 by
default) for a peer fails, and a peer that dies closes its connections, which fails the others' next
collective at once: the job ends instead of hanging.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
from collections.abc import Iterator
from typing import Any

import numpy as np

from kfit.distributed import _launch
from kfit.distributed._engine import Engine, WorkerLostError


class TorchEngine(Engine):
    """``torch.distributed`` behind :class:`kfit.distributed._engine.Engine` (PyTorch backend)."""

    name = "native"

    def __init__(self, environment: _launch.LaunchEnvironment) -> None:
        import torch
        import torch.distributed as dist

        self._dist = dist
        self._env = environment
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(environment.local_rank % torch.cuda.device_count())
        if not dist.is_initialized():
            dist.init_process_group(
                backend="cpu:gloo,cuda:nccl" if cuda else "gloo",
                init_method="env://",
                rank=environment.rank,
                world_size=environment.size,
                timeout=datetime.timedelta(seconds=_launch.timeout_seconds()),
            )
            atexit.register(_shutdown)
        if dist.get_world_size() != environment.size or dist.get_rank() != environment.rank:
            raise RuntimeError(
                f"torch.distributed was started by someone else as rank {dist.get_rank()} of {dist.get_world_size()}, "
                f"but the launcher says RANK={environment.rank}, WORLD_SIZE={environment.size}."
            )

    def rank(self) -> int:
        return self._env.rank

    def size(self) -> int:
        return self._env.size

    def local_rank(self) -> int:
        return self._env.local_rank

    def local_size(self) -> int:
        return self._env.local_size

    def host_sum(self, arrays: list[np.ndarray], name: str) -> list[np.ndarray]:
        import torch

        out = []
        for array in arrays:
            tensor = torch.from_numpy(np.array(array, copy=True, order="C"))
            with self._failures(name):
                self._dist.all_reduce(tensor, op=self._dist.ReduceOp.SUM)
            out.append(tensor.numpy())
        return out

    def host_broadcast(self, array: np.ndarray, root_rank: int, name: str) -> np.ndarray:
        import torch

        tensor = torch.from_numpy(np.array(array, copy=True, order="C"))
        with self._failures(name):
            self._dist.broadcast(tensor, src=root_rank)
        return tensor.numpy()

    def step_sum(self, tensors: list, name: str, average: bool = False) -> list:
        import torch

        # One flat buffer per (dtype, device): one all_reduce each, whatever the number of variables.
        groups: dict[tuple, list[int]] = {}
        for i, tensor in enumerate(tensors):
            groups.setdefault((tensor.dtype, tensor.device), []).append(i)
        out: list[Any] = [None] * len(tensors)
        for indices in groups.values():
            parts = [tensors[i].detach().reshape(-1) for i in indices]
            flat = torch.cat(parts) if len(parts) > 1 else parts[0].clone()
            with self._failures(name):
                self._dist.all_reduce(flat, op=self._dist.ReduceOp.SUM)
            if average:
                flat = flat / self._env.size
            offset = 0
            for i in indices:
                n = tensors[i].numel()
                out[i] = flat[offset : offset + n].view(tensors[i].shape)
                offset += n
        return out

    @contextlib.contextmanager
    def _failures(self, name: str) -> Iterator[None]:
        """Says which collective failed on which worker, and what it usually means, around the engine's error."""
        try:
            yield
        except RuntimeError as error:
            raise WorkerLostError.of(
                name, self._env.rank, self._env.size, "native engine, torch.distributed",
                f"{_launch.TIMEOUT_VARIABLE}={_launch.timeout_seconds():g}", str(error)) from error


def _shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - at exit, with a peer possibly gone: nothing left to do
            pass
