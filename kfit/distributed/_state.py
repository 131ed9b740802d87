"""What the workers agree on besides gradients: the initial state, the stop flag, the metrics."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import keras
import numpy as np

from kfit.distributed import _evaluation, _select


def any_true(flag: bool) -> bool:
    """True on every worker when ``flag`` is True on any worker: one allreduce of one integer."""
    return count_true([flag])[0] > 0


def count_true(flags: list[bool]) -> list[int]:
    """On how many workers each of ``flags`` is True (the same list on every worker): one allreduce of
    ``len(flags)`` integers, whatever their number."""
    engine = _select.current()
    if engine is None:  # one worker
        return [1 if flag else 0 for flag in flags]
    engine.before_host_collective()
    (total,) = engine.host_sum([np.array([1 if flag else 0 for flag in flags], dtype=np.int32)], "kfit.any_true")
    return [int(count) for count in total]


def _state_variables(model: Any) -> list:
    """The model's variables (weights, non-trainable state, seed generators) and its optimizer's."""
    variables = list(model.variables)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and getattr(optimizer, "built", False):
        variables += list(optimizer.variables)
    return variables


def broadcast_variables(variables: list, root_rank: int = 0, name: str = "kfit.broadcast") -> None:
    """Assigns rank ``root_rank``'s values to ``variables`` on every worker, bit for bit.

    All values travel as one byte buffer (one broadcast, whatever their dtypes). Every worker must pass
    variables of the same shapes and dtypes in the same order.

    Raises:
        RuntimeError: this worker's variables do not match the root's in total size.
    """
    values = [np.asarray(keras.ops.convert_to_numpy(v.value)) for v in variables]
    expected = sum(v.nbytes for v in values)
    payload = b"".join(v.tobytes() for v in values)
    received = _select.current().broadcast_bytes(payload, root_rank, name)
    if len(received) != expected:
        raise RuntimeError(
            f"Rank {root_rank}'s model and optimizer state is {len(received)} bytes, this worker's is {expected}: "
            "every worker must build the same model and optimizer before training."
        )
    offset = 0
    for variable, value in zip(variables, values):
        data = np.frombuffer(received, dtype=value.dtype, count=value.size, offset=offset).reshape(value.shape)
        offset += value.nbytes
        if data.tobytes() != value.tobytes():
            variable.assign(data.copy())


def broadcast_bytes(payload: bytes | None, root_rank: int = 0, name: str = "kfit.broadcast_bytes") -> bytes:
    """Rank ``root_rank``'s ``payload`` (None on the other ranks) on every worker."""
    return _select.current().broadcast_bytes(payload, root_rank, name)


def broadcast_json(value: Any, root_rank: int = 0, name: str = "kfit.broadcast_json") -> Any:
    """Rank ``root_rank``'s JSON-serializable ``value`` on every worker."""
    engine = _select.current()
    payload = json.dumps(value).encode() if engine.rank() == root_rank else None
    return json.loads(engine.broadcast_bytes(payload, root_rank, name).decode())


def broadcast_training_state(model: Any, root_rank: int = 0) -> None:
    """Makes every worker hold rank ``root_rank``'s model and optimizer variables, clock and stream position."""
    from kfit import _backend
    from kfit._run import current_run

    _backend.sync_model(model)
    broadcast_variables(_state_variables(model), root_rank)
    run = current_run(model)
    clock = getattr(run, "clock", None)
    stream = getattr(run, "stream", None)
    state = broadcast_json(
        {
            "clock": clock.get_state() if clock is not None else None,
            "position": int(stream.position) if stream is not None else None,
        },
        root_rank,
    )
    if clock is not None and state["clock"] is not None:
        clock.set_state(state["clock"])
    if stream is not None and state["position"] is not None:
        stream.position = state["position"]


@dataclasses.dataclass(frozen=True)
class DataCheck:
    """What :func:`check_same` compares of one data set across the workers.

    ``num_samples``: its length (-1: none given, -2: a source whose length kfit does not read); ``signature``: its
    arrays' shapes past the first axis and dtypes; ``content``: a fingerprint of a few of its rows
    (:func:`fingerprint`, "" when not compared); ``fix``: what the message tells the user to do.
    """

    what: str
    num_samples: int
    signature: str
    content: str = ""
    fix: str = ""


def signature_of(leaves: list) -> str:
    """The shapes past the first axis and the dtypes of ``leaves`` (None kept as None)."""
    return repr([None if leaf is None else (tuple(leaf.shape[1:]), str(leaf.dtype)) for leaf in leaves])


def fingerprint(leaves: list, num_samples: int) -> str:
    """A checksum of rows 0, ``num_samples // 2`` and ``num_samples - 1`` of every array of ``leaves`` (three rows
    read, from an h5py dataset too): workers given each its own shard of the same length differ there."""
    import zlib

    rows = sorted({0, num_samples // 2, num_samples - 1}) if num_samples > 0 else []
    total = 0
    for leaf in leaves:
        for row in rows:
            if leaf is not None:
                value = leaf[row]
                try:
                    value = np.asarray(value)
                except (TypeError, RuntimeError):  # a tensor on an accelerator
                    value = keras.ops.convert_to_numpy(value)
                total = zlib.crc32(np.ascontiguousarray(value).tobytes(), total)
    return f"{total:08x}"


def fingerprinted_rows(num_samples: int) -> str:
    """``rows 0, 20 and 40``: the rows :func:`fingerprint` reads."""
    rows = [str(r) for r in sorted({0, num_samples // 2, num_samples - 1})]
    return "row " + rows[0] if len(rows) == 1 else "rows " + ", ".join(rows[:-1]) + " and " + rows[-1]


def check_same_data(num_samples: int, signature: str, what: str = "training data", settings: str = "",
                    content: str = "", also: tuple[DataCheck, ...] = ()) -> None:
    """Refuses, on every worker, training data that differs between the workers in its number of samples, in its
    arrays' shapes past the first axis and dtypes (``signature``) or in a few of its rows (``content``, see
    :func:`fingerprint`), other data (``also``: e.g. the validation data) that differs likewise, and a run whose
    ``settings`` (the arguments that fix the global minibatches: their size, the epoch, the bound, the shuffle and
    its seed) differ: one host sum, as training begins. Every worker must pass as many ``also``.

    Data-parallel ``kfit.fit`` cuts each global minibatch into the workers' shares of the same sample stream; workers
    given different data (e.g. each its own shard) would count different epochs and schedules and train apart.

    Raises:
        ValueError: the workers' data differ; the message names each worker's length and says how to fix it.
    """
    check_same((DataCheck(what, num_samples, signature, content), *also), settings)


def check_same(checks: tuple[DataCheck, ...] | list[DataCheck], settings: str | None = None) -> None:
    """Refuses, on every worker, data that differs between the workers (see :func:`check_same_data`): one host sum
    for all of ``checks`` (every worker passes as many, in the same order) and the ``settings`` (None: not compared).

    Raises:
        ValueError: the first of ``checks`` that differs (or the settings), naming what differs on which ranks.
    """
    import zlib

    engine = _select.current()
    size, rank = engine.size(), engine.rank()
    table = np.zeros((3 * len(checks) + 1, size), dtype=np.int64)
    for i, check in enumerate(checks):
        table[3 * i, rank] = int(check.num_samples)
        table[3 * i + 1, rank] = zlib.crc32(check.signature.encode())
        table[3 * i + 2, rank] = zlib.crc32(check.content.encode())
    table[-1, rank] = zlib.crc32((settings or "").encode())
    (table,) = engine.host_sum([table], "kfit.same_data")
    for i, check in enumerate(checks):
        _refuse_different(check, *(table[3 * i + j].tolist() for j in range(3)), rank)
    runs = table[-1].tolist()
    if settings is not None and len(set(runs)) > 1:
        others = ", ".join(str(r) for r, s in enumerate(runs) if s != runs[rank])
        raise ValueError(f"The workers were given different kfit.fit settings: rank {rank} has {settings}, rank(s) "
                         f"{others} something else. Every worker trains its share of the same global minibatches: give "
                         "every worker the same minibatch_size, epoch_size, epochs, max_samples, shuffle and seed.")


def _refuse_different(check: DataCheck, lengths: list, signatures: list, contents: list, rank: int) -> None:
    what = check.what
    fix = check.fix or (f"Data-parallel kfit.fit reads each worker's share of the same {what}: give every worker the "
                        "same full data (load the whole data set on every worker; kfit shards it itself, do not shard "
                        "it yourself).")
    if len(set(lengths)) > 1:
        if min(lengths) >= 0:
            detail = ", ".join(f"rank {r}: {n}" for r, n in enumerate(lengths)) + " samples"
        else:
            names = {-1: "none", -2: "a source of unknown length"}
            detail = ", ".join(f"rank {r}: {names.get(n, f'{n} samples')}" for r, n in enumerate(lengths))
        raise ValueError(f"The workers were given {what} of different lengths ({detail}). {fix}")
    if len(set(signatures)) > 1:
        others = ", ".join(str(r) for r, s in enumerate(signatures) if s != signatures[rank])
        raise ValueError(f"The workers were given {what} of {lengths[0]} samples each, but with arrays of different "
                         f"shapes or dtypes: rank {rank} holds {check.signature}, rank(s) {others} something else. {fix}")
    if len(set(contents)) > 1:
        others = ", ".join(str(r) for r, s in enumerate(contents) if s != contents[rank])
        raise ValueError(f"The workers were given {what} of {lengths[0]} samples each with the same shapes and dtypes, "
                         f"but different values: {fingerprinted_rows(lengths[0])} of rank {rank}'s differ from rank(s) "
                         f"{others}'. {fix}")


def gather_arrays(arrays: list[np.ndarray], name: str = "kfit.gather") -> list[list[np.ndarray]]:
    """Every worker's ``arrays``, on every worker: ``result[rank][i]`` is worker ``rank``'s ``arrays[i]``, bit for bit.

    One allreduce of a ``(size, n)`` float64 matrix in which each worker fills its own row and leaves the others
    zero: adding zeros changes no value, so floating-point values of up to 64 bits (and integers below 2**53)
    come back exactly, in their own dtypes. Every worker must pass arrays of the same shapes and dtypes.
    """
    engine = _select.current()
    flat = [np.asarray(a).astype(np.float64).ravel() for a in arrays]
    width = sum(a.size for a in flat)
    matrix = np.zeros((engine.size(), width), dtype=np.float64)
    if flat:
        matrix[engine.rank()] = np.concatenate(flat)
    engine.before_host_collective()
    (total,) = engine.host_sum([matrix], name)
    gathered = []
    for row in total:
        offset, values = 0, []
        for array in arrays:
            array = np.asarray(array)
            values.append(row[offset:offset + array.size].reshape(array.shape).astype(array.dtype))
            offset += array.size
        gathered.append(values)
    return gathered


def local_sample_count(model: Any) -> float:
    """The samples this worker trained on since the metrics were reset (the loss tracker's count), or 1."""
    for metric in getattr(model, "metrics", []):
        count = getattr(metric, "count", None)
        if metric.name == "loss" and isinstance(count, keras.Variable):
            return float(keras.ops.convert_to_numpy(count.value))
    return 1.0


def average_logs(logs: dict, weight: float) -> dict:
    """Averages the numeric entries of ``logs`` over the workers, weighted by ``weight`` (one allreduce).

    Every worker must hold the same keys. Returns a new dict; non-numeric entries are kept as they are.
    """
    keys = sorted(k for k, v in logs.items() if _is_number(v))
    if not keys:
        return dict(logs)
    weight = float(weight)
    vector = np.array([weight * float(keras.ops.convert_to_numpy(logs[k])) for k in keys] + [weight], dtype=np.float64)
    (total,) = _select.current().host_sum([vector], "kfit.metrics")
    out = dict(logs)
    if total[-1] <= 0:
        return out
    for i, key in enumerate(keys):
        out[key] = float(total[i] / total[-1])
    return out


def take_training_metrics(model: Any) -> tuple[dict | None, float]:
    """What the epoch's training logs are combined from over the workers, taken at the epoch's end or before
    ``model.fit``'s validation resets the metrics; a collective: every worker calls it at the same point.

    Returns ``(results, samples)``. Where Keras's own ``train_step`` and ``compute_metrics`` update metrics whose
    states are all sums over samples (the loss, accuracies, ``AUC``, ``Precision``...: see ``_evaluation``),
    ``results`` are the model's results on those states summed over the workers (one allreduce): the numbers one
    process would log, sample weights and thresholds included. Else ``results`` is None and the logs are averaged,
    weighted by ``samples``, the samples this worker trained on (:func:`combine_training_logs`).
    """
    samples = local_sample_count(model)  # (before the sum, which sums the loss tracker's count too)
    split = _evaluation.training_metrics_split(model)
    if split is None or split[1] or not split[0]:
        return None, samples
    return _evaluation.combine_metric_states(model), samples


def combine_training_logs(logs: dict, taken: tuple[dict | None, float]) -> dict:
    """The epoch's training ``logs`` over the workers from what :func:`take_training_metrics` took: the summed
    states' results where it has them, the rest averaged weighted by the samples (one allreduce)."""
    results, samples = taken
    exact = {key: keras.ops.convert_to_numpy(results[key]) for key in logs if results is not None and key in results}
    averaged = average_logs({key: value for key, value in logs.items() if key not in exact}, samples)
    return {**averaged, **{key: float(value) if value.ndim == 0 else value for key, value in exact.items()}}


def average_metrics(logs: dict, model: Any) -> dict:
    """The epoch's training ``logs`` averaged over the workers, each weighted by the samples it trained on."""
    return average_logs(logs, local_sample_count(model))


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float, np.integer, np.floating)):
        return True
    try:
        return keras.ops.is_tensor(value) and tuple(keras.ops.shape(value)) == ()
    except Exception:  # noqa: BLE001 - anything that is not a scalar tensor is kept as is
        return False
