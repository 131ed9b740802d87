"""Horovod's collective operations, per backend: the one place that imports Horovod.

Horovod's Keras layer (``horovod.keras``, ``horovod.tensorflow.keras``) does not work with Keras 3, so kfit
calls Horovod's collective operations itself, through one framework plugin per process:

* TensorFlow backend: ``horovod.tensorflow``. The gradient sum is a ``HorovodGroupedAllreduce`` op inside
  the traced train step (so the step cannot be XLA-compiled); host operations run the same ops eagerly.
* PyTorch backend: ``horovod.torch``, on the step's CPU tensors.
* JAX backend: Horovod has no JAX plugin. The jitted step hands its gradients to the host with
  ``jax.experimental.io_callback`` (ordered), where ``horovod.torch`` sums them, and takes the result back.

Two plugins in one process would start two Horovod runtimes, so host operations (broadcast, metric
averaging, the stop flag) use the same plugin as the step. Nothing here runs, nor imports Horovod,
outside ``horovodrun``: ``kfit.distributed._launch.horovod_launched`` reads the environment that ``horovodrun``
sets.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import keras
import numpy as np

from kfit.distributed._engine import Engine, WorkerLostError

BACKEND = keras.backend.backend()

INSTALL_HINT = (
    "Horovod with its TensorFlow and PyTorch plugins is not installed in this environment. "
    "Run `bash scripts/install_horovod.sh` (it builds Horovod 0.28.1 for Keras 3's backends)."
)

_hvd: Any = None  # the framework plugin in use: horovod.tensorflow or horovod.torch


def plugin_name() -> str:
    """The Horovod plugin this backend uses: ``horovod.tensorflow`` or ``horovod.torch``."""
    return "horovod.tensorflow" if BACKEND == "tensorflow" else "horovod.torch"


def plugin() -> Any:
    """The initialized Horovod plugin (imported and initialized on first use).

    Raises:
        ImportError: Horovod, or its plugin for this backend, is not installed (the message says how
            to install it).
    """
    global _hvd
    if _hvd is None:
        import importlib

        try:
            module = importlib.import_module(plugin_name())
        except ImportError as error:
            raise ImportError(f"{INSTALL_HINT} ({plugin_name()}: {error})") from error
        module.init()
        _hvd = module
    return _hvd


# -- host (NumPy) collectives -------------------------------------------------------------------------
def _torch_wait(handle: int) -> Any:
    """Waits for a horovod.torch operation by polling with short sleeps.

    ``horovod.torch.synchronize`` alone waits busily: with one core per worker it takes the core from
    Horovod's background thread and Gloo, and a small allreduce took 12 ms instead of 2 ms on two cores.
    """
    hvd = plugin()
    delay = 0.0001
    while not hvd.poll(handle):
        time.sleep(delay)
        delay = min(2 * delay, 0.001)  # a long wait costs at most 1000 wake-ups a second
    return hvd.synchronize(handle)


def _to_frontend(array: np.ndarray) -> Any:
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.convert_to_tensor(array)
    import torch

    return torch.from_numpy(np.array(array, copy=True))


def _to_numpy(tensor: Any) -> np.ndarray:
    return np.asarray(tensor.numpy())


def _contiguous(array: np.ndarray) -> np.ndarray:
    return array if array.flags.c_contiguous else np.ascontiguousarray(array).reshape(array.shape)


def _tf_name(name: str) -> str:
    return name.replace(".", "_")


def host_sum(arrays: list[np.ndarray], name: str) -> list[np.ndarray]:
    """Sums NumPy arrays over all workers with one grouped allreduce (returns new arrays)."""
    hvd = plugin()
    tensors = [_to_frontend(np.ascontiguousarray(a)) for a in arrays]
    if BACKEND == "tensorflow":
        out = hvd.grouped_allreduce(tensors, op=hvd.Sum, name=_tf_name(name), ignore_name_scope=True)
    else:
        out = _torch_wait(hvd.grouped_allreduce_async(tensors, op=hvd.Sum, name=name))
    return [_to_numpy(t) for t in out]


def host_broadcast(array: np.ndarray, root_rank: int, name: str) -> np.ndarray:
    """Rank ``root_rank``'s ``array`` on every worker (same shape and dtype on every worker)."""
    hvd = plugin()
    tensor = _to_frontend(np.ascontiguousarray(array))
    if BACKEND == "tensorflow":
        out = hvd.broadcast(tensor, root_rank, name=_tf_name(name), ignore_name_scope=True)
    else:
        out = _torch_wait(hvd.broadcast_async(tensor, root_rank, name=name))
    return _to_numpy(out)


def broadcast_bytes(payload: bytes | None, root_rank: int, name: str) -> bytes:
    """Rank ``root_rank``'s ``payload`` on every worker (the others pass anything, e.g. None)."""
    length = np.array([len(payload) if payload is not None else 0], dtype=np.int64)
    length = int(host_broadcast(length, root_rank, f"{name}.length")[0])
    if length == 0:
        return b""
    buffer = np.frombuffer(payload, dtype=np.uint8) if payload is not None and len(payload) == length else np.zeros(length, np.uint8)
    return host_broadcast(buffer, root_rank, name).tobytes()


# -- the gradient sum inside the compiled train step --------------------------------------------------
# Every worker's step sum carries one more number, 1 (its presence): a worker whose model.fit ended joined Horovod
# (:meth:`HorovodEngine.leave`) and gives zeros to the others' allreduces instead, so a step that sums fewer than ``size()`` is
# refused (:func:`left_message`) instead of training on, or hanging in the next host collective.

# What to do about a stop one worker decided alone under plain model.fit (no apostrophes: see left_message).
_LONE_STOP_FIX = (
    "(keras.callbacks.EarlyStopping deciding on the logs of one worker, TerminateOnNaN, a callback of yours): list "
    "kfit.distributed.AgreedStopCallback() after the callbacks that stop training, in the callbacks of model.fit, and "
    "every worker stops after the same step (kfit.fit agrees by itself).")


def left_message(gone: Any) -> str:
    """The error of a step that ``gone`` of the workers did not take part in: their model.fit had ended (no
    apostrophes: TensorFlow's assertion error escapes them)."""
    return (
        f"kfit.distributed: the train step of rank {plugin().rank()} found {gone} of the {plugin().size()} workers gone: "
        "their model.fit ended while this worker trained on. A callback set model.stop_training on those workers alone "
        f"{_LONE_STOP_FIX} The logs of the other workers say where they stopped.")


def _tf_step_sum(tensors: list, name: str, average: bool) -> list:
    import tensorflow as tf

    hvd = plugin()
    op = hvd.Average if average else hvd.Sum
    out = list(hvd.grouped_allreduce([*tensors, tf.ones([1], tf.float32)], op=op, name=_tf_name(name),
                                     ignore_name_scope=True))
    present = out.pop()[0] * (hvd.size() if average else 1)
    message = tf.strings.format(left_message("{}"), [hvd.size() - tf.cast(tf.round(present), tf.int32)])
    check = tf.debugging.Assert(present > hvd.size() - 0.5, [message])
    if tf.inside_function():  # traced: the op's error reaches Python from the call of model.train_function
        from kfit import _backend

        _backend.convert_train_function_errors(_backend.model_in_train_step(), _tf_peer_left)
    with tf.control_dependencies([check]):
        return [tf.identity(t) for t in out]


def _tf_peer_left(error: BaseException) -> BaseException | None:
    """TensorFlow's error of the step's allreduce when a worker has left, with the hint of :func:`peer_left_hint`; of
    the same class (``tf.errors.UnknownError``), which Horovod's and kfit's elastic modes recognize."""
    import tensorflow as tf

    if isinstance(error, tf.errors.OpError) and "Horovod has been shut down" in error.message:
        return type(error)(error.node_def, error.op, f"{error.message}\n{peer_left_hint()}")
    return None


def peer_left_hint() -> str:
    """What kfit adds to Horovod's error of a step's gradient allreduce when another worker has left."""
    return (
        f"kfit.distributed: the gradient allreduce of rank {plugin().rank()} failed: another worker left (it failed, "
        "or its script ended). Under plain model.fit, a callback may have set model.stop_training on that worker alone "
        f"{_LONE_STOP_FIX}")


def _torch_step_sum(tensors: list, name: str, average: bool) -> list:
    import torch

    hvd = plugin()
    op = hvd.Average if average else hvd.Sum
    host = [*(t.contiguous() for t in tensors), torch.ones(1, dtype=torch.float32)]
    out = _torch_step_allreduce(host, op, name)
    _check_present(float(out.pop()[0]), average)
    return out


def _torch_step_allreduce(tensors: list, op: Any, name: str) -> list:
    """The step's grouped allreduce on horovod.torch (PyTorch, JAX). Horovod's error when a worker has left (its
    script ended, e.g. after a stop of its own without kfit's callbacks) gets :func:`peer_left_hint`; it
    stays a HorovodInternalError, which Horovod's elastic mode recovers from."""
    try:
        return list(_torch_wait(plugin().grouped_allreduce_async(tensors, op=op, name=name)))
    except Exception as error:
        from horovod.common.exceptions import HorovodInternalError

        if not isinstance(error, HorovodInternalError):
            raise
        raise HorovodInternalError(f"{error}\n{peer_left_hint()}") from error


def _check_present(flag: float, average: bool) -> None:
    present = flag * plugin().size() if average else flag  # the workers in the step, from their summed flags
    if present < plugin().size() - 0.5:
        raise WorkerLostError(left_message(plugin().size() - round(present)))


def _jax_step_sum(tensors: list, name: str, average: bool) -> list:
    import jax
    from jax.experimental import io_callback

    hvd = plugin()
    op = hvd.Average if average else hvd.Sum
    shapes = [jax.ShapeDtypeStruct(t.shape, t.dtype) for t in tensors]

    def reduce_on_host(*arrays: Any) -> list[np.ndarray]:
        import torch

        # The callback's arguments are read-only views of XLA's buffers, valid until it returns: Horovod
        # reads them in place (no copy in) and writes new tensors, which XLA copies into the step's buffers.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch warns about read-only arrays
            host = [torch.from_numpy(_contiguous(np.asarray(a))) for a in arrays]
        out = _torch_step_allreduce([*host, torch.ones(1)], op, name)
        _check_present(float(out.pop()[0]), average)
        return [o.numpy() for o in out]

    return list(io_callback(reduce_on_host, shapes, *tensors, ordered=True))


def step_sum(tensors: list, name: str, average: bool = False) -> list:
    """Sums (or averages) backend tensors over all workers inside the train step: one grouped allreduce.

    Args:
        tensors: backend tensors (traced on TensorFlow and JAX), same shapes and dtypes on every worker.
        name: the collective's name, the same on every worker.
        average: average instead of sum.
    """
    if not tensors:
        return []
    if BACKEND == "tensorflow":
        return _tf_step_sum(tensors, name, average)
    if BACKEND == "jax":
        return _jax_step_sum(tensors, name, average)
    return _torch_step_sum(tensors, name, average)


def check_step_compilable(model: Any = None) -> None:
    """Refuses an XLA-compiled TensorFlow step: Horovod's TensorFlow ops have no XLA kernels."""
    if BACKEND != "tensorflow":
        return
    import tensorflow as tf

    try:
        from tensorflow.python.ops import control_flow_util

        in_xla = control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
    except (ImportError, AttributeError):  # pragma: no cover - TensorFlow moved its internals
        in_xla = False
    if in_xla:
        raise ValueError(
            "kfit.distributed.DistributedOptimizer cannot run inside an XLA-compiled TensorFlow train step: "
            "Horovod's TensorFlow operations have no XLA kernels. Compile the model with "
            "model.compile(..., jit_compile=False), or train with kfit.fit (which does it for you)."
        )


def _join() -> None:
    """Horovod's join: waits until every worker has joined, giving zeros to the allreduces of those not joined."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        tf.function(plugin().join)()  # eager TensorFlow runs hvd.join() once per process, then returns at once
    else:
        plugin().join()


class HorovodEngine(Engine):
    """The Horovod engine: this module's functions behind :class:`kfit.distributed._engine.Engine`."""

    name = "horovod"

    def __init__(self) -> None:
        plugin()

    def rank(self) -> int:
        return int(plugin().rank())

    def size(self) -> int:
        return int(plugin().size())

    def local_rank(self) -> int:
        return int(plugin().local_rank())

    def local_size(self) -> int:
        return int(plugin().local_size())

    def host_sum(self, arrays: list[np.ndarray], name: str) -> list[np.ndarray]:
        return host_sum(arrays, name)

    def host_broadcast(self, array: np.ndarray, root_rank: int, name: str) -> np.ndarray:
        return host_broadcast(array, root_rank, name)

    def broadcast_bytes(self, payload: bytes | None, root_rank: int, name: str) -> bytes:
        return broadcast_bytes(payload, root_rank, name)

    def step_sum(self, tensors: list, name: str, average: bool = False) -> list:
        return step_sum(tensors, name, average)

    def check_step_compilable(self) -> None:
        check_step_compilable()

    def leave(self, where: str) -> None:
        try:
            _join()  # gives zeros to the others' allreduces (their next step refuses them) until all join
        except Exception as error:  # (HorovodInternalError, or TensorFlow's error of the op): a worker failed
            raise WorkerLostError(
                f"kfit.distributed: rank {self.rank()} of {self.size()} stopped training alone ({where}), and the "
                f"others went on: a callback set model.stop_training on this worker only {_LONE_STOP_FIX} "
                f"({type(error).__name__}: {error})") from error

    def before_host_collective(self) -> None:
        if BACKEND == "jax":
            import jax

            # Wait (asleep) for the step dispatched last and its gradient allreduce, instead of polling
            # for the flag's allreduce all through the step: with one core per worker, polling slows it.
            jax.effects_barrier()
