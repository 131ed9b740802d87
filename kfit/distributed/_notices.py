"""kfit's warnings about the whole job, shown once per job (on rank 0) under data-parallel training.

Every worker of a data-parallel run takes the same decisions, so a warning about the job (a checkpoint's note as
it is restored, the JAX engine's padding, model.fit's resume from an epoch's start) would be shown once per worker.
:func:`warn_job` issues it on every worker, so that the program's warning filters act alike everywhere (an
``"error"`` filter raises on every worker, not on one while the others wait in a collective), but only rank 0's
is shown (or recorded, or handed to the program's ``showwarning``): the other workers' go to a list of their own.
"""

from __future__ import annotations

import warnings


def warn_job(message: str, category: type[Warning] = UserWarning, stacklevel: int = 1,
             chief: bool | None = None) -> None:
    """``warnings.warn(message, category, stacklevel)``, shown only on rank 0 (see the module).

    Args:
        message: the warning.
        category: its class.
        stacklevel: as for ``warnings.warn``, counted from the caller of this function.
        chief: whether this worker is rank 0; None asks ``kfit.distributed.is_chief()`` (pass it while the engine
            is starting, when asking would start it again).
    """
    if chief is None:
        from kfit import distributed

        chief = distributed.is_chief()
    if chief:
        warnings.warn(message, category, stacklevel=stacklevel + 1)
        return
    with warnings.catch_warnings(record=True):  # the same filters decide; a warning they let through is not shown
        warnings.warn(message, category, stacklevel=stacklevel + 1)
