"""``DistributedOptimizer``: a Keras 3 optimizer whose gradients are summed over the workers (any engine).

Keras 3 trains through one method on every backend: the train step calls ``optimizer.apply(grads, vars)``
on TensorFlow (through ``apply_gradients``) and PyTorch, and ``optimizer.stateless_apply`` on JAX, which
calls ``apply`` inside a ``StatelessScope``. Horovod-Keras hooked methods that Keras 3 no longer calls
(``get_gradients``, ``_aggregate_gradients``), so its optimizer trains each worker on its own without an
error. kfit overrides ``apply``: the gradients of the step go through one grouped allreduce of the engine
(fused into one buffer by Horovod; one flat buffer per dtype by the native engines), then the optimizer's own
update runs on the result.

How the workers' gradients are combined. Keras losses are means over the minibatch, so worker ``r``'s
gradient ``g_r`` is the mean over its ``n_r`` samples. Under :func:`kfit.fit` the train step knows
``n_r`` (the leading dimension of its inputs), and the allreduce carries it too::

    g = sum_r(n_r * g_r) / sum_r(n_r)

which is the mean gradient of the whole global minibatch, also when its size does not divide evenly
among the workers (worker shares differ by one sample). On the JAX engine's in-step path every share is
padded to the same number of rows ``p`` with zero-weight rows (``kfit/distributed/_jax_engine.py``); the loss,
a mean over the padded rows, gives ``g_r = sum_i(w_i * grad_i) / p``, so the weight is ``p`` and the divisor
the global number of real samples: ``g = sum_r(p * g_r) / sum_r(n_r)``, the same mean gradient.
A global minibatch of fewer samples than workers (an epoch's or ``max_samples``'s last, cut short) leaves some
shares empty; such a worker trains one padding row (``kfit.data._stream.read_share``) with ``n_r = 0``: on PyTorch
its step knows that from the run's plan (:class:`StepSizes`), weights its gradient by 0 and gives its metrics back
their state from before the step; the JAX engine's step pads the share as any other (weight 0 on the row).
Under plain ``model.fit`` (Horovod's usage), the workers' gradients are averaged, ``g = mean_r(g_r)``, as
Horovod does: each worker's minibatch counts equally. Both assume a loss reduced by its mean over the minibatch (Keras's default).
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass
from typing import Any

import keras

from kfit.distributed import _engine, _select


class Compression:
    """How gradients travel in the allreduce (Horovod's ``hvd.Compression``).

    ``Compression.none`` sends them as they are; ``Compression.fp16`` sends floating-point gradients as
    float16 and casts the sum back, halving the bytes sent at the cost of precision.
    """

    none = "none"
    fp16 = "fp16"


#: Reduction operations accepted by :func:`DistributedOptimizer` (Horovod's ``hvd.Average``, ``hvd.Sum``).
Average = "average"
Sum = "sum"
#: Horovod's ``hvd.Adasum``, so that a ported script's name resolves: :func:`DistributedOptimizer` refuses it.
Adasum = "adasum"

GRADIENTS_NAME = "kfit.gradients"


@dataclass(frozen=True)
class _Options:
    op: str
    compression: str
    num_groups: int
    name: str
    predivide: float = 1.0


# The number of samples of the step being traced, set by the train-step hook that prepare_model installs
# (a Python int on JAX and PyTorch, a scalar tensor of the traced graph on TensorFlow).
_step = threading.local()


def _local_count() -> Any:
    return getattr(_step, "count", None)


def _groups(items: list, num_groups: int) -> list[list]:
    if num_groups <= 1 or len(items) <= 1:
        return [items]
    num_groups = min(num_groups, len(items))
    size, extra = divmod(len(items), num_groups)  # the first `extra` groups get one item more
    bounds = [g * size + min(g, extra) for g in range(num_groups + 1)]
    return [items[start:stop] for start, stop in zip(bounds, bounds[1:])]


def reduce_gradients(grads: list, options: _Options) -> list:
    """The workers' gradients combined (see the module's docstring); ``None`` entries stay ``None``."""
    ops = keras.ops
    index = [i for i, g in enumerate(grads) if g is not None]
    if not index:
        return grads
    dense = [_dense(grads[i]) for i in index]
    dtypes = [g.dtype for g in dense]
    count = _local_count()
    weighted = options.op == Average and count is not None
    if weighted:
        n = ops.cast(count, dense[0].dtype)
        dense = [g * ops.cast(n, g.dtype) for g in dense]
    if options.predivide != 1.0:  # Horovod's gradient_predivide_factor: part of the division before the sum
        dense = [g / ops.cast(options.predivide, g.dtype) if _is_float(g) else g for g in dense]
    if options.compression == Compression.fp16:
        dense = [ops.cast(g, "float16") if _is_float(g) else g for g in dense]
    average = options.op == Average and not weighted
    groups = _groups(list(range(len(dense))), options.num_groups)
    reduced: list = [None] * len(dense)
    for k, group in enumerate(groups):
        tensors = [dense[i] for i in group]
        if weighted and k == len(groups) - 1:
            real = _engine.step_real_count()  # a padded share: its real samples (see the module docstring)
            tensors.append(ops.reshape(ops.cast(count if real is None else real, "float32"), (1,)))
        name = options.name if len(groups) == 1 else f"{options.name}.{k}"
        out = _select.current().step_sum(tensors, name, average=average)
        if weighted and k == len(groups) - 1:
            total = out.pop()
        for i, value in zip(group, out):
            reduced[i] = value
    reduced = [ops.cast(r, dtype) for r, dtype in zip(reduced, dtypes)]
    if weighted:
        reduced = [r / ops.cast(total[0], r.dtype) for r in reduced]
    if options.predivide != 1.0:  # ... and the rest after it
        reduced = [r * ops.cast(options.predivide, r.dtype) if _is_float(r) else r for r in reduced]
    out = list(grads)
    for i, value in zip(index, reduced):
        out[i] = value
    return out


def _dense(gradient: Any) -> Any:
    # TensorFlow gives tf.IndexedSlices for embedding lookups; the allreduce sums dense tensors.
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        if isinstance(gradient, tf.IndexedSlices):
            return tf.convert_to_tensor(gradient)
    return gradient


def _is_float(tensor: Any) -> bool:
    return keras.backend.standardize_dtype(tensor.dtype).startswith(("float", "bfloat"))


class _DistributedMixin:
    """Overrides ``apply``: the step's gradients are reduced over the workers before the update."""

    _kfit_distributed = True

    def apply(self, grads, trainable_variables=None):
        from kfit import distributed

        if distributed.size() > 1 and len(grads) > 0:
            _select.current().check_step_compilable()
            grads = reduce_gradients(list(grads), self._kfit_horovod_options)
        return super().apply(grads, trainable_variables)


_classes: dict[type, type] = {}


def _distributed_class(cls: type) -> type:
    if cls not in _classes:
        # Serialized as the optimizer's own class (same name, module and Keras names): saving the model records
        # the plain optimizer, and loading it gives one back (load_model wraps it again), as with Horovod.
        from kfit import _backend

        _classes[cls] = type(cls.__name__, (_DistributedMixin, cls), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
        _backend.serialize_as(_classes[cls], cls)
    return _classes[cls]


def is_distributed(optimizer: Any) -> bool:
    """True when ``optimizer`` was made distributed by :func:`DistributedOptimizer`."""
    return bool(getattr(optimizer, "_kfit_distributed", False))


def DistributedOptimizer(
    optimizer: keras.optimizers.Optimizer,
    name: str | None = None,
    compression: str = Compression.none,
    op: str = Average,
    num_groups: int = 0,
    *,
    device_dense: str = "",
    device_sparse: str = "",
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    groups: int | None = None,
    process_set: Any = None,
    scale_local_gradients: bool = True,
) -> keras.optimizers.Optimizer:
    """Makes a Keras 3 optimizer sum its gradients over the workers at every step (Horovod or native engine).

    The port of ``hvd.DistributedOptimizer`` to Keras 3, for TensorFlow, JAX and PyTorch. The optimizer is
    changed in place (its class becomes a subclass that overrides ``apply``) and returned, so both
    ``opt = DistributedOptimizer(opt)`` and wrapping ``model.optimizer`` work, before or after the model
    is compiled or trained. Its variables and configuration are kept; ``model.save`` records the plain
    optimizer. Without a launcher (one worker) it changes nothing in training.

    Each step's gradients go through one grouped allreduce (``num_groups`` of them if given), which
    Horovod fuses into one buffer: the mean gradient of all workers' samples (see the module docstring
    for how uneven shares are weighted under ``kfit.fit``). On TensorFlow the allreduce is an op of the
    traced step, which therefore cannot be XLA-compiled: compile with ``jit_compile=False`` (``kfit.fit``
    does it). On JAX the jitted step calls the host with ``jax.experimental.io_callback`` (Horovod, and the
    native engine under plain ``model.fit``); under ``kfit.fit`` the native JAX engine sums inside the step (``psum``).

    Args:
        optimizer: a ``keras.optimizers.Optimizer`` (Keras's, kfit's, or a ``LossScaleOptimizer``).
        name: the name of the allreduce (the same on every worker). Default ``"kfit.gradients"``.
        compression: ``Compression.none`` or ``Compression.fp16`` (float16 on the wire).
        op: ``Average`` (the mean gradient) or ``Sum`` (the sum of the workers' gradients).
        num_groups: split the gradients into this many allreduce calls (0 or 1: one call).

    Horovod's other arguments, keyword-only here, are accepted where they keep their meaning and refused,
    saying what to use instead, where they cannot:

    - ``device_dense``, ``device_sparse``: accepted, unused (the gradients stay where the backend put them);
    - ``sparse_as_dense``: accepted; kfit always sends sparse gradients (``tf.IndexedSlices``) as dense tensors;
    - ``gradient_predivide_factor``: with ``op=Average``, the gradients are divided by it before the sum and the
      sum multiplied by ``factor / size`` after it, as Horovod does (the same average; a smaller sum on the wire);
    - ``backward_passes_per_step``: 1 only; accumulate gradients with the Keras optimizer's own
      ``gradient_accumulation_steps=N`` (which averages them: Horovod's ``average_aggregated_gradients=True``);
    - ``average_aggregated_gradients``: accepted (it means nothing for one backward pass per step);
    - ``groups``: a number of groups, as ``num_groups``; lists of variables are refused;
    - ``process_set``: None only (kfit reduces over every worker);
    - ``scale_local_gradients``: accepted (Keras 3 models have no Horovod local variables).

    Returns:
        ``optimizer``, now distributed.

    Raises:
        TypeError: ``optimizer`` is not a Keras optimizer.
        ValueError: an unknown ``compression`` or ``op`` (``Adasum`` included), a negative ``num_groups``, an empty
            ``name``, or a Horovod argument kfit cannot honour (above; the message says what to use instead).

    Example:
        >>> import keras, kfit
        >>> opt = kfit.distributed.DistributedOptimizer(keras.optimizers.SGD(0.01 * kfit.distributed.size()))
        >>> type(opt).__name__, kfit.distributed.is_distributed(opt)
        ('SGD', True)
    """
    given = {key: value for key, value in locals().items() if key != "optimizer"}  # the arguments, by name
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "Argument `optimizer` must be a keras.optimizers.Optimizer. "
            f"Received: optimizer={optimizer!r} of type {type(optimizer).__name__}"
        )
    options = make_options(**given)
    if not is_distributed(optimizer):
        optimizer.__class__ = _distributed_class(type(optimizer))
    object.__setattr__(optimizer, "_kfit_horovod_options", options)
    return optimizer


def make_options(**given: Any) -> _Options:
    """:func:`DistributedOptimizer`'s arguments but ``optimizer``, by name (those left out take its defaults), checked
    (the errors it documents) and resolved."""
    given = {**OPTION_DEFAULTS, **given}
    compression, op, num_groups, name = given["compression"], given["op"], given["num_groups"], given["name"]
    if compression not in (Compression.none, Compression.fp16):
        raise ValueError(
            "Invalid value for argument `compression`: expected kfit.distributed.Compression.none or "
            f"Compression.fp16. Received: compression={compression!r}"
        )
    if op == Adasum:
        raise ValueError(
            "Invalid value for argument `op`: kfit has no Adasum reduction (Horovod's adaptive summation). Received: "
            "op=Adasum. Use op=kfit.distributed.Average (the default) with the learning rate scaled by size(), or "
            "op=Sum."
        )
    if op not in (Average, Sum):
        raise ValueError(
            f"Invalid value for argument `op`: expected kfit.distributed.Average or Sum. Received: op={op!r}"
        )
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"Invalid value for argument `num_groups`: expected a non-negative integer. Received: num_groups={num_groups!r}")
    num_groups = _horovod_arguments(given)
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"Invalid value for argument `name`: expected a non-empty string. Received: name={name!r}")
    return _Options(op, compression, num_groups, name or GRADIENTS_NAME, float(given["gradient_predivide_factor"]))


#: :func:`DistributedOptimizer`'s arguments but ``optimizer``, with their defaults.
OPTION_DEFAULTS = {name: p.default for name, p in inspect.signature(DistributedOptimizer).parameters.items()
                   if name != "optimizer"}


def _horovod_arguments(given: dict) -> int:
    """Checks Horovod's arguments that kfit accepts for compatibility; returns the number of groups."""

    def refuse(name: str, expected: str, fix: str = "") -> ValueError:
        return ValueError(f"Invalid value for argument `{name}`: expected {expected}. Received: {name}={given[name]!r}"
                          + (f". {fix}" if fix else ""))

    for name in ("device_dense", "device_sparse"):
        if not isinstance(given[name], str):
            raise refuse(name, "a string (accepted for Horovod's sake; kfit does not use it)")
    for name in ("sparse_as_dense", "average_aggregated_gradients", "scale_local_gradients"):
        if not isinstance(given[name], bool):
            raise refuse(name, "True or False")
    factor = given["gradient_predivide_factor"]
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor < float("inf"):
        raise refuse("gradient_predivide_factor", "a positive number")
    if factor != 1.0 and given["op"] != Average:
        raise refuse("gradient_predivide_factor", "1.0 unless op is Average (it splits an average's division, as in "
                     "Horovod)", "With op=Sum there is no division to split: use op=kfit.distributed.Average, or leave "
                     "gradient_predivide_factor out")
    passes = given["backward_passes_per_step"]
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise refuse("backward_passes_per_step", "a positive integer")
    if passes != 1:
        raise refuse("backward_passes_per_step", "1 (kfit reduces the gradients of every step)",
                     f"To accumulate {passes} minibatches' gradients per update, give the Keras optimizer "
                     f"gradient_accumulation_steps={passes} (it averages them, as Horovod's "
                     "average_aggregated_gradients=True), e.g. keras.optimizers.SGD(..., "
                     f"gradient_accumulation_steps={passes})")
    if given["process_set"] is not None:
        raise refuse("process_set", "None (kfit reduces the gradients over every worker)",
                     "Leave process_set out")
    groups, num_groups = given["groups"], given["num_groups"]
    if groups is None:
        return num_groups
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 0:
        raise refuse("groups", "None or a non-negative number of groups (lists of variables are not supported)",
                     "Give the number of allreduce groups, e.g. num_groups=2")
    if num_groups not in (0, groups):
        raise ValueError(f"Arguments `groups` and `num_groups` both give the number of groups; give one. Received: "
                         f"groups={groups!r}, num_groups={num_groups!r}")
    return groups


class StepSizes:
    """The global minibatch of each step of ``model``'s run as the steps run: the run's driver planned the sizes of
    the steps of Keras's execution (several with ``steps_per_execution``), read here in order by a caller that runs
    once per step; else the clock's. None outside a run of ``kfit.fit``."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._pending: list | None = None
        self._next = 0

    def next(self) -> int | None:
        from kfit._run import current_run

        run = current_run(self.model)
        pending = getattr(getattr(run, "driver", None), "pending", None)
        if pending:
            if pending is not self._pending:
                self._pending, self._next = pending, 0
            if self._next < len(pending):
                self._next += 1
                return int(pending[self._next - 1])
        size = getattr(getattr(run, "clock", None), "minibatch_size", None)
        return int(size) if size else None


def pads_empty_shares() -> bool:
    """Whether ``kfit.fit``'s step trains a worker's empty share of a global minibatch (fewer samples than workers)
    as one padding row of weight 0 on this backend and engine: on PyTorch (the step runs in Python, which knows the
    step's share from the run's plan) and in the JAX engine's compiled step (which pads every share)."""
    return keras.backend.backend() == "torch" or _select.current().trains_in_step()


def _count_samples(model: keras.Model, train_step: Any) -> Any:
    """Wraps a model's ``train_step`` so that the optimizer's allreduce knows the step's local sample count.

    On PyTorch a step whose share is empty (its batch is one padding row, ``kfit.data._stream.read_share``) counts
    0 samples, so its gradient weighs nothing, and gives the metrics back their state from before the step."""
    from kfit.data._stream import real_count

    sizes = StepSizes(model) if keras.backend.backend() == "torch" else None

    def counted_train_step(*args: Any) -> Any:
        data = args[-1]
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        first = next(leaf for leaf in keras.tree.flatten(x) if leaf is not None)
        _step.count = keras.ops.shape(first)[0]
        saved = None
        engine = _select.current()
        total = sizes.next() if sizes is not None and engine.size() > 1 else None
        if total is not None and real_count(total, engine.rank(), engine.size()) == 0:
            _step.count = 0
            saved = [keras.ops.copy(v.value) for v in model.metrics_variables]
        try:
            logs = train_step(*args)
        finally:
            _step.count = None
        if saved is not None:
            for variable, value in zip(model.metrics_variables, saved):
                variable.assign(value)
            results = model.get_metrics_result()
            if isinstance(logs, dict) and set(logs) == set(results):
                logs = results
        return logs

    counted_train_step._kfit_counts_samples = True
    return counted_train_step


def prepare_model(model: keras.Model) -> None:
    """Prepares a compiled model for data-parallel training by ``kfit.fit`` (called before its step is built).

    The optimizer becomes a :func:`DistributedOptimizer` (unless it already is one), the train step tells
    it the local sample count (so that uneven shares are weighted exactly), the TensorFlow and PyTorch
    steps are not XLA/``torch.compile``-compiled (Horovod's ops cannot be), and the train function is
    rebuilt so that a step traced before (by an earlier ``model.fit``) is not reused.
    """
    if not is_distributed(model.optimizer):
        DistributedOptimizer(model.optimizer)
    if not getattr(model.train_step, "_kfit_counts_samples", False):
        object.__setattr__(model, "train_step", _count_samples(model, model.train_step))
    if keras.backend.backend() in ("tensorflow", "torch") and model.jit_compile:
        model.jit_compile = False
    engine = _select.current()
    if engine.trains_in_step() and not getattr(model.make_train_function, "_kfit_in_step", False):
        from kfit import _backend

        _backend.replace_train_function(model, lambda train_step: engine.train_step_function(model, train_step))
        model.make_train_function._kfit_in_step = True
        _backend.exclude_padding_from_metrics(model, _engine.step_padding, _training_metrics_check(model))
    model.train_function = None


def _training_metrics_check(model: keras.Model) -> Any:
    """``split()``: the model's training metrics as ``(additive, other)``, or None (see
    ``_evaluation.training_metrics_split``); asked when the step is first traced (the metrics are built then), and
    warns once when padding rows stay in some training metric."""
    from kfit.distributed import _evaluation

    verdict: list = []

    def split() -> tuple[list, list] | None:
        if not verdict:
            found = _evaluation.training_metrics_split(model)
            if found is None:
                reason = "the model defines its own train_step or compute_metrics"
            else:
                reason = ", ".join(f"metric {m.name!r} ({type(m).__name__}) may hold a state that is not a sum over "
                                   "samples" for m in found[1]) or None
            if reason is not None:
                from kfit.distributed._notices import warn_job

                warn_job(
                    f"kfit's JAX engine pads the workers' shares of a global minibatch that does not divide among "
                    f"them; the gradient stays exact, but {reason}, so the training values of such steps include "
                    f"the padding rows there.", stacklevel=2)
            verdict.append(found)
        return verdict[0]

    return split
