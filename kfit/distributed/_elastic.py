"""Horovod's elastic mode with kfit's training state as the Horovod state.

    horovodrun -np 4 --min-np 2 --max-np 8 --host-discovery-script ./discover_hosts.sh python train.py

When a worker is lost, the others get an error in their next collective operation; when hosts are added
or removed, every worker is told at its next commit. Horovod then restarts the training function on the
new set of workers from the last committed state. :class:`ElasticState` is that state: the model's and the
optimizer's variables, the sample clock, the stream position and the kfit callbacks' states, committed in
host memory every ``commit_frequency`` samples. ``kfit.fit`` called again inside :func:`run` resumes from
it: each worker reads its share of the global minibatches for the new number of workers, from the same
position of the stream.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import keras
import numpy as np
from horovod.common.elastic import State, run_fn
from horovod.common.exceptions import HorovodInternalError

from kfit import _backend, _checks
from kfit._run import current_run
from kfit.callbacks._base import KfitCallback
from kfit.clock import Clock
from kfit.distributed import _horovod, _select, _state


def _check_engine() -> None:
    """Elastic mode is Horovod's: refused under another engine (the native one has no elastic mode)."""
    if _select.chosen() == "native":
        raise ValueError(
            "Horovod's elastic mode (kfit.distributed.ElasticState, @kfit.distributed.elastic.run) needs the Horovod "
            "engine, but this process runs the native engine (torchrun's environment or KFIT_ENGINE=native). Launch "
            "with `horovodrun --min-np ... --host-discovery-script ...`, or resume from a kfit.callbacks.Checkpoint "
            "after a restart instead."
        )


def _is_horovod_failure(error: BaseException) -> bool:
    # A collective that failed because a peer is gone: raised as HorovodInternalError by the host
    # operations, wrapped by TensorFlow (an op error) and JAX (an io_callback error) inside the step.
    text = str(error)
    return "Horovod" in text and any(w in text for w in ("shut down", "HorovodInternalError", "Gloo", "gloo", "connection", "Connection"))


def run(func: Any) -> Any:
    """Horovod's ``hvd.elastic.run`` for kfit: restarts ``func(state, ...)`` after a reset of the workers.

    Like Horovod's decorator, with the failures of Horovod's collectives inside a TensorFlow or JAX train
    step recognized as such (they reach Python wrapped in the backend's own errors).

    Example::

        @kfit.distributed.elastic.run
        def train(state):
            kfit.fit(model, x, y, minibatch_size=256, max_samples=1_000_000, callbacks=[state])

        train(kfit.distributed.ElasticState(model, commit_frequency=10_000))
    """

    _check_engine()

    @functools.wraps(func)
    def wrapper(state: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except HorovodInternalError:
            raise
        except Exception as error:  # noqa: BLE001 - re-raised unless a peer is gone
            if _is_horovod_failure(error):
                raise HorovodInternalError(error) from error
            raise

    def reset() -> None:
        hvd = _horovod.plugin()
        hvd.shutdown()
        hvd.init()

    return run_fn(wrapper, reset)


class ElasticState(KfitCallback, State):
    """kfit's training state as Horovod's elastic state; also the callback that commits it.

    Give it to ``kfit.fit``'s callbacks inside a function decorated with :func:`run`. Every
    ``commit_frequency`` samples (global) it commits the state to host memory and checks whether hosts were
    added or removed (then Horovod restarts the function on the new workers). After a lost worker, every
    worker goes back to the last commit; the restarted ``kfit.fit`` continues from its clock. The epoch's
    metrics restart at the resumption.

    Args:
        model: the compiled model being trained.
        commit_frequency: samples between commits (a positive int).
        name: the callback's name.

    Raises:
        ValueError: a bad ``commit_frequency``.

    Example::

        import kfit.distributed as hvd

        hvd.init()
        state = hvd.ElasticState(model, commit_frequency=10_000)

        @hvd.elastic.run
        def train(state):
            kfit.fit(model, x, y, minibatch_size=256, max_samples=1_000_000, callbacks=[state])

        train(state)
    """

    default_name = "elastic_state"
    order = 110  # after the checkpoint: a commit holds everything the step did

    def __init__(self, model: keras.Model, commit_frequency: int, name: str | None = None):
        _checks.count("commit_frequency", commit_frequency, low=1)  # samples
        _check_engine()
        KfitCallback.__init__(self, name=name)
        hvd = _horovod.plugin()
        # An explicit name: Horovod names the broadcast after the object's type by default, and a worker
        # that has just joined (nothing committed: None) would wait for a broadcast of another name.
        State.__init__(self, bcast_object=lambda obj: hvd.broadcast_object(obj, root_rank=0, name="kfit.elastic"),
                       get_rank=hvd.rank)
        self.tracked_model = model
        self.commit_frequency = commit_frequency
        self._variables: list[np.ndarray] | None = None
        self._saved: dict | None = None  # clock, stream position, callbacks' states
        self.resets = 0

    # -- Horovod's State ---------------------------------------------------------------------------------
    def _variables_of(self) -> list:
        model = self.tracked_model
        optimizer = model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(model.trainable_variables)
        return _state._state_variables(model)

    def save(self) -> None:
        """Copies the state to host memory (called by ``commit``)."""
        model = self.tracked_model
        _backend.sync_model(model)
        self._variables = [np.array(keras.ops.convert_to_numpy(v.value), copy=True) for v in self._variables_of()]
        run = current_run(model)
        clock = run.clock if run is not None else None
        self._saved = {
            "clock": clock.get_state() if clock is not None else None,
            "callbacks": {
                peer.name: copy.deepcopy(peer.get_state())
                for peer in (run.callbacks if run is not None else [])
                if isinstance(peer, KfitCallback) and peer is not self
            },
        }

    def restore(self) -> None:
        """Puts the last committed variables back (after a lost worker); the clock follows at the next fit."""
        if self._variables is None:
            return
        for variable, value in zip(self._variables_of(), self._variables):
            variable.assign(value)

    def sync(self) -> None:
        """Every worker takes rank 0's committed state (also a worker that has just joined)."""
        _state.broadcast_variables(self._variables_of(), 0)
        self._saved = self._bcast_object(self._saved)
        self._variables = None

    def reset(self) -> None:
        self.resets += 1

    # -- the callback ----------------------------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        saved = self._saved
        if not saved or saved.get("clock") is None:
            return
        model = self._model
        run = self.training_run
        self.clock.set_state(saved["clock"])
        if run.stream is not None:
            run.stream.position = self.clock.samples
        for peer in run.callbacks:
            if isinstance(peer, KfitCallback) and peer is not self and peer.name in saved["callbacks"]:
                peer.set_state(copy.deepcopy(saved["callbacks"][peer.name]))
        model.reset_metrics()

    def on_step_end(self, clock: Clock, logs: dict | None) -> None:
        size = clock.minibatch_size or 0
        if size and (clock.samples - size) // self.commit_frequency != clock.samples // self.commit_frequency:
            self.commit()
