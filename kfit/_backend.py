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
    """Converts a (nested) batch of NumPy arrays to the backend's tensors (safe on a reader thread)."""
    if BACKEND == "jax":
        import jax

        return jax.tree_util.tree_map(jax.device_put, batch)
    return keras.tree.map_structure(
        lambda a: None if a is None else keras.ops.convert_to_tensor(a), batch
    )


def _variable_index(variables: list, variable: Any) -> int | None:
    for i, v in enumerate(variables):
        if v is variable:
            return i
    return None


RUNNER_ATTRIBUTE = "_kfit_runner"


def set_variable(model: Any, variable: Any, value: Any) -> None:
    """Assigns ``value`` to a model or optimizer ``variable`` during training.

    On TensorFlow and PyTorch this is ``variable.assign``. On JAX the fit loop holds the state outside
    the Keras variables: inside kfit's loop the new value is written into the held state directly (one
    array, no sync); inside Keras's own ``model.fit`` loop the state is synced into the variables first,
    and Keras re-reads it before the next step.
    """
    if BACKEND == "jax":
        runner = getattr(model, RUNNER_ATTRIBUTE, None)
        if runner is not None and runner.patch(variable, value):
            return
        if getattr(model, "_jax_state", None) and not getattr(model, "_jax_state_synced", True):
            model.jax_state_sync()
    variable.assign(value)


def read_variable(model: Any, variable: Any) -> np.ndarray:
    """Reads a variable's current value during training (see :func:`set_variable`)."""
    if BACKEND == "jax":
        runner = getattr(model, RUNNER_ATTRIBUTE, None)
        held = runner.read(variable) if runner is not None else None
        if held is not None:
            return held
        sync_model(model)
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
        self._positions: dict[int, tuple[int, int] | None] = {}
        if BACKEND == "jax":
            object.__setattr__(model, RUNNER_ATTRIBUTE, self)

    def _held(self, variable: Any) -> tuple[int, int] | None:
        """Where ``variable`` sits in the held JAX state: (group, index), or None."""
        if self._state is None or self.model._jax_state_synced:
            return None
        key = id(variable)
        if key not in self._positions:  # found once per variable, not at every step
            groups = (self.model.trainable_variables, self.model.non_trainable_variables,
                      self.model.optimizer.variables, self.model.metrics_variables)
            self._positions[key] = next(
                ((g, index) for g in (2, 1, 0, 3) if (index := _variable_index(groups[g], variable)) is not None), None)
        return self._positions[key]

    def patch(self, variable: Any, value: Any) -> bool:
        """Writes ``value`` into the held state (JAX); False when the variables are current instead."""
        where = self._held(variable)
        if where is None:
            return False
        import jax.numpy as jnp

        g, index = where
        new = jnp.asarray(value, dtype=self._state[g][index].dtype)
        self._state[g][index] = new
        # Keep the copy a callback would sync from (model.jax_state_sync) in step with it.
        names = ("trainable_variables", "non_trainable_variables", "optimizer_variables", "metrics_variables")
        shown = getattr(self.model, "_jax_state", None)
        if shown and shown.get(names[g]) is not None:
            shown[names[g]][index] = new
        return True

    def read(self, variable: Any) -> np.ndarray | None:
        where = self._held(variable)
        return None if where is None else np.asarray(self._state[where[0]][where[1]])

    def build(self, batch: Any) -> None:
        """Builds the model, its metrics and its optimizer from one batch, without training on it."""
        model = self.model
        if BACKEND == "tensorflow":
            model._maybe_symbolic_build(data_batch=batch)
        # On TensorFlow too: Keras would build the compile metrics only when tracing the first step, and a
        # checkpoint restored at on_train_begin must find their variables (a mid-epoch resume restores them).
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
            # The state is a tuple of four lists (fresh from the jitted step): patch() writes into them.
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
            object.__setattr__(self.model, RUNNER_ATTRIBUTE, None)
