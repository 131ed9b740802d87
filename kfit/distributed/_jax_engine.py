"""The native engine of the JAX backend: ``jax.distributed``, with the gradient sum inside the compiled step.

Started from the same launcher environment as the PyTorch engine (``torchrun``: ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``), so ``torchrun --nproc_per_node 2 script.py`` trains
data-parallel on JAX without Horovod. It needs PyTorch installed (which ``torchrun`` is part of).

Two channels:

* the host operations (stop flag, metric sums, the initial broadcast, checkpoint bytes) go through
  ``torch.distributed`` (Gloo), as on the PyTorch engine (:class:`TorchEngine`), with its timeout and its
  :class:`WorkerLostError`;
* the gradients never leave the device: the worker starts ``jax.distributed`` (``jax.distributed.initialize``
  with ``jax_cpu_collectives_implementation="gloo"`` on CPU; the coordinator listens on a free port of
  ``MASTER_ADDR`` that rank 0 chooses and sends to the others over ``torch.distributed``), and kfit.fit's
  train step runs under ``jax.shard_map`` over a one-axis mesh of one device per worker, so that the
  optimizer's :meth:`JaxEngine.step_sum` is a ``jax.lax.psum`` compiled into the step (an all-reduce in its
  HLO, no host callback).

A multi-process JAX program is one SPMD program: every worker's share of a global minibatch must have the same
shape. kfit's shares differ by one sample when the global minibatch does not divide among the workers, so
the step pads each share to ``ceil(B / N)`` rows (:func:`pad_share`): the padding rows are copies of the share's
last row with sample weight 0 (a batch given without sample weights gets weights of 1 for its real rows). What
stays exact (equal to one process up to the float summation order):

* the gradient: Keras's default loss reduction (``sum_over_batch_size``) divides by the rows of the padded
  share, padding included, so the optimizer weights each worker's gradient by its padded row count and divides
  the sum by the global number of real samples (``kfit/distributed/_optimizer.py``);
* the loss tracker (its count is corrected by the padding rows) and every metric whose state is a sum over
  samples (the Keras classes of sharded evaluation, ``_evaluation.training_metrics_split``), updated by Keras's
  own ``train_step`` and ``compute_metrics``: the contribution of the padding rows (copies of one row) is
  computed and taken out (``kfit/_backend.py:exclude_padding_from_metrics``), so the step's logs and the epoch
  metrics are the unpadded ones (checked to 1e-5 against one process by ``tests/test_engines.py``).

Not exact with padding: layers with batch statistics (``BatchNormalization`` in training mode sees the
padding row); a loss a layer adds in its forward pass (``add_loss``, an activity regularizer: a mean over the
rows, the padding row included; kfit warns once, naming the layer; not refused here, unlike ``pad_remainders``);
the training value of a metric with another kind of state, or of every metric of a model with its own
``train_step`` or ``compute_metrics`` (it includes the padding rows; kfit warns once, naming it); per-output loss
metrics of a multi-output model (not tried); a loss with another reduction than the mean over the minibatch (then
the gradient too). A step whose global minibatch divides among the workers is not padded.

The train step is built by :meth:`JaxEngine.train_step_function` for :func:`kfit.fit` (its step knows the
global minibatch, hence the padded share). The state stays process-local between steps (Keras's loop, kfit's
hyperparameter writes and callbacks see ordinary single-device arrays); each step wraps it, without a copy,
into replicated global arrays (``jax.make_array_from_single_device_arrays``) and unwraps the results.

Under plain ``model.fit`` with :func:`kfit.distributed.DistributedOptimizer` (Horovod's API), where kfit
does not build the step, and with ``KFIT_JAX_COLLECTIVES=host`` (for comparison: ``benchmarks/scaling.py``),
the gradients leave the jitted step as on Horovod: an ordered ``jax.experimental.io_callback`` hands them to
the host, ``torch.distributed`` sums them, and the step goes on with the result (a device → host → device round
trip per step). Host operations then first wait for the steps already dispatched (``jax.effects_barrier``).

Failures: a peer that dies closes its Gloo connections, which fails this worker's next collective (the step's
or the host's) at once with :class:`WorkerLostError`; a hung peer fails the host collective after
``KFIT_COLLECTIVE_TIMEOUT`` seconds, and ``jax.distributed``'s heartbeat ends the job after the same time if a
worker is blocked inside a compiled step. A worker that ends with an error leaves at once, without waiting in
``jax.distributed``'s shutdown barrier for peers that will never reach it.
"""

from __future__ import annotations

import atexit
import math
import os
import socket
import sys
import threading
import warnings
from typing import Any

import numpy as np

from kfit import _backend
from kfit.distributed import _engine, _launch, _optimizer
from kfit.distributed._engine import WorkerLostError
from kfit.distributed._notices import warn_job
from kfit.distributed._torch_engine import TorchEngine

#: The mesh axis of the workers inside the compiled step.
AXIS = "kfit_workers"
#: ``step`` (default): the gradient sum is a psum inside the compiled step; ``host``: through the host.
COLLECTIVES_VARIABLE = "KFIT_JAX_COLLECTIVES"
COLLECTIVES = ("step", "host")

_tracing = threading.local()  # .in_step: True while kfit's sharded train step is being traced
_failed = threading.Event()  # set when a collective failed: leave without JAX's shutdown barrier


def collectives_mode() -> str:
    """``"step"`` or ``"host"``: where the JAX engine sums the gradients (``KFIT_JAX_COLLECTIVES``).

    Raises:
        ValueError: another value.
    """
    raw = os.environ.get(COLLECTIVES_VARIABLE, "")
    value = raw.strip().lower() or "step"
    if value not in COLLECTIVES:
        raise ValueError(f"Invalid value for environment variable {COLLECTIVES_VARIABLE}: expected 'step' (the "
                         f"default: a psum inside the compiled step) or 'host' (io_callback to torch.distributed). "
                         f"Received: {COLLECTIVES_VARIABLE}={raw!r}")
    return value


class JaxEngine(TorchEngine):
    """``jax.distributed`` in the step and ``torch.distributed`` on the host, behind
    :class:`kfit.distributed._engine.Engine` (JAX backend)."""

    def __init__(self, environment: _launch.LaunchEnvironment) -> None:
        self.in_step = collectives_mode() == "step"
        super().__init__(environment)
        self.mesh = None
        if self.in_step:
            self.mesh = self._start_jax_distributed(environment)

    # -- starting ----------------------------------------------------------------------------------------
    def _start_jax_distributed(self, environment: _launch.LaunchEnvironment) -> Any:
        import jax
        from jax._src import xla_bridge

        busy = np.array([1 if xla_bridge.backends_are_initialized() else 0], dtype=np.int32)
        if TorchEngine.host_sum(self, [busy], "kfit.jax_backend_in_use")[0][0] > 0:  # every worker takes the same path
            warn_job(
                "kfit's JAX engine starts jax.distributed before JAX runs anything (when kfit is imported), but "
                "JAX's backend was already in use in a worker: the gradients go through the host instead "
                "(io_callback, as with KFIT_JAX_COLLECTIVES=host). Import kfit before building a model.",
                stacklevel=3, chief=environment.rank == 0)
            self.in_step = False
            return None
        port = np.array([_free_port() if environment.rank == 0 else 0], dtype=np.int64)
        port = int(TorchEngine.host_broadcast(self, port, 0, "kfit.jax_coordinator_port")[0])
        timeout = _launch.timeout_seconds()
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=f"{_host(environment.master_addr)}:{port}",
            num_processes=environment.size,
            process_id=environment.rank,
            local_device_ids=[environment.local_rank],
            initialization_timeout=max(int(math.ceil(timeout)), 60),
            heartbeat_timeout_seconds=max(int(math.ceil(timeout)) + 5, 10),
            shutdown_timeout_seconds=max(int(math.ceil(timeout)), 10),
        )
        atexit.register(_leave_at_once_after_an_error)  # runs before jax.distributed's own shutdown (LIFO)
        _gloo_on_the_masters_route(environment)
        from jax.sharding import Mesh

        devices = {}
        for device in jax.devices():
            devices.setdefault(device.process_index, device)
        if len(devices) != environment.size:
            raise RuntimeError(f"jax.distributed sees {len(devices)} processes, the launcher says {environment.size}.")
        if devices[environment.rank] != jax.local_devices()[0]:
            raise RuntimeError(f"jax.distributed's first device of process {environment.rank} is "
                               f"{devices[environment.rank]}, this process's is {jax.local_devices()[0]}.")
        return Mesh(np.array([devices[r] for r in range(environment.size)]), (AXIS,))

    # -- host operations -----------------------------------------------------------------------------------
    def host_sum(self, arrays: list[np.ndarray], name: str) -> list[np.ndarray]:
        _barrier()
        return super().host_sum(arrays, name)

    def host_broadcast(self, array: np.ndarray, root_rank: int, name: str) -> np.ndarray:
        _barrier()
        return super().host_broadcast(array, root_rank, name)

    def _failures(self, name: str):  # noqa: ANN202 - TorchEngine's context manager, marking the failure
        context = super()._failures(name)
        return _MarkFailure(context)

    # -- the step ------------------------------------------------------------------------------------------
    def step_sum(self, tensors: list, name: str, average: bool = False) -> list:

        if getattr(_tracing, "in_step", False):
            return _flat_psum(list(tensors), self.size() if average else None)
        return self._host_step_sum(tensors, name, average)

    def _host_step_sum(self, tensors: list, name: str, average: bool) -> list:
        import jax
        from jax.experimental import io_callback

        shapes = [jax.ShapeDtypeStruct(t.shape, t.dtype) for t in tensors]
        reduce = super().step_sum

        def reduce_on_host(*arrays: Any) -> list[np.ndarray]:
            import torch

            # The callback's arguments are read-only views of XLA's buffers, valid until it returns.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # torch warns about read-only arrays
                host = [torch.from_numpy(np.ascontiguousarray(np.asarray(a))) for a in arrays]
            return [np.asarray(o.numpy()) for o in reduce(host, name, average)]

        return list(io_callback(reduce_on_host, shapes, *tensors, ordered=True))

    def step_sum_function(self) -> Any:
        """``f(arrays) -> sums``: this worker's single-device arrays summed over the workers by the in-step route
        alone (one compiled ``shard_map`` program whose psum is the train step's), for measurements
        (``benchmarks/scaling.py``). In host mode, the io_callback route in a jitted function."""
        import jax

        if not self.in_step:
            return jax.jit(lambda arrays: self.step_sum(list(arrays), "kfit.measure"))
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        def body(arrays: Any) -> Any:
            _tracing.in_step = True
            try:
                return self.step_sum(list(arrays), "kfit.measure")
            finally:
                _tracing.in_step = False

        summed = jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=P(), out_specs=P(), check_vma=False))
        replicated, device = NamedSharding(self.mesh, P()), jax.local_devices()[0]

        def run(arrays: Any) -> list:
            inputs = [jax.make_array_from_single_device_arrays(np.shape(a), replicated, [jax.device_put(a, device)])
                      for a in arrays]
            return [o.addressable_data(0) for o in summed(inputs)]

        return run

    def trains_in_step(self) -> bool:
        return self.in_step

    def train_step_function(self, model: Any, train_step: Any) -> Any:
        if not self.in_step:
            return None
        return _ShardedStep(self, model, train_step)


def _flat_psum(tensors: list, divide_by: int | None) -> list:
    """``jax.lax.psum`` over the workers, one flat buffer per dtype (one all-reduce each: on CPU Gloo, several
    small all-reduces cost several times one of their total size)."""
    import jax
    import jax.numpy as jnp

    groups: dict[Any, list[int]] = {}
    for i, tensor in enumerate(tensors):
        groups.setdefault(jnp.dtype(tensor.dtype), []).append(i)
    out: list[Any] = [None] * len(tensors)
    for indices in groups.values():
        flat = jnp.concatenate([jnp.ravel(tensors[i]) for i in indices]) if len(indices) > 1 else \
            jnp.ravel(tensors[indices[0]])
        flat = jax.lax.psum(flat, AXIS)
        if divide_by is not None:
            flat = flat / divide_by
        offset = 0
        for i in indices:
            size = int(np.prod(tensors[i].shape))
            out[i] = jnp.reshape(flat[offset:offset + size], tensors[i].shape)
            offset += size
    return out


class _MarkFailure:
    def __init__(self, context: Any) -> None:
        self._context = context

    def __enter__(self) -> None:
        self._context.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self._context.__exit__(*exc)
        except WorkerLostError:
            _failed.set()
            raise


class _ShardedStep:
    """``step(state, data) -> (logs, state)``: the model's train step under ``jax.shard_map`` over the workers.

    ``data`` is this worker's share (process-local arrays); its global minibatch, planned before the step by
    kfit's driver (:meth:`global_minibatch`), gives the padded share size.
    """

    def __init__(self, engine: JaxEngine, model: Any, train_step: Any) -> None:
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        self.engine = engine
        self.model = model
        self.size = engine.size()
        self.device = jax.local_devices()[0]
        self.replicated = NamedSharding(engine.mesh, P())
        self.split = NamedSharding(engine.mesh, P(AXIS))
        self._sizes = _optimizer.StepSizes(model)  # the driver's planned sizes of the steps, in order
        self._losses_checked = False  # whether _warn_added_losses has looked at the traced step

        def body(state: Any, data: Any, real: Any) -> Any:
            rows = batch_rows(data)
            _tracing.in_step = True
            _engine.STEP.real = real[0]
            _engine.STEP.padding = rows - real[0]
            try:
                with _backend.without_state_sharding_constraints(model):
                    result = train_step(state, data)
            finally:
                _tracing.in_step = False
                _engine.STEP.real = None
                _engine.STEP.padding = None
            self._warn_added_losses()
            return result

        # State in, state and logs out: P() (one copy per worker). The trainable state is the same on every
        # worker (psummed gradients); the metrics' state is each worker's own (check_vma off: not replicated).
        sharded = jax.shard_map(body, mesh=engine.mesh, in_specs=(P(), P(AXIS), P(AXIS)), out_specs=(P(), P()),
                                check_vma=False)
        self.jitted = jax.jit(sharded, donate_argnums=0)

    def _warn_added_losses(self) -> None:
        """Once per model, as its step is traced: a layer's ``add_loss`` (an activity regularizer included) averages
        over the padding rows of a padded share too, so such steps' gradients are not exact (see the module)."""
        if self._losses_checked:
            return
        self._losses_checked = True
        if added := _backend.layers_that_added_losses(self.model):
            warn_job(
                f"kfit's JAX engine pads the workers' shares of a global minibatch that does not divide among them; "
                f"layer {added[0].name!r} adds a loss in its forward pass (add_loss, an activity regularizer), "
                f"which averages over the padding rows too, so the gradient of such steps is not exact. Choose "
                f"minibatch sizes and an epoch size that divide by the {self.size} workers to train it exactly.",
                stacklevel=2)

    def global_minibatch(self) -> int | None:
        """The global minibatch of the step about to run: the run's driver planned the sizes of the steps of
        Keras's execution (several with ``steps_per_execution``), called here in order; else the clock's."""
        return self._sizes.next()

    def prepare(self, state: Any, data: Any, total: int | None = None) -> tuple:
        """The global arrays of one step (the arguments of :attr:`jitted`): the state replicated, the shares
        padded and split over the workers, and each share's real sample count. ``total``: the global minibatch
        (default: the run's ``clock.minibatch_size``)."""
        import jax

        from kfit.data._stream import real_count

        n = batch_rows(data)
        total = total or self.global_minibatch()
        rows = -(-total // self.size) if total else n
        real = real_count(total, self.engine.rank(), self.size) if total else n
        if total is None or n != max(real, 1):
            raise ValueError(
                f"kfit's JAX engine pads each worker's share of the global minibatch to one shape, and needs the "
                f"global minibatch size of the step (kfit.fit's clock): got a share of {n} rows for a global "
                f"minibatch of {total} on {self.size} workers.")
        # (an empty share is read as one padding row: real is 0, and pad_share gives the row weight 0)
        data = pad_share(data, rows, weights=rows * self.size != total, real=real)
        local = jax.device_put
        state = jax.tree_util.tree_map(
            lambda a: jax.make_array_from_single_device_arrays(
                np.shape(a), self.replicated, [a if _on(a, self.device) else local(a, self.device)]), state)
        data = jax.tree_util.tree_map(
            lambda a: jax.make_array_from_single_device_arrays(
                (a.shape[0] * self.size, *a.shape[1:]), self.split,
                [a if _on(a, self.device) else local(a, self.device)]), data)
        real = jax.make_array_from_single_device_arrays(
            (self.size,), self.split, [local(np.array([real], np.float32), self.device)])
        return state, data, real

    def __call__(self, state: Any, data: Any) -> tuple:
        import jax

        state, data, real = self.prepare(state, data)
        try:
            logs, state = self.jitted(state, data, real)
        except Exception as error:  # noqa: BLE001 - only the collective's failure is translated
            raise _translated(error, self.engine) from error
        return jax.tree_util.tree_map(lambda a: a.addressable_data(0), (logs, state))


def pad_share(data: Any, rows: int, weights: bool, xp: Any = None, real: int | None = None) -> Any:
    """``data`` (``x``, ``(x, y)`` or ``(x, y, sample_weight)``) padded to ``rows`` rows with copies of its last
    row, whose sample weight is 0; with ``weights`` a batch without sample weights gets them (1 for real rows),
    so that every worker's batch has the same structure. ``real``: the real rows of ``data`` (default: all); the
    rows after them are padding already (an empty share read as one padding row) and get weight 0 too. ``xp``: the
    array module (default ``jax.numpy``; NumPy for host batches, ``kfit.training._padding``)."""
    import keras

    if xp is None:
        import jax.numpy as xp
    n = batch_rows(data)
    real = n if real is None else real
    extra = rows - n
    if extra < 0 or not 0 <= real <= n:
        raise ValueError(f"A batch of {n} rows ({real} real) cannot be padded to {rows} rows.")
    if extra == 0 and real == n and not weights:
        return data
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)

    def pad(a: Any) -> Any:
        if a is None or extra == 0:
            return a
        return xp.concatenate([a, xp.repeat(a[-1:], extra, axis=0)], axis=0)

    def pad_weight(w: Any) -> Any:
        w = xp.asarray(w)
        zeros = rows - real
        return w if zeros == 0 else xp.concatenate([w[:real], xp.zeros((zeros, *w.shape[1:]), w.dtype)], axis=0)

    x = keras.tree.map_structure(pad, x)
    y = keras.tree.map_structure(pad, y) if y is not None else None
    if sample_weight is None:
        sample_weight = xp.ones((n,), "float32")
    return (x, y, keras.tree.map_structure(pad_weight, sample_weight))


def batch_rows(data: Any) -> int:
    """The rows of a batch: the leading dimension of its first leaf."""
    import keras

    leaf = next(leaf for leaf in keras.tree.flatten(data) if leaf is not None)
    return int(leaf.shape[0])


def _on(array: Any, device: Any) -> bool:
    import jax

    return isinstance(array, jax.Array) and len(array.devices()) == 1 and next(iter(array.devices())) == device


def _translated(error: Exception, engine: JaxEngine) -> Exception:
    text = str(error)
    if "Gloo" not in text and "gloo" not in text and "UNAVAILABLE" not in text:
        return error
    _failed.set()
    return WorkerLostError.of(
        "kfit.gradients", engine.rank(), engine.size(), "native engine, jax.distributed, in the compiled step",
        f"{_launch.TIMEOUT_VARIABLE}={_launch.timeout_seconds():g}", text.splitlines()[0] if text else repr(error))


def _gloo_on_the_masters_route(environment: _launch.LaunchEnvironment) -> None:
    """Makes JAX's Gloo CPU collectives listen on the address through which this worker reaches
    ``MASTER_ADDR`` (or on ``GLOO_SOCKET_IFNAME``'s interface, as torch.distributed's Gloo does).

    JAX's own choice is the address of the machine's host name, which on a machine whose host name resolves to a
    loopback address (``/etc/hosts``), or in a container, is one the other machines cannot reach. The CPU backend's
    factory is registered again with the collectives made here: ``xla_bridge.register_backend_factory``,
    ``make_cpu_client(collectives=)`` and ``_jax.make_gloo_tcp_collectives(hostname=, interface=)`` are JAX
    internals, checked against JAX 0.10.2.
    """
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax

    interface = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0].strip() or None
    hostname = None if interface else _routed_address(environment.master_addr, environment.master_port)

    def make_cpu_client() -> Any:
        collectives = _jax.make_gloo_tcp_collectives(distributed_client=distributed.global_state.client,
                                                     hostname=hostname, interface=interface)
        return xla_bridge.make_cpu_client(collectives=collectives)

    xla_bridge.register_backend_factory("cpu", make_cpu_client, priority=0, fail_quietly=False)


def _routed_address(host: str, port: int) -> str | None:
    """The local address of the route to ``host`` (no packet is sent), or None."""
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(info[0], socket.SOCK_DGRAM) as s:
            s.connect(info[4])
            return s.getsockname()[0]
    except OSError:
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def _leave_at_once_after_an_error() -> None:
    """At exit after an error (a lost peer, or any exception that ended the script): leave now. JAX's shutdown
    would wait in a barrier for every worker, up to its heartbeat timeout, for peers that may be gone."""
    ended_by_an_error = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)  # 3.12+ / 3.11
    if _failed.is_set() or ended_by_an_error is not None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - leaving anyway
                pass
        os._exit(1)


def _barrier() -> None:
    import jax

    jax.effects_barrier()
