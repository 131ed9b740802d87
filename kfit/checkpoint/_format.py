"""The checkpoint file: an HDF5 layout, a checksum, and writes that survive crashes.

Layout (format version 1)::

    /                       attrs: format="kfit-checkpoint", format_version=1,
                                   meta=<JSON>, checksum="crc32:<8 hex digits>"
    /<group>/<index>        one dataset per array ("model/0", "optimizer/3", "callbacks/0", "rng/numpy")

Everything that is not an array lives in the JSON ``meta`` attribute: the versions and backend, the clock,
the stream, callback states (arrays inside them are references ``{"__kfit_array__": "callbacks/0"}``), the
history, and an index of the datasets with the shape, dtype and CRC-32 of each. The ``checksum`` attribute
is the CRC-32 of the ``meta`` text, so together they cover every stored byte. Reading never unpickles:
datasets are plain numeric arrays and ``meta`` is parsed with :func:`json.loads`.

A write goes to a temporary file beside the target (``PATH.tmp.<pid>.<n>``), is flushed and fsynced,
verified (re-opened, its metadata parsed and its checksum and datasets checked), then renamed over the
target. A crash at any point leaves either the old file or the new one, never a
half-written file under the target's name. Preserved checkpoints are named ``PATH.<samples>``.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import threading
import zlib
from typing import Any

import h5py
import numpy as np

FORMAT_NAME = "kfit-checkpoint"
FORMAT_VERSION = 1
_TEMP_INFIX = ".tmp."
_COUNTER = itertools.count()
# Above this many bytes, the CRC is computed on a second thread while h5py writes (both release the GIL).
_PARALLEL_CRC_BYTES = 8 << 20


class CheckpointError(ValueError):
    """A checkpoint cannot be written, read or restored; the message says what is wrong and what to do."""


class CheckpointCorruptError(CheckpointError):
    """The file is truncated, damaged, or not a kfit checkpoint (its checksum or layout does not hold)."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint is intact but does not fit the model, optimizer or data it is restored into."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No checkpoint file exists at the path."""


# -- arrays ------------------------------------------------------------------------------------------
def _storable(array: np.ndarray) -> tuple[np.ndarray, str]:
    """The array as HDF5 can store it, and the dtype name to restore (bfloat16 etc. stored as raw bits)."""
    array = np.asarray(array)
    dtype = array.dtype
    if dtype.kind in "biuf" and dtype.isnative:
        return array, dtype.name
    if dtype.kind == "V" and dtype.itemsize in (1, 2, 4, 8) and not dtype.fields:  # ml_dtypes: bfloat16, float8_*
        return np.ascontiguousarray(array).view(f"u{dtype.itemsize}"), dtype.name
    raise CheckpointError(f"Cannot store an array of dtype {dtype} in a checkpoint: only numeric arrays are stored.")


def _restore_dtype(array: np.ndarray, name: str) -> np.ndarray:
    if array.dtype.name == name:
        return array
    import ml_dtypes  # noqa: F401  (registers bfloat16 and friends with NumPy)

    return array.view(np.dtype(name))


def _crc(array: np.ndarray) -> int:
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return zlib.crc32(data)


def _checksum(text: str) -> str:
    return f"crc32:{zlib.crc32(text.encode('utf-8')):08x}"


class _CrcThread(threading.Thread):
    """CRC-32 of each array, on a second thread when there is enough data to gain from it."""

    def __init__(self, arrays: list[np.ndarray]):
        super().__init__(name="kfit-checkpoint-crc", daemon=True)
        self.arrays = arrays
        self.crcs: list[int] = []
        self.error: BaseException | None = None
        if sum(a.nbytes for a in arrays) >= _PARALLEL_CRC_BYTES:
            self.start()
        else:
            self.run()

    def run(self) -> None:
        try:
            self.crcs = [_crc(a) for a in self.arrays]
        except BaseException as error:  # surfaced by result()
            self.error = error

    def result(self) -> list[int]:
        if self.is_alive() or self.ident is not None:
            self.join()
        if self.error is not None:
            raise self.error
        return self.crcs


# -- writing -----------------------------------------------------------------------------------------
def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def write_file(path: str | os.PathLike, arrays: dict[str, np.ndarray], meta: dict[str, Any],
               numbered: str | None = None) -> str:
    """Writes a checkpoint atomically: temporary file, flush, fsync, verify, rename.

    Args:
        path: the target file; it is replaced only by a complete, verified file.
        arrays: datasets by name (``"model/0"``), written in this order.
        meta: JSON-serialisable data; an ``"arrays"`` index with each array's shape, dtype and CRC-32 is added.
        numbered: also give the new file this name (a hard link, or a copy where links are not supported),
            before it replaces ``path``.

    Returns:
        The checksum of the written file.

    Raises:
        CheckpointError: the file cannot be written (naming the path and the system's reason); the old
            file at ``path`` is then untouched.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    temp = f"{path}{_TEMP_INFIX}{os.getpid()}.{next(_COUNTER)}"
    names = list(arrays)
    stored, dtypes = [], []
    for name in names:
        data, dtype = _storable(arrays[name])
        stored.append(data)
        dtypes.append(dtype)
    try:
        crcs = _CrcThread(stored)
        with h5py.File(temp, "w") as f:
            for name, data in zip(names, stored, strict=True):
                f.create_dataset(name, data=data)
            index = [
                {"name": name, "shape": list(data.shape), "dtype": dtype, "crc32": crc}
                for name, data, dtype, crc in zip(names, stored, dtypes, crcs.result(), strict=True)
            ]
            text = json.dumps({**meta, "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "arrays": index},
                              sort_keys=True, separators=(",", ":"))
            checksum = _checksum(text)
            f.attrs["format"] = FORMAT_NAME
            f.attrs["format_version"] = FORMAT_VERSION
            f.attrs["meta"] = text
            f.attrs["checksum"] = checksum
        _fsync_path(temp)
        _verify_written(temp, checksum, index)
        if numbered is not None:
            _link_or_copy(temp, numbered)
        # Atomic. The directory is not fsynced: after a power cut the rename may be lost, and the previous
        # (complete) checkpoint is found instead; the new file itself is already durable.
        os.replace(temp, path)
    except OSError as error:
        _remove_quietly(temp)
        reason = error.strerror or str(error)
        raise CheckpointError(
            f"Cannot write the checkpoint {path!r}: {reason}. Check that the directory {directory!r} exists, "
            "is a directory, is writable and has free space; the previous checkpoint there is untouched."
        ) from error
    except BaseException:
        _remove_quietly(temp)
        raise
    return checksum


def _verify_written(temp: str, checksum: str, index: list[dict]) -> None:
    """Re-opens the new file: its metadata must parse, its checksum hold and every dataset be in place.

    (The data itself was just written and fsynced; reading it back would only read the page cache.)
    """
    expected: dict[str, int] = {}
    for entry in index:
        group = entry["name"].rpartition("/")[0]
        expected[group] = expected.get(group, 0) + 1
    with h5py.File(temp, "r") as f:
        text = f.attrs["meta"]
        if f.attrs["checksum"] != checksum or _checksum(text) != checksum:
            raise OSError(f"verification of {temp!r} failed: the metadata read back differs from what was written")
        for group, count in expected.items():
            if len(f[group]) != count:
                raise OSError(f"verification of {temp!r} failed: group {group!r} holds {len(f[group])} of {count} datasets")


def _link_or_copy(source: str, target: str) -> None:
    temp = f"{target}{_TEMP_INFIX}link.{os.getpid()}.{next(_COUNTER)}"
    try:
        os.link(source, temp)
    except OSError:
        shutil.copyfile(source, temp)
        _fsync_path(temp)
    os.replace(temp, target)


# -- reading -----------------------------------------------------------------------------------------
def read_file(path: str | os.PathLike, load_arrays: bool = True,
              verify: bool = True) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Reads a checkpoint file, checking its format, metadata checksum and (when loading) every array's CRC.

    Args:
        path: the checkpoint file.
        load_arrays: read the datasets (otherwise only the metadata; the arrays dict is empty).
        verify: check the CRC-32 of every array (needs ``load_arrays``).

    Returns:
        ``(meta, arrays)``: the parsed JSON metadata and the arrays by dataset name.

    Raises:
        CheckpointNotFoundError: no file at ``path``.
        CheckpointCorruptError: the file is truncated, damaged, or not a kfit checkpoint; the message says which.
        CheckpointError: the file was written by a newer format version.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        what = "is a directory, not a checkpoint file" if os.path.isdir(path) else "does not exist"
        raise CheckpointNotFoundError(f"No checkpoint at {path!r}: the path {what}.")
    try:
        f = h5py.File(path, "r")
    except OSError as error:
        raise CheckpointCorruptError(
            f"The checkpoint {path!r} is not a readable HDF5 file: it is truncated or damaged ({error}). "
            "Restore from an older checkpoint (restore=True falls back to one by itself)."
        ) from None
    try:
        with f:
            meta = _read_meta(f, path)
            arrays: dict[str, np.ndarray] = {}
            if load_arrays:
                for entry in meta["arrays"]:
                    arrays[entry["name"]] = _read_array(f, path, entry, meta, verify)
    except (OSError, KeyError, RuntimeError, TypeError) as error:
        raise CheckpointCorruptError(f"The checkpoint {path!r} is damaged: reading it failed ({error}).") from None
    return meta, arrays


def _read_meta(f: h5py.File, path: str) -> dict[str, Any]:
    if f.attrs.get("format") != FORMAT_NAME:
        raise CheckpointCorruptError(
            f"{path!r} is an HDF5 file but not a kfit checkpoint (it has no format={FORMAT_NAME!r} attribute)."
        )
    version = f.attrs.get("format_version")
    if not isinstance(version, (int, np.integer)) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"The checkpoint {path!r} has format version {version!r}; this kfit reads versions up to "
            f"{FORMAT_VERSION}. Upgrade kfit to read it."
        )
    text = f.attrs.get("meta")
    checksum = f.attrs.get("checksum")
    if not isinstance(text, str) or not isinstance(checksum, str):
        raise CheckpointCorruptError(f"The checkpoint {path!r} is damaged: its metadata or checksum attribute is missing.")
    if _checksum(text) != checksum:
        raise CheckpointCorruptError(
            f"The checkpoint {path!r} is damaged: the checksum of its metadata does not hold "
            f"(stored {checksum}, computed {_checksum(text)})."
        )
    try:
        meta = json.loads(text)
    except ValueError as error:  # cannot happen with a matching checksum, unless written by something else
        raise CheckpointCorruptError(f"The checkpoint {path!r} has unreadable metadata ({error}).") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("arrays"), list):
        raise CheckpointCorruptError(f"The checkpoint {path!r} has no index of its arrays.")
    return meta


def _variable_name(meta: dict[str, Any], name: str) -> str:
    """``model/3`` -> ``variable 'dense/kernel' (model/3)`` for error messages."""
    group, _, index = name.partition("/")
    paths = meta.get("variables", {}).get(group)
    if paths and index.isdigit() and int(index) < len(paths):
        return f"variable {paths[int(index)]!r} ({name})"
    return f"array {name!r}"


def _read_array(f: h5py.File, path: str, entry: dict, meta: dict, verify: bool) -> np.ndarray:
    dataset = f.get(entry["name"])
    what = _variable_name(meta, entry["name"])
    if not isinstance(dataset, h5py.Dataset) or list(dataset.shape) != entry["shape"]:
        raise CheckpointCorruptError(f"The checkpoint {path!r} is damaged: {what} is missing or has the wrong shape.")
    array = dataset[()]
    if not isinstance(array, np.ndarray):  # scalars come back as NumPy scalars
        array = np.asarray(array)
    if array.dtype.kind not in "biuf":
        raise CheckpointCorruptError(f"The checkpoint {path!r} holds a non-numeric {what}; kfit stores only numbers.")
    if verify and _crc(array) != entry["crc32"]:
        raise CheckpointCorruptError(
            f"The checkpoint {path!r} is damaged: the checksum of {what} does not hold. "
            "Restore from an older checkpoint (restore=True falls back to one by itself)."
        )
    return _restore_dtype(array, entry["dtype"])


# -- files of one checkpoint path --------------------------------------------------------------------
def numbered_path(path: str | os.PathLike, samples: int) -> str:
    """The name of the checkpoint preserved at ``samples``: ``PATH.<samples>``."""
    return f"{os.fspath(path)}.{int(samples)}"


def numbered_files(path: str | os.PathLike) -> list[tuple[int, str]]:
    """``(samples, file)`` of every ``PATH.<samples>`` file, oldest first."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    pattern = re.compile(re.escape(os.path.basename(path)) + r"\.(\d+)$")
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        match = pattern.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(os.path.dirname(path), name)))
    return sorted(found)


def prune(path: str | os.PathLike, keep: int) -> list[str]:
    """Removes all but the newest ``keep`` numbered checkpoints; returns the removed files."""
    files = numbered_files(path)
    removed = [file for _, file in files[: max(len(files) - keep, 0)]]
    for file in removed:
        _remove_quietly(file)
    return removed


def remove_stale_temporaries(path: str | os.PathLike) -> list[str]:
    """Removes temporary files left beside ``path`` by interrupted writes of other processes."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    prefix = os.path.basename(path)
    own = f"{_TEMP_INFIX}{os.getpid()}."
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        rest = name[len(prefix):]
        if name.startswith(prefix) and rest.startswith(".") and _TEMP_INFIX in rest and own not in rest:
            file = os.path.join(directory, name)
            _remove_quietly(file)
            removed.append(file)
    return removed


def write_checkpoint(path: str | os.PathLike, arrays: dict[str, np.ndarray], meta: dict[str, Any], samples: int,
                     keep: int = 1, preserve_all: bool = False) -> str:
    """Writes the newest checkpoint to ``path``; with ``preserve_all`` or ``keep > 1`` also as ``PATH.<samples>``,
    then removes numbered checkpoints beyond the newest ``keep`` (none with ``preserve_all``).

    Returns:
        The checksum of the written file.
    """
    history = preserve_all or keep > 1
    checksum = write_file(path, arrays, meta, numbered=numbered_path(path, samples) if history else None)
    if not preserve_all:
        prune(path, keep if history else 0)
    return checksum


def candidates(path: str | os.PathLike) -> list[str]:
    """The checkpoint files of ``path``, newest first: ``PATH`` and ``PATH.<samples>`` by their sample count.

    ``PATH``'s count is read from its metadata; when that cannot be read it is tried first (a restore then
    reports the damage and falls back). Files that are links to one another are listed once.
    """
    path = os.fspath(path)
    found: list[tuple[float, int, str]] = [(samples, 0, file) for samples, file in numbered_files(path)]
    if os.path.isfile(path):
        try:
            meta, _ = read_file(path, load_arrays=False)
            samples = meta.get("summary", {}).get("samples")
        except CheckpointError:
            samples = None
        found.append((float("inf") if samples is None else samples, 1, path))
    ordered: list[str] = []
    for _, _, file in sorted(found, reverse=True):
        try:
            if any(os.path.samefile(file, seen) for seen in ordered):
                continue
        except OSError:
            pass
        ordered.append(file)
    return ordered
