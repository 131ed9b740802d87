"""Restoring a run from its newest checkpoint: a step of the loop that drives the run, not of a callback.

The loop takes the step once every kfit callback of the run has begun (reset itself in ``on_train_begin``):
:func:`kfit.fit`'s loop before the workers agree on the state (``kfit.training._fit._RunControl``), plain
``model.fit``'s in ``kfit.callbacks._model_fit.ModelFitLoop``. :func:`restore_run` restores, for every
:class:`kfit.callbacks.Checkpoint` of the run with ``restore=True``, the newest intact checkpoint of its path, and
records on the callback what it found (``restored_from``, ``finished_before``). The callback itself only saves.

Example:
    >>> import os, tempfile, keras, kfit
    >>> from kfit._run import Run, RunLoop
    >>> from kfit.checkpoint._restore import resume
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> path = os.path.join(tempfile.mkdtemp(), "run.ckpt")
    >>> run = Run(model, loop=RunLoop())
    >>> resume(run, path) is None  # no checkpoint yet: the run starts afresh
    True
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kfit import _backend
from kfit._run import Run, hyperparameters_set_in_code, record_hyperparameters
from kfit.checkpoint import CheckpointInfo, _format, _info, _run_status, _state
from kfit.checkpoint._format import CheckpointCorruptError, CheckpointError, CheckpointMismatchError
from kfit.distributed._notices import warn_job


@dataclass(frozen=True)
class Resumed:
    """What :func:`resume` restored.

    Attributes:
        info: the checkpoint restored.
        finished: the restored run had finished (complete, or stopped by a callback): this run trains nothing.
    """

    info: CheckpointInfo
    finished: bool


def restore_run(run: Run) -> bool:
    """The restore step of ``run``'s loop: every checkpointing callback of the run with ``restore=True`` resumes
    from its path's newest intact checkpoint (if there is one), and holds what it restored in ``restored_from`` and
    ``finished_before``. A restore that fails ends that callback's hold on its path and raises.

    Returns:
        True when a restored run had finished (complete, or stopped by a callback): this run trains nothing.
    """
    finished = False
    run.hyperparameters_in_code = hyperparameters_set_in_code(
        getattr(run.model, "optimizer", None), _state.hyperparameters(_state.model_variables(run.model)["optimizer"]))
    for callback in run.callbacks:
        if not getattr(callback, "writes_checkpoints", False) or not callback.restore:
            continue
        try:
            resumed = resume(run, callback.path, resume_finished=callback.resume_finished,
                             params=callback.params)
        except BaseException:
            callback.release()
            raise
        if resumed is not None:
            callback.restored_from, callback.finished_before = resumed.info, resumed.finished
            finished = finished or resumed.finished
    # (what the run leaves, if it never ends: a model.fit that raised tells no callback)
    started = _state.hyperparameters(_state.model_variables(run.model)["optimizer"])
    record_hyperparameters(run, started | dict.fromkeys(_state.set_before_steps(run) & set(started)))
    return finished


def resume(run: Run, path: str, resume_finished: bool = False, params: dict | None = None) -> Resumed | None:
    """Restores the newest intact checkpoint of ``path`` into ``run`` (None when there is none).

    A damaged newer file is reported with a warning and passed over. Prints the resume line, or, for a run that
    had finished, says so and stops the run before its first step (``resume_finished``: a stopped run goes on).
    ``params``: ``model.fit``'s params (its ``epochs``), for a loop that counts epochs itself.

    Raises:
        CheckpointMismatchError: the checkpoint does not fit the run (nothing was changed).
        CheckpointError: no intact checkpoint, but a damaged one.
    """
    found = read_newest(path)
    if found is None:
        return None
    file, meta, arrays, damaged = found
    loop = run.loop
    from kfit import distributed

    # A loop that restarts the epoch (model.fit) resets the metrics: restoring them would only raise warnings.
    # (Each worker gets its share of the saved workers' training metrics.)
    try:
        plan = _state.plan_restore(run, meta, arrays, file, metrics=loop.exact_resume, rank=distributed.rank(),
                                   size=distributed.size())
    except CheckpointMismatchError as mismatch:
        raise CheckpointMismatchError(
            f"{mismatch} To start over instead of resuming: pass restore=False to Checkpoint, or delete "
            f"{file!r} and the other checkpoints of {path!r}."
        ) from None
    saved_clock = dict(plan.clock_state) if plan.clock_state is not None else None  # (before the loop moves it)
    start_epoch = loop.prepare_restore(run, plan)
    if start_epoch is not None:
        start_at_epoch(run, start_epoch)
    _state.apply_restore(run, plan, meta, arrays)
    clock = run.clock
    if clock is not None and clock.samples_in_epoch != 0:  # (model.fit's loop moved the clock to the epoch start)
        run.resumed_mid_epoch = True  # the restored metric state continues the epoch
    info = _info(file, meta, checksum_ok=True)
    if damaged:
        warn_job(" ".join(damaged) + f" Falling back to the previous intact checkpoint: resumed from "
                      f"{file!r} (sample {info.samples}).", stacklevel=3)
    restored_epoch = start_epoch if start_epoch is not None else info.epoch
    finished = _run_status.resume_or_finish(run, info, restored_epoch, resume_finished, params, noted=plan.noted)
    if finished:
        if saved_clock is not None and clock is not None:  # the final state: the clock where the run ended, not at
            clock.set_state(saved_clock)  # the epoch start where model.fit would have restarted that epoch
        start_epoch = loop.finished_epoch(run, params, restored_epoch)
        if start_epoch is not None:
            start_at_epoch(run, start_epoch)
    else:
        _state.drop_partial_epoch(run, plan.history)  # the epoch a stopped run ended in is trained to its end
    return Resumed(info, finished)


def start_at_epoch(run: Run, epoch: int) -> None:
    """Tells ``model.fit`` the epoch to start from (read after ``on_train_begin``; the run's loop undoes it when
    training ends)."""
    _backend.set_initial_epoch(run.model, epoch)
    run.initial_epoch_set = True


def read_newest(path: str) -> tuple[str, dict, dict, list[str]] | None:
    """``(file, meta, arrays, damaged)`` of the newest intact checkpoint of ``path`` (None: there is none; a
    damaged newer file is passed over, never a crash). With several workers rank 0 reads it and sends its bytes to
    the others, so that only rank 0 needs the file (no shared file system) and every worker restores the same
    state."""
    from kfit import distributed

    if distributed.size() == 1:
        return _format.read_newest_intact(path)
    from kfit.distributed import _state as _collective

    header: dict[str, Any] = {}
    data = b""
    if distributed.is_chief():
        try:
            found = _format.newest_intact_image(path)
        except CheckpointError as error:  # the others must not wait for a file that will not come
            found, header = None, {"error": str(error), "corrupt": isinstance(error, CheckpointCorruptError)}
        if found is not None:
            data, header = found[3], {"file": found[0], "damaged": found[4]}
    received = _collective.broadcast_bytes(json.dumps(header).encode() + b"\n" + data if distributed.is_chief()
                                           else None, 0, "kfit.checkpoint")
    text, _, data = received.partition(b"\n")
    header = json.loads(text)
    if "error" in header:
        raise (CheckpointCorruptError if header["corrupt"] else CheckpointError)(header["error"])
    if "file" not in header:
        return None
    meta, arrays = _format.read_image(header["file"], data)
    return header["file"], meta, arrays, header["damaged"]
