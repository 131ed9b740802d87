"""Horovod's Keras callbacks, for Keras 3: broadcast, metric averaging, learning-rate warm-up and schedule.

Same names and arguments as ``horovod.keras.callbacks``, so a Horovod-Keras script ports by changing its
imports. They are for plain ``model.fit``; :func:`kfit.fit` broadcasts and averages by itself (adding
them there is harmless), and :class:`LearningRateWarmupCallback` works under both.
"""

from __future__ import annotations

import weakref
from typing import Any

import keras

from kfit import _backend, _checks
from kfit._run import current_run
from kfit.distributed import _check_rank, _select, rank, size

# The model.fit of each model whose lone stop a callback has handed to the engine (the callbacks of one fit share
# Keras's ``params`` dict): one leave per fit, whichever of the callbacks below is listed.
_left: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _LeavesAtALoneStop(keras.callbacks.Callback):
    """Tells the engine when this worker's ``model.fit`` ends at a stop before its last step (``model.stop_training``
    set by a callback): Horovod then joins, and a worker that trains on fails in its next step, naming the cause and
    :class:`AgreedStopCallback`, instead of hanging. A stop inside an epoch leaves as the validation begins or the
    epoch ends, before :class:`MetricAverageCallback`'s collectives there (list these callbacks before other callbacks
    with collectives, as Horovod's examples do); any other stop as training ends. Costs a read of
    ``optimizer.iterations`` as each epoch begins and ends."""

    _epoch = 0
    _iterations_at_epoch_begin = 0

    def _iterations(self) -> int:
        return int(_backend.read_variable(self._model, self._model.optimizer.iterations))

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if size() > 1 and getattr(self._model, "optimizer", None) is not None:
            self._epoch, self._iterations_at_epoch_begin = epoch, self._iterations()

    def _leave_at_a_stop(self, epoch_ended: bool) -> None:
        """Leaves if this worker stopped before the end of its epoch, or (``epoch_ended`` False) of its training."""
        model, params = self._model, self.params or {}
        if size() == 1 or not model.stop_training or getattr(model, "optimizer", None) is None or _left.get(model) is params:
            return
        steps, epochs = self._iterations() - self._iterations_at_epoch_begin, params.get("epochs") or 0
        if (epoch_ended or self._epoch + 1 >= epochs) and (not params.get("steps") or steps >= params["steps"]):
            return  # the epoch's (or the training's) planned end: every worker gets there
        _left[model] = params
        _select.current().leave(f"model.fit stopped after step {steps} of epoch {self._epoch + 1} of {epochs}")

    def on_test_begin(self, logs: dict | None = None) -> None:  # (model.fit validates after a stop inside the epoch)
        self._leave_at_a_stop(epoch_ended=True)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._leave_at_a_stop(epoch_ended=True)

    def on_train_end(self, logs: dict | None = None) -> None:
        self._leave_at_a_stop(epoch_ended=False)


class BroadcastGlobalVariablesCallback(_LeavesAtALoneStop):
    """Broadcasts rank ``root_rank``'s model and optimizer variables to every worker when training begins.

    Every worker then starts from the same weights, whatever its random initialization, or from the
    checkpoint that rank 0 alone loaded. Unlike Horovod-Keras (which broadcast after the first batch, once
    TensorFlow 1 had created the optimizer's slots), Keras 3 builds the optimizer before training, so the
    broadcast happens in ``on_train_begin`` and the first step already starts from the same state.

    Args:
        root_rank: the rank whose state every worker takes (usually 0).
        device: accepted for compatibility with Horovod; unused.

    Raises:
        ValueError: ``root_rank`` is not a rank.

    Example:
        >>> import kfit.distributed as hvd
        >>> callbacks = [hvd.BroadcastGlobalVariablesCallback(0), hvd.MetricAverageCallback()]
        >>> # model.fit(x, y, callbacks=callbacks, ...)
    """

    def __init__(self, root_rank: int, device: str = ""):
        super().__init__()
        _check_rank(root_rank)
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False

    def on_train_begin(self, logs: dict | None = None) -> None:
        if size() == 1:
            return
        from kfit.distributed import _state

        model = self.model
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and not optimizer.built:
            optimizer.build(model.trainable_variables)
        _state.broadcast_variables(_state._state_variables(model), self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(_LeavesAtALoneStop):
    """Combines the epoch's metrics over the workers, so that every worker logs the same numbers.

    At each epoch end, the training metrics become the ones of all the workers' samples: where the model's metrics
    all keep a state that is a sum over samples (the loss, accuracies, crossentropies, ``AUC``, ``Precision``...,
    with Keras's own ``train_step``), the results of those states summed over the workers, i.e. what one process
    would log; else each numeric entry averaged over the workers, weighted by the samples each one trained on. The
    ``val_*`` entries are averaged, weighted by the samples each worker evaluated. The logs are changed in place:
    put this callback before those that read them (checkpoints, early stopping, loggers), as with Horovod.

    Args:
        device: accepted for compatibility with Horovod; unused.

    Example:
        >>> import kfit.distributed as hvd
        >>> callbacks = [hvd.MetricAverageCallback(), keras.callbacks.CSVLogger("log.csv")]
    """

    def __init__(self, device: str = ""):
        super().__init__()
        self.device = device
        self._taken: tuple | None = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_begin(epoch, logs)
        self._taken = None

    def on_test_begin(self, logs: dict | None = None) -> None:
        # model.fit validates through model.evaluate, which resets the metrics: take the training metrics first
        # (model.fit has synced the state on JAX by now).
        super().on_test_begin(logs)
        if self._taken is None and size() > 1:
            from kfit.distributed import _state

            self._taken = _state.take_training_metrics(self.model)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is None or size() == 1:
            return
        from kfit.distributed import _state

        super().on_epoch_end(epoch, logs)  # (a stop inside the epoch: the others are in their next step)
        validated, self._taken = self._taken, None
        taken = validated or _state.take_training_metrics(self.model)
        val_count = _state.local_sample_count(self.model) if validated else taken[1]
        train = {k: v for k, v in logs.items() if not k.startswith("val_")}
        val = {k: v for k, v in logs.items() if k.startswith("val_")}
        logs.update(_state.combine_training_logs(train, taken))
        logs.update(_state.average_logs(val, val_count))


class AgreedStopCallback(keras.callbacks.Callback):
    """Makes a stop that any worker decides, or a SIGTERM that reached any worker, stop every worker after the same
    step (plain ``model.fit``).

    Under ``model.fit`` on several workers a stop decided on one worker only (a callback setting
    ``model.stop_training``: Keras's ``TerminateOnNaN``, its ``EarlyStopping`` on the worker's own metric, your own
    callback) ends that worker's ``model.fit`` alone, and the job fails (under Horovod, with
    :class:`BroadcastGlobalVariablesCallback` or :class:`MetricAverageCallback` listed, the others' next step raises an
    error that names this callback; without either of them, Horovod's "shut down" error once the stopped worker's
    script ends, with kfit's hint naming this callback, or a hang while it goes on running). Put this
    callback last in ``model.fit``'s list: after every step and at every epoch end, the workers agree (one allreduce
    of two integers) and every worker stops if any worker's ``model.stop_training`` is set. The same allreduce agrees
    on a SIGTERM caught by ``kfit.callbacks.Checkpoint(save_on_preemption=True)`` on any worker, as :func:`kfit.fit`
    does: rank 0 saves that step, and every worker ends as SIGTERM would. That allreduce costs time at every step
    (measured on loopback with one thread per worker: about 1.5 ms under Horovod, 0.2 ms under the native engine).
    On several workers a ``kfit.callbacks.Checkpoint(save_on_preemption=True)`` is refused as training begins unless
    this callback comes after it.
    :func:`kfit.fit` agrees on every stop by itself.

    Example:
        >>> import kfit.distributed as hvd
        >>> callbacks = [keras.callbacks.TerminateOnNaN(), hvd.AgreedStopCallback()]
        >>> # model.fit(x, y, callbacks=callbacks, ...)
    """

    order = 2000  # under kfit.fit (data-parallel): after every callback that may stop training
    _preemptible: list = []  # the run's callbacks that save on preemption (Checkpoint(save_on_preemption=True))
    _stoppable: list = []  # the run's callbacks that save a stop agreed inside an epoch (Checkpoint._stop_agreed)

    def set_model(self, model: Any) -> None:
        super().set_model(model)
        run = current_run(model)
        if run is not None and not run.begun:  # (Keras hands every callback the model before training begins)
            run.listed_before_agreement = list(run.callbacks)

    def on_train_begin(self, logs: dict | None = None) -> None:
        run = current_run(self.model) if size() > 1 else None
        callbacks = run.callbacks if run is not None else []
        if run is not None:  # the run's checkpoints leave a SIGTERM and a stop to this agreement
            run.agreed_stops = True
        self._preemptible = [c for c in callbacks if hasattr(c, "_preemption_agreed")]
        self._stoppable = [c for c in callbacks if hasattr(c, "_stop_agreed")]

    def _agree(self, epoch: int | None = None, logs: dict | None = None) -> None:
        from kfit.distributed import _state

        # Every step: ``self._model``, not ``self.model``, which on JAX syncs the whole training state into the
        # variables to read one Python flag (as KfitCallback.training_model).
        model = self._model
        requested = any(c._preemption_requested() for c in self._preemptible)
        stops, preempted = _state.count_true([bool(model.stop_training), requested])
        model.stop_training = stops > 0
        if preempted:  # every worker's checkpoint saves (rank 0 writes) and ends as SIGTERM would
            for callback in self._preemptible:
                callback._preemption_agreed(preempted, epoch, logs)
        elif stops and epoch is None:  # a checkpoint saves the step where every worker stops (Checkpoint._stop_agreed)
            for callback in self._stoppable:
                callback._stop_agreed()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._agree()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        # A stop decided as an epoch ends (a callback's on_epoch_end, a cross-validation at "1ep"), which Keras reads
        # before the next epoch's first step; a SIGTERM that came during the epoch's end (validation).
        self._agree(epoch, logs)


def _momentum_to_correct(optimizer: keras.optimizers.Optimizer, owner: str) -> keras.Variable | None:
    """The momentum variable that a change of learning rate must correct (Goyal et al.), or None."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    momentum = getattr(inner, "momentum", None)
    if isinstance(momentum, keras.Variable):
        return momentum if getattr(inner, "variant", "keras") == "keras" else None
    if isinstance(momentum, (int, float)) and not isinstance(momentum, bool) and momentum > 0:
        raise ValueError(
            f"{owner}(momentum_correction=True) needs the momentum in a variable, but "
            f"{type(inner).__name__} keeps momentum={momentum} as a Python float compiled into the train step. "
            "Use kfit.optimizers.MomentumSGD(variant='keras', momentum=...) (Keras's update, momentum in a "
            "variable), or pass momentum_correction=False."
        )
    return None


class _LearningRateCallback(keras.callbacks.Callback):
    """Sets the optimizer's learning rate before steps; with ``momentum_correction``, a step whose rate changes from
    ``lr`` to ``lr'`` uses ``mu * lr' / lr`` as its momentum (Goyal et al.), given back after the step."""

    def __init__(self) -> None:
        super().__init__()
        self.current_epoch = 0
        self._lr_variable = None
        self._momentum_variable = None
        self._restore_momentum: float | None = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        from kfit.optimizers import hyperparameter_variable

        optimizer = self._model.optimizer
        self._lr_variable = hyperparameter_variable(optimizer, "learning_rate")
        self._momentum_variable = _momentum_to_correct(optimizer, type(self).__name__) if self.momentum_correction else None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.current_epoch = epoch

    def _set_learning_rate(self, old_lr: float, new_lr: float) -> None:
        model = self._model
        _backend.set_variable(model, self._lr_variable, new_lr)
        if self._momentum_variable is not None and old_lr and new_lr != old_lr:
            momentum = float(_backend.read_variable(model, self._momentum_variable))
            self._restore_momentum = momentum
            _backend.set_variable(model, self._momentum_variable, momentum * new_lr / old_lr)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._restore_momentum is not None:
            _backend.set_variable(self._model, self._momentum_variable, self._restore_momentum)
            self._restore_momentum = None


class LearningRateWarmupCallback(_LearningRateCallback):
    """Gradual learning-rate warm-up from ``initial_lr / size()`` to ``initial_lr`` (Goyal et al., 2017).

    With ``size()`` workers the global minibatch is ``size()`` times larger, so the linear scaling rule
    multiplies the learning rate by ``size()``: ``initial_lr`` is that scaled rate (Horovod's meaning).
    Starting at it can diverge, so the rate rises linearly from the single-worker rate::

        lr = initial_lr / size * (1 + (size - 1) * p),   p = (S + B) / W   (clipped to 1)

    set before each step, where ``S`` is the sample clock before the step, ``B`` the step's global
    minibatch size and ``W`` the warm-up length in samples: ``warmup_samples``, or
    ``warmup_epochs * epoch_size`` on kfit's clock. Under plain ``model.fit`` without a
    :class:`kfit.callbacks.SampleClock`, Horovod's formula in epochs is used:
    ``p = (epoch + (batch + 1) / steps_per_epoch) / warmup_epochs``. After the warm-up the learning rate is
    left alone (a later schedule may take over). The epoch's logs get ``lr``.

    Momentum correction (Goyal et al.): Keras's classic momentum keeps the learning rate inside the
    velocity (``v = mu*v - lr*g``), so when the rate changes from ``lr`` to ``lr'`` the velocity is
    rescaled by using ``mu * lr' / lr`` as the momentum for that one step. It needs the momentum in a
    variable: ``kfit.optimizers.MomentumSGD(variant="keras")`` is corrected; CNTK's update
    (``MomentumSGD(variant="cntk")``, the default) keeps summed gradients in its buffer and applies the rate
    outside it, so it needs no correction; optimizers without momentum need none.

    Args:
        initial_lr: the learning rate after warm-up (the single-worker rate times ``size()``).
        warmup_epochs: warm-up length in epochs (ignored when ``warmup_samples`` is given).
        momentum_correction: apply the momentum correction above.
        steps_per_epoch: steps per epoch under plain ``model.fit`` without a clock (default: Keras's).
        verbose: 1 prints when the warm-up ends (on rank 0).
        warmup_samples: warm-up length in samples on kfit's clock (global samples over all workers).

    Raises:
        ValueError: a non-positive ``initial_lr``, a negative ``warmup_epochs``, a non-positive
            ``steps_per_epoch`` or ``warmup_samples``; at ``on_train_begin``, ``warmup_samples`` without kfit's
            clock, or momentum correction asked for an optimizer whose momentum is a Python float
            (``keras.optimizers.SGD(momentum>0)``: use ``kfit.optimizers.MomentumSGD(variant="keras")`` or
            ``momentum_correction=False``).

    Example:
        >>> import kfit.distributed as hvd
        >>> warmup = hvd.LearningRateWarmupCallback(initial_lr=0.1 * hvd.size(), warmup_samples=50_000)
    """

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: float = 5,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
        *,
        warmup_samples: int | None = None,
    ):
        super().__init__()
        self.initial_lr = _checks.real("initial_lr", initial_lr, low=0, low_inclusive=False)
        self.warmup_epochs = _checks.real("warmup_epochs", warmup_epochs, low=0)
        self.momentum_correction = _checks.boolean("momentum_correction", momentum_correction)
        self.steps_per_epoch = _checks.count("steps_per_epoch", steps_per_epoch, low=1, allow_none=True)
        self.verbose = verbose
        self.warmup_samples = _checks.count("warmup_samples", warmup_samples, low=1, allow_none=True)
        self._last_lr: float | None = None
        self._finished = False
        self._announced = False

    # -- setup ---------------------------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        super().on_train_begin(logs)
        model = self._model
        clock = getattr(current_run(model), "clock", None)
        if self.warmup_samples is not None and clock is None:
            raise ValueError(
                "LearningRateWarmupCallback(warmup_samples=...) counts kfit's global samples: train with kfit.fit, "
                "or add kfit.callbacks.SampleClock(batch_size=..., num_samples=...) to model.fit's callbacks."
            )
        if clock is None and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError(
                    "LearningRateWarmupCallback could not find the number of steps per epoch: pass steps_per_epoch=..."
                )
        self._last_lr = float(_backend.read_variable(model, self._lr_variable))
        self._finished = self._announced = False

    # -- the schedule ----------------------------------------------------------------------------------
    def progress(self, batch: int) -> float | None:
        """The warm-up's progress ``p`` after the coming step (None once the warm-up is over)."""
        clock = getattr(current_run(self._model), "clock", None)
        if clock is not None and clock.minibatch_size is not None and (self.warmup_samples or clock.epoch_size):
            length = self.warmup_samples or self.warmup_epochs * clock.epoch_size
            if length <= 0 or clock.samples >= length:
                return None
            return min((clock.samples + clock.minibatch_size) / length, 1.0)
        if self.warmup_epochs <= 0 or self.current_epoch >= self.warmup_epochs:
            return None
        return min((self.current_epoch + (batch + 1) / self.steps_per_epoch) / self.warmup_epochs, 1.0)

    def learning_rate(self, progress: float) -> float:
        """``initial_lr / size * (1 + (size - 1) * progress)``."""
        n = size()
        return self.initial_lr / n * (1.0 + (n - 1) * progress)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        run = current_run(self._model)
        if run is not None and run.clock is not None and run.driver is not None:
            run.driver.batch_begin(run.clock, batch)  # under model.fit: the step's size, once per step
        p = self.progress(batch)
        if p is None:
            return
        self._finished = p >= 1.0
        new_lr = self.learning_rate(p)
        old_lr = self._last_lr
        if new_lr == old_lr:
            return
        self._set_learning_rate(old_lr, new_lr)
        self._last_lr = new_lr

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None and self._last_lr is not None:
            logs["lr"] = self._last_lr
        if self.verbose and self._finished and rank() == 0 and not self._announced:
            self._announced = True
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {self._last_lr:g}.")


class LearningRateScheduleCallback(_LearningRateCallback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` between two epochs (Horovod's callback).

    The port of ``hvd.callbacks.LearningRateScheduleCallback``, with its arguments and meaning. In epochs
    ``start_epoch <= epoch < end_epoch`` (``end_epoch`` None: to the end), the rate is set before the first
    step of each epoch to ``initial_lr * multiplier(epoch)`` (``staircase=True``), or before every step to
    ``initial_lr * multiplier(epoch + batch / steps_per_epoch)`` (``staircase=False``). A number as
    ``multiplier`` is an exponential decay: ``multiplier ** (epoch - start_epoch)``. Outside those epochs the
    rate is left alone (another callback, such as :class:`LearningRateWarmupCallback` before ``start_epoch``,
    may set it). With ``momentum_correction``, a step whose rate changes from ``lr`` to ``lr'`` uses
    ``mu * lr' / lr`` as its momentum (see :class:`LearningRateWarmupCallback` for the optimizers it applies
    to). The epoch's logs get ``lr``.

    Args:
        initial_lr: the rate the multiplier scales (Horovod requires it: usually the single-worker rate times
            ``size()``).
        multiplier: a function of the (fractional) epoch, or a positive number (exponential decay).
        start_epoch: the first epoch the schedule sets (from 0, as Keras counts).
        end_epoch: the epoch it stops before (None: never).
        staircase: True: once per epoch; False: before every step.
        momentum_correction: apply the momentum correction.
        steps_per_epoch: steps per epoch, for ``staircase=False`` (default: Keras's ``params["steps"]``).

    Raises:
        ValueError: a missing or non-positive ``initial_lr``, a ``multiplier`` that is neither callable nor a
            positive number, a negative ``start_epoch``, an ``end_epoch`` not after ``start_epoch``, a
            non-positive ``steps_per_epoch``; at ``on_train_begin``, the momentum correction asked for an optimizer
            whose momentum is a Python float, or no steps per epoch for ``staircase=False``.

    Example:
        >>> import kfit.distributed as hvd
        >>> decay = hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1 * hvd.size(), multiplier=0.1,
        ...                                                     start_epoch=30, end_epoch=60)
        >>> decay.lr_at(31)
        0.010000000000000002
    """

    def __init__(
        self,
        initial_lr: float,
        multiplier: Any,
        start_epoch: int = 0,
        end_epoch: int | None = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
    ):
        super().__init__()
        self.initial_lr = _checks.real("initial_lr", initial_lr, low=0, low_inclusive=False)  # (Horovod requires it)
        start_epoch = _checks.count("start_epoch", start_epoch)
        if not callable(multiplier):
            if not _checks.is_real(multiplier) or not multiplier > 0:
                raise _checks.InvalidArgumentError(
                    "Invalid value for argument `multiplier`: expected a function of the epoch or a positive number. "
                    f"Received: multiplier={multiplier!r}")
            factor = float(multiplier)
            multiplier = lambda epoch: factor ** (epoch - start_epoch)  # noqa: E731  (Horovod's exponential decay)
        if end_epoch is not None and (not _checks.is_real(end_epoch) or end_epoch <= start_epoch):
            raise _checks.InvalidArgumentError(
                f"Invalid value for argument `end_epoch`: expected None or an epoch after start_epoch={start_epoch}. "
                f"Received: end_epoch={end_epoch!r}")
        self.multiplier = multiplier
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = _checks.boolean("staircase", staircase)
        self.momentum_correction = _checks.boolean("momentum_correction", momentum_correction)
        self.steps_per_epoch = _checks.count("steps_per_epoch", steps_per_epoch, low=1, allow_none=True)

    def lr_at(self, epoch: float) -> float:
        """``initial_lr * multiplier(epoch)``: the rate the schedule sets at a (fractional) epoch."""
        return self.initial_lr * float(self.multiplier(epoch))

    def on_train_begin(self, logs: dict | None = None) -> None:
        super().on_train_begin(logs)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError(f"{type(self).__name__}(staircase=False) could not find the number of steps per epoch: pass steps_per_epoch=...")

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        epoch = self.current_epoch
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return
        if self.staircase and batch != 0:
            return
        new_lr = self.lr_at(epoch if self.staircase else epoch + batch / self.steps_per_epoch)
        self._set_learning_rate(float(_backend.read_variable(self._model, self._lr_variable)), new_lr)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None and self._lr_variable is not None:
            logs["lr"] = float(_backend.read_variable(self._model, self._lr_variable))
