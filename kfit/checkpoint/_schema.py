"""What a checkpoint's metadata must look like, checked before anything in it is used.

A file whose bytes are intact can still hold metadata that kfit never wrote (edited by hand or by another
program, with its checksum recomputed). :func:`check` walks the parsed JSON against :data:`META` (required
keys and their types) and checks that every array it refers to is in the file, so that a restore never
fails half-way with a ``KeyError`` after some of the state has been assigned. Extra keys are allowed (a
later kfit may add some). Only the standard library here: the command line reads files without Keras.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ARRAY_REF = "__kfit_array__"
#: The arrays of every worker's training-metric variables but rank 0's (which are the ``metrics`` group):
#: ``worker_metrics/<rank>/<i>``, the ``i``-th of ``meta.variables.metrics`` (see ``meta.workers``).
WORKER_METRICS = "worker_metrics"


class SchemaError(ValueError):
    """The metadata does not match the schema; the message names the field and what it should be."""


# A schema is a function (value, where) -> None that raises SchemaError.
Spec = Callable[[Any, str], None]


def _fail(where: str, expected: str, value: Any) -> None:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise SchemaError(f"{where} should be {expected}, found {type(value).__name__} {shown}")


def _type(expected: str, test: Callable[[Any], bool]) -> Spec:
    def check(value: Any, where: str) -> None:
        if not test(value):
            _fail(where, expected, value)
    return check


STR = _type("a string", lambda v: isinstance(v, str))
BOOL = _type("true or false", lambda v: isinstance(v, bool))
INT = _type("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
COUNT = _type("an integer >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)
SHUFFLE = _type('true, false or "batch"', lambda v: isinstance(v, bool) or v == "batch")
POSITIVE = _type("an integer >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1)
NUMBER = _type("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))


def ANY(value: Any, where: str) -> None:  # noqa: N802  (a schema constant, like STR)
    """Any JSON value."""


def optional(spec: Spec) -> Spec:
    """``spec`` or null."""
    def check(value: Any, where: str) -> None:
        if value is not None:
            spec(value, where)
    return check


def list_of(spec: Spec) -> Spec:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, list):
            _fail(where, "a list", value)
        for i, item in enumerate(value):
            spec(item, f"{where}[{i}]")
    return check


def dict_of(spec: Spec) -> Spec:
    """An object with any keys, each value matching ``spec``."""
    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            _fail(where, "an object", value)
        for key, item in value.items():
            spec(item, f"{where}[{key!r}]")
    return check


def record(required: dict[str, Spec], optional_keys: dict[str, Spec] | None = None) -> Spec:
    """An object with these keys (``optional_keys`` may be absent); other keys are allowed."""
    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            _fail(where, "an object", value)
        for key, spec in required.items():
            if key not in value:
                raise SchemaError(f"{where}.{key} is missing")
            spec(value[key], f"{where}.{key}")
        for key, spec in (optional_keys or {}).items():
            if key in value:
                spec(value[key], f"{where}.{key}")
    return check


# The optimizer's options and a LossScaleOptimizer's inner optimizer (older files: neither).
_NAMED = record({"name": STR, "class": STR}, {"options": dict_of(ANY)})
_OPTIMIZER = record({"name": STR, "class": STR}, {"options": dict_of(ANY), "inner": _NAMED})
META: Spec = record({
    "format": STR,
    "format_version": INT,
    "kfit_version": STR,
    "keras_version": STR,
    "backend": STR,
    "created": STR,
    "kfit_fit": BOOL,
    "model": record({"name": STR, "class": STR}, {"outputs": list_of(STR), "metrics": list_of(STR)}),  # (older files: neither)
    "optimizer": optional(_OPTIMIZER),
    "variables": record({"model": list_of(STR), "optimizer": list_of(STR), "metrics": list_of(STR)}),
    "clock": optional(record({"samples": COUNT, "minibatches": COUNT},
                             {"epoch_size": optional(COUNT), "minibatch_size": optional(COUNT),
                              "epoch_start": optional(list_of(COUNT))})),
    # (a source whose passes' length Keras learns: "pass_batches", that length once known; older files: none)
    "stream": optional(record({}, {"position": COUNT, "seed": optional(INT), "shuffle": SHUFFLE,
                                   "num_samples": optional(COUNT), "kind": STR, "pass_batches": optional(COUNT)})),
    "callbacks": dict_of(ANY),
    "history": optional(record({"epoch": list_of(ANY), "history": dict_of(list_of(ANY))},
                               {"partial": BOOL, "partial_keys": list_of(STR)})),
    "rng": record({
        "numpy": record({"algorithm": STR, "pos": COUNT, "has_gauss": INT, "gauss": NUMBER}),
        "python": record({"version": INT, "gauss_next": optional(NUMBER)}),
    }),
    "summary": record({}, {
        **{key: optional(COUNT) for key in ("samples", "minibatches", "epoch", "samples_in_epoch",
                                            "epoch_size", "minibatch_size")},
        "hyperparameters": dict_of(NUMBER),
        "hyperparameters_in_code": optional(dict_of(NUMBER)),
        # A Keras LearningRateSchedule's class, the optimizer's step count and the next step's rate (older files: none).
        "learning_rate_schedule": optional(record({"class": STR, "step": COUNT, "value": NUMBER})),
        "last_metrics": dict_of(NUMBER),
    }),
    "arrays": list_of(record({"name": STR, "shape": list_of(COUNT), "dtype": STR}, {"crc32": INT})),
}, {
    "run": record({"status": STR}, {"reason": optional(STR)}),  # (older files hold no run status)
    # The workers that trained (older files: one) and how many of them have their metric states in the file:
    # every one's, or rank 0's only (1).
    "workers": record({"count": POSITIVE, "metric_states": POSITIVE}),
})

# Arrays every checkpoint holds, with their shapes: the random states.
_FIXED_SHAPES = {"rng/numpy": [624], "rng/python": [625]}


def _references(value: Any, where: str):
    """Every ``{"__kfit_array__": name}`` inside ``value``, with where it is."""
    if isinstance(value, dict):
        if ARRAY_REF in value:
            yield value[ARRAY_REF], where
        for key, item in value.items():
            yield from _references(item, f"{where}[{key!r}]")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _references(item, f"{where}[{i}]")


def check(meta: Any) -> None:
    """Checks parsed checkpoint metadata: :data:`META`, and that every array it names is in its index.

    Raises:
        SchemaError: naming the first field that does not match.
    """
    META(meta, "meta")
    shapes: dict[str, list[int]] = {}
    for entry in meta["arrays"]:
        if entry["name"] in shapes:
            raise SchemaError(f"meta.arrays lists {entry['name']!r} twice")
        shapes[entry["name"]] = entry["shape"]
    for group, paths in meta["variables"].items():
        for i in range(len(paths)):
            if f"{group}/{i}" not in shapes:
                raise SchemaError(f"meta.variables.{group}[{i}] has no array {group}/{i} in meta.arrays")
    workers = meta.get("workers")
    if workers is not None:
        if workers["metric_states"] not in (1, workers["count"]):
            raise SchemaError(f"meta.workers.metric_states should be 1 or meta.workers.count ({workers['count']}), "
                              f"found {workers['metric_states']}")
        for rank in range(1, workers["metric_states"]):
            for i in range(len(meta["variables"]["metrics"])):
                name = f"{WORKER_METRICS}/{rank}/{i}"
                if shapes.get(name) != shapes[f"metrics/{i}"]:
                    raise SchemaError(f"meta.arrays should hold {name} of the shape of metrics/{i}, "
                                      f"{shapes[f'metrics/{i}']}, found {shapes.get(name)}")
    for name, shape in _FIXED_SHAPES.items():
        if shapes.get(name) != shape:
            raise SchemaError(f"meta.arrays should hold {name} of shape {shape}, found {shapes.get(name)}")
    for key in ("clock", "stream", "callbacks", "history"):
        for name, where in _references(meta[key], f"meta.{key}"):
            if not isinstance(name, str) or name not in shapes:
                raise SchemaError(f"{where} refers to an array {name!r} that meta.arrays does not list")
