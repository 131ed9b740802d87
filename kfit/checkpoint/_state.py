"""The training state: collected from a run into arrays and JSON, and put back into one.

What is kept: the model's variables (weights, non-trainable state, seed-generator state),
the optimizer's variables (slots, iteration counter, hyperparameter variables), the metric variables (so
an epoch's running training metrics continue exactly after a mid-epoch resume), the clock, the stream's
position and seed, the state of every callback that has ``get_state``, the history, and the NumPy, Python
and PyTorch global random states. Variables are identified by ``variable.path``.

A restore validates everything first (shapes, dtypes, the optimizer's class, the data's length, the
callbacks' keys) and assigns only then, so a checkpoint that does not fit changes nothing.
"""

from __future__ import annotations

import datetime
import functools
import json
import random
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

from kfit import _backend
from kfit._run import Run, current_run, last_clock
from kfit.checkpoint._format import GROUPS, CheckpointMismatchError
from kfit.checkpoint._schema import WORKER_METRICS
from kfit.distributed._notices import warn_job

_ARRAY = "__kfit_array__"
_PAIRS = "__kfit_dict__"  # a dict whose keys are not all strings: [[key, value], ...]


def training_parts(model: Any, clock: Any = None, stream: Any = None, callbacks: list | None = None,
                   history: Any = None) -> Run:
    """The parts given, completed from the run in progress on ``model``, if any (a new :class:`Run`, not
    registered: the run in progress is not changed), with its clock's driver (which sets the minibatch size)."""
    run = current_run(model)
    if run is None:  # after a run: the clock it ended with, unless one is given
        return Run(model, last_clock(model) if clock is None else clock, stream, list(callbacks or []), history)
    return Run(model, run.clock if clock is None else clock, run.stream if stream is None else stream,
               list(run.callbacks if callbacks is None else callbacks), run.history if history is None else history,
               loop=run.loop, driver=run.driver, hyperparameters_in_code=run.hyperparameters_in_code)


def model_variables(model: Any) -> dict[str, list]:
    optimizer = getattr(model, "optimizer", None)
    return {
        "model": list(model.variables),
        "optimizer": list(optimizer.variables) if optimizer is not None else [],
        "metrics": list(getattr(model, "metrics_variables", [])),
    }


def state_key(callback: Any) -> str:
    """The key of a callback's state: its ``name`` for kfit callbacks, its class name otherwise."""
    return callback.name if hasattr(type(callback), "default_name") else type(callback).__name__


class KerasCallbackState:
    """``get_state`` / ``set_state`` for one of Keras's built-in callbacks whose decisions depend on what it has
    seen (``EarlyStopping``'s wait and best weights, ``ReduceLROnPlateau``'s wait and cooldown,
    ``ModelCheckpoint``'s best value, ``TensorBoard``'s batch steps): a resumed run decides as the uninterrupted
    run does. Keras resets them in
    ``on_train_begin``; the loop restores after it. Its key: the class name and what it monitors, e.g.
    ``EarlyStopping(val_loss)`` (a second of the same kind: ``EarlyStopping(val_loss)#2``)."""

    default_name = "keras_callback"  # (the key is its name: see state_key)

    def __init__(self, callback: Any, attributes: tuple[str, ...], name: str):
        self.callback, self.attributes, self.name = callback, attributes, name

    def get_state(self) -> dict[str, Any]:
        return {name: getattr(self.callback, name, None) for name in self.attributes}

    def set_state(self, state: dict[str, Any]) -> None:
        for name in self.attributes:
            if name in state:
                setattr(self.callback, name, state[name])


class CSVLoggerState(KerasCallbackState):
    """``get_state`` / ``set_state`` for Keras's ``CSVLogger``: the rows its file held when the checkpoint was
    written, so that a resumed run's file is the uninterrupted run's (Keras's own would be emptied, with
    ``append=False``, or get the rows of the epochs run again, with ``append=True``)."""

    def get_state(self) -> dict[str, Any] | None:
        return _backend.csv_logger_state(self.callback)

    def set_state(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            _backend.set_csv_logger_state(self.callback, state)


def _with_state(callback: Any) -> Any:
    """``callback`` if it has ``get_state``; a :class:`KerasCallbackState` for a Keras callback with counters
    (a :class:`CSVLoggerState` for Keras's ``CSVLogger``); else None."""
    if callable(getattr(callback, "get_state", None)):
        return callback
    if _backend.is_csv_logger(callback):
        return CSVLoggerState(callback, (), "CSVLogger")
    attributes = _backend.keras_callback_state_attributes(callback)
    if not attributes:
        return None
    monitor = getattr(callback, "monitor", None)
    return KerasCallbackState(callback, attributes, type(callback).__name__ + (f"({monitor})" if monitor else ""))


def stateful_callbacks(callbacks: list) -> dict[str, Any]:
    """The callbacks that have ``get_state``, by key (checkpoint callbacks excluded), and the
    :class:`KerasCallbackState` of Keras's built-in callbacks that keep counters.

    Raises:
        ValueError: two callbacks have the same key.
    """
    keyed: dict[str, Any] = {}
    for callback in callbacks:
        if getattr(callback, "writes_checkpoints", False):
            continue
        stateful = _with_state(callback)
        if stateful is None:
            continue
        if isinstance(stateful, KerasCallbackState):
            key = stateful.name  # a Keras callback has no name to give: a second one of the same kind is numbered
            number = 2
            while key in keyed:
                key, number = f"{stateful.name}#{number}", number + 1
            stateful.name = key
            keyed[key] = stateful
            continue
        key = state_key(callback)
        if key in keyed and keyed[key] is not callback:
            raise ValueError(
                f"Two callbacks keep their state under the same key {key!r} ({type(keyed[key]).__name__} and "
                f"{type(callback).__name__}), so a checkpoint cannot tell them apart. Give them different "
                "names, e.g. name='early_stopping_val_loss'."
            )
        keyed[key] = callback
    return keyed


# -- plain data <-> JSON + arrays ----------------------------------------------------------------------
def _encode(value: Any, arrays: dict, prefix: str, where: str) -> Any:
    if value is None or isinstance(value, (bool, str, int, float)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) or keras.ops.is_tensor(value):
        name = f"{prefix}/{sum(1 for k in arrays if k.startswith(prefix + '/'))}"
        # A copy: the callback may change its array in place while a background write reads this one.
        arrays[name] = np.array(value, copy=True) if isinstance(value, np.ndarray) else keras.ops.convert_to_numpy(value)
        return {_ARRAY: name}
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value) and _ARRAY not in value and _PAIRS not in value:
            return {k: _encode(v, arrays, prefix, f"{where}[{k!r}]") for k, v in value.items()}
        return {_PAIRS: [[_encode(k, arrays, prefix, where), _encode(v, arrays, prefix, f"{where}[{k!r}]")]
                         for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return [_encode(v, arrays, prefix, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TypeError(
        f"{where} holds a {type(value).__name__}, which a checkpoint cannot store: get_state() must return "
        "plain data (None, bool, int, float, str, lists, dicts) and NumPy arrays."
    )


def _decode(value: Any, arrays: dict) -> Any:
    if isinstance(value, list):
        return [_decode(v, arrays) for v in value]
    if isinstance(value, dict):
        if set(value) == {_ARRAY}:
            return arrays[value[_ARRAY]]
        if set(value) == {_PAIRS}:
            return {_hashable(_decode(k, arrays)): _decode(v, arrays) for k, v in value[_PAIRS]}
        return {k: _decode(v, arrays) for k, v in value.items()}
    return value


def _decoded(value: Any, arrays: dict, file: str, what: str) -> Any:
    """:func:`_decode`, with an error naming the file when the stored structure is not what kfit writes."""
    try:
        return _decode(value, arrays)
    except (KeyError, TypeError, ValueError) as error:
        from kfit.checkpoint._format import CheckpointCorruptError

        raise CheckpointCorruptError(
            f"The checkpoint {file!r} has metadata that kfit did not write: {what} cannot be decoded "
            f"({type(error).__name__}: {error}). Nothing was restored from it; restore from another checkpoint."
        ) from None


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


# -- collecting ----------------------------------------------------------------------------------------
def host_view(value: Any) -> np.ndarray:
    """A NumPy array of a tensor's value, sharing the tensor's host memory where the backend allows.

    ``keras.ops.convert_to_numpy`` always copies into fresh memory, which for a large model can cost more
    than writing the file. The view is valid until the next training step changes or frees the buffer:
    copy it (``np.copyto``) to keep it longer. (A backend difference: a candidate for ``kfit._backend``.)
    """
    if _backend.BACKEND == "torch":
        import torch

        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dtype != torch.bfloat16:
            return value.detach().numpy()
    elif _backend.BACKEND == "tensorflow":
        # A variable's read is an immutable tensor (a later assign copies on write); ``_numpy`` views its
        # buffer where ``numpy()`` would copy it. The view keeps the tensor alive.
        tensor = value.read_value() if hasattr(value, "read_value") else value
        array = tensor._numpy() if hasattr(tensor, "_numpy") else None
        if isinstance(array, (np.ndarray, np.generic)):  # (a scalar's is a NumPy scalar)
            return np.asarray(array)
    else:
        array = np.asarray(value)  # a JAX array on the CPU: a view
        if array.dtype != object:
            return array
    return keras.ops.convert_to_numpy(value)


def _host(variable: Any, name: str, buffers: dict | None) -> np.ndarray:
    view = host_view(variable.value)
    if buffers is None:  # written before training goes on: the view is enough
        return view
    buffer = buffers.get(name)
    if buffer is None or buffer.shape != view.shape or buffer.dtype != view.dtype:
        buffer = buffers[name] = np.empty_like(view)
    np.copyto(buffer, view)
    return buffer


def _history_state(history: Any, arrays: dict, epoch: int | None, epoch_logs: dict | None) -> dict | None:
    if history is None:
        return None
    record = {k: list(v) for k, v in getattr(history, "history", {}).items()}
    epochs = list(getattr(history, "epoch", []))
    if epoch is not None and epoch_logs is not None and epoch not in epochs:
        # Under plain model.fit the History callback runs after this one: count the epoch that just ended (also one
        # whose logs are empty: PyTorch's epoch of no step where a pass ends).
        epochs.append(epoch)
        for key, value in epoch_logs.items():
            record.setdefault(key, []).append(value)
    return {"epoch": _encode(epochs, arrays, "history", "history.epoch"),
            "history": _encode(record, arrays, "history", "history.history")}


def partial_history_state(history: Any, arrays: dict, epoch: int | None, epoch_logs: dict | None,
                          keys: list[str] | None = None) -> dict | None:
    """The history of a run that stopped inside an epoch, once that epoch has ended: its last entry (the partial
    epoch, as ``model.fit`` records it) is marked ``partial``, with the ``keys`` it logged (those of ``epoch_logs``
    when given: an earlier epoch may have logged others, say a cross-validation result), for
    :func:`drop_partial_epoch`."""
    state = _history_state(history, arrays, epoch, epoch_logs)
    if state is None:
        return None
    keys = sorted(epoch_logs) if epoch_logs else keys
    return dict(state, partial=True) if keys is None else dict(state, partial=True, partial_keys=list(keys))


def drop_partial_epoch(run: Run, history: dict | None) -> None:
    """A run that goes on from a checkpoint of a run stopped inside an epoch trains that epoch to its end: the
    partial epoch's entry in the restored history (see :func:`partial_history_state`) makes way for the whole one."""
    if not history or not history.get("partial") or not history["epoch"]:
        return
    if run.restored_history_epochs:  # plain model.fit's History gets these epochs when training begins
        run.restored_history_epochs = run.restored_history_epochs[:-1]
    if run.history is not None and getattr(run.history, "epoch", None):
        run.history.epoch = run.history.epoch[:-1]
        # The partial epoch's own values only: a key it did not log keeps every value (a checkpoint written before
        # the keys were recorded drops the last value of each, as then).
        logged = history.get("partial_keys")
        logged = run.history.history.keys() if logged is None else set(logged)
        run.history.history = {key: values[:-1] if key in logged else values
                               for key, values in run.history.history.items() if values[:-1] or key not in logged}


def _random_state(arrays: dict) -> dict:
    algorithm, keys, pos, has_gauss, gauss = np.random.get_state()
    arrays["rng/numpy"] = np.array(keys, copy=True)
    version, internal, gauss_next = random.getstate()
    arrays["rng/python"] = np.array(internal, dtype=np.int64)
    state = {"numpy": {"algorithm": algorithm, "pos": int(pos), "has_gauss": int(has_gauss), "gauss": float(gauss)},
             "python": {"version": version, "gauss_next": gauss_next}}
    if _backend.BACKEND == "torch":
        import torch

        arrays["rng/torch"] = torch.get_rng_state().numpy().copy()
    keras_global = _backend.global_seed_state()  # keras.random ops called without a SeedGenerator of their own
    if keras_global is not None:
        arrays["rng/keras_global"] = keras_global
    return state


def _summary(parts: Run, variables: dict, record: dict | None, epoch_logs: dict | None) -> dict:
    clock = parts.clock
    metrics = {}
    if epoch_logs:
        metrics = {k: float(v) for k, v in epoch_logs.items() if _is_number(v)}
    elif record:
        metrics = {k: float(v[-1]) for k, v in record.items() if v and _is_number(v[-1])}
    rates, schedule = hyperparameters(variables["optimizer"]), _learning_rate_schedule(parts.model)
    optimizer = getattr(parts.model, "optimizer", None)
    if schedule is not None or _rate_function(getattr(optimizer, "inner_optimizer", optimizer)) is not None:
        rates.pop("learning_rate", None)  # (a LossScaleOptimizer's own learning_rate variable, 0, is not the rate)
    return {
        "samples": None if clock is None else clock.samples,
        "minibatches": None if clock is None else clock.minibatches,
        "epoch": None if clock is None else clock.epoch,
        "samples_in_epoch": None if clock is None else clock.samples_in_epoch,
        "epoch_size": None if clock is None else clock.epoch_size,
        "minibatch_size": None if clock is None else clock.minibatch_size,
        "hyperparameters": rates,
        "hyperparameters_in_code": parts.hyperparameters_in_code,
        "learning_rate_schedule": schedule,
        "last_metrics": metrics,
    }


def hyperparameters(variables: list) -> dict[str, float]:
    """The scalar float variables of an optimizer (``learning_rate``, ``momentum``, ...) by name."""
    return {_name(variable): float(host_view(variable.value)) for variable in variables
            if tuple(variable.shape) == () and "float" in keras.backend.standardize_dtype(variable.dtype)}


def _learning_rate_schedule(model: Any) -> dict | None:
    """Where the optimizer's learning rate is a Keras ``LearningRateSchedule`` (not a variable, so not among the
    hyperparameters): its class, the optimizer's step count and the rate of the next step (``optimizer.learning_rate``:
    the schedule's value at that count)."""
    optimizer = getattr(model, "optimizer", None)
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # (a LossScaleOptimizer's rate is its inner one's)
    schedule = getattr(inner, "_learning_rate", None)
    if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        return None
    step = int(host_view(inner.iterations))
    return {"class": type(schedule).__name__, "step": step,
            "value": float(keras.ops.convert_to_numpy(schedule(step)))}


def _rate_function(optimizer: Any) -> str | None:
    """The qualified name of the Python function given as the optimizer's learning rate (Keras calls it before each
    step; no variable holds the rate), else None."""
    rate = getattr(optimizer, "_learning_rate", None)
    if not callable(rate) or isinstance(rate, (keras.Variable, keras.optimizers.schedules.LearningRateSchedule)):
        return None
    return getattr(rate, "__qualname__", None) or type(rate).__name__


def optimizer_description(optimizer: Any) -> dict:
    """The optimizer's name, class and options (its ``get_config()`` as plain JSON data, less its name and the
    options that it holds in variables: those are restored with the checkpoint, and the hyperparameter note names
    their changes); a ``LossScaleOptimizer``'s inner optimizer as ``inner``. Options that ``get_config`` cannot
    give are left out."""
    description = {"name": optimizer.name, "class": type(optimizer).__name__}
    try:
        with warnings.catch_warnings():  # (Keras warns of a lambda learning rate each time it serializes one)
            warnings.simplefilter("ignore")
            config = dict(optimizer.get_config())
    except Exception:  # (an optimizer of the user's without get_config: its class is still checked)
        return description
    function = _rate_function(optimizer)
    if function is not None:  # (Keras serializes a function by its bare name, a lambda as its bytecode)
        config["learning_rate"] = f"<function {function}>"
    config.pop("inner_optimizer", None)  # (described apart, below)
    inner = getattr(optimizer, "inner_optimizer", None)
    skip = {"name", "initial_scale"}  # (a LossScaleOptimizer's scale goes on from its variable, dynamic_scale)
    options = {key: value for key, value in config.items()
               if key not in skip and not isinstance(getattr(optimizer, key, None), keras.Variable)}
    # Plain data, as read back from the file (tuples as lists); what JSON cannot hold, by its type's name.
    description["options"] = json.loads(json.dumps(options, default=lambda value: f"<{type(value).__name__}>"))
    if inner is not None:
        description["inner"] = optimizer_description(inner)
    return description


def _option_text(value: Any) -> str:
    """An option's value as the note shows it: a serialized Keras object (a schedule) as ``Class(arg=value, ...)``."""
    if isinstance(value, dict) and isinstance(value.get("class_name"), str) and isinstance(value.get("config"), dict):
        arguments = ", ".join(f"{k}={_option_text(v)}" for k, v in sorted(value["config"].items()) if k != "name")
        return f"{value['class_name']}({arguments})"
    return repr(value)


def _changed_options(saved: dict | None, now: dict) -> list[tuple[str, Any, Any]]:
    """``(option, saved value, value now)`` for each option of the optimizer (and of its inner optimizer, where the
    class is the same) whose value differs (an option that only one side records is not compared: older files
    record none)."""
    if not saved or saved.get("class") != now.get("class"):
        return []
    theirs, mine = saved.get("options") or {}, now.get("options") or {}
    changed = [(key, theirs[key], mine[key]) for key in mine if key in theirs and theirs[key] != mine[key]]
    if "inner" in now:
        changed += _changed_options(saved.get("inner"), now["inner"])
    return changed


def set_before_steps(parts: Run) -> set[str]:
    """The names of the optimizer's scalar variables that the run sets before its steps, whatever the code set them
    to: a kfit ``LearningRateSchedule``'s or ``MomentumSchedule``'s, and, where the run's clock drives its steps, the
    minibatch size (kfit's ``MomentumSGD``)."""
    from kfit.optimizers import minibatch_size_variable

    found = [getattr(callback, "scheduled_variable", None) for callback in parts.callbacks]
    optimizer = getattr(parts.model, "optimizer", None)
    if parts.driver is not None and optimizer is not None:
        found.append(minibatch_size_variable(optimizer))
    return {_name(variable) for variable in found if variable is not None}


def _name(variable: Any) -> str:
    return variable.path.rsplit("/", 1)[-1]


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def collect(parts: Run, buffers: dict | None = None, epoch: int | None = None,
            epoch_logs: dict | None = None, workers: int = 1,
            worker_metrics: list | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The run's state as ``(arrays, meta)`` for :func:`kfit.checkpoint._format.write_file`.

    Args:
        parts: what to save.
        buffers: host buffers to copy the variables into (kept between calls, so a copy never pays for fresh
            memory); None returns views of the variables, valid until the next training step.
        epoch, epoch_logs: the epoch that just ended and its logs, when saving at an epoch end.
        workers: the number of workers training (each keeps the training metrics of its own share).
        worker_metrics: every worker's metric variables, ``[rank][i]`` (``kfit.distributed._state.gather_arrays``),
            stored beside this process's own (rank 0's) as ``worker_metrics/<rank>/<i>``; None: only rank 0's.
    """
    import kfit

    model = parts.model
    _backend.sync_model(model)
    arrays: dict[str, np.ndarray] = {}
    variables = model_variables(model)
    paths = {}
    for group in GROUPS:
        paths[group] = [v.path for v in variables[group]]
        for i, variable in enumerate(variables[group]):
            arrays[f"{group}/{i}"] = _host(variable, f"{group}/{i}", buffers)
    for rank, values in enumerate(worker_metrics or []):
        for i, value in enumerate(values if rank else []):  # (rank 0's are the "metrics" group's)
            arrays[f"{WORKER_METRICS}/{rank}/{i}"] = np.array(value, copy=True)
    callback_states = {
        key: _encode(callback.get_state(), arrays, "callbacks", f"The state of callback {key!r}")
        for key, callback in stateful_callbacks(parts.callbacks).items()
    }
    history = _history_state(parts.history, arrays, epoch, epoch_logs)
    optimizer = getattr(model, "optimizer", None)
    meta = {
        "kfit_version": kfit.__version__,
        "keras_version": keras.__version__,
        "backend": _backend.BACKEND,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "kfit_fit": parts.kfit_fit,
        "model": {"name": model.name, "class": type(model).__name__, **_model_names(model)},
        "optimizer": None if optimizer is None else optimizer_description(optimizer),
        "variables": paths,
        "workers": {"count": workers, "metric_states": len(worker_metrics) if worker_metrics else 1},
        "clock": None if parts.clock is None else _encode(parts.clock.get_state(), arrays, "clock", "clock"),
        "stream": None if parts.stream is None else _encode(parts.stream.get_state(), arrays, "stream", "stream"),
        "callbacks": callback_states,
        "history": history,
        "rng": _random_state(arrays),
        "summary": _summary(parts, variables, None if history is None else history["history"], epoch_logs),
    }
    return arrays, meta


# -- restoring -----------------------------------------------------------------------------------------
def _normalized(path: str) -> str:
    """``sequential_1/dense_2/kernel`` -> ``sequential/dense/kernel``: Keras numbers layers it auto-names."""
    return re.sub(r"_\d+(?=/|_|$)", "", path)


def _model_names(model: Any) -> dict[str, list[str]]:
    """The names that make the model's log keys: its outputs' and its metrics' (:func:`_backend.metric_names`)."""
    return {"outputs": list(getattr(model, "output_names", None) or []), "metrics": _backend.metric_names(model)}


def _renamed_keys(saved: dict, now: dict) -> Any:
    """The map of the saved model's log keys to this model's (a function of a key; None where none is renamed), where
    the names of outputs (``dense_1_loss``, ``val_dense_1_mae``) or metrics (``auc`` in ``val_auc``) differ only in
    Keras's automatic numbering, place by place: the same model built again in one process (a notebook cell run
    again) names its outputs ``dense_4``... and its ``keras.metrics.AUC()`` ``auc_1``... ``saved``, ``now``: the
    models' ``outputs`` and ``metrics`` (names in order, as a checkpoint's metadata holds them).

    >>> renamed = _renamed_keys({"metrics": ["auc", "accuracy"]}, {"outputs": [], "metrics": ["auc_1", "accuracy"]})
    >>> [renamed(key) for key in ("auc", "val_auc", "accuracy", "loss")]
    ['auc_1', 'val_auc_1', 'accuracy', 'loss']
    """
    outputs = _renames(saved.get("outputs"), now["outputs"], _normalized)
    metrics = _renames(saved.get("metrics"), now["metrics"], lambda name: re.sub(r"_\d+$", "", name))
    if not outputs and not metrics:
        return None
    # An output's name begins a key or follows a prefix ("val_", "minibatch/"); a metric's ends one. The longest
    # first ("my_dense_1" before "dense_1").
    def alternatives(renames: dict) -> str:
        return "|".join(map(re.escape, sorted(renames, key=len, reverse=True))) or "(?!)"

    output, metric = (re.compile(r"(?<![^_/])(" + alternatives(outputs) + ")_"),
                      re.compile(r"(?<![^_/])(" + alternatives(metrics) + ")$"))
    return lambda key: metric.sub(lambda match: metrics[match.group(1)], output.sub(
        lambda match: outputs[match.group(1)] + "_", key, count=1), count=1)


def _renames(saved: list[str] | None, now: list[str], unnumbered: Any) -> dict[str, str]:
    """``{saved name: this model's}`` for the names that differ, when every name differs at most in its numbering."""
    if saved is None or len(saved) != len(now) or any(unnumbered(a) != unnumbered(b) for a, b in zip(saved, now)):
        return {}
    return {old: new for old, new in zip(saved, now) if old != new}


def _history_renamed(history: dict, renamed: Any) -> dict:
    """The restored history with its keys renamed (:func:`_renamed_keys`): its lists go on under the names this run
    logs, as one run's would."""
    if renamed is None:
        return history
    history = dict(history, history={renamed(key): values for key, values in history["history"].items()})
    if history.get("partial_keys") is not None:
        history["partial_keys"] = [renamed(key) for key in history["partial_keys"]]
    return history


def _describe(path: str, shape: Any, dtype: str) -> str:
    return f"{path!r} (shape {tuple(shape)}, {dtype})"


#: The ends of the names of the optimizer variables that an option adds (Keras's names).
_OPTION_VARIABLES = {"_gradient_accumulator": "gradient_accumulation_steps", "_average": "use_ema",
                     "_velocity_hat": "amsgrad"}


def _option_hint(group: str, mine: str, theirs: str) -> str:
    """Where one of two optimizer variables met in one place is one that an option adds and the other is not: that
    option, and which optimizer has it (a run resumed with other optimizer options); else ''."""
    for end, option in _OPTION_VARIABLES.items() if group == "optimizer" else ():
        if mine.endswith(end) != theirs.endswith(end):
            has, lacks = ("this model's", "the checkpoint's") if mine.endswith(end) else ("the checkpoint's", "this model's")
            return (f" (a variable of the optimizer option `{option}`: {has} optimizer has it, {lacks} not; compile "
                    f"with the optimizer options of the run that saved it)")
    return ""


def _match_group(group: str, variables: list, saved: list[str], arrays: dict, file: str) -> list[tuple[Any, np.ndarray]]:
    """Pairs each variable with its array, by path, else by position when the paths differ only in Keras's
    automatic numbering (a model built twice in one process). Raises naming the first variable that differs."""
    current = [v.path for v in variables]
    stored = [arrays[f"{group}/{i}"] for i in range(len(saved))]
    if len(set(current)) == len(current) == len(set(saved)) == len(saved) and set(current) == set(saved):
        where = {path: i for i, path in enumerate(saved)}
        order = [where[path] for path in current]
    else:
        order = list(range(len(current)))
        for i, v in enumerate(variables):
            mine = _describe(v.path, v.shape, keras.backend.standardize_dtype(v.dtype))
            if i >= len(saved):
                problem = (f"{group} variable {mine} is not in it (it holds only {len(saved)} {group} variables)"
                           + _option_hint(group, v.path, ""))
            elif _normalized(v.path) != _normalized(saved[i]) or tuple(v.shape) != stored[i].shape:
                theirs = _describe(saved[i], stored[i].shape, stored[i].dtype.name)
                problem = (f"{group} variable {mine} differs from the checkpoint's {theirs} in its place"
                           + _option_hint(group, v.path, saved[i]))
            else:
                continue
            raise CheckpointMismatchError(
                f"The checkpoint {file!r} does not fit this model: {problem}. Restore into a model (and "
                "optimizer) built like the one that saved it."
            )
        if len(saved) > len(current):
            raise CheckpointMismatchError(
                f"The checkpoint {file!r} does not fit this model: it holds {len(saved)} {group} variables and "
                f"the model {len(current)}; the first one the model lacks is {saved[len(current)]!r}"
                f"{_option_hint(group, '', saved[len(current)])}. Restore into "
                "a model (and optimizer) built like the one that saved it."
            )
    return [(variable, _fit_array(group, variable, saved[index], stored[index], file))
            for variable, index in zip(variables, order, strict=True)]


def _fit_array(group: str, variable: Any, saved_path: str, array: np.ndarray, file: str) -> np.ndarray:
    dtype = keras.backend.standardize_dtype(variable.dtype)
    saved_as = "" if saved_path == variable.path else f", saved as {saved_path!r}"
    if tuple(variable.shape) != array.shape:
        raise CheckpointMismatchError(
            f"The checkpoint {file!r} does not fit this model: {group} variable {variable.path!r} has shape "
            f"{tuple(variable.shape)} in the model and {array.shape} in the checkpoint{saved_as}. Restore into "
            "a model built like the one that saved it."
        )
    if array.dtype.name != dtype:
        converted = array.astype(dtype)
        if not np.array_equal(converted.astype(array.dtype), array, equal_nan=array.dtype.kind == "f"):
            raise CheckpointMismatchError(
                f"The checkpoint {file!r} does not fit this model: {group} variable {variable.path!r} is "
                f"{dtype} in the model and {array.dtype.name} in the checkpoint{saved_as}, and its values do not "
                "convert exactly. Restore into a model with the same dtypes (mixed-precision policy)."
            )
        array = converted
    return array


@dataclass
class _Restore:
    """Everything validated and ready to assign."""

    assignments: list = field(default_factory=list)
    callback_states: list = field(default_factory=list)
    stream_state: dict | None = None
    clock_state: dict | None = None
    history: dict | None = None
    notes: list = field(default_factory=list)
    noted: list = field(default_factory=list)  # the callbacks whose restore_note is among the notes
    renamed: Any = None  # the saved model's log keys -> this one's, where Keras renumbered outputs or metrics
    file: str = ""
    reset_metrics: bool = False  # this worker's training metrics start from their reset state


def _a(name: str) -> str:
    """``Adam`` -> ``an Adam``, ``SGD`` -> ``an SGD``, ``MomentumSGD`` -> ``a MomentumSGD``."""
    return ("an " if name[:1] in "AEIOU" or name.startswith(("SGD", "RMS")) else "a ") + name


def _policy_name(model: Any) -> str:
    policy = getattr(model, "dtype_policy", None)
    return getattr(policy, "name", None) or keras.config.dtype_policy().name


def _build_optimizer(model: Any, meta: dict, file: str) -> None:
    optimizer = getattr(model, "optimizer", None)
    saved = meta.get("optimizer")
    if saved is None or optimizer is None:
        if saved is not None and meta["variables"]["optimizer"]:
            raise CheckpointMismatchError(
                f"The checkpoint {file!r} holds the state of {_a(saved['class'])} optimizer, and the model has no "
                "optimizer. Compile the model with the optimizer it was trained with before restoring."
            )
        return
    if saved["class"] != type(optimizer).__name__:
        scaled = "LossScaleOptimizer" in (saved["class"], type(optimizer).__name__)
        raise CheckpointMismatchError(
            f"The checkpoint {file!r} was saved with {_a(saved['class'])} optimizer, and this model's optimizer is "
            f"{_a(type(optimizer).__name__)}. Compile the model with the optimizer it was trained with"
            + (" and under the dtype policy it was trained under (Keras wraps the optimizer in a LossScaleOptimizer "
               f"under the mixed_float16 policy; this model's policy is {_policy_name(model)!r})." if scaled else ".")
        )
    inner, saved_inner = getattr(optimizer, "inner_optimizer", None), saved.get("inner")  # (older files: none)
    if inner is not None and saved_inner is not None and saved_inner.get("class") != type(inner).__name__:
        raise CheckpointMismatchError(
            f"The checkpoint {file!r} was saved with {_a(saved['class'])} wrapping {_a(saved_inner['class'])} "
            f"optimizer, and this model's {saved['class']} wraps {_a(type(inner).__name__)}. Compile the model with "
            "the optimizer it was trained with."
        )
    if not optimizer.built and meta["variables"]["optimizer"]:
        if not model.trainable_variables:
            return  # the model check reports the unbuilt model
        optimizer.build(model.trainable_variables)


def _worker_metrics(model: Any, variables: list, meta: dict, arrays: dict, file: str, rank: int,
                    size: int) -> tuple[list | None, list[str]]:
    """``(pairs, notes)``: this worker's training-metric variables paired with their saved values, or None where they
    start from their reset state.

    Each worker keeps the metrics of its own share, and the epoch's logs combine the workers' results weighted by
    the samples each trained. On as many workers as saved the checkpoint, each gets its own state back (exact).
    On another number, worker 0 gets the sum of the saved states and the others start at zero: for a metric
    whose state is a sum over samples (the loss, a mean, an accuracy) the combined result is then the one over
    every sample the epoch trained, up to float rounding. A metric with another kind of state goes on from saved
    worker 0's alone (a note names it)."""
    saved = meta["variables"]["metrics"]
    workers = meta.get("workers") or {"count": 1, "metric_states": 1}  # (older files: rank 0's state, as one worker's)
    count, known = workers["count"], workers["metric_states"]

    def state(r: int) -> dict:
        return {f"metrics/{i}": arrays[f"metrics/{i}" if r == 0 else f"{WORKER_METRICS}/{r}/{i}"] for i in range(len(saved))}

    first = _match_group("metrics", variables, saved, state(0), file)  # (checked on every worker alike)
    notes = []
    if known < count and rank == 0 and (meta.get("summary") or {}).get("samples_in_epoch", 1):  # (inside an epoch)
        notes.append(
            f"The checkpoint {file!r} holds the training metrics of worker 0 only, of the {count} workers that "
            "trained (the others could not gather theirs: a Checkpoint that not every worker was given, or a file "
            "of an older kfit): the training metrics of the epoch it resumes in leave out what the other workers "
            "trained in it before the checkpoint."
        )
    if count == size:
        return (_match_group("metrics", variables, saved, state(rank), file) if rank < known else None), notes
    if rank != 0:
        return None, notes
    if known == 1:
        return first, notes
    summed = {name: np.sum([state(r)[name].astype(np.float64) for r in range(known)], axis=0).astype(array.dtype)
              for name, array in state(0).items()}
    from kfit.distributed import _evaluation

    additive = {id(v) for v in _evaluation.additive_metric_variables(model)}
    pairs, alone = [], []
    for (variable, value), (_, total) in zip(first, _match_group("metrics", variables, saved, summed, file), strict=True):
        pairs.append((variable, total if id(variable) in additive else value))
        if id(variable) not in additive:
            alone.append(variable.path)
    if alone:
        notes.append(
            f"The checkpoint {file!r} was written by {count} workers and is resumed on {size}: the metric variables "
            f"{alone} do not hold sums over samples, so the epoch it resumes in counts, of what was trained in it "
            "before the checkpoint, only saved worker 0's share in them."
        )
    return pairs, notes


def plan_restore(parts: Run, meta: dict, arrays: dict, file: str, metrics: bool = True, rank: int = 0,
                 size: int = 1, fresh: bool = True) -> _Restore:
    """Checks that the checkpoint fits the run and prepares every assignment; changes nothing.

    With ``metrics`` the metric variables are restored too, when they fit (a note says so otherwise): worker
    ``rank`` of ``size`` gets its share of the saved workers' training metrics (see :func:`_worker_metrics`).
    ``fresh``: the callbacks have just started afresh (a resume as training begins), and one the file holds no state
    for goes on so; else (``kfit.load_checkpoint``) it keeps the state it has. The note says which.
    """
    model = parts.model
    restore = _Restore(file=file)
    written = [(f"on the {meta.get('backend')} backend", f"on {_backend.BACKEND}")] * (meta.get("backend") != _backend.BACKEND)
    written += [(f"under Keras {meta['keras_version']}", f"under Keras {keras.__version__}")] * (
        meta["keras_version"] != keras.__version__)
    if written:
        restore.notes.append(
            f"The checkpoint {file!r} was written {', '.join(w for w, _ in written)} and is restored "
            f"{', '.join(h for _, h in written)}: the run goes on from the same weights, but not bit-identically."
        )
    if meta["variables"]["model"] and not model.variables:
        if getattr(model, "built", False):  # a build() of its own that creates no variable (nor its layers')
            raise CheckpointMismatchError(
                f"The model has no variables, so the checkpoint {file!r} cannot be restored into it: it is built, "
                "but its build() created none (a subclassed model's layers are built when it is first called). "
                "Call it on a batch first, then restore."
            )
        raise CheckpointMismatchError(
            f"The model is not built, so the checkpoint {file!r} cannot be restored into it. Build it first "
            "(model.build(input_shape), or call it on a batch), then restore."
        )
    _build_optimizer(model, meta, file)
    variables = model_variables(model)
    summary = meta.get("summary") or {}
    in_code, saved = summary.get("hyperparameters_in_code") or {}, summary.get("hyperparameters", {})
    now = parts.hyperparameters_in_code or hyperparameters(variables["optimizer"])  # (not what a last run left)
    # (an unchanged value, or one that a schedule or ReduceLROnPlateau moved since, is no change in code; nor is a
    # value that this run's schedules or clock set before every step: the code's plays no part)
    scheduled = set_before_steps(parts)
    changed = [name for name in in_code if name in now and name in saved and name not in scheduled
               and now[name] not in (in_code[name], saved[name])]
    if changed:
        restore.notes.append(
            f"This code sets the optimizer's {', '.join(f'{n}={now[n]:g}' for n in changed)}; the run that wrote the "
            f"checkpoint {file!r} set {', '.join(f'{n}={in_code[n]:g}' for n in changed)}, and the checkpoint's "
            f"{', '.join(f'{n}={saved[n]:g}' for n in changed)} is restored, so that the run goes on as it was. To "
            f"train with the new value, assign it once the run has resumed (e.g. "
            f"model.optimizer.{changed[0]}.assign({now[changed[0]]:g}) in a callback's on_epoch_begin), or start over "
            "(restore=False)."
        )
    optimizer = getattr(model, "optimizer", None)
    options = [] if optimizer is None else _changed_options(meta.get("optimizer"), optimizer_description(optimizer))
    if options:
        restore.notes.append(
            f"The run that wrote the checkpoint {file!r} used the optimizer's "
            f"{', '.join(f'{n}={_option_text(theirs)}' for n, theirs, _ in options)}; this code uses "
            f"{', '.join(f'{n}={_option_text(mine)}' for n, _, mine in options)}: the resumed run follows the code. "
            "To go on as the run began, compile the optimizer with the options it used."
        )
    for group in ("model", "optimizer"):
        restore.assignments += _match_group(group, variables[group], meta["variables"][group], arrays, file)
    if metrics and meta["variables"]["metrics"] and variables["metrics"]:  # unbuilt metrics: nothing to restore
        try:
            pairs, notes = _worker_metrics(model, variables["metrics"], meta, arrays, file, rank, size)
        except CheckpointMismatchError as mismatch:
            if _backend.compiled_metrics_unbuilt(model):  # a model compiled anew, before its first step
                if (meta.get("summary") or {}).get("samples_in_epoch"):  # (at an epoch's end nothing is lost)
                    restore.notes.append(
                        f"The training metrics of the checkpoint {file!r} are not restored (they start afresh): "
                        "this model's compiled metrics are not built yet (Keras builds them at the first training "
                        "or evaluation step), so the epoch it resumes in leaves out what was trained in it before "
                        "the checkpoint. To restore them, evaluate the model on one batch before restoring.")
            else:
                restore.notes.append(f"The training metrics are not restored (they start afresh): {mismatch}")
        else:
            restore.notes += notes
            restore.assignments += pairs or []
            restore.reset_metrics = pairs is None

    saved_stream = meta.get("stream") or None
    if saved_stream is not None and parts.stream is not None and (
            saved_stream.get("kind", "stream") != getattr(parts.stream, "state_kind", "stream")):
        # Saved on a tf.data pipeline and resumed on arrays (or the other way): the clock positions the data.
        restore.notes.append("The data's saved position is for another kind of data source: the clock positions it.")
        saved_stream = None
    if parts.stream is not None and saved_stream is not None:
        saved, have = saved_stream.get("num_samples"), parts.stream.num_samples
        if saved is not None and saved != have:
            raise CheckpointMismatchError(
                f"The checkpoint {file!r} was taken on training data of {saved} samples, and this run's data holds "
                f"{have}. Resume with the same training data (the stream's position would mean other samples)."
            )
        changed = [f"{key}={saved_stream[key]!r} (this run asked for {key}={getattr(parts.stream, key)!r})"
                   for key in ("seed", "shuffle") if saved_stream.get(key) is not None
                   and getattr(parts.stream, key, None) is not None and saved_stream[key] != getattr(parts.stream, key)]
        if changed:
            restore.notes.append(
                f"The checkpoint {file!r} was taken reading the training data with {' and '.join(changed)}: the "
                "checkpoint's order is kept, so that the run goes on as it began. To read the data in the new "
                "order, start over (restore=False).")
        restore.stream_state = _decoded(meta["stream"], arrays, file, "the stream's state")

    if parts.clock is not None and meta.get("clock"):
        state = dict(_decoded(meta["clock"], arrays, file, "the clock's state"))
        have = parts.clock.epoch_size
        if have and state.get("epoch_size") and state["epoch_size"] != have:
            restore.notes.append(
                f"The checkpoint {file!r} was taken with epoch_size={state['epoch_size']}; this run uses "
                f"epoch_size={have}, which is kept (epochs are counted from it from now on)."
            )
            state["epoch_size"] = have
        restore.clock_state = state

    restore.renamed = _renamed_keys(meta["model"], _model_names(model))
    saved_states = meta.get("callbacks") or {}
    keyed = stateful_callbacks(parts.callbacks)
    for key, callback in keyed.items():
        if key in saved_states:
            state = _decoded(saved_states[key], arrays, file, f"the state of {key!r}")
            if restore.renamed is not None and callable(getattr(callback, "renamed_state", None)):
                state = callback.renamed_state(state, restore.renamed)  # (its log keys under this run's names)
            restore.callback_states.append((callback, state))
            note = callback.restore_note(state, file) if callable(getattr(callback, "restore_note", None)) else None
            if note:
                restore.notes.append(note)
                restore.noted.append(callback)
        # (A file saved without callbacks: no note for each. A callback with its own _put_back, a kfit schedule, always
        # has a state, and its get_state refuses a reset to a Python callable, which a load need not save.)
        elif saved_states and (callable(getattr(callback, "_put_back", None)) or callback.get_state()):
            restore.notes.append(f"The checkpoint {file!r} holds no state for callback {key!r}: "
                                 + ("it starts afresh." if fresh else "it keeps the state it has."))
    unused = sorted(set(saved_states) - set(keyed))
    if unused and keyed:  # (not for load_checkpoint(path, model) outside a run: no callbacks asked for)
        restore.notes.append(f"The checkpoint {file!r} holds the state of callbacks {unused}, which this run does not have.")
    if parts.history is not None and meta.get("history"):
        restore.history = _history_renamed(_decoded(meta["history"], arrays, file, "the history"), restore.renamed)
    return restore


def apply_restore(parts: Run, restore: _Restore, meta: dict, arrays: dict, random_state: bool = True) -> None:
    """Assigns a validated restore, all or nothing.

    The parts that can still refuse their state (the random states, the callbacks, the stream, the clock)
    are set first, and put back as they were if one refuses; the variables, which were checked by
    :func:`plan_restore`, are assigned last.

    Raises:
        CheckpointMismatchError: a part refused its saved state (naming it); nothing was changed.
    """
    undo: list = []
    part = ""
    try:
        if random_state:
            part = "the random states"
            undo.append(_random_state_setter(_current_random_state()))
            _set_random_state(meta["rng"], arrays)
        for callback, state in restore.callback_states:
            part = f"callback {state_key(callback)!r}"
            undo.append(_put_back(callback))
            callback.set_state(state)
        for name, owner, state in (("the data stream", parts.stream, restore.stream_state),
                                   ("the clock", parts.clock, restore.clock_state)):
            if state is not None:
                part = name
                undo.append(_put_back(owner))
                owner.set_state(state)
    except Exception as error:
        for put_back in reversed(undo):
            put_back()
        raise CheckpointMismatchError(
            f"The checkpoint {restore.file!r} cannot be restored: {part} refused its saved state "
            f"({type(error).__name__}: {error}). Nothing was changed."
        ) from error
    model = parts.model
    _backend.sync_model(model)
    if restore.reset_metrics:
        model.reset_metrics()
    for variable, array in restore.assignments:
        variable.assign(array)
    _set_again_before_next_step(current_run(model))
    parts.renamed_keys = restore.renamed
    if restore.history is not None:
        parts.history.history = {k: list(v) for k, v in restore.history["history"].items()}
        parts.history.epoch = list(restore.history["epoch"])
    for note in restore.notes:
        warn_job(note, stacklevel=3)


def _set_again_before_next_step(run: Run | None) -> None:
    """After a restore into a run in progress (``load_checkpoint`` from a callback or a custom loop), the optimizer's
    minibatch size and scheduled values hold the checkpoint's: the run's clock driver and schedules, which set a value
    only where it differs from the one they set last, set theirs again before the next step (nothing per step)."""
    if run is None:
        return
    if run.driver is not None:
        run.driver.applied = None
    run.set_values_again()


def _put_back(callback: Any):
    """What puts ``callback``'s state back as it is now: its own ``_put_back()`` where it has one (a kfit schedule,
    whose ``get_state`` refuses a reset to a Python callable, which only a checkpoint cannot hold), else its
    ``get_state()``, set again."""
    own = getattr(callback, "_put_back", None)
    return own() if callable(own) else functools.partial(callback.set_state, callback.get_state())


def _current_random_state() -> tuple:
    torch_state = None
    if _backend.BACKEND == "torch":
        import torch

        torch_state = torch.get_rng_state()
    return np.random.get_state(), random.getstate(), torch_state, _backend.global_seed_state()


def _random_state_setter(saved: tuple):
    def put_back() -> None:
        numpy_state, python_state, torch_state, keras_global = saved
        np.random.set_state(numpy_state)
        random.setstate(python_state)
        if keras_global is not None:
            _backend.set_global_seed_state(keras_global)
        if torch_state is not None:
            import torch

            torch.set_rng_state(torch_state)
    return put_back


def _set_random_state(state: dict, arrays: dict) -> None:
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["algorithm"], arrays["rng/numpy"].astype(np.uint32), numpy_state["pos"],
                         numpy_state["has_gauss"], numpy_state["gauss"]))
    python_state = state["python"]
    random.setstate((python_state["version"], tuple(int(v) for v in arrays["rng/python"]), python_state["gauss_next"]))
    if _backend.BACKEND == "torch" and "rng/torch" in arrays:
        import torch

        torch.set_rng_state(torch.from_numpy(np.ascontiguousarray(arrays["rng/torch"], dtype=np.uint8)))
    if "rng/keras_global" in arrays:
        _backend.set_global_seed_state(arrays["rng/keras_global"])
