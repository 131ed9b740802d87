"""``load_model``: Horovod-Keras's ``hvd.load_model``, a saved model back with its optimizer made distributed.

Every worker loads the file itself (as Horovod does: a path that every worker can read, e.g. on a shared file
system), so every worker starts from the same saved weights and optimizer state without a broadcast. The file holds
the plain optimizer (a model compiled with :func:`DistributedOptimizer` saves it so, and loads as such with
``keras.models.load_model``); the loaded one is wrapped in place, its variables kept.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import keras

from kfit.distributed import _optimizer
from kfit.distributed._optimizer import Compression


def load_model(
    filepath: Any,
    custom_optimizers: Sequence[type] | None = None,
    custom_objects: Mapping[str, Any] | None = None,
    compression: str = Compression.none,
    legacy_opts: bool = False,
    *,
    safe_mode: bool = True,
    **optimizer_options: Any,
) -> keras.Model:
    """Loads a saved Keras model with its optimizer made a :func:`DistributedOptimizer` (Horovod's ``hvd.load_model``).

    ``keras.models.load_model(filepath, custom_objects=..., safe_mode=safe_mode)`` (a ``.keras`` file, a legacy
    ``.h5`` file, anything Keras 3 loads), then ``DistributedOptimizer(model.optimizer, compression=compression,
    **optimizer_options)``: the optimizer keeps its configuration and state (``iterations``, slot variables), so
    training resumes where the saved model stopped, now with the gradients averaged over the workers. Every worker
    loads the file itself, as in Horovod: give every worker a path it can read. When one cannot, every worker raises
    (no worker is left waiting for the others). A model saved without an optimizer (not compiled) comes back as it
    is: compile it with a :func:`DistributedOptimizer`.

    Args:
        filepath: what ``keras.models.load_model`` accepts (a path to a ``.keras`` or ``.h5`` file).
        custom_optimizers: optimizer classes the file may name that Keras cannot find by itself (neither Keras's
            nor registered with ``keras.saving.register_keras_serializable``), as in Horovod; added to
            ``custom_objects`` under their class names.
        custom_objects: names to classes or functions for loading, as in ``keras.models.load_model``; they take
            precedence over ``custom_optimizers``.
        compression: ``Compression.none`` or ``Compression.fp16``, as in :func:`DistributedOptimizer`.
        legacy_opts: Horovod's switch to ``tf.keras.optimizers.legacy``: False only (Keras 3 has no legacy
            optimizers).
        safe_mode: passed to ``keras.models.load_model`` (False allows loading ``lambda`` code).
        **optimizer_options: any other keyword argument of :func:`DistributedOptimizer` (``name``, ``op``,
            ``num_groups``, ``gradient_predivide_factor``, ...).

    Returns:
        The loaded model; its optimizer distributed (``kfit.distributed.is_distributed(model.optimizer)``).

    Raises:
        TypeError: ``custom_optimizers`` is not a list of optimizer classes, ``custom_objects`` not a mapping of
            names, or an ``optimizer_options`` name is not an argument of :func:`DistributedOptimizer`.
        ValueError: ``legacy_opts=True``, a ``safe_mode`` that is not True or False, a value
            :func:`DistributedOptimizer` refuses (checked before the file is read), or what
            ``keras.models.load_model`` raises (e.g. no such file).
        RuntimeError: another worker could not load the file (it raised there).

    Example:
        >>> import os, tempfile
        >>> import keras, kfit
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> model.compile(optimizer=kfit.distributed.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
        >>> path = os.path.join(tempfile.mkdtemp(), "model.keras")
        >>> model.save(path)
        >>> loaded = kfit.distributed.load_model(path)
        >>> type(loaded.optimizer).__name__, kfit.distributed.is_distributed(loaded.optimizer)
        ('SGD', True)
    """
    objects = _custom_objects(custom_optimizers, custom_objects)
    if not isinstance(legacy_opts, bool):
        raise ValueError(f"Invalid value for argument `legacy_opts`: expected True or False. Received: legacy_opts={legacy_opts!r}")
    if legacy_opts:
        raise ValueError(
            "Invalid value for argument `legacy_opts`: Keras 3 has no legacy optimizers (tf.keras.optimizers.legacy), "
            "so there is nothing to switch to. Received: legacy_opts=True. Leave legacy_opts out.")
    if not isinstance(safe_mode, bool):
        raise ValueError(f"Invalid value for argument `safe_mode`: expected True or False. Received: safe_mode={safe_mode!r}")
    accepted = [p for p in _optimizer.OPTION_DEFAULTS if p != "compression"]
    unknown = sorted(set(optimizer_options) - set(accepted))
    if unknown:
        raise TypeError(
            f"kfit.distributed.load_model() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}: the "
            f"keyword arguments beside its own are DistributedOptimizer's ({', '.join(accepted)}).")
    _optimizer.make_options(compression=compression, **optimizer_options)  # refuse a bad one before reading the file
    model, error = None, None
    try:
        model = keras.models.load_model(filepath, custom_objects=objects, safe_mode=safe_mode)
    except Exception as raised:  # noqa: BLE001 - agreed on with the other workers, then raised again
        error = raised
    from kfit import distributed

    if distributed.any_true(error is not None):
        if error is not None:
            raise error
        raise RuntimeError(
            f"kfit.distributed.load_model({filepath!r}): another worker could not load the model (see its error); "
            "every worker reads the file itself, as in Horovod: give every worker a path it can read, e.g. on a "
            "shared file system.")
    optimizer = getattr(model, "optimizer", None)  # an uncompiled model has no such attribute
    if optimizer is not None:
        _optimizer.DistributedOptimizer(optimizer, compression=compression, **optimizer_options)
    return model


def _custom_objects(custom_optimizers: Any, custom_objects: Any) -> dict[str, Any] | None:
    """Horovod's ``custom_optimizers`` (by class name) and ``custom_objects`` (which win) in one mapping, checked."""
    if custom_optimizers is None and custom_objects is None:
        return None
    objects: dict[str, Any] = {}
    if custom_optimizers is not None:
        if isinstance(custom_optimizers, (str, bytes)) or not isinstance(custom_optimizers, Sequence) or not all(
                inspect.isclass(c) and issubclass(c, keras.optimizers.Optimizer) for c in custom_optimizers):
            raise TypeError(
                "Argument `custom_optimizers` must be a list of keras.optimizers.Optimizer subclasses (classes, not "
                f"instances). Received: custom_optimizers={custom_optimizers!r}")
        objects.update({cls.__name__: cls for cls in custom_optimizers})
    if custom_objects is not None:
        if not isinstance(custom_objects, Mapping) or not all(isinstance(k, str) for k in custom_objects):
            raise TypeError(
                "Argument `custom_objects` must be a dict of names (strings) to classes or functions, as in "
                f"keras.models.load_model. Received: custom_objects={custom_objects!r}")
        objects.update(custom_objects)
    return objects
