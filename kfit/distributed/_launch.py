"""Which engine a process asks for: the launcher's environment and ``KFIT_ENGINE``.

* ``horovodrun`` (or ``mpirun``) sets ``HOROVOD_RANK`` (``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``): Horovod.
* ``torchrun`` and SLURM-style wrappers set ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (and
  ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``): the backend's native engine (``torch.distributed`` on PyTorch,
  ``jax.distributed`` on JAX).
* ``KFIT_ENGINE=horovod|native|none`` overrides what the environment says (``none``: every process trains
  alone, as one worker).

Nothing here imports an engine: this module only reads the environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: Environment variables through which Horovod's launchers tell a process its rank (horovodrun with Gloo
#: sets HOROVOD_RANK; mpirun sets the OpenMPI or PMI ones).
HOROVOD_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")

#: The variable that overrides the choice, and its values.
ENGINE_VARIABLE = "KFIT_ENGINE"
ENGINES = ("horovod", "native", "none")

#: Seconds a native engine's collective waits for the other workers before failing the job.
TIMEOUT_VARIABLE = "KFIT_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True)
class LaunchEnvironment:
    """What a ``torchrun``-style launcher tells a worker."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    master_addr: str
    master_port: int


def horovod_launched() -> bool:
    """True when this process was started by ``horovodrun`` (or ``mpirun``)."""
    return any(name in os.environ for name in HOROVOD_VARIABLES)


def native_launched() -> bool:
    """True when a ``torchrun``-style launcher started this process as one of several workers."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and os.environ["WORLD_SIZE"].strip() != "1"


def requested_engine() -> str:
    """The engine this process uses: ``"horovod"``, ``"native"`` or ``"none"`` (one worker).

    Raises:
        ValueError: ``KFIT_ENGINE`` holds another value.
    """
    value = os.environ.get(ENGINE_VARIABLE)
    if value is not None and value.strip() != "":
        engine = value.strip().lower()
        if engine not in ENGINES:
            raise ValueError(
                f"Invalid value for environment variable {ENGINE_VARIABLE}: expected one of "
                f"{', '.join(repr(e) for e in ENGINES)} (or unset, to follow the launcher). "
                f"Received: {ENGINE_VARIABLE}={value!r}"
            )
        return engine
    if horovod_launched():
        return "horovod"
    if native_launched():
        return "native"
    return "none"


def _integer(name: str, default: int | None = None, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        if default is not None:
            return default
        raise ValueError(
            f"The native engine needs the environment variable {name}, as torchrun and SLURM-style launchers set "
            f"it (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Launch with `torchrun --nproc_per_node N script.py`, "
            f"or set {ENGINE_VARIABLE}=none to train this process alone."
        )
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValueError(
            f"Invalid value for environment variable {name}: expected an integer >= {minimum}. Received: {name}={raw!r}"
        )
    return value


def launch_environment() -> LaunchEnvironment:
    """The launcher's environment, checked.

    Raises:
        ValueError: a variable is missing or malformed, or ``RANK`` is not below ``WORLD_SIZE`` (the message
            names it).
    """
    size = _integer("WORLD_SIZE", minimum=1)
    rank = _integer("RANK")
    if rank >= size:
        raise ValueError(f"Invalid value for environment variable RANK: expected 0 to WORLD_SIZE - 1 = {size - 1}. "
                         f"Received: RANK={rank}")
    local_size = _integer("LOCAL_WORLD_SIZE", default=size, minimum=1)
    local_rank = _integer("LOCAL_RANK", default=rank if local_size == size else 0)
    addr = os.environ.get("MASTER_ADDR", "").strip()
    if not addr:
        _integer("MASTER_ADDR")  # raises the missing-variable error
    port = _integer("MASTER_PORT", minimum=1)
    if port > 65535:
        raise ValueError(f"Invalid value for environment variable MASTER_PORT: expected a TCP port (1 to 65535). "
                         f"Received: MASTER_PORT={port}")
    return LaunchEnvironment(rank, size, local_rank, local_size, addr, port)


def timeout_seconds() -> float:
    """How long a native engine's collective waits for the other workers (``KFIT_COLLECTIVE_TIMEOUT``).

    Raises:
        ValueError: ``KFIT_COLLECTIVE_TIMEOUT`` is not a positive number of seconds.
    """
    raw = os.environ.get(TIMEOUT_VARIABLE)
    if raw is None or raw.strip() == "":
        return DEFAULT_TIMEOUT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"Invalid value for environment variable {TIMEOUT_VARIABLE}: expected a positive number of "
                         f"seconds. Received: {TIMEOUT_VARIABLE}={raw!r}")
    return value
