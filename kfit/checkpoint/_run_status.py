"""Where a run stands (running, complete, stopped and by what), recorded in its checkpoints.

A checkpoint holds ``meta["run"] = {"status": ..., "reason": ...}``. On a restore, :func:`resume_or_finish`
prints the resume line, or, for a run that had finished, says so and makes the rerun train nothing.
"""

from __future__ import annotations

import math
import sys
from typing import Any


def _stop_reason(model: Any, callbacks: list, clock: Any) -> str:
    """What set ``model.stop_training``: the callbacks that record a stop, named with what they watched."""
    for callback in callbacks:
        kind = type(callback).__name__
        module = type(callback).__module__
        if getattr(callback, "stopped", False) is True and getattr(callback, "stopped_samples", None) is not None:
            # kfit's EarlyStopping and ReduceLROnPlateau (the latter after its last reduction)
            monitor = getattr(callback, "monitor", None)
            reason = f"stopped by {kind}" + (f" on {monitor}" if monitor else "")
            if kind == "ReduceLROnPlateau":
                reason += f" after {getattr(callback, 'reductions', '?')} learning-rate reductions"
            return reason
        if module.startswith("keras") and getattr(callback, "stopped_epoch", 0):
            monitor = getattr(callback, "monitor", None)
            return f"stopped by keras {kind}" + (f" on {monitor}" if monitor else "") + f" at epoch {callback.stopped_epoch + 1}"
    samples = None if clock is None else clock.samples
    for callback in callbacks:
        # kfit's CrossValidation: its user callback returned False at the evaluation just made.
        results = getattr(callback, "results", None)
        function = getattr(callback, "callback", None)
        if type(callback).__name__ == "CrossValidation" and function is not None and results:
            if samples is None or results[-1].get("samples") == samples:
                name = getattr(function, "__name__", type(function).__name__)
                index = int(results[-1].get("val_index", len(results) - 1))
                return f"stopped by the cross-validation callback {name}, which returned False at val_index {index}"
    return _UNRECORDED_STOP


_UNRECORDED_STOP = "stopped by a callback (model.stop_training = True)"


def status(run: Any, params: dict | None, epochs_done: int, interrupted: bool) -> dict[str, Any]:
    """``{"status": "running" | "complete" | "stopped", "reason": ...}`` for a checkpoint of ``run`` written now."""
    reached = run.loop.bound_reached(run, params, epochs_done)
    if run.model.stop_training and not interrupted:
        reason = _stop_reason(run.model, run.callbacks, run.clock)
        # A callback's stop at the step a bound is reached too is a stop (a resumed run with a higher bound must not
        # go on past it, as the uninterrupted run did not), unless kfit's own stop at max_samples on a source that
        # batches by itself set the flag first and no callback records a stop of its own.
        if reached is None or not (run.stopped_at_bound and reason == _UNRECORDED_STOP):
            return {"status": "stopped", "reason": reason}
    if reached is not None and not interrupted:
        return {"status": "complete", "reason": reached}
    return {"status": "running", "reason": None}


def _where(info: Any, epoch: int | None = None) -> str:
    """``sample 3900 (end of epoch 3; `` / ``sample 4000 (epoch 4, 100 samples in; `` / ``the end of epoch 2 (`` /
    ``sample 64 (1 epoch ended; `` (no ``epoch_size``: data of unknown length)."""
    if info.samples is None:  # model.fit without a SampleClock: epochs only
        return f"the end of epoch {epoch if epoch is not None else info.epoch or 0} ("
    if info.epoch is None:
        return f"sample {info.samples} ("
    if not info.epoch_size and epoch:  # data of unknown length under model.fit: its History counts the epochs
        return f"sample {info.samples} ({epoch} epoch{'s' * (epoch != 1)} ended; "
    if info.samples_in_epoch:
        return f"sample {info.samples} (epoch {info.epoch + 1}, {info.samples_in_epoch} samples in; "
    return f"sample {info.samples} (end of epoch {info.epoch}; "


def resume_line(info: Any, epoch: int | None = None) -> str:
    """``kfit: resumed from FILE at sample N (end of epoch E; written T)``."""
    return f"kfit: resumed from {info.path} at {_where(info, epoch)}written {info.created})"


def _say(message: str) -> None:
    from kfit import distributed

    if distributed.is_chief():
        print(message, file=sys.stderr, flush=True)


def changed_schedules(callbacks: list, info: Any, noted: list = ()) -> list[str]:
    """Notes for the learning-rate and momentum schedules of this script that would not have given the
    value the checkpoint's last minibatch trained with (the script was edited between the runs), but for those in
    ``noted``: their restore note, which compares the schedules themselves, said so."""
    samples, minibatches, size = info.samples, info.minibatches, info.minibatch_size
    if samples is None or minibatches is None or not size or samples < size or minibatches < 1:
        return []
    notes = []
    for callback in callbacks:
        kind = getattr(callback, "kind", None)
        if kind not in ("learning_rate", "momentum") or not hasattr(callback, "active_schedule") or any(
                callback is other for other in noted):
            continue
        names = ("learning_rate",) if kind == "learning_rate" else ("momentum", "beta_1")
        saved = next((info.hyperparameters[n] for n in names if n in info.hyperparameters), None)
        if saved is None:
            continue
        schedule, s0, m0 = callback.active_schedule(samples - size)
        try:
            value = float(schedule.for_minibatch(samples - size - s0, minibatches - 1 - m0, callback.samples_per_update(size)))
        except Exception:  # noqa: BLE001 - a note is a nicety; the schedule's own errors come at the first step
            continue
        if not math.isclose(value, saved, rel_tol=1e-5, abs_tol=1e-12):
            what = kind.replace("_", " ")
            notes.append(
                f"kfit: note: the {what} schedule differs from the one the run trained with: it gives {value:.6g} "
                f"for the checkpoint's last minibatch, which trained with {saved:.6g}. Training goes on with this "
                f"script's schedule."
            )
    return notes


def resume_or_finish(run: Any, info: Any, restored_epoch: int | None, resume_finished: bool = False,
                     params: dict | None = None, noted: list = ()) -> bool:
    """After a restore: print the resume line, or say that the run had finished and stop it before its first step.
    (``noted``: the callbacks whose restore note has been given, see :func:`changed_schedules`.)

    Returns:
        True when the run had finished and this one trains nothing.
    """
    model = run.model
    stopped = info.status == "stopped"
    if stopped and resume_finished:
        model.stop_training = False
        for callback in run.callbacks:  # the controllers' stop marks; their counters stay
            if getattr(callback, "stopped_samples", None) is not None and hasattr(callback, "stopped"):
                callback.stopped_samples = None
        _say(resume_line(info, restored_epoch) + f"; it had {info.status_reason or 'stopped'}: going on (resume_finished=True)")
        return False
    reached = None if stopped else run.loop.end_reached(run, params, restored_epoch)
    if not stopped and reached is None:
        note = ""
        if info.status == "complete":
            note = f"; the run was complete ({info.status_reason}): going on to the new end"
        _say(resume_line(info, restored_epoch) + note)
        for line in changed_schedules(run.callbacks, info, noted):
            _say(line)
        return False
    why = info.status_reason if stopped else (info.status_reason if info.status == "complete" else reached)
    where = f"sample {info.samples}" if info.samples is not None else f"the end of epoch {restored_epoch}"
    how = ("pass Checkpoint(..., resume_finished=True) to continue it" if stopped
           else "raise epochs or max_samples to continue it")
    _say(f"kfit: run already complete at {where} ({why}); nothing to train. Restored its final state from "
         f"{info.path}. Pass restore=False or delete {info.path} to start over, or {how}.")
    model.stop_training = True
    return True
