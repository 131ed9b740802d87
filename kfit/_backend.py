"""Every difference between the TensorFlow, JAX and PyTorch backends that kfit cares about, in one place.

The rest of kfit speaks public Keras API and ``keras.ops``. What cannot be said that way lives here:

* building a model before ``model.fit`` runs, and telling ``model.fit`` which epoch to start from;
* Keras's ``DataAdapter`` base class (``model.fit`` trains on kfit's stream through one);
* on JAX, ``model.fit`` holds the model's state outside the Keras variables; a hyperparameter change
  must reach that state without forcing a full state sync at every step;
* converting a host (NumPy) batch to the backend's tensors.

Versions: "checked against Keras 3.10-3.15" in a note below means the releases kfit's core tests (the files of
``KFIT_OLDEST_KERAS_TESTS=all bash scripts/test_oldest_keras.sh``) were run on: Keras 3.10.0 (the oldest
``pyproject.toml`` allows), 3.11.3, 3.12.4, 3.13.2, 3.14.1 and 3.15.1, on JAX for each; on TensorFlow and PyTorch
for 3.10.0, 3.12.4, 3.14.1 and 3.15.1 (TensorFlow 2.21, 2.20 for 3.10). CI runs the oldest and the newest only.
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import keras
import numpy as np

BACKEND = keras.backend.backend()


def to_tensors(batch: Any) -> Any:
    """Converts a (nested) batch of NumPy arrays to the backend's tensors (safe on a reader thread)."""
    if BACKEND == "jax":
        import jax

        return jax.tree_util.tree_map(jax.device_put, batch)
    return keras.tree.map_structure(
        lambda a: None if a is None else keras.ops.convert_to_tensor(a), batch
    )


_GROUPS = ("trainable_variables", "non_trainable_variables", "optimizer_variables", "metrics_variables")

# Writes waiting for the next step of Keras's JAX loop: model -> {id(variable): (group, index, value)}.
# Kept beside the model (weakly), never on it.
_pending_writes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_positions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {id(variable): (group, index)}


def _group_variables(model: Any) -> tuple[list, list, list, list]:
    optimizer = getattr(model, "optimizer", None)
    return (model.trainable_variables, model.non_trainable_variables,
            list(optimizer.variables) if optimizer is not None else [], model.metrics_variables)


def _position(model: Any, variable: Any) -> tuple[int, int] | None:
    """``(group, index)`` of ``variable`` in the state Keras's JAX loop holds; a table made once per run."""
    table = _positions.get(model)
    if table is None:
        table = {id(v): (g, i) for g, group in enumerate(_group_variables(model)) for i, v in enumerate(group)}
        if model in _pending_writes:  # the run's variables are fixed until hold_writes is released
            _positions[model] = table
    return table.get(id(variable))


def _state_is_held(model: Any) -> bool:
    """True between two steps of ``model.fit`` on JAX: the state lives outside the Keras variables."""
    return bool(getattr(model, "_jax_state", None)) and not getattr(model, "_jax_state_synced", True)


def hold_writes(model: Any) -> Callable[[], None]:
    """Lets :func:`set_variable` reach the state Keras's JAX loop hands its next step (no-op off JAX).

    Keras's JAX ``fit`` keeps the training state in a local variable between steps; a callback can only
    reach it through a full sync. Instead, ``model.train_function`` (built before ``on_train_begin``) is
    wrapped to write the pending values into the state it receives, and ``model.jax_state_sync`` (which any
    callback's ``self.model`` calls) to write them into the Keras variables, so that a callback reading a variable
    sees the value set for the next step, as under ``model.fit``. Returns the function that unwraps both.
    The unwrapping also lets go of Keras's function: what still holds the wrapper after training (kfit's run, in a
    reference cycle with a generator Keras's loop left suspended when it read ahead: Keras 3.10-3.14, and 3.15 off
    CPU) would otherwise keep the jitted ``train_step`` alive, and with it its traces in JAX's caches, where the step
    of the model compiled again (other metrics) would find them. ``train_function(state, iterator)`` and
    ``jax_state_sync()`` are Keras internals, checked against Keras 3.10.0, 3.11.3, 3.12.4, 3.13.2, 3.14.1 and 3.15.1.
    """
    if BACKEND != "jax" or getattr(model, "train_function", None) is None:
        return lambda: None
    original = model.train_function  # (let go of by release)
    writes = _pending_writes.setdefault(model, {})

    def train_function(state: Any, iterator: Any) -> Any:
        if writes:
            import jax.numpy as jnp

            groups = [list(g) for g in state]
            for group, index, value in writes.values():
                groups[group][index] = jnp.asarray(value, dtype=groups[group][index].dtype)
            writes.clear()
            state = tuple(groups)
        try:
            return original(state, iterator)
        except BaseException:
            if getattr(model, "_jax_state", None) is None:
                # The run's first step failed (a shape error in the data, say): Keras has taken the values out of the
                # variables (``purge_model_variables``) and its final sync has no state to put back, which would
                # leave the model unusable. They go back as they were, as after model.fit's own early failure.
                for variables, values in zip(_group_variables(model), state):
                    for variable, value in zip(variables, values):
                        variable.assign(value)
            raise

    model.train_function = train_function
    keras_sync = model.jax_state_sync

    def jax_state_sync() -> None:
        keras_sync()
        if writes:  # the variables now hold the state, and the next step reads them
            groups = _group_variables(model)
            for group, index, value in writes.values():
                groups[group][index].assign(value)
            writes.clear()

    object.__setattr__(model, "jax_state_sync", jax_state_sync)

    def release() -> None:
        nonlocal original
        if model.train_function is train_function:
            model.train_function = original
        original = None
        if vars(model).get("jax_state_sync") is jax_state_sync:
            del vars(model)["jax_state_sync"]
        _pending_writes.pop(model, None)
        _positions.pop(model, None)

    return release


def after_each_train_call(model: Any, done: Callable[[], None]) -> Callable[[], None]:
    """Calls ``done()`` each time ``model.train_function`` (made by ``model.fit`` before ``on_train_begin``) returns:
    the steps Keras began at its last ``on_train_batch_begin`` have run (a call that raises, finding the data ended,
    has not). Returns the function that unwraps it. A wrapper that a run ended by an error left is replaced, not
    wrapped again. ``train_function`` is what the loops of Keras's three trainers call, checked against Keras 3.15.
    """
    original = model.train_function
    original = getattr(original, "_kfit_unwrapped", original)

    def train_function(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        done()
        return result

    train_function._kfit_unwrapped = original
    model.train_function = train_function

    def release() -> None:
        if model.train_function is train_function:
            model.train_function = original

    return release


def set_variable(model: Any, variable: Any, value: Any) -> None:
    """Assigns ``value`` to a model or optimizer ``variable`` during training.

    On TensorFlow and PyTorch this is ``variable.assign``. On JAX, between the steps of ``model.fit``, the
    state lives outside the Keras variables: the value is handed to the next step (see :func:`hold_writes`);
    without that hook the state is synced into the variables first, and Keras re-reads it.
    """
    if BACKEND == "jax":
        writes = _pending_writes.get(model)
        if _state_is_held(model):
            where = _position(model, variable) if writes is not None else None
            if where is not None:
                writes[id(variable)] = (*where, value)
                return
            model.jax_state_sync()
        elif writes:
            writes.pop(id(variable), None)  # the variable itself holds the newer value: no older write after it
    variable.assign(value)


def read_variable(model: Any, variable: Any) -> np.ndarray:
    """Reads a variable's current value during training (see :func:`set_variable`)."""
    if BACKEND == "jax":
        pending = _pending_writes.get(model, {}).get(id(variable))
        if pending is not None:
            return np.asarray(pending[2])
        if _state_is_held(model):
            where = _position(model, variable)
            if where is not None:
                return np.asarray(model._jax_state[_GROUPS[where[0]]][where[1]])
    return to_numpy(variable.value)


def to_numpy(value: Any) -> np.ndarray:
    """``keras.ops.convert_to_numpy(value)`` without NumPy 2's ``DeprecationWarning`` for an ``__array__`` that takes
    no ``copy=`` (TensorFlow's and PyTorch's tensors, Keras's variables), which ``model.fit`` does not give where kfit
    reads a value (NumPy 2.x, TensorFlow 2.21, torch 2.13, Keras 3.10-3.15)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "__array__ implementation", DeprecationWarning)
        return keras.ops.convert_to_numpy(value)


def fit_in_progress(model: Any, thread_id: int | None) -> bool:
    """Whether a ``fit`` of ``model`` is running on the thread ``thread_id``: a frame of a method named ``fit`` whose
    ``self`` is ``model`` is on that thread's stack. Keras tells callbacks nothing when ``fit`` ends with an exception;
    this is how kfit knows, when it asks, that such a run is over. (The trainers' ``fit(self, ...)``, Keras 3.10-3.15.)"""
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    while frame is not None:
        if frame.f_code.co_name == "fit" and "self" in frame.f_code.co_varnames and frame.f_locals.get("self") is model:
            return True
        frame = frame.f_back
    return False


def sync_model(model: Any) -> None:
    """Makes the Keras variables hold the latest training state (a no-op off JAX)."""
    if BACKEND == "jax" and getattr(model, "_jax_state", None) and hasattr(model, "jax_state_sync"):
        model.jax_state_sync()  # (with the writes :func:`hold_writes` holds)


def before_empty_step(model: Any) -> None:
    """Keras is about to ask for a step whose data has ended (an epoch shorter than declared).

    Keras's JAX ``fit`` purges the variables before it finds the data ended, then restores them from
    ``model._jax_state``, which a ``model.evaluate`` inside a callback has set to None: the variables
    would stay purged. Holding the current values there makes the restore exact. Checked against
    Keras 3.10-3.15.
    """
    if BACKEND == "jax" and getattr(model, "_jax_state_synced", True) and not getattr(model, "_jax_state", None):
        optimizer = getattr(model, "optimizer", None)
        model._jax_state = {
            "trainable_variables": [v.value for v in model.trainable_variables],
            "non_trainable_variables": [v.value for v in model.non_trainable_variables],
            "optimizer_variables": [v.value for v in optimizer.variables] if optimizer is not None else [],
            "metrics_variables": [v.value for v in model.metrics_variables],
        }


@contextlib.contextmanager
def without_state_sharding_constraints(model: Any) -> Any:
    """While a train step is traced under ``jax.shard_map`` (kfit's JAX engine): Keras's own JAX ``train_step``
    leaves the state's sharding alone. Keras 3.10 ends its ``train_step`` with ``_enforce_jax_state_sharding``,
    which constrains every state variable to the single-device sharding recorded when ``fit`` began, a device set
    that contradicts the workers' mesh (JAX refuses the step: "incompatible devices"); inside ``shard_map`` each
    worker's state is its own, and no constraint is needed. Keras 3.12-3.15 make no such call (nothing to do). A Keras
    internal, checked against Keras 3.10.0 and 3.11.3 (present), 3.12.4, 3.13.2, 3.14.1 and 3.15.1 (absent)."""
    if not hasattr(model, "_enforce_jax_state_sharding"):
        yield
        return

    def unconstrained(trainable_variables: Any = None, non_trainable_variables: Any = None,
                      optimizer_variables: Any = None, metrics_variables: Any = None) -> tuple:
        return (trainable_variables or [], non_trainable_variables or [], optimizer_variables or [],
                metrics_variables or [])

    object.__setattr__(model, "_enforce_jax_state_sharding", unconstrained)
    try:
        yield
    finally:
        vars(model).pop("_enforce_jax_state_sharding", None)


def replace_train_function(model: Any, make_step: Callable[[Any], Callable]) -> None:
    """Makes ``model.fit`` (JAX) train with ``make_step(model.train_step)`` instead of ``jax.jit(train_step)``.

    ``make_step(train_step)`` returns ``step(state, data) -> (logs, state)``, called as Keras calls its jitted
    step; Keras's ``_make_function`` still drives it (``steps_per_execution``). The model's
    ``make_train_function`` is replaced on the instance (``model.fit`` calls it before ``on_train_begin``).
    ``make_train_function(force)``, ``_make_function(step)`` and ``train_function(state, iterator)`` are
    Keras internals, checked against Keras 3.10-3.15.
    """

    def make_train_function(force: bool = False) -> None:
        if model.train_function is not None and not force:
            return
        model.train_function = model._make_function(make_step(model.train_step))

    object.__setattr__(model, "make_train_function", make_train_function)


def exclude_padding_from_metrics(model: Any, padding: Callable[[], Any],
                                 metrics_split: Callable[[], tuple[list, list] | None],
                                 tracker_count: bool = True) -> None:
    """Takes padding rows out of the training metrics of a step that trains on a padded batch (JAX engine,
    ``pad_remainders``).

    ``padding()`` gives, while a step is traced, the number of padding rows at the end of the batch (a traced
    scalar: rows that are copies of the batch's last real row, with sample weight 0), else None. Keras's JAX
    ``train_step`` updates the loss tracker (``Mean`` of the minibatch loss weighted by the batch's rows: its
    ``count`` grows by the padding rows too) and then calls ``compute_metrics`` inside the ``StatelessScope``
    of the metric variables; ``compute_metrics`` is wrapped here. The loss tracker's count loses the padding rows
    (its total needs nothing: a zero-weight row adds 0). ``metrics_split()`` gives the compiled metrics as
    ``(additive, other)`` (None: a model's own ``train_step`` or ``compute_metrics``, left as they are): the
    contribution of the padding rows to an additive metric (its state a sum over samples), ``padding`` times that
    of the last row, is measured by updating the metrics once more on the last row and taken out; the other
    metrics keep their state of the padded batch. ``tracker_count=False`` leaves the loss tracker to the caller
    (a step whose loss trackers count the real rows themselves). ``_loss_tracker``, its ``count``, the call order inside
    ``train_step`` and the stateless scope are Keras internals, checked against Keras 3.10-3.15.
    """
    original = model.compute_metrics

    def compute_metrics(x: Any, y: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        pad = padding()
        logs = original(x, y, y_pred, sample_weight)
        if pad is None:
            return logs
        ops = keras.ops
        tracker = getattr(model, "_loss_tracker", None) if tracker_count else None
        if tracker is not None and isinstance(getattr(tracker, "count", None), keras.Variable):
            tracker.count.assign(tracker.count.value - ops.cast(pad, tracker.count.dtype))
        split = metrics_split()
        if split is None:
            return logs
        additive, other = split
        corrected = [v for m in additive for v in m.variables]
        kept = [v for m in other for v in m.variables]
        snapshot = lambda v: ops.copy(v.value)  # noqa: E731 (TensorFlow: a read of the value, not the variable)
        after = [snapshot(v) for v in corrected + kept]

        def last(structure: Any) -> Any:
            return keras.tree.map_structure(lambda a: None if a is None else a[-1:], structure)

        if corrected:
            original(last(x), last(y), last(y_pred), last(sample_weight))
        for variable, value in zip(corrected, after):
            once_more = snapshot(variable)
            variable.assign(value - ops.cast(pad, variable.dtype) * (once_more - value))
        for variable, value in zip(kept, after[len(corrected):]):
            variable.assign(value)
        return model.get_metrics_result()

    object.__setattr__(model, "compute_metrics", compute_metrics)


def loss_trackers(model: Any) -> list:
    """The ``Mean`` metrics Keras's train step updates with each minibatch's loss, weighted by its rows: the loss
    tracker, and one per output's loss for a model with several. ``_loss_tracker`` and ``CompileLoss.metrics`` are
    Keras internals, checked against Keras 3.10-3.15."""
    compile_loss = getattr(model, "_compile_loss", None)
    trackers = [getattr(model, "_loss_tracker", None), *(getattr(compile_loss, "metrics", None) or [])]
    return [t for t in trackers if t is not None]


def samples_counted_by_keras(model: Any) -> int | None:
    """The samples Keras's own ``train_step`` has counted since the epoch's metrics were reset: its loss tracker's
    ``count`` (each step adds the rows of its batch). None for a model with its own ``train_step`` (whose trackers
    count what it chooses) or no loss tracker. On JAX the model's state must have been synced first (read it
    through a callback's ``self.model``). ``_loss_tracker`` and its weighting by the batch's rows are Keras
    internals, checked against Keras 3.10-3.15."""
    step = getattr(type(model), "train_step", None)
    if not getattr(step, "__module__", "").startswith("keras.") or not step.__qualname__.endswith("Trainer.train_step"):
        return None
    count = getattr(getattr(model, "_loss_tracker", None), "count", None)
    if count is None:
        return None
    return int(round(float(to_numpy(count.value))))


def layers_that_added_losses(model: Any) -> list:
    """The layers of ``model`` (itself included) that added a loss with ``add_loss`` in the forward pass just run or
    traced (an activity regularizer is one): Keras keeps their ids (``_loss_ids``: JAX's stateless trace) or the
    losses themselves (``_losses``) until the next call. Keras internals, checked against Keras 3.10-3.15."""
    return [layer for layer in model._flatten_layers(include_self=True)
            if getattr(layer, "_loss_ids", None) or getattr(layer, "_losses", None)]


def loss_reductions(model: Any) -> list[tuple[str, str | None]]:
    """``(name, reduction)`` of each loss ``model.compile`` gave (built). ``CompileLoss._flat_losses`` (entries
    ``(path, loss, weight, name)``) is a Keras internal, checked against Keras 3.10-3.15."""
    compile_loss = getattr(model, "_compile_loss", None)
    found = []
    for entry in getattr(compile_loss, "_flat_losses", None) or []:
        loss = entry[1]
        found.append((getattr(loss, "name", None) or type(loss).__name__, getattr(loss, "reduction", None)))
    return found


def fit_reads_a_first_batch(model: Any) -> bool:
    """True when Keras's own ``fit`` would read one batch, from an iterator of its own, before its first epoch (to
    build the model symbolically): on JAX and PyTorch, while a layer, the compiled metrics or the compiled loss are
    not built (on TensorFlow it builds by tracing the first step, reading nothing more). Over a ``tf.data``
    pipeline that read draws the pipeline's next shuffle seed. Keras internal (``Trainer._symbolic_build``),
    checked against Keras 3.10-3.15."""
    if BACKEND == "tensorflow":
        return False
    metrics, loss = getattr(model, "_compile_metrics", None), getattr(model, "_compile_loss", None)
    return (not all(layer.built for layer in model._flatten_layers()) or (metrics is not None and not metrics.built)
            or (loss is not None and not loss.built))


def compiled_metrics_unbuilt(model: Any) -> bool:
    """True when the metrics given to ``compile`` have no variables yet (Keras builds them at the first training
    or evaluation step). Keras internal (``Trainer._compile_metrics``), checked against Keras 3.10-3.15."""
    metrics = getattr(model, "_compile_metrics", None)
    return metrics is not None and not metrics.built


def build(model: Any, batch: Any) -> None:
    """Builds the model, its metrics and its optimizer from one batch (as ``model.fit`` would on its first
    step), so that a checkpoint restored when training begins finds every variable.

    A model that cannot be built symbolically (a subclassed model with a ``train_step`` and no ``call()``)
    is left to ``model.fit``, which builds it on its first step as usual. ``Trainer._symbolic_build`` is a
    Keras internal, checked against Keras 3.10-3.15.
    """
    try:
        model._symbolic_build(data_batch=batch)
    except Exception:  # noqa: BLE001 -- model.fit builds such a model itself, and reports its own errors
        return
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)


def set_initial_epoch(model: Any, epoch: int | None) -> None:
    """The epoch ``model.fit`` starts from, when set during ``on_train_begin`` (None: the argument's).

    Keras reads ``model._initial_epoch`` after ``on_train_begin`` (its ``BackupAndRestore`` sets it the
    same way). Checked against Keras 3.10-3.15.
    """
    model._initial_epoch = epoch


def keras_data_adapter(x: Any, y: Any, sample_weight: Any, batch_size: Any, steps_per_epoch: Any, shuffle: Any,
                       class_weight: Any) -> Any:
    """Keras's own data adapter for ``x`` (``tf.data``, a generator, a torch ``DataLoader``...), as
    ``model.fit`` would make it. Checked against Keras 3.10-3.15."""
    from keras.src.trainers.data_adapters import get_data_adapter

    return get_data_adapter(x, y, sample_weight=sample_weight, batch_size=batch_size,
                            steps_per_epoch=steps_per_epoch, shuffle=shuffle, class_weight=class_weight)


def numpy_batches(adapter: Any) -> Any:
    """``adapter.get_numpy_iterator()``, the source's batches as NumPy arrays (kfit's look at a first batch).
    Keras 3.11-3.13's adapter for a Grain dataset imports Grain's ``SharedMemoryArrayMetadata`` from where Grain
    kept it before 0.2.16, so with a newer Grain that method fails (``model.fit`` reads the backend's iterator and
    trains); kfit then converts the dataset's batches as that method does. ``_dataset`` and
    ``data_adapter_utils.get_numpy_iterator`` are Keras internals, checked against Keras 3.11.3, 3.12.4 and 3.13.2
    (the old place only) and 3.14.1-3.15.1 (both places), with Grain 0.2.18."""
    try:
        return adapter.get_numpy_iterator()
    except ModuleNotFoundError:
        if type(adapter).__name__ != "GrainDatasetAdapter":
            raise
    from keras.src.trainers.data_adapters import data_adapter_utils

    return data_adapter_utils.get_numpy_iterator(adapter._dataset)


def torch_data_loader(adapter: Any) -> Any:
    """The torch ``DataLoader`` behind Keras's adapter for one (None for other sources): the adapter's
    ``get_torch_dataloader()`` gives it as it is (Keras's ``TorchDataLoaderAdapter``, known by its class name).
    Checked against Keras 3.10-3.15."""
    return adapter.get_torch_dataloader() if type(adapter).__name__ == "TorchDataLoaderAdapter" else None


def draw_as_a_data_loader_pass() -> None:
    """Draws from torch's default generator what a new pass over a torch ``DataLoader`` draws as it begins (its
    workers' base seed, ``_BaseDataLoaderIter.__init__``; one int64). Keras's PyTorch loop opens a pass over its
    array adapter's ``DataLoader`` to build the model (``Trainer._symbolic_build``) and at each epoch's beginning and
    end (``EpochIterator._enumerate_iterator``); kfit's stream makes the same draws there, so that what draws from
    torch's default generator in a step (a ``Dropout`` without a seed, ``torch.nn.functional.dropout``) draws what it
    draws under ``model.fit``. PyTorch only. Checked against Keras 3.10-3.15 and torch 2.x."""
    if BACKEND == "torch":
        import torch

        torch.empty((), dtype=torch.int64).random_()


def shuffles_from_process_random_state(adapter: Any) -> bool:
    """Whether Keras's adapter for arrays shuffles them with the process's random state as each pass begins
    (``shuffle=True`` or ``"batch"`` on JAX: NumPy's global generator; on PyTorch: torch's default one; see
    :func:`shuffled_arrays_draw` for the ones kfit saves). On TensorFlow the pass is a ``tf.data`` pipeline. (``ArrayDataAdapter._shuffle``, checked against Keras 3.10-3.15.)"""
    return (BACKEND != "tensorflow" and type(adapter).__name__ == "ArrayDataAdapter"
            and bool(getattr(adapter, "_shuffle", False)))


class NumpyGlobalRandom:
    """NumPy's global random state (``np.random``'s MT19937), read and set as bytes, as a torch generator's."""

    def get_state(self) -> np.ndarray:
        name, keys, position, has_gauss, gauss = np.random.get_state()
        return np.concatenate([np.asarray(keys, dtype=np.uint32).view(np.uint8),
                               np.array([position, has_gauss], dtype=np.int64).view(np.uint8),
                               np.array([gauss], dtype=np.float64).view(np.uint8)])

    def set_state(self, state: np.ndarray) -> None:
        raw = np.ascontiguousarray(state, dtype=np.uint8)
        if raw.size != 624 * 4 + 3 * 8:
            raise ValueError(f"A saved NumPy random state has 2520 bytes; this one has {raw.size}.")
        position, has_gauss = raw[2496:2512].view(np.int64)
        np.random.set_state(("MT19937", raw[:2496].view(np.uint32), int(position), int(has_gauss),
                             float(raw[2512:].view(np.float64)[0])))


class PythonGlobalRandom:
    """Python's global random state (``random``'s Mersenne Twister), read and set as bytes, as a torch generator's."""

    def get_state(self) -> np.ndarray:
        _, internal, gauss_next = random.getstate()
        return np.concatenate([np.asarray(internal, dtype=np.uint32).view(np.uint8),
                               np.frombuffer(np.array([gauss_next is not None], np.uint8).tobytes()
                                             + np.array([gauss_next or 0.0], np.float64).tobytes(), np.uint8)])

    def set_state(self, state: np.ndarray) -> None:
        raw = np.ascontiguousarray(state, dtype=np.uint8)
        if raw.size != 625 * 4 + 1 + 8:
            raise ValueError(f"A saved Python random state has 2509 bytes; this one has {raw.size}.")
        gauss_next = float(np.frombuffer(raw[2501:].tobytes(), np.float64)[0]) if raw[2500] else None
        random.setstate((3, tuple(int(v) for v in raw[:2500].view(np.uint32)), gauss_next))


def pydataset_shuffle_draw(adapter: Any) -> PythonGlobalRandom | None:
    """Python's global random state where Keras's adapter for a ``PyDataset`` of known length draws the order of a
    pass's batches from it as the pass begins (``shuffle=True``, no workers: ``PyDatasetAdapter._finite_generator``,
    checked against Keras 3.10-3.15; with workers its enqueuer shuffles at every epoch instead); None otherwise."""
    if (type(adapter).__name__ == "PyDatasetAdapter" and getattr(adapter, "shuffle", False)
            and getattr(adapter, "enqueuer", None) is None and adapter.num_batches):
        return PythonGlobalRandom()
    return None


def shuffled_arrays_draw(adapter: Any) -> Any:
    """The generator Keras's adapter for arrays draws a pass's shuffle order from as the pass begins, when kfit can
    save and set it: NumPy's global state on JAX (``shuffle=True`` or ``"batch"``: every draw is the pass's own),
    torch's default generator on PyTorch (``shuffle=True``; ``"batch"`` draws there at every batch, between the
    steps); None otherwise. (``ArrayDataAdapter._shuffle``, checked against Keras 3.10-3.15.)"""
    if not shuffles_from_process_random_state(adapter):
        return None
    if BACKEND == "torch":
        import torch

        return torch.default_generator if adapter._shuffle is True else None
    return NumpyGlobalRandom()


def pydataset_queue_first_batch(adapter: Any) -> Any:
    """The first batch of a ``PyDataset`` read by workers (Keras's adapter for it has a queue: ``workers > 0``), as
    its pass's iterator gives it, read without taking it from the queue; None for any other source. The queue
    is one stream: a batch taken from it for a look is a batch the pass never trains on. ``enqueuer``,
    ``py_dataset`` and ``_standardize_batch`` are Keras internals, checked against Keras 3.10-3.15."""
    if getattr(adapter, "enqueuer", None) is None or not hasattr(adapter, "py_dataset"):
        return None
    from keras.src.trainers.data_adapters import data_adapter_utils

    batch = adapter._standardize_batch(adapter.py_dataset[0])
    return next(data_adapter_utils.get_numpy_iterator(iter([batch])))


def fit_reads_past_a_pass(adapter: Any) -> bool:
    """True when ``model.fit``'s own loop over ``adapter`` (Keras's adapter for the source) asks an epoch's pass for a
    batch after its last one (ending the pass: a shuffling torch sampler then draws from its generator once more).
    TensorFlow: yes (``tf.data``'s injected prefetching reads ahead of the steps). PyTorch: no (Keras iterates the
    ``DataLoader`` itself, one batch a step). JAX: when ``JAXEpochIterator._get_iterator`` reads a batch ahead
    (Keras 3.10: two ahead; 3.11-3.13: two ahead unless the adapter has ``builtin_prefetch``, a ``DataLoader`` with
    workers; 3.14: one ahead; 3.15: one ahead except on CPU; never under a ``keras.distribution``), asked of the
    class itself over a pass of one batch. Keras internal, checked against Keras 3.10-3.15."""
    if BACKEND != "jax":
        return BACKEND == "tensorflow"
    asked = _jax_loop_asks(adapter, 1)
    return asked is None or asked > 1  # (an unknown loop: taken as reading ahead, as kfit's own reader does)


def fit_batches_read_ahead(adapter: Any) -> int:
    """How many batches ``model.fit``'s own JAX loop over ``adapter`` has read beyond the one its step runs: Keras's
    ``JAXEpochIterator._get_iterator`` hands the step batches it read ahead (Keras 3.10-3.14: one; 3.15: one off CPU,
    none on CPU; none under a ``keras.distribution``). Asked of the class itself, over a pass of four batches: the
    batches it read before it handed on the first (``fit``'s look at a first batch, to build the model, reads them
    too). 0 off JAX (PyTorch's loop reads a batch as its step runs; on TensorFlow, ``tf.data``'s prefetch reads ahead
    and kfit holds nothing back). Keras internal, checked against Keras 3.10.0, 3.11.3, 3.12.4, 3.13.2, 3.14.1 and
    3.15.1."""
    if BACKEND != "jax":
        return 0
    asked = _jax_loop_asks(adapter, 4)
    return 0 if asked is None else max(min(asked, 4) - 1, 0)  # (an unknown loop: none, kfit's reader holds then)


def _jax_loop_asks(adapter: Any, batches: int) -> int | None:
    """How many times Keras's ``JAXEpochIterator._get_iterator`` asks a pass of ``batches`` one-row batches for a
    batch (one past the last included) before it hands on the first; None when the probe fails."""
    from keras.src.backend.jax.trainer import JAXEpochIterator

    asked = []

    def passes() -> Any:
        for _ in range(batches):
            asked.append(1)
            yield (np.zeros((1, 1), np.float32),)
        asked.append(1)

    probe = JAXEpochIterator.__new__(JAXEpochIterator)
    probe.data_adapter = _adapter_with(adapter, get_jax_iterator=passes)
    try:
        next(iter(probe._get_iterator()))
    except Exception:  # noqa: BLE001 -- an unknown loop: the caller decides
        return None
    return len(asked)


def declare_epoch_steps(steps: int) -> None:
    """Tells the ``EpochIterator`` of the running ``model.fit`` how many steps the epoch beginning now holds.

    Keras reads an adapter's ``num_batches`` once, when ``fit`` starts; kfit's epochs can differ in length
    (a minibatch-size schedule, the epoch a run resumes in, the last one before ``max_samples``). Called
    from the adapter's ``on_epoch_begin``, which ``EpochIterator._enumerate_iterator`` calls just before it
    reads ``_num_batches`` for the epoch. Checked against Keras 3.10-3.15.
    """
    owner = _running_epoch_iterator()
    if owner is not None and owner.steps_per_epoch is None:
        owner._num_batches = max(int(steps), 1)


def callback_list(callbacks: list, model: Any, verbose: Any, epochs: int, steps: int | None,
                  batch_offset: Callable[[], int]) -> Any:
    """The ``keras.callbacks.CallbackList`` that ``model.fit`` would make of ``callbacks`` (History and progress
    bar added as it adds them, the same ``params``), which adds ``batch_offset()`` to the batch number of every
    training batch hook: the steps of the current epoch that ran before this call, nonzero in the epoch a run
    resumes in its middle (Keras numbers a call's steps from 0). ``model.fit`` takes a ``CallbackList`` as it is;
    the arguments are those its trainers pass (``steps``: its ``EpochIterator``'s ``num_batches``, that is
    ``steps_per_epoch`` or the adapter's). Checked against Keras 3.10-3.15."""
    return _OffsetCallbackList(callbacks, batch_offset, add_history=True, add_progbar=verbose != 0, verbose=verbose,
                               epochs=epochs, steps=steps, model=model)


class _OffsetCallbackList(keras.callbacks.CallbackList):
    """Keras's ``CallbackList``, with the training batch numbers of the uninterrupted run."""

    def __init__(self, callbacks: list, batch_offset: Callable[[], int], **kwargs: Any):
        super().__init__(callbacks, **kwargs)
        self._batch_offset = batch_offset
        self._first_end: tuple[int, float] | None = None  # this call's first batch end in the epoch: (batch, time)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._first_end = None
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        super().on_train_batch_begin(batch + self._batch_offset(), logs)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        offset = self._batch_offset()
        if offset and self._progbar is not None:
            self._keep_progbar_rate(batch, offset)
        super().on_train_batch_end(batch + offset, logs)

    def _keep_progbar_rate(self, batch: int, offset: int) -> None:
        """In the epoch a run resumed in, the progress bar counts the ``offset`` steps the epoch had run before this
        call, but Keras's ``Progbar`` takes its time per step as the time since it began over the steps it counts
        (the ETA came out short by up to the factor of the steps counted). Its rate is kept at this call's own: the
        time since the call's first batch end over the steps since (``Progbar._time_after_first_step``, the time
        Keras measures from, is put where that rate puts it; checked against Keras 3.10-3.15)."""
        now = time.time()
        if self._first_end is None:
            self._first_end = (batch, now)
            return
        progbar = getattr(self._progbar, "progbar", None)
        first_batch, first_time = self._first_end
        if batch > first_batch and progbar is not None and hasattr(progbar, "_time_after_first_step"):
            per_step = (now - first_time) / (batch - first_batch)
            progbar._time_after_first_step = now - (batch + offset) * per_step  # Keras divides by current - 1


def steps_per_execution(model: Any) -> int:
    """The steps one call of the model's compiled train function runs (``compile(steps_per_execution=...)``)."""
    return max(int(getattr(model, "steps_per_execution", 1) or 1), 1)


def set_epoch_batches(num_batches: int | None) -> None:
    """Sets what the ``EpochIterator`` of the running ``model.fit`` takes as the number of batches, also when
    ``steps_per_epoch`` was given (its loop stops after them and opens its next iterator). Used for the epoch a
    run resumes in on a source that cannot seek (the steps it has left), and, when the next epoch begins, to
    put back the source's own length (Keras takes an iterator that ended early for a pass of that many
    batches, which would cut every later epoch short). Called from the adapter's ``on_epoch_begin``. Checked
    against Keras 3.10-3.15."""
    owner = _running_epoch_iterator()
    if owner is not None:
        owner._num_batches = num_batches


def one_iterator_epoch_loop() -> Any:
    """The ``TFEpochIterator`` of the running ``model.fit`` when one ``tf.data`` iterator can serve all its epochs
    (TensorFlow, one step per execution: a call of more steps would read across an epoch's end; no
    ``steps_per_epoch``), else None. Called from the adapter's ``on_epoch_begin``. ``TFEpochIterator`` and its
    ``_distributed_dataset``, ``_distribute_strategy``, ``steps_per_execution`` are Keras internals, checked
    against Keras 3.10-3.15."""
    if BACKEND != "tensorflow":
        return None
    owner = _running_epoch_iterator()
    if (owner is None or not hasattr(owner, "_distributed_dataset") or not hasattr(owner, "_distribute_strategy")
            or owner.steps_per_epoch is not None or owner.steps_per_execution != 1):
        return None
    return owner


def iterate_once(owner: Any, dataset: Any) -> None:
    """Makes the ``TFEpochIterator`` ``owner`` read ``dataset`` through one iterator, made at its next ``iter()``
    and handed back at every later one (Keras's loop makes one at every epoch begin and end): the epochs follow
    one another in ``dataset``. Checked against Keras 3.10-3.15 (``_get_iterator`` returns
    ``_distributed_dataset``; ``_enumerate_iterator`` calls ``iter()`` on it)."""
    owner._distributed_dataset = _OneIterator(owner._distribute_strategy.experimental_distribute_dataset(dataset))


class _OneIterator:
    """Hands Keras's epoch loop the same iterator at every ``iter()`` (made at the first)."""

    def __init__(self, dataset: Any):
        self._dataset = dataset
        self._iterator: Any = None

    def __iter__(self) -> Any:
        if self._iterator is None:
            self._iterator = iter(self._dataset)
        return self._iterator


def _running_epoch_iterator() -> Any:
    """The ``EpochIterator`` whose method called the adapter hook calling our caller, if any."""
    from keras.src.trainers.epoch_iterator import EpochIterator

    frame = sys._getframe(2)
    for _ in range(4):
        frame = frame.f_back
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, EpochIterator):
            return owner
    return None


def warned_by_iterator_of(adapter: Any) -> bool:
    """True when the warning being shown now was issued by the ``EpochIterator`` reading ``adapter`` (``model.fit``'s
    training iterator over kfit's data), not by another one (a validation's, a callback's ``model.evaluate``), whose
    "ran out of data" is the user's to see. Checked against Keras 3.10-3.15 (``EpochIterator._interrupted_warning``)."""
    from keras.src.trainers.epoch_iterator import EpochIterator

    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, EpochIterator):
            return owner.data_adapter is adapter
        frame = frame.f_back
    return False


def epoch_iterator_opened_next_pass() -> bool:
    """True when the adapter's ``on_epoch_end`` calling us is called by an ``EpochIterator`` that has just made
    the iterator for its next epoch: its loop ran a pass of known length to its end (no ``steps_per_epoch``; a
    pass that ran dry and ``reset()`` drop the iterator before calling the hook). On TensorFlow that iterator is a
    ``tf.data`` iterator, made at once and never read (the next epoch makes its own): over a user's ``tf.data``
    pipeline it draws the pipeline's next shuffle seed. Checked against Keras 3.10-3.15
    (``EpochIterator._enumerate_iterator``, ``reset``, ``catch_stop_iteration``)."""
    owner = _running_epoch_iterator()
    return (owner is not None and owner.steps_per_epoch is None and owner._steps_seen == 0
            and owner._current_iterator is not None)


def average_in_progbar(progbar: Any, name: str) -> None:
    """Makes ``keras.utils.Progbar`` average the log ``name`` over the epoch. Keras 3.11-3.15's
    ``ProgbarLogger`` shows every log as it is except the names in ``progbar.stateless_metrics``; Keras 3.10's
    averages every log not in ``stateful_metrics`` (so ``name`` already is). Checked against Keras 3.10-3.15."""
    if getattr(progbar, "stateless_metrics", None) is not None:
        progbar.stateless_metrics.add(name)


def show_last_in_progbar(progbar: Any, name: str, logs: list[str]) -> None:
    """Makes ``keras.utils.Progbar`` show the log ``name`` after the others of ``logs`` (it shows logs in the order
    it first saw them: the validation logs, first seen at an epoch's end, would follow ``name``). Keras internal
    (``_values_order``), checked against Keras 3.10-3.15."""
    order = getattr(progbar, "_values_order", None)
    if not isinstance(order, list):
        return
    order.extend(key for key in logs if key not in order)
    if name in order:
        order.remove(name)
        order.append(name)


def global_seed_state() -> np.ndarray | None:
    """The state of Keras's global ``SeedGenerator`` (used by ``keras.random`` ops called without a seed
    generator of their own), or None when none was made. Checked against Keras 3.10-3.15."""
    from keras.src.backend.common import global_state

    # The global-state key (Keras 3.11+ names it seed_generator.GLOBAL_SEED_GENERATOR; 3.10 spells it out).
    generator = global_state.get_global_attribute("global_seed_generator")
    if generator is None:
        return None
    return np.array(keras.ops.convert_to_numpy(generator.state.value))


def set_global_seed_state(value: np.ndarray) -> None:
    """Restores :func:`global_seed_state` (making the global generator if needed)."""
    from keras.src.random.seed_generator import global_seed_generator

    global_seed_generator().state.assign(value)


# What each of Keras's built-in callbacks has seen during a run, by attribute: what its next decisions depend on.
# Keras resets them in on_train_begin (ModelCheckpoint's `best` in __init__); a checkpoint keeps them.
_KERAS_CALLBACK_STATE = {
    "EarlyStopping": ("wait", "stopped_epoch", "best", "best_weights", "best_epoch"),
    "ReduceLROnPlateau": ("wait", "best", "cooldown_counter"),
    "ModelCheckpoint": ("best", "_batches_seen_since_last_saving", "_last_batch_seen"),
    "TensorBoard": ("_global_train_batch", "_global_test_batch"),  # the steps of its batch-level summaries
    # whether the moving averages are in the model (swap_on_epoch=True: from an epoch's end to the next's begin)
    "SwapEMAWeights": ("_ema_weights_in_model",),
}


def keras_callback_state_attributes(callback: Any) -> tuple[str, ...]:
    """The attributes of one of Keras's built-in callbacks that hold what it has seen in the run (its counters,
    the best value, the best weights), or ``()`` for a callback that keeps none kfit knows of. A subclass of one
    counts as it (its own ``get_state``, if any, is used instead). Checked against Keras 3.10-3.15."""
    for cls in type(callback).__mro__:
        if cls.__module__.startswith("keras.") and cls.__name__ in _KERAS_CALLBACK_STATE:
            return _KERAS_CALLBACK_STATE[cls.__name__]
    return ()


def before_ema_finalize(optimizer: Any, hook: Callable[[], None]) -> Callable[[], None]:
    """Has ``hook()`` called right before ``optimizer.finalize_variable_values``, which ``model.fit`` calls when its
    epochs are over, right before ``on_train_end`` (on JAX also after an exception), and which overwrites the model's
    trainable variables with their moving averages when the optimizer keeps them (``use_ema=True``). Returns what
    undoes it. Nothing is done for an optimizer without EMA. Checked against Keras 3.10-3.15 (every backend's
    ``fit``; ``LossScaleOptimizer`` hands the call to its inner optimizer)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if not getattr(inner, "use_ema", False) or "finalize_variable_values" in vars(optimizer):
        return lambda: None
    finalize = optimizer.finalize_variable_values

    def finalize_after_hook(var_list: Any) -> None:
        hook()
        finalize(var_list)

    optimizer.finalize_variable_values = finalize_after_hook

    def undo() -> None:
        if vars(optimizer).get("finalize_variable_values") is finalize_after_hook:
            del optimizer.finalize_variable_values
    return undo


def finalize_ema(model: Any) -> None:
    """What ``model.fit`` does once its epochs are over: an optimizer with ``use_ema=True`` overwrites the model's
    trainable variables with their moving averages (nothing for one without)."""
    optimizer = getattr(model, "optimizer", None)
    if isinstance(optimizer, keras.optimizers.Optimizer) and optimizer.built:
        optimizer.finalize_variable_values(model.trainable_weights)


def is_csv_logger(callback: Any) -> bool:
    """Whether ``callback`` is Keras's ``CSVLogger`` (or a subclass of it)."""
    return isinstance(callback, keras.callbacks.CSVLogger)


def csv_logger_state(callback: Any) -> dict[str, Any] | None:
    """What Keras's ``CSVLogger`` has written and will write: its file's contents (bytes, as uint8) and its columns;
    None before its ``on_train_begin`` opened the file. Keras internals (``csv_file``, ``keys``), checked against
    Keras 3.10-3.15."""
    from keras.src.utils import file_utils

    csv_file = getattr(callback, "csv_file", None)
    if csv_file is None or csv_file.closed:
        return None
    csv_file.flush()
    with file_utils.File(callback.filename, "rb") as f:
        contents = f.read()
    return {"contents": np.frombuffer(contents, dtype=np.uint8), "keys": callback.keys}


def set_csv_logger_state(callback: Any, state: dict[str, Any]) -> None:
    """Puts back what :func:`csv_logger_state` read, after the callback's ``on_train_begin`` opened its file (and,
    with ``append=False``, emptied it): the file holds the rows written until then, the next row follows them
    in the same columns, without a second header. Keras internals (``csv_file``, ``writer``, ``keys``,
    ``append_header``), checked against Keras 3.10-3.15."""
    from keras.src.utils import file_utils

    csv_file = getattr(callback, "csv_file", None)
    if csv_file is not None and not csv_file.closed:
        csv_file.close()
    contents = np.asarray(state["contents"], dtype=np.uint8).tobytes()
    with file_utils.File(callback.filename, "wb") as f:
        f.write(contents)
    callback.csv_file = file_utils.File(callback.filename, "a")
    callback.writer = None
    callback.keys = None if state.get("keys") is None else list(state["keys"])
    callback.append_header = not contents


def stop_epoch_reader(adapter: Any) -> None:
    """Stops the ``OrderedEnqueuer`` of Keras's data ``adapter`` (a PyDataset's ``workers``) if it still runs.

    Keras's loop stops it at an epoch's end only: a run that stops inside an epoch (``stop_training``, kfit's
    ``max_samples``) leaves its threads (or processes) running, ``model.fit`` too (on TensorFlow, 6 threads a run with
    ``workers=2``), and the ``tf.data`` iterator reading it makes the garbage collection that destroys it wait up to
    5 s (its ``get`` polls every 5 s while the enqueuer runs). The dataset's own ``on_epoch_end`` is not called, as
    ``model.fit`` does not call it then. Keras internal (``PyDatasetAdapter.enqueuer``), checked against Keras
    3.15.1."""
    enqueuer = getattr(adapter, "enqueuer", None)
    if enqueuer is not None and enqueuer.is_running():
        enqueuer.stop()


def record_state_sharding(model: Any) -> None:
    """Records the training state's sharding specs where Keras has cleared them, for a train step traced now. Keras
    3.10-3.11's JAX ``train_step`` constrains the state it returns to the specs ``fit`` records as it begins and clears
    as it ends, as ``evaluate`` does too: a step traced after a ``model.evaluate`` made inside ``fit`` (kfit's
    ``CrossValidation`` and ``Test``: a new minibatch size, the state's arrays replaced), or lowered outside ``fit``
    (a :class:`~kfit.training._compile_ahead.CompileAhead` made after ``fit`` ended), would fail ("'NoneType' object
    is not subscriptable"). Keras internals (``_trainable_variable_shardings``,
    ``_record_training_state_sharding_spec``), checked against Keras 3.10.0 and 3.11.3 (cleared); 3.12.4, 3.13.2,
    3.14.1 and 3.15.1 keep no such specs: nothing to do."""
    if BACKEND != "jax" or not hasattr(model, "_record_training_state_sharding_spec"):
        return
    if getattr(model, "_trainable_variable_shardings", ()) is None:
        model._record_training_state_sharding_spec()


def initial_epoch(model: Any) -> int | None:
    """What :func:`set_initial_epoch` set (None: nothing)."""
    return getattr(model, "_initial_epoch", None)


def data_adapter_base() -> type:
    """Keras's ``DataAdapter`` base class: ``model.fit`` takes an instance of it as ``x``."""
    from keras.src.trainers.data_adapters.data_adapter import DataAdapter as base

    return base


DataAdapter = data_adapter_base()


def jitted_train_step(model: Any) -> Any:
    """Keras's jitted JAX train step, ``jit(train_step)``, inside ``model.train_function``; None off JAX, and when
    one call runs several steps (``steps_per_execution``), the step is not jitted (``run_eagerly``,
    ``jit_compile=False``) or a model distribution is set. Its ``lower(state, data).compile()`` compiles a shape
    ahead: the step's own later call finds it compiled. Keras's ``make_train_function`` wraps the jitted step in
    ``iterator_step`` (kfit's :func:`hold_writes` wraps that): found through the closures. Checked against Keras
    3.10-3.15."""
    if BACKEND != "jax" or steps_per_execution(model) != 1 or getattr(model, "run_eagerly", False):
        return None
    if not getattr(model, "jit_compile", True) or keras.distribution.distribution() is not None:
        return None
    todo, seen = [getattr(model, "train_function", None)], set()
    while todo:
        function = todo.pop()
        if function is None or id(function) in seen:
            continue
        seen.add(id(function))
        if type(function).__name__ == "PjitFunction" and hasattr(function, "lower"):
            return function
        for cell in getattr(function, "__closure__", None) or ():
            try:
                todo.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
    return None


def xla_step_warmer(model: Any) -> Callable[[int], None] | None:
    """On TensorFlow with ``jit_compile=True``: a function ``warm(rows)`` that has XLA compile Keras's train step for
    minibatches of ``rows`` rows, as training will run it, without touching the model; None otherwise (another
    backend, no XLA, ``run_eagerly``, several steps per call, a distribution strategy, a train function kfit
    replaced).

    kfit's ``tf.data`` hands the step minibatches of an unknown batch dimension, so one trace serves every size, but XLA
    compiles that trace again for each new shape, when its first step runs. ``warm`` runs the traced function
    (``multi_step_on_iterator``, the one ``model.fit`` calls with its iterator) once on a minibatch of zeros of the new
    shape, on copies of the variables it captures (the model's, the optimizer's, the metrics'): XLA compiles the shape
    and keeps it, for the step's later call on the real variables. It raises if the function is not traced yet (call it
    after training's first step) or captures a resource that is none of those variables (nothing is run then).
    ``train_function``'s closure (``multi_step_on_iterator``) is a Keras internal, checked against Keras 3.10-3.15;
    ``ConcreteFunction._call_flat(inputs, captured_inputs)`` and ``IteratorSpec._element_spec`` TensorFlow ones, checked against TensorFlow 2.20-2.21."""
    if BACKEND != "tensorflow" or not getattr(model, "jit_compile", False) or getattr(model, "run_eagerly", False):
        return None
    import tensorflow as tf

    strategy = getattr(model, "distribute_strategy", None)
    if steps_per_execution(model) != 1 or type(strategy).__name__ not in ("_DefaultDistributionStrategy", "NoneType"):
        return None
    function = getattr(model, "train_function", None)
    cells = dict(zip(getattr(function, "__code__", None) and function.__code__.co_freevars or (),
                     getattr(function, "__closure__", None) or ()))
    traced = cells.get("multi_step_on_iterator")
    traced = None if traced is None else traced.cell_contents
    if not hasattr(traced, "_list_all_concrete_functions_for_serialization"):
        return None
    variables = [*model.variables, *model.optimizer.variables, *getattr(model, "metrics_variables", [])]

    def warm(rows: int) -> None:
        def element_spec(concrete: Any) -> Any:  # (of the iterator the step takes)
            return concrete.structured_input_signature[0][0]._element_spec

        concrete = [c for c in traced._list_all_concrete_functions_for_serialization()
                    if all(spec.shape.rank and spec.shape[0] is None for spec in tf.nest.flatten(element_spec(c)))]
        if not concrete:
            raise RuntimeError("the train step is not traced for minibatches of any size yet")
        step = concrete[-1]
        by_handle = {id(v.handle): v for v in variables}
        copies, captured = [], []  # (the copies are kept: a variable no longer referenced frees its resource)
        for tensor in step.captured_inputs:
            if tensor.dtype == tf.resource:
                if id(tensor) not in by_handle:
                    raise RuntimeError("the train step uses a resource that is not one of the model's, the "
                                       "optimizer's or the metrics' variables")
                copies.append(tf.Variable(by_handle[id(tensor)].value, trainable=False))
                tensor = copies[-1].handle
            captured.append(tensor)

        def zeros(spec: Any) -> Any:
            if not isinstance(spec, tf.TensorSpec):
                raise TypeError(f"the step takes a {type(spec).__name__}")
            shape = [rows, *spec.shape[1:]]
            return tf.fill(shape, "") if spec.dtype == tf.string else tf.zeros(shape, spec.dtype)

        iterator = iter(tf.data.Dataset.from_tensors(tf.nest.map_structure(zeros, element_spec(step))))
        step._call_flat(tf.nest.flatten(iterator, expand_composites=True), captured_inputs=captured)

    return warm


def train_state_specs(model: Any) -> list[tuple]:
    """The states Keras's JAX ``fit`` hands its train step, each as XLA compiles a step for it: (trainable,
    non-trainable, optimizer, metrics) variables, as ``jax.ShapeDtypeStruct`` lists.

    One state where the step leaves the state's sharding alone (Keras 3.12.4, 3.13.2, 3.14.1 and 3.15.1): its shapes and
    dtypes. Keras 3.10.0 and 3.11.3's step constrains the state it returns to the sharding ``fit`` recorded as it began
    (see :func:`record_state_sharding`): JAX then compiles it once per sharding of its arguments, a new minibatch size
    twice under ``model.fit`` itself. An epoch's first step takes the metrics Keras has just reset (arrays of no
    sharding), the state the step returned otherwise; the steps after it take the state the step returned. Two states
    then: everything of the recorded sharding, and the same with the metrics of none. Keras internals
    (``_trainable_variable_shardings`` and its three siblings), checked against those releases."""
    import jax

    groups = _group_variables(model)
    unsharded = [[None] * len(group) for group in groups]
    recorded = [getattr(model, f"_{name.removesuffix('_variables')}_variable_shardings", None) for name in _GROUPS]

    def state(shardings: list) -> tuple:
        return tuple([jax.ShapeDtypeStruct(tuple(v.shape), v.value.dtype, sharding=s) for v, s in zip(group, specs)]
                     for group, specs in zip(groups, shardings))

    if not hasattr(model, "_enforce_jax_state_sharding") or None in recorded:
        return [state(unsharded)]
    return [state(recorded), state([*recorded[:3], unsharded[3]])]


def thread_state() -> Callable[[], None]:
    """Captures Keras's per-thread global state (the distribution, scopes, settings) of the calling thread; the
    returned function gives it to the thread that calls it, so that a train step traced there sees what the
    training thread sees. Keras internal (``global_state``'s thread-locals), checked against Keras 3.10-3.15."""
    from keras.src.backend.common import global_state

    trackers = [t for t in (getattr(global_state, "GLOBAL_STATE_TRACKER", None),
                            getattr(global_state, "GLOBAL_SETTINGS_TRACKER", None)) if t is not None]
    snapshots = [(tracker, dict(vars(tracker))) for tracker in trackers]

    def adopt() -> None:
        for tracker, values in snapshots:
            for name, value in values.items():
                setattr(tracker, name, value)

    return adopt


def tf_iterator_state(iterator: Any) -> np.ndarray | None:
    """The state of a ``tf.data`` iterator as bytes (uint8), as ``tf.train.Checkpoint`` saves it: its position and
    its pipeline's random state (a reshuffling ``shuffle``'s seed generator included), or None when the pipeline
    cannot be saved (a ``py_function``, ``from_generator`` or a stateful random op in it: TensorFlow refuses under
    the dataset's ``experimental_external_state_policy``, FAIL by default). TensorFlow internal (the iterator's
    saveable ``_serialize_to_tensors``), checked against TensorFlow 2.21."""
    import tensorflow as tf

    try:
        state = iterator._serialize_to_tensors()["_STATE"]
        return np.frombuffer(tf.io.serialize_tensor(state).numpy(), dtype=np.uint8).copy()
    except (tf.errors.FailedPreconditionError, tf.errors.UnimplementedError, AttributeError, KeyError):
        return None


def set_tf_iterator_state(iterator: Any, state: np.ndarray) -> None:
    """Puts a state from :func:`tf_iterator_state` into a new iterator over the same pipeline (also restoring the
    pipeline's seed generators: the next iterator made from the dataset goes on from there)."""
    import tensorflow as tf

    variant = tf.io.parse_tensor(np.asarray(state, dtype=np.uint8).tobytes(), tf.variant)
    iterator._restore_from_tensors({"_STATE": variant})


def _adapter_with(adapter: Any, **attributes: Any) -> Any:
    """A shallow copy of a Keras data adapter with ``attributes`` replaced (what it reads, or how)."""
    import copy

    reader = copy.copy(adapter)
    for name, value in attributes.items():
        setattr(reader, name, value)
    return reader


def generator_tf_dataset(adapter: Any, batches: Callable[[], Any]) -> Any:
    """Keras's own ``tf.data`` dataset for a Python generator (its ``GeneratorDataAdapter``, its conversions: a None
    part, sparse parts) over ``batches()``, kfit's reader of the generator, read no further ahead than ``model.fit``'s
    own loop reads it (TensorFlow): without its ``prefetch(AUTOTUNE)``, and with no prefetch injected by tf.data's
    optimizations (kfit's reader reads one batch ahead, as that prefetch does in ``model.fit``; with it, a callback
    that changes the generator's state as an epoch begins would find its batches read two or three ahead). Keras
    internal (the adapter's ``generator`` attribute, read by ``get_tf_dataset``, which ends with ``prefetch``;
    ``_input_dataset`` is the dataset a tf.data transformation reads), checked against Keras 3.10-3.15 and
    TensorFlow 2.21."""
    import tensorflow as tf

    dataset = _adapter_with(adapter, generator=batches).get_tf_dataset()
    if type(dataset).__name__ == "_PrefetchDataset":
        dataset = dataset._input_dataset
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return dataset.with_options(options)


def python_steps_dataset(open_pass: Callable[[], Any], element_spec: Any, steps_per_execution: int,
                         at_end: Callable[[], None] | None = None) -> Any:
    """What ``model.fit`` reads on TensorFlow for a source kfit's reader reads (``open_pass()``: an iterator over one
    pass, of eager tensors), handed to Keras's loop as they are: a ``tf.distribute.DistributedDataset`` whose
    iterator is a Python iterator, which Keras's compiled train function takes from Python one step at a time
    (its ``function(iterator)``), with no second ``tf.data`` pipeline between kfit's reader and the step. None
    under a ``tf.distribute`` strategy other than the default (kfit then hands a ``from_generator`` dataset).
    Keras internal (``TFEpochIterator`` keeps a ``DistributedDataset`` as it is; the train function runs
    ``zip(range(steps_per_execution), iterator)`` on an iterator that is neither a ``tf.data`` nor a distributed
    one; ``catch_stop_iteration`` takes ``tf.errors.OutOfRangeError`` for the pass's end), checked against Keras
    3.10-3.15 and TensorFlow 2.20-2.21. ``at_end``: called as the call of the train function past the pass's end
    asks for its batch (a pass of unknown length: the call model.fit's loop finds the end by)."""
    import tensorflow as tf

    if tf.distribute.has_strategy():
        return None

    class _PassEnd(tf.distribute.DistributedDataset):
        def __iter__(self) -> Any:
            return _PythonSteps(open_pass(), steps_per_execution, at_end)

        @property
        def element_spec(self) -> Any:
            return element_spec

    return _PassEnd()


class _PythonSteps:
    """A pass's batches for Keras's TensorFlow train function, read in calls of ``steps_per_execution`` steps: at the
    pass's end, ``StopIteration`` ends a call that has run steps (its logs are the last step's, as when a
    ``tf.data`` pass ends inside a call), and ``tf.errors.OutOfRangeError`` tells Keras's loop the epoch's data ended
    (a ``StopIteration`` there would leave the call with no step and no logs)."""

    def __init__(self, batches: Any, steps_per_execution: int, at_end: Callable[[], None] | None = None):
        self._batches = batches
        self._per_call = steps_per_execution
        self._handed = 0
        self._ended_a_call = False
        self._at_end = at_end

    def __iter__(self) -> _PythonSteps:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._batches)
        except StopIteration:
            import tensorflow as tf

            if self._handed % self._per_call and not self._ended_a_call:
                self._ended_a_call = True
                raise
            at_end, self._at_end = self._at_end, None
            if at_end is not None:
                at_end()
            raise tf.errors.OutOfRangeError(None, None, "End of sequence") from None
        self._handed += 1
        return batch


def call_train_function_past_a_pass_end(model: Any, element_spec: Any, options: Any) -> None:
    """Calls the model's compiled train function once on a ``tf.data`` iterator with no batch left (an empty
    ``from_generator`` dataset of that ``element_spec``), as Keras's TensorFlow loop calls it on the source's own
    iterator to find a pass of unknown length ended: with one step per call TensorFlow runs that call in part before
    the iterator's end stops it (the ops that read no batch: the optimizer's iteration count, the seed generators),
    and Keras's loop takes the ``OutOfRangeError`` (or, with more steps per call, ``StopIteration``) for the pass's
    end. Keras's own function for a ``tf.data`` iterator, traced for this element spec: the same part runs.
    ``model.train_function`` (made by ``fit`` before ``on_train_begin``) and its ``function(iterator)`` protocol are
    Keras internals, checked against Keras 3.10-3.15 and TensorFlow 2.20-2.21."""
    import tensorflow as tf

    if getattr(model, "train_function", None) is None:
        model.make_train_function()
    empty = tf.data.Dataset.from_generator(lambda: iter(()), output_signature=element_spec).with_options(options)
    iterator = iter(tf.distribute.get_strategy().experimental_distribute_dataset(empty))
    try:
        model.train_function(iterator)
    except (tf.errors.OutOfRangeError, StopIteration):
        return
    raise RuntimeError("kfit: the train function ran a step on an empty pass (a Keras change kfit does not know).")


def keras_pass(adapter: Any, iterator: Any, method: str) -> Any:
    """Keras's own pass over a ``tf.data`` source (``adapter.<method>()``: ``get_numpy_iterator``,
    ``get_jax_iterator`` or ``get_torch_dataloader``, with Keras's conversions, sparse ones included) read from
    ``iterator``, an iterator over the adapter's dataset that kfit made (and whose state it saves). Keras internal
    (``TFDatasetAdapter._dataset``, iterated once per pass), checked against Keras 3.10-3.15."""
    class _Given:
        def __iter__(self) -> Any:
            return iterator

    return getattr(_adapter_with(adapter, _dataset=_Given()), method)()


def replace_epoch_dataset(dataset: Any) -> bool:
    """Makes the ``TFEpochIterator`` of the running ``model.fit`` read ``dataset`` from its next ``iter()`` on, in place
    of the dataset it took from the adapter's ``get_tf_dataset`` (whose batch dimension no longer holds for the epochs
    to come). Called from the adapter's ``on_epoch_begin``, right before Keras's loop makes the epoch's iterator (no
    ``steps_per_epoch``). False where no ``TFEpochIterator`` runs. ``_distributed_dataset``, ``_distribute_strategy``
    and ``_get_iterator`` are Keras internals, checked against Keras 3.10-3.15."""
    if BACKEND != "tensorflow":
        return False
    owner = _running_epoch_iterator()
    if owner is None or not hasattr(owner, "_distributed_dataset") or not hasattr(owner, "_distribute_strategy"):
        return False
    owner._distributed_dataset = owner._distribute_strategy.experimental_distribute_dataset(dataset)
    return True


def serialize_as(subclass: type, base: type) -> None:
    """Makes Keras save instances of ``subclass`` as instances of ``base``: the same ``module``, ``class_name`` and
    ``registered_name`` in the saved config, so that a file saved with one loads as the other.

    Keras names a saved object after its class, looked up in two tables keyed by the class: the public ``keras.*``
    names (``api_export.REGISTERED_OBJS_TO_NAMES``) and the names of ``register_keras_serializable``
    (``object_registration.GLOBAL_CUSTOM_NAMES``); a class in neither is named ``__name__``. ``subclass`` gets
    ``base``'s entries; the tables loading reads (name to class) are left alone, so loading gives ``base``. Without
    this, a subclass of a registered class (``kfit.optimizers.MomentumSGD``, package ``kfit``) saved as
    ``registered_name: "MomentumSGD"``, which loading cannot find. Keras internals, checked against Keras 3.15.1 (both
    tables read in the source of 3.10.0 too)."""
    from keras.src import api_export
    from keras.src.saving import object_registration

    for table in (api_export.REGISTERED_OBJS_TO_NAMES, object_registration.GLOBAL_CUSTOM_NAMES):
        if base in table:
            table[subclass] = table[base]


class PassCount(NamedTuple):
    """Where the ``EpochIterator`` of an uninterrupted ``model.fit`` stood in a pass of a source of unknown length
    read on across epochs (``steps_per_epoch``), as an epoch that a run resumes in begins (see
    :func:`resume_pass_count`)."""

    #: The steps the epoch has left (the run resumes inside it), or None (it resumes as the epoch begins).
    steps_left: int | None
    #: The steps Keras had counted since it made the pass's iterator, or None where it makes one now (a new pass).
    steps_seen: int | None
    #: The pass length Keras had learned when the first pass ended (its count as it found the end), or None.
    num_batches: int | None


def resume_pass_count(count: PassCount) -> Callable[[], None] | None:
    """Puts the ``EpochIterator`` of the running ``model.fit`` where the uninterrupted run's stood in the pass read
    (``count``), so that it finds the pass's end and learns the pass length as that run's did: Keras counts a pass's
    steps from the iterator it makes (``_steps_seen``) and, where the source's length is unknown, takes its count as a
    pass's end is found for the length of every pass (``_num_batches``, ``catch_stop_iteration``); a resumed run's
    Keras made its iterator at the resume. Called from the adapter's ``on_epoch_begin``, which
    ``EpochIterator._enumerate_iterator`` calls right before it reads ``steps_per_epoch`` and makes the iterator
    where it has none: the iterator is made here, as it makes it (``_get_iterator``), and its count set. The epoch a run
    resumes inside runs the steps it has left: ``steps_per_epoch`` is that many for this epoch (Keras's loop ends the
    epoch after them and goes on in the same pass, as at any epoch's end); returns what puts it back, to be called as
    the next epoch begins (None when unchanged). Keras internal (``_current_iterator``, ``_steps_seen``,
    ``_num_batches``, ``steps_per_epoch``, ``_get_iterator``), checked against Keras 3.10-3.15 (the source of
    3.10.0, 3.11.3, 3.12.4, 3.13.2, 3.14.0; run on 3.10.0 and 3.15.1)."""
    owner = _running_epoch_iterator()
    if owner is None or not all(hasattr(owner, name) for name in ("_current_iterator", "_steps_seen", "_num_batches")):
        return None
    owner._num_batches = count.num_batches
    if count.steps_seen is not None:
        if owner._current_iterator is None:
            owner._current_iterator = iter(owner._get_iterator())
        owner._steps_seen = count.steps_seen
    if count.steps_left is None:
        return None
    steps_per_epoch, owner.steps_per_epoch = owner.steps_per_epoch, count.steps_left

    def put_back() -> None:
        owner.steps_per_epoch = steps_per_epoch

    return put_back


def epoch_iterator_reads_on() -> bool:
    """True when the ``EpochIterator`` of the running ``model.fit``, whose adapter's ``on_epoch_begin`` calls us, holds
    the iterator of the pass it reads and reads on in it in the epoch beginning (``steps_per_epoch`` given): it drops
    it only as it finds the pass ended (``catch_stop_iteration``), so a pass whose last batch ended the last epoch,
    which kfit's reader (or Keras's JAX loop, reading ahead) has found ended, is one whose end Keras has still to find.
    Keras internal (``_current_iterator``, ``steps_per_epoch``), checked against Keras 3.10-3.15 (the source of
    3.10.0, 3.11.3, 3.12.4, 3.13.2, 3.14.0; run on 3.10.0 and 3.15.1)."""
    owner = _running_epoch_iterator()
    return owner is not None and owner.steps_per_epoch is not None and owner._current_iterator is not None


def empty_epoch_logs(model: Any, previous: dict, validated: bool) -> dict:
    """The logs ``model.fit`` ends an epoch of no step with (``steps_per_epoch`` on a source whose last batch of a pass
    ended the epoch before: Keras finds the pass ended by one more call, and the epoch ends empty), where the fit call
    trained the epoch before it: its trainers take ``_get_metrics_result_or_logs(logs)`` of the ``logs`` of that
    call's last step, the metrics reset as the epoch began. On TensorFlow: the reset metrics (0.0) where the step's
    logs name them; on JAX the metrics as the last epoch ended, as its loop left them in the model's variables, where
    the epoch before it did not validate (``validated``), the reset ones where it did (``evaluate`` hands the state
    back to the variables and drops it; under ``model.fit`` itself the loop then fails reading a purged metric
    variable); on PyTorch ``{}`` (its loop starts every epoch's ``logs`` anew). ``previous``: the training logs of the
    epoch before it (its History entry without validation; with a custom ``train_step`` whose logs do not name the
    model's metrics, its last step's logs, which Keras returns as they are). Called as the epoch of a resumed run
    begins (the metrics reset). Keras internals (the loops of ``fit``, ``get_metrics_result``), checked against Keras
    3.15.1."""
    if BACKEND == "torch":
        return {}
    metrics = model.get_metrics_result()
    if not set(metrics) <= set(previous):
        return dict(previous)
    return dict(metrics) if BACKEND == "tensorflow" or validated else {name: previous[name] for name in metrics}


def validates_in_epoch(model: Any, epoch: int, validation_freq: Any) -> bool:
    """Whether ``model.fit`` runs validation at the end of ``epoch`` (from 0) under ``validation_freq``. Keras
    internal (``Trainer._should_eval``), checked against Keras 3.15.1."""
    return bool(model._should_eval(epoch, validation_freq))


def metric_names(model: Any) -> list[str]:
    """The names of the metrics that name the model's logged metrics (``auc_1`` in ``val_auc_1``), in the model's
    order: those given to ``compile`` (flattened as Keras builds them; before it has, strings and functions by the name
    Keras will give them, a dict of them per output in the outputs' order as ``CompileMetrics.build`` takes it),
    then those the model and its layers track themselves; the loss trackers left out (their names are the outputs').
    Keras internals (``Trainer._compile_metrics``, ``CompileMetrics._user_metrics`` and ``_user_weighted_metrics``,
    ``Trainer._loss_tracker``, ``_compile_loss``), checked against Keras 3.15.1 and 3.10.0's source (a dict per output
    built in the outputs' order in 3.10-3.15); tests/test_small_fidelity_resume.py and tests/test_carried_items.py run
    on TensorFlow 2.21 with Keras 3.11.3, 3.12.4, 3.13.2, 3.14.1 and 3.15.1."""
    compiled = getattr(model, "_compile_metrics", None)
    names: list[str] = []
    if compiled is not None and compiled.built:
        names = [m.name for m in compiled.metrics]
    elif compiled is not None:
        outputs = getattr(model, "output_names", None) or []

        def in_order(group: Any) -> list:  # (keras.tree.flatten would take a dict's keys sorted)
            if isinstance(group, dict) and set(group) <= set(outputs):
                group = [group[name] for name in outputs if name in group]
            return keras.tree.flatten(group or [])

        given = [m for group in (compiled._user_metrics, compiled._user_weighted_metrics) for m in in_order(group)]
        names = [m if isinstance(m, str) else getattr(m, "name", None) or getattr(m, "__name__", "") for m in given]
    own = {id(compiled), id(getattr(model, "_loss_tracker", None))}
    own |= {id(m) for m in getattr(getattr(model, "_compile_loss", None), "metrics", None) or []}
    return names + [m.name for m in getattr(model, "metrics", []) if id(m) not in own]


def model_in_train_step() -> Any:
    """The model whose train step is running (being traced, on TensorFlow) further up the stack: the ``self`` of the
    nearest caller frame that is a ``keras.Model`` with a ``train_function`` (``model.fit`` built it before calling it;
    Keras's ``fit`` and ``train_step`` are methods of the model); None outside one. Walks the frames: call it once per
    trace, not per step. Keras internal (``train_function``), checked against Keras 3.15.1's source."""
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, keras.Model) and getattr(candidate, "train_function", None) is not None:
            return candidate
        frame = frame.f_back
    return None


def convert_train_function_errors(model: Any, convert: Callable[[BaseException], BaseException | None]) -> None:
    """Has ``model.train_function`` (what the loops of ``model.fit`` call for each step or execution) re-raise an error
    ``convert(error)`` gives another one for as that one, ``from`` the error; once per train function. Left alone
    while kfit wraps it for a run (:func:`after_each_train_call`, whose release restores what it wrapped). Keras
    internal (``train_function``, read by ``fit`` at each call), checked against Keras 3.15.1's source."""
    original = getattr(model, "train_function", None)
    if original is None or hasattr(original, "_kfit_unwrapped") or hasattr(original, "_kfit_converts"):
        return

    def train_function(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except Exception as error:
            converted = convert(error)
            if converted is None:
                raise
            raise converted from error

    train_function._kfit_converts = True
    model.train_function = train_function


def make_validation_iterator_again(model: Any, validation_data: Any, batch_size: Any, validation_steps: Any) -> None:
    """On TensorFlow, makes now the validation iterator ``model.fit`` makes at its first validation and keeps for the
    rest of the call (``model._eval_epoch_iterator``), leaving the torch random generators of a ``DataLoader`` given as
    ``validation_data`` where they were. Keras's adapter of a DataLoader reads a batch from a new iterator to find its
    tensor specs as that validation iterator is made, which draws from torch's generators (the iterator's base seed):
    a run resumed after an epoch that validated must not draw it again, since the interrupted run drew it before its
    checkpoint, and a training DataLoader's next shuffle order follows torch's default generator. Called as a resumed
    fit begins (Keras empties the attribute as its ``fit`` starts, before the callbacks' ``on_train_begin``). Does
    nothing on the other backends (their loops read a DataLoader as it is) and for other validation data. Keras
    internals (``TFEpochIterator``, the TensorFlow trainer's ``_eval_epoch_iterator``): checked against Keras 3.15.1's
    source (the same code in Keras 3.10-3.14's); tests/test_hunt_sources.py run on TensorFlow 2.21 with Keras 3.11.3,
    3.12.4, 3.13.2, 3.14.1 and 3.15.1."""
    if BACKEND != "tensorflow" or validation_data is None:
        return
    from keras.src.trainers.data_adapters import data_adapter_utils

    x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(validation_data)
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.utils.data.DataLoader):
        return
    from keras.src.backend.tensorflow.trainer import TFEpochIterator

    generators = [g for g in (torch.default_generator, x.generator, getattr(x.sampler, "generator", None)) if g is not None]
    states = [g.get_state() for g in generators]
    model._eval_epoch_iterator = TFEpochIterator(
        x=x, y=y, sample_weight=sample_weight, batch_size=batch_size, distribute_strategy=model.distribute_strategy,
        steps_per_execution=model.steps_per_execution, steps_per_epoch=validation_steps, shuffle=False)
    for generator, state in zip(generators, states):
        generator.set_state(state)


def quiet_rate_schedulers(callbacks: list) -> Callable[[], None]:
    """Silences Keras's ``LearningRateScheduler``s (``verbose=0``) until the returned function is called: a run resumed
    in the middle of an epoch begins it again, and the scheduler's ``on_epoch_begin`` would print a rate stepped a
    second time, which kfit puts back. Calling the returned function again does nothing. Its ``verbose`` attribute:
    checked against Keras 3.10-3.15."""
    quieted = [(c, c.verbose) for c in callbacks if isinstance(c, keras.callbacks.LearningRateScheduler) and c.verbose]
    for callback, _ in quieted:
        callback.verbose = 0

    def undo() -> None:
        for callback, verbose in quieted:
            callback.verbose = verbose
        quieted.clear()
    return undo
