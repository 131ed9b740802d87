"""Full-state checkpoints: one HDF5 file holds everything a run needs to go on exactly where it stopped.

The :class:`kfit.callbacks.Checkpoint` callback saves and restores during :func:`kfit.fit` (and, as far as
it can, under plain ``model.fit``). The functions here do the same for users who write their own loops:

* :func:`save_checkpoint` / :func:`load_checkpoint`: the model's and optimizer's variables, the metric
  variables, the clock, the stream, callback states, the history and the global random states;
* :func:`read_checkpoint_info`: what a file holds, without restoring it (``kfit inspect PATH`` prints it);
* :func:`list_checkpoints`: the files of one checkpoint path, newest first.

File names: ``PATH`` always holds the newest checkpoint; with ``preserve_all`` or ``keep > 1`` every
checkpoint is also kept as ``PATH.<samples>`` (the clock's sample count when it was taken). The file
layout, the checksum and the crash-safe write are described in ``kfit/checkpoint/_format.py``.

Example:
    >>> import os, tempfile, keras, kfit
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> path = os.path.join(tempfile.mkdtemp(), "run.ckpt")
    >>> _ = kfit.save_checkpoint(path, model)
    >>> info = kfit.load_checkpoint(path, model)
    >>> info.checksum_ok, [v.shape for v in info.variables if v.group == "model"]
    (True, [(3, 1), (1,)])
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from kfit import _checks
from kfit.checkpoint import _format, _lock
from kfit.checkpoint._format import (
    FORMAT_VERSION,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointLockedError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointWriteError,
)

# Reading a file (read_checkpoint_info, list_checkpoints: what `kfit inspect` calls) needs only h5py and
# NumPy; saving and restoring need Keras, imported with ``_state`` on first use, so that ``kfit inspect``
# starts fast.


@dataclass(frozen=True)
class VariableInfo:
    """One stored variable: its group (``model``, ``optimizer``, ``metrics``), path, shape and dtype."""

    group: str
    path: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class CheckpointInfo:
    """What a checkpoint file holds.

    Attributes:
        path: the file.
        format_version, kfit_version, keras_version, backend, created: how and when it was written.
        samples, minibatches, epoch, samples_in_epoch, epoch_size, minibatch_size: the clock (None without one).
        hyperparameters: the optimizer's scalar variables (``learning_rate``, ``momentum``, ...), by name.
        last_metrics: the metrics of the last finished epoch.
        variables: every stored variable.
        optimizer: the optimizer's class name.
        inner_optimizer: the class name of a ``LossScaleOptimizer``'s inner optimizer (None for another optimizer).
        optimizer_options: the optimizer's ``get_config()`` less its name and the options it holds in variables
            (those are among ``hyperparameters``); a ``LossScaleOptimizer``'s with its inner optimizer's. A learning
            rate given as a Python function is ``"<function QUALNAME>"``. Empty for files written before kfit recorded
            them.
        learning_rate_schedule: where the learning rate is a Keras ``LearningRateSchedule`` (no variable, so not
            among ``hyperparameters``): its ``class``, the optimizer's step count (``step``) and the schedule's rate
            there (``value``), the next step's.
        kfit_fit: True when saved inside ``kfit.fit`` (exact mid-epoch resume possible).
        status: where the run stood when the file was written: ``"running"``, ``"complete"`` (it reached
            its ``epochs`` or ``max_samples``) or ``"stopped"`` (a callback stopped it); None for files
            written before kfit recorded it.
        status_reason: why it ended (``"reached epochs=50"``, ``"stopped by EarlyStopping on val_loss"``).
        checksum_ok: True when every stored byte matched its checksum, None when not checked.
        problem: what is wrong with the file when ``checksum_ok`` is False (only format-1 files, whose
            arrays have checksums of their own, can be read with damaged arrays; a damaged format-2 file
            raises :class:`CheckpointCorruptError` instead).
    """

    path: str
    format_version: int
    kfit_version: str
    keras_version: str
    backend: str
    created: str
    samples: int | None
    minibatches: int | None
    epoch: int | None
    samples_in_epoch: int | None
    epoch_size: int | None
    minibatch_size: int | None
    hyperparameters: dict[str, float] = field(default_factory=dict)
    last_metrics: dict[str, float] = field(default_factory=dict)
    variables: list[VariableInfo] = field(default_factory=list)
    optimizer: str | None = None
    inner_optimizer: str | None = None
    optimizer_options: dict[str, Any] = field(default_factory=dict)
    learning_rate_schedule: dict[str, Any] | None = None
    kfit_fit: bool = False
    status: str | None = None
    status_reason: str | None = None
    checksum_ok: bool | None = None
    problem: str | None = None

    def status_text(self) -> str:
        """The status in words: ``running``, ``complete (reached epochs=50)``, ``stopped by ...``."""
        if self.status is None:
            return "unknown (written by an older kfit)"
        if self.status == "stopped" and self.status_reason:
            return self.status_reason if self.status_reason.startswith("stopped") else f"stopped: {self.status_reason}"
        return self.status + (f" ({self.status_reason})" if self.status_reason else "")

    def as_dict(self) -> dict[str, Any]:
        """Plain data (for ``kfit inspect --json``)."""
        out = dict(self.__dict__)
        out["variables"] = [dict(v.__dict__, shape=list(v.shape)) for v in self.variables]
        return out


def _info(path: str, meta: dict, checksum_ok: bool | None, problem: str | None = None) -> CheckpointInfo:
    summary = meta.get("summary", {})
    shapes = {entry["name"]: entry for entry in meta["arrays"]}
    variables = []
    for group in _format.GROUPS:
        for i, variable_path in enumerate(meta["variables"].get(group, [])):
            entry = shapes[f"{group}/{i}"]
            variables.append(VariableInfo(group, variable_path, tuple(entry["shape"]), entry["dtype"]))
    optimizer = meta.get("optimizer") or {}
    inner = optimizer.get("inner") or {}
    return CheckpointInfo(
        path=path, format_version=meta["format_version"], kfit_version=meta.get("kfit_version", "?"),
        keras_version=meta.get("keras_version", "?"), backend=meta.get("backend", "?"), created=meta.get("created", "?"),
        samples=summary.get("samples"), minibatches=summary.get("minibatches"), epoch=summary.get("epoch"),
        samples_in_epoch=summary.get("samples_in_epoch"), epoch_size=summary.get("epoch_size"),
        minibatch_size=summary.get("minibatch_size"), hyperparameters=summary.get("hyperparameters", {}),
        last_metrics=summary.get("last_metrics", {}), variables=variables,
        optimizer=optimizer.get("class"), inner_optimizer=inner.get("class"),
        optimizer_options={**inner.get("options", {}), **optimizer.get("options", {})},
        learning_rate_schedule=summary.get("learning_rate_schedule"), kfit_fit=bool(meta.get("kfit_fit")),
        status=meta.get("run", {}).get("status"), status_reason=meta.get("run", {}).get("reason"),
        checksum_ok=checksum_ok, problem=problem,
    )


def save_checkpoint(
    path: str | os.PathLike,
    model: Any,
    *,
    clock: Any = None,
    stream: Any = None,
    callbacks: list | None = None,
    history: Any = None,
    keep: int = 1,
    preserve_all: bool = False,
) -> str:
    """Saves the whole training state of ``model`` to ``path``, atomically.

    Inside a run (a callback of :func:`kfit.fit`) the clock, stream, callbacks and history are the run's;
    outside one, pass those you have (the model's clock, if one is attached, is taken by default).

    Args:
        path: the checkpoint file. Its directory is created if needed. A symbolic link is resolved: its target is
            written (with the lock and numbered files beside it), and the link stays.
        model: a built Keras model (its optimizer and metric variables are saved too).
        clock: a :class:`kfit.Clock`.
        stream: a :class:`kfit.data.SampleStream`.
        callbacks: callbacks whose ``get_state()`` is saved (keyed by their ``name``; other Keras callbacks
            by class name), and the counters and best values of Keras's ``EarlyStopping``,
            ``ReduceLROnPlateau``, ``ModelCheckpoint`` and ``TensorBoard`` (keyed by class and monitor, e.g.
            ``EarlyStopping(val_loss)``).
        history: a ``keras.callbacks.History``.
        keep: how many numbered checkpoints ``PATH.<samples>`` to keep (1: only ``PATH``). Those of more samples
            than this one (an earlier, longer run's, which a restore would take for newer states) are removed.
        preserve_all: keep every checkpoint as ``PATH.<samples>``.

    Returns:
        The checksum of the written file (``"sha256:..."``).

    Raises:
        CheckpointWriteError: the file cannot be written (the message names the path and the reason: a full
            disk, an I/O error, a read-only file system); the previous checkpoint at ``path`` is then
            untouched and no temporary file is left.
        CheckpointLockedError: another writer (a ``Checkpoint`` callback, here or in another process)
            holds ``path``.
        ValueError: two callbacks have the same state key.
        TypeError: a callback's state is not plain data, or a ``LearningRateSchedule`` or ``MomentumSchedule`` was
            reset to a schedule built from a Python callable (the message names the reset and what to give it).

    Example:
        >>> # in a custom loop, every 10_000 samples:
        >>> # kfit.save_checkpoint("run.ckpt", model, clock=clock, stream=stream, callbacks=[early_stopping])
    """
    from kfit.checkpoint import _state

    check_keep(keep, preserve_all)

    path = _checks.output_path("path", path, example="model.ckpt", parents=False)
    make_directory(path)
    parts = _state.training_parts(model, clock, stream, callbacks, history)
    arrays, meta = _state.collect(parts)
    samples = meta["summary"]["samples"] or 0
    with _lock.PathLock(path, "kfit.save_checkpoint"):
        return _format.write_checkpoint(path, arrays, meta, samples, keep=keep, preserve_all=preserve_all)


def load_checkpoint(
    path: str | os.PathLike,
    model: Any,
    *,
    clock: Any = None,
    stream: Any = None,
    callbacks: list | None = None,
    history: Any = None,
    random_state: bool = False,
) -> CheckpointInfo:
    """Restores a checkpoint into ``model`` (and the clock, stream, callbacks and history given).

    The whole file is checked first (its checksum, every variable present with the right shape and dtype,
    the optimizer's class, the data's length); only then is anything assigned, so a checkpoint that does
    not fit changes nothing. An unbuilt optimizer is built first.

    Args:
        path: the checkpoint file.
        model: a built, compiled model like the one that saved it.
        clock, stream, callbacks, history: the parts to restore (inside a run: the run's, by default).
        random_state: also restore the process-wide NumPy, Python and (on PyTorch) torch random states (off by
            default: a library call leaves the process's random state alone; the ``Checkpoint`` callback restores
            them, as an exact resume needs).

    From a callback of a run, the load must come between two epochs (``on_epoch_end``): between two steps of an epoch
    (a batch hook) it is refused with a ``RuntimeError``, before anything changes (under plain ``model.fit`` on data
    of unknown length too, where only a kfit callback's ``on_epoch_end`` tells that the epoch has ended: list the
    callback that loads after ``SampleClock``). Under plain ``model.fit`` the training metrics are left as they are
    (as a resume, which restarts the epoch, leaves them out), and a file written inside an epoch puts the clock at
    that epoch's start, from which ``model.fit``'s next epoch trains it, as a resume of the file does.

    A callback the file holds no state for keeps the state it has.

    A run that had ended (complete, or stopped by a callback) is restored as ``model.fit`` left the model: with an
    optimizer that keeps moving averages (``use_ema=True``), they are swapped into the model's weights, as
    ``model.fit`` does at its end (the checkpoint keeps the trained weights, from which a continued run goes on).

    Returns:
        A :class:`CheckpointInfo` of the file restored.

    Raises:
        CheckpointNotFoundError: no file at ``path``.
        CheckpointCorruptError: the file is truncated or damaged, or its metadata is not what kfit writes
            (the message says where); nothing is changed.
        CheckpointMismatchError: the checkpoint does not fit (names the first variable that differs);
            nothing is changed.
        RuntimeError: called from a callback inside an epoch of the run (see above); nothing is changed.

    Example:
        >>> # model = build_model(); model.compile(...); model.build(input_shape)
        >>> # info = kfit.load_checkpoint("run.ckpt", model, clock=clock); info.samples
    """
    from kfit import _backend
    from kfit._run import current_run
    from kfit.checkpoint import _state

    path = os.fspath(path)
    parts = _state.training_parts(model, clock, stream, callbacks, history)
    meta, arrays = _format.read_file(path)
    run = current_run(model)
    into_run = run is not None and run.clock is not None and parts.clock is run.clock  # (from a callback of the run)
    # (plain model.fit goes on with its own epoch: the file's metric state, of another, would mix into its means)
    # (a callback the file has no state for keeps its own: only a resume's callbacks have just started afresh)
    restore = _state.plan_restore(parts, meta, arrays, path, metrics=not into_run or run.kfit_fit, fresh=False)
    if into_run and getattr(run.driver, "ran", False):
        run.flush()  # a step that has run, not counted yet (model.fit: at the next kfit hook), on the clock it ran on
    if into_run and getattr(run.driver, "inside_epoch", lambda clock: False)(run.clock):
        unknown = "" if run.kfit_fit or run.clock.epoch_size else _UNKNOWN_LENGTH
        raise RuntimeError(_INSIDE_EPOCH[run.kfit_fit].format(path=path, samples=run.clock.samples) + unknown)
    if into_run and run.loop is not None:  # (a clock attached by hand has none)
        run.loop.prepare_load(run, restore)
    before = (run.clock.samples, run.clock.minibatches) if into_run else None
    _state.apply_restore(parts, restore, meta, arrays, random_state=random_state)
    if into_run:
        if run.kfit_fit:  # Keras resets the metrics as the next epoch begins: a file's state inside its epoch is put
            # back then (by kfit.fit's loop), as a resume of the file puts it back
            held = model.metrics_variables if run.clock.samples_in_epoch else []
            run.restored_values = [(v, _backend.to_numpy(v.value)) for v in held]
        for callback in run.members():  # (a ProgressPrinter ends the epoch in progress with the samples it trained)
            restored = getattr(callback, "_clock_restored", None)
            if restored is not None:
                restored(*before)
    if (meta.get("run") or {}).get("status") in ("complete", "stopped"):
        _backend.finalize_ema(model)  # the model as model.fit left it (the file keeps the trained weights)
    return _info(path, meta, checksum_ok=True)


# kfit.load_checkpoint from a batch hook of a run, inside an epoch (keyed by run.kfit_fit).
_INSIDE_EPOCH = {
    True: "kfit.load_checkpoint({path!r}) was called inside an epoch of kfit.fit (at sample {samples}): kfit.fit has "
          "planned the epoch's minibatches from its start, so a checkpoint can be restored into the run only between "
          "epochs. Call it from on_epoch_end (the next epoch starts from the file's sample), or set "
          "self.model.stop_training = True and run kfit.fit again with Checkpoint(path, restore=True). Nothing was "
          "restored.",
    False: "kfit.load_checkpoint({path!r}) was called inside an epoch of model.fit (at sample {samples}): model.fit "
           "goes on with the epoch's next minibatches from its own position in the data, which kfit cannot move, so "
           "the clock and model.fit's epochs would no longer agree. A checkpoint can be restored into the run only "
           "between epochs: call it from on_epoch_end, or set self.model.stop_training = True and train again with "
           "Checkpoint(path, restore=True) (kfit.fit resumes inside the epoch, exactly). Nothing was restored.",
}
_UNKNOWN_LENGTH = (" On data of unknown length (a generator, a tf.data pipeline without steps_per_epoch) every step may "
                   "be the epoch's last: kfit knows that the epoch has ended once a kfit callback's on_epoch_end has "
                   "run, so list a callback that loads there after kfit.callbacks.SampleClock.")


def read_checkpoint_info(path: str | os.PathLike, verify: bool = True) -> CheckpointInfo:
    """What the checkpoint at ``path`` holds, without restoring it.

    Args:
        path: the checkpoint file.
        verify: read every array and check its checksum (``checksum_ok``); otherwise only the metadata
            (itself always checked) is read.

    Safe on any path: a damaged or foreign file, a directory, a FIFO, a device or a file declaring huge
    arrays raises a :class:`CheckpointError` naming it (no crash, no hang, no other exception), and only
    h5py and NumPy are imported (no Keras).

    Returns:
        A :class:`CheckpointInfo`; ``checksum_ok`` is False (with ``problem``) when an array of a format-1
        file is damaged.

    Raises:
        CheckpointNotFoundError: no file at ``path``.
        CheckpointCorruptError: the file is damaged or not a kfit checkpoint (for format 2: any changed byte).

    Example:
        >>> # info = kfit.checkpoint.read_checkpoint_info("run.ckpt"); info.samples, info.checksum_ok
    """
    path = os.fspath(path)
    meta, _ = _format.read_file(path, load_arrays=False)
    if meta["format_version"] >= 2:  # the whole file was checked
        return _info(path, meta, checksum_ok=True)
    if not verify:
        return _info(path, meta, checksum_ok=None)
    try:
        _format.read_file(path)
    except CheckpointCorruptError as damage:
        return _info(path, meta, checksum_ok=False, problem=str(damage))
    return _info(path, meta, checksum_ok=True)


def list_checkpoints(path: str | os.PathLike) -> list[tuple[int | None, str]]:
    """The checkpoint files of ``path`` as ``(samples, file)``, newest first (``PATH`` before its twin).

    Example:
        >>> # A file whose metadata cannot be read is listed first, with samples None.
        >>> # kfit.checkpoint.list_checkpoints("run.ckpt")
        >>> # [(3000, 'run.ckpt'), (2000, 'run.ckpt.2000'), (1000, 'run.ckpt.1000')]
    """
    path = os.fspath(path)
    listed = []
    numbered = {file: samples for samples, file in _format.numbered_files(path)}
    for file in [path] if os.path.isfile(path) else []:
        try:
            meta, _ = _format.read_file(file, load_arrays=False)
            listed.append((meta.get("summary", {}).get("samples"), file))
        except CheckpointError:
            listed.append((None, file))
    listed += [(samples, file) for file, samples in numbered.items()]
    return sorted(listed, key=lambda item: (float("inf") if item[0] is None else item[0], item[1] == path), reverse=True)


def check_keep(keep: Any, preserve_all: Any) -> None:
    _checks.count("keep", keep, low=1)
    _checks.boolean("preserve_all", preserve_all)


def make_directory(path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise CheckpointError(
            f"Cannot write checkpoints to {path!r}: its directory {directory!r} cannot be created "
            f"({error.strerror or error}). Give a path in a writable directory."
        ) from error


__all__ = [
    "FORMAT_VERSION",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointLockedError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointWriteError",
    "VariableInfo",
    "list_checkpoints",
    "load_checkpoint",
    "read_checkpoint_info",
    "save_checkpoint",
]
