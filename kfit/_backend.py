"""Every difference between the TensorFlow, JAX and PyTorch backends that kfit cares about, in one place.

The rest of kfit speaks public Keras API and ``keras.ops``. What cannot be said that way lives here:

* running one compiled training step on a batch, the way ``model.fit`` does, keeping metric state
  across steps (``train_on_batch`` resets metrics at every call);
* on JAX, the fit loop holds the model's state outside the Keras variables; a hyperparameter change
  must reach that state without forcing a full state sync at every step;
* converting a host (NumPy) batch to the backend's tensors.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

BACKEND = keras.backend.backend()


def to_tensors(batch: Any) -> Any:
    """Converts a (nested) batch of NumPy arrays to the backend's tensors."""
    if BACKEND == "jax":
        # jax.jit takes NumPy arrays directly; converting first would only add a copy.
        return batch
    return keras.tree.map_structure(
        lambda a: None if a is None else keras.ops.convert_to_tensor(a), batch
    )


def _variable_index(variables: list, variable: Any) -> int | None:
    for i, v in enumerate(variables):
        if v is variable:
            return i
    return None


def set_variable(model: Any, variable: Any, value: Any) -> None:
    """Assigns ``value`` to a model or optimizer ``variable`` during training.

    On TensorFlow and PyTorch this is ``variable.assign``. On JAX, inside a fit loop (Keras's or kfit's),
    the step reads the state held by the loop: the new value is written there directly (one array) when
    the loop holds it, instead of syncing every variable of the model back and forth.
    """
    if BACKEND == "jax":
        state = getattr(model, "_jax_state", None)
        if state and not getattr(model, "_jax_state_synced", True):
            for group, variables in (
                ("optimizer_variables", lambda: model.optimizer.variables),
                ("non_trainable_variables", lambda: model.non_trainable_variables),
            ):
                held = state.get(group)
                if held is None:
                    continue
                index = _variable_index(variables(), variable)
                if index is not None and isinstance(held, list) and index < len(held):
                    import jax.numpy as jnp

                    held[index] = jnp.asarray(value, dtype=held[index].dtype)
                    return
            # Not found in the loop's state: fall back to a full sync, then a plain assign.
            model.jax_state_sync()
    variable.assign(value)


def read_variable(model: Any, variable: Any) -> np.ndarray:
    """Reads a variable's current value during training (see :func:`set_variable`)."""
    if BACKEND == "jax":
        state = getattr(model, "_jax_state", None)
        if state and not getattr(model, "_jax_state_synced", True):
            for group, variables in (
                ("optimizer_variables", lambda: model.optimizer.variables),
                ("non_trainable_variables", lambda: model.non_trainable_variables),
            ):
                held = state.get(group)
                index = None if held is None else _variable_index(variables(), variable)
                if index is not None and index < len(held):
                    return np.asarray(held[index])
            model.jax_state_sync()
    return keras.ops.convert_to_numpy(variable.value)


def sync_model(model: Any) -> None:
    """Makes the Keras variables hold the latest training state (a no-op off JAX)."""
    if BACKEND == "jax" and hasattr(model, "jax_state_sync"):
        model.jax_state_sync()


class StepRunner:
    """Runs compiled training steps on ``model``, as ``model.fit``'s inner loop does.

    Metric state accumulates across steps until :meth:`reset_metrics` (the epoch boundary).
    The compiled function is built once; its number of traces is bounded by the number of
    distinct batch shapes.
    """

    def __init__(self, model: Any):
        self.model = model
        self._state = None

    def build(self, batch: Any) -> None:
        """Builds the model, its metrics and its optimizer from one batch, without training on it."""
        model = self.model
        if BACKEND == "tensorflow":
            model._maybe_symbolic_build(data_batch=batch)
        else:
            model._symbolic_build(data_batch=batch)
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        model.make_train_function()

    def begin(self) -> None:
        """Starts (or restarts) a run of steps: the state is read from the Keras variables."""
        if BACKEND == "jax":
            self.model._jax_state_synced = True

    def step(self, batch: Any) -> dict:
        """One training step on ``batch`` (a tuple ``(x, y, sample_weight)`` of tensors)."""
        model = self.model
        if BACKEND == "jax":
            if model._jax_state_synced:
                self._state = model._get_jax_state(
                    trainable_variables=True,
                    non_trainable_variables=True,
                    optimizer_variables=True,
                    metrics_variables=True,
                    purge_model_variables=True,
                )
                model._jax_state_synced = False
            logs, self._state = model.train_function(self._state, iter([batch]))
            trainable, non_trainable, optimizer_vars, metrics_vars = self._state
            model._jax_state = {
                "trainable_variables": trainable,
                "non_trainable_variables": non_trainable,
                "optimizer_variables": optimizer_vars,
                "metrics_variables": metrics_vars,
            }
            return logs
        return model.train_function([batch])

    def sync(self) -> None:
        """Writes the loop's state back into the Keras variables."""
        sync_model(self.model)

    def end(self) -> None:
        """Ends the run: variables hold the final state."""
        self.sync()
        if BACKEND == "jax":
            self.model._jax_state = None
            self._state = None

    def count_compiled(self) -> int | None:
        """How many compiled versions of the train step exist (None on eager PyTorch)."""
        fn = self.model.train_function
        if BACKEND == "jax":
            inner = getattr(fn, "__wrapped__", None)
            for candidate in (fn, inner):
                if candidate is not None and hasattr(candidate, "_cache_size"):
                    return candidate._cache_size()
        return None
