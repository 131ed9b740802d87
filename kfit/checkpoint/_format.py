"""The checkpoint file: a sealed header, an HDF5 body, and writes that survive crashes and full disks.

Layout (format version 2)::

    bytes 0-511     the header, which HDF5 sees as a user block:
                    magic b"\x89KFIT\r\n\x1a", format version (uint32), header size (uint32, 512),
                    file length (uint64), SHA-256 (32 bytes) of every byte of the file except these 32,
                    then a line of text saying what the file is, zero-padded
    bytes 512-      an HDF5 file:
                    /             attrs: format="kfit-checkpoint", format_version=2, meta=<JSON>
                    /<group>/<i>  one dataset per array ("model/0", "optimizer/3", "callbacks/0", "rng/numpy")

A reader checks the header and the SHA-256 from the raw bytes before HDF5 parses anything, so a damaged
file (a flipped byte anywhere, a truncation) is refused as damaged and never reaches h5py, which can crash
or hang on damaged input. Everything that is not an array lives in the JSON ``meta`` attribute (the
versions and backend, the clock, the stream, callback states with references
``{"__kfit_array__": "callbacks/0"}`` to their arrays, the history, an index of the datasets with shape and
dtype); it is checked against a schema (``_schema.py``) before anything uses it. Reading never unpickles:
datasets are plain numeric arrays and ``meta`` is parsed with :func:`json.loads`. Files of format 1 (no
header; a CRC-32 of the metadata and of each array) are still read, without the whole-file check: HDF5 parses
them unchecked, so they are read in a child process, and one that crashes or does not finish (HDF5 looped forever
on a format-1 file with one byte of its metadata changed) is reported as a damaged file.

A write builds the whole file in memory (HDF5's ``core`` driver), then writes its bytes with ``os.write``
to a temporary file beside the target (``PATH.tmp.<pid>.<n>``), fsyncs it, checks its size and header,
and renames it over the target. A failed write (a full disk, an I/O error, a read-only file system) is
then an ``OSError`` from plain Python, never an error inside HDF5. (With h5py 3.14 / HDF5 1.14.6, when
``File.close`` cannot flush the metadata cache for lack of space, ``H5Fclose`` fails half-way: the file's
dataset identifiers stay registered while the file under them is torn down, and HDF5's own shutdown at
process exit, ``H5_term_library`` -> ``H5D_top_term_package`` -> ``H5VL_dataset_close``, dereferences the
freed file: a segfault, long after the error was caught.)
The temporary file is removed and the previous checkpoint stays the newest intact one. A crash at any
point leaves either the old file or the new one, never a half-written file under the target's name.
Preserved checkpoints are named ``PATH.<samples>``. Only this module, ``_schema.py``, NumPy and h5py are
needed to read a file: no Keras, no backend.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import stat
import struct
import threading
import zlib
from typing import Any

import numpy as np

from kfit.checkpoint import _schema

FORMAT_NAME = "kfit-checkpoint"
GROUPS = ("model", "optimizer", "metrics")
FORMAT_VERSION = 2
MAGIC = b"\x89KFIT\r\n\x1a"  # 8 bytes, like PNG's and HDF5's signatures
HEADER_SIZE = 512
_HEADER = struct.Struct("<8sIIQ")  # magic, format version, header size, file length
_DIGEST = slice(_HEADER.size, _HEADER.size + 32)
_NOTE = (b"kfit checkpoint: a SHA-256-sealed header, then an HDF5 file (h5py and h5dump read it as a "
         b"file with a 512-byte user block). Read it with kfit.load_checkpoint or `kfit inspect`.\n")
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
TEMP_INFIX = ".tmp."
_COUNTER = itertools.count()
# Above this many bytes, the SHA-256 is computed on a second thread while the file is written.
_PARALLEL_HASH_BYTES = 8 << 20


class CheckpointError(ValueError):
    """A checkpoint cannot be written, read or restored; the message says what is wrong and what to do."""


class CheckpointCorruptError(CheckpointError):
    """The file is truncated, damaged, or not a kfit checkpoint (its checksum, layout or metadata does not hold)."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint is intact but does not fit the model, optimizer or data it is restored into."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No checkpoint file exists at the path."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (full disk, I/O error, read-only file system, no permission).

    Attributes:
        path: the checkpoint that was being written.
        cause: the ``OSError`` that stopped the write.
    """

    def __init__(self, message: str, path: str, cause: BaseException | None = None):
        super().__init__(message)
        self.path = path
        self.cause = cause


class CheckpointLockedError(CheckpointError):
    """Another writer (callback or process) holds the checkpoint path; the message names it."""


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

    dtype = np.dtype(name)
    if dtype.itemsize != array.dtype.itemsize or dtype.kind not in "biufV":
        raise ValueError(f"dtype {name!r} cannot be stored as {array.dtype.name}")
    return array.view(dtype)


def _crc(array: np.ndarray) -> int:
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return zlib.crc32(data)


def _checksum(text: str) -> str:
    """Format 1's checksum of the metadata text."""
    return f"crc32:{zlib.crc32(text.encode('utf-8', 'surrogatepass')):08x}"


# -- the header --------------------------------------------------------------------------------------
def _digest(prefix: bytes | memoryview, rest: bytes | memoryview) -> bytes:
    """SHA-256 of a file without its digest field: ``prefix`` is the header up to the digest, ``rest``
    everything after it (hashlib releases the GIL on large buffers)."""
    h = hashlib.sha256(prefix)
    h.update(rest)
    return h.digest()


class _HashThread(threading.Thread):
    """The digest of a file, on a second thread when the file is large enough to gain from it."""

    def __init__(self, prefix: bytes, rest: memoryview):
        super().__init__(name="kfit-checkpoint-hash", daemon=True)
        self.prefix, self.rest = prefix, rest
        self.value = b""
        if len(rest) >= _PARALLEL_HASH_BYTES:
            self.start()
        else:
            self.run()

    def run(self) -> None:
        self.value = _digest(self.prefix, self.rest)

    def result(self) -> bytes:
        if self.ident is not None:
            self.join()
        return self.value


def _note() -> bytes:
    return _NOTE.ljust(HEADER_SIZE - _DIGEST.stop, b"\0")


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


def _hdf5_image(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> bytes:
    """The HDF5 part of a checkpoint, built in memory: nothing touches the disk, so no file system error
    can reach HDF5."""
    import h5py

    names = list(arrays)
    stored, index = [], []
    for name in names:
        data, dtype = _storable(arrays[name])
        stored.append(data)
        index.append({"name": name, "shape": list(data.shape), "dtype": dtype})
    text = json.dumps({**meta, "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "arrays": index},
                      sort_keys=True, separators=(",", ":"))
    memory_name = f"kfit-checkpoint-{os.getpid()}-{next(_COUNTER)}.h5"
    with h5py.File(memory_name, "w", driver="core", backing_store=False) as f:
        for name, data in zip(names, stored, strict=True):
            f.create_dataset(name, data=data)
        f.attrs["format"] = FORMAT_NAME
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["meta"] = text
        f.flush()
        return f.id.get_file_image()


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _write_sealed(temp: str, image: bytes) -> str:
    """Writes header + ``image`` to the new file ``temp`` and fsyncs it; returns the digest's hex.

    The body is written first, while a second thread computes the digest, then the header."""
    body = memoryview(image)
    length = HEADER_SIZE + len(body)
    prefix = _HEADER.pack(MAGIC, FORMAT_VERSION, HEADER_SIZE, length)
    note = _note()
    hashing = _HashThread(prefix + note, body)
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        _write_all(fd, body, HEADER_SIZE)
        digest = hashing.result()
        header = prefix + digest + note
        _write_all(fd, memoryview(header), 0)
        os.fsync(fd)
        if os.fstat(fd).st_size != length or os.pread(fd, HEADER_SIZE, 0) != header:
            raise OSError(f"verification of {temp!r} failed: the file on disk is not the one written")
    finally:
        os.close(fd)
    return digest.hex()


def _link_or_copy(source: str, target: str) -> None:
    temp = f"{target}{TEMP_INFIX}link.{os.getpid()}.{next(_COUNTER)}"
    try:
        try:
            os.link(source, temp)
        except OSError:
            shutil.copyfile(source, temp)
            _fsync_path(temp)
        os.replace(temp, target)
    except BaseException:
        _remove_quietly(temp)
        raise


def write_file(path: str | os.PathLike, arrays: dict[str, np.ndarray], meta: dict[str, Any],
               numbered: str | None = None) -> str:
    """Writes a checkpoint atomically: built in memory, written to a temporary file, fsynced, checked, renamed.

    Args:
        path: the target file; it is replaced only by a complete, checked file.
        arrays: datasets by name (``"model/0"``), written in this order.
        meta: JSON-serialisable data; ``format``, ``format_version`` and an ``"arrays"`` index (shape and
            dtype of each array) are added.
        numbered: also give the new file this name (a hard link, or a copy where links are not supported),
            before it replaces ``path``.

    Returns:
        The file's checksum, ``"sha256:<hex>"``.

    Raises:
        CheckpointWriteError: the file cannot be written (naming the path and the system's reason); the old
            file at ``path`` is then untouched and no temporary file is left.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    temp = f"{path}{TEMP_INFIX}{os.getpid()}.{next(_COUNTER)}"
    image = _hdf5_image(arrays, meta)
    try:
        digest = _write_sealed(temp, image)
        del image
        if numbered is not None:
            _link_or_copy(temp, numbered)
        # Atomic. The directory is not fsynced: after a power cut the rename may be lost, and the previous
        # (complete) checkpoint is found instead; the new file itself is already durable.
        os.replace(temp, path)
    except OSError as error:
        _remove_quietly(temp)
        reason = error.strerror or str(error)
        fix = (f"the directory {directory!r} does not exist (removed during the run?): make it again or choose "
               "another path; no checkpoint is left there" if not os.path.lexists(directory) else
               f"check that {directory!r} is a directory, is writable and has free space; the previous checkpoint "
               "there is untouched")
        raise CheckpointWriteError(f"Cannot write the checkpoint {path!r}: {reason}. {fix[0].upper()}{fix[1:]}.",
                                   path, error) from error
    except BaseException:
        _remove_quietly(temp)
        raise
    return f"sha256:{digest}"


# -- reading -----------------------------------------------------------------------------------------
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _not_a_file(path: str, mode: int) -> CheckpointError:
    if stat.S_ISDIR(mode):
        return CheckpointNotFoundError(f"No checkpoint at {path!r}: the path is a directory, not a checkpoint file.")
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return CheckpointCorruptError(f"{path!r} is {kind}, not a checkpoint file: kfit reads checkpoints only from "
                                  "regular files. Give the path of a file written by kfit.")


def _read_bytes(path: str) -> bytes:
    """The whole file, read once (what is checked is exactly what is parsed). Never blocks on a FIFO."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"No checkpoint at {path!r}: the path does not exist.") from None
    except ValueError:  # (Python's 'embedded null byte')
        raise CheckpointNotFoundError(f"No checkpoint at {path!r}: a path holds no NUL character.") from None
    except OSError as error:
        raise CheckpointCorruptError(f"The checkpoint {path!r} cannot be read: {error.strerror or error}.") from None
    if not stat.S_ISREG(mode):
        raise _not_a_file(path, mode)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise CheckpointCorruptError(f"The checkpoint {path!r} cannot be opened: {error.strerror or error}.") from None
    with open(fd, "rb", buffering=0, closefd=True) as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced between the stat and the open
            raise _not_a_file(path, mode)
        try:
            return f.readall()
        except MemoryError:
            raise CheckpointCorruptError(
                f"The checkpoint {path!r} ({os.fstat(fd).st_size} bytes) does not fit in memory.") from None
        except OSError as error:
            raise CheckpointCorruptError(f"The checkpoint {path!r} cannot be read: {error.strerror or error}.") from None


def _damaged(path: str, what: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"The checkpoint {path!r} is damaged: {what}. Restore from an older checkpoint (restore=True falls "
        "back to one by itself)."
    )


def _check_header(path: str, data: bytes) -> int:
    """Checks a format-2 file's header and digest from its raw bytes; returns its format version."""
    if len(data) < HEADER_SIZE:
        raise _damaged(path, f"it is truncated or damaged ({len(data)} bytes, shorter than its {HEADER_SIZE}-byte header)")
    magic, version, header_size, length = _HEADER.unpack_from(data)
    if header_size != HEADER_SIZE or length != len(data):
        what = "truncated or damaged" if length > len(data) else "damaged"
        raise _damaged(path, f"it is {what} (its header declares {length} bytes and a {header_size}-byte "
                             f"header; the file has {len(data)} bytes)")
    view = memoryview(data)
    digest = _digest(view[: _DIGEST.start], view[_DIGEST.stop:])
    if digest != data[_DIGEST]:
        raise _damaged(path, "the checksum of the file (SHA-256) does not hold, so some of its bytes changed "
                             "since it was written")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"The checkpoint {path!r} has format version {version}; this kfit reads versions up to "
            f"{FORMAT_VERSION}. Upgrade kfit to read it."
        )
    if version < 2:
        raise _damaged(path, f"its header declares format version {version}, which never had a header")
    return version


def read_file(path: str | os.PathLike, load_arrays: bool = True,
              verify: bool = True) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Reads a checkpoint file: its raw bytes are checked first, then its metadata, then its arrays.

    Safe on any input: a damaged, truncated, foreign or hostile file, a directory, a FIFO or a device
    raises a :class:`CheckpointError` naming the file, never another exception, a crash or a hang
    (format-2 files' bytes are checked before HDF5 sees them; format-1 files are read in a child process).

    Args:
        path: the checkpoint file.
        load_arrays: read the datasets (otherwise only the metadata; the arrays dict is empty).
        verify: for format-1 files, check the CRC-32 of every array (format 2 checks the whole file always).

    Returns:
        ``(meta, arrays)``: the parsed JSON metadata and the arrays by dataset name.

    Raises:
        CheckpointNotFoundError: no file at ``path`` (or a directory).
        CheckpointCorruptError: the file is truncated, damaged, or not a kfit checkpoint; the message says which.
        CheckpointError: the file was written by a newer format version.
    """
    path = os.fspath(path)
    return read_image(path, _read_bytes(path), load_arrays, verify)


def read_image(path: str, data: bytes, load_arrays: bool = True,
               verify: bool = True) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """:func:`read_file` on the bytes of the file ``path`` already read (e.g. received from another worker)."""
    try:
        if data[:8] == MAGIC:
            version = _check_header(path, data)
        elif data[:8] == _HDF5_MAGIC:
            version = 1
        else:
            raise CheckpointCorruptError(
                f"{path!r} is not a kfit checkpoint: it starts with neither kfit's header nor HDF5's signature "
                "(truncated to nothing, damaged at its start, or another kind of file)."
            )
        if version == 1:
            return _read_format_1_apart(path, data, load_arrays, verify)
        return _read_hdf5(path, version, data, load_arrays, verify)
    except CheckpointError:
        raise
    except Exception as error:  # whatever h5py, NumPy or JSON raise on a file that is not as written
        raise _damaged(path, f"reading it failed ({type(error).__name__}: {error})") from None


# Seconds a format-1 file's reader may take (plus one per 20 MB) before the file is called damaged.
FORMAT_1_TIMEOUT_S = 60.0
_FORMAT_1_CHILD = """
import io, json, sys, types
package = types.ModuleType("kfit")  # kfit's own __init__ imports Keras: the reader needs only h5py and NumPy
package.__path__ = [sys.argv[1]]
sys.modules["kfit"] = package
import numpy as np
from kfit.checkpoint import _format
data = sys.stdin.buffer.read()
out = sys.stdout.buffer
try:
    meta, arrays = _format._read_hdf5(sys.argv[2], 1, data, sys.argv[3] == "1", sys.argv[4] == "1")
except _format.CheckpointError as error:
    out.write(json.dumps({"error": type(error).__name__, "message": str(error)}).encode() + b"\\n")
    sys.exit(0)
out.write(json.dumps({"meta": meta, "arrays": list(arrays)}).encode() + b"\\n")
for array in arrays.values():
    np.save(out, array, allow_pickle=False)
"""


_PROBE_CHILD = """
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    print(f.attrs.get("format") == sys.argv[2])
"""


def is_kfit_hdf5(path: str) -> bool:
    """Whether the HDF5 file ``path`` has kfit's format attribute (a format-1 checkpoint), asked in a child process
    (HDF5 can loop forever or crash on a damaged file). One that h5py cannot read, or that does not answer in
    :data:`FORMAT_1_TIMEOUT_S`, counts as a (damaged) checkpoint."""
    import subprocess
    import sys

    try:
        done = subprocess.run([sys.executable, "-c", _PROBE_CHILD, path, FORMAT_NAME], capture_output=True,
                              timeout=FORMAT_1_TIMEOUT_S, env=dict(os.environ, PYTHONSAFEPATH="1"))
    except subprocess.TimeoutExpired:
        return True
    return done.returncode != 0 or done.stdout.strip() == b"True"


def _read_format_1_apart(path: str, data: bytes, load_arrays: bool,
                         verify: bool) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Reads a format-1 file (no header, no whole-file checksum) in a child process: HDF5 can loop forever or
    crash on a damaged file (one changed byte in a format-1 file's metadata made ``H5Aread`` spin), and only its
    own process can be stopped. A child that crashes or does not finish is reported as a damaged file."""
    import subprocess
    import sys

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    timeout = FORMAT_1_TIMEOUT_S + len(data) / 20e6
    try:
        done = subprocess.run(
            [sys.executable, "-c", _FORMAT_1_CHILD, package, path, "1" if load_arrays else "0", "1" if verify else "0"],
            input=data, capture_output=True, timeout=timeout, env=dict(os.environ, PYTHONSAFEPATH="1"))
    except subprocess.TimeoutExpired:
        raise _damaged(path, f"it is in kfit's first format (no checksum of the whole file) and HDF5 did not "
                             f"finish reading it in {timeout:.0f} s") from None
    head, _, rest = done.stdout.partition(b"\n")
    try:
        answer = json.loads(head)
    except ValueError:
        answer = None
    if done.returncode != 0 or not isinstance(answer, dict):
        reason = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise _damaged(path, f"it is in kfit's first format (no checksum of the whole file) and reading it with "
                             f"HDF5 failed ({reason[0]})")
    if "error" in answer:
        kinds = {kind.__name__: kind for kind in (CheckpointError, CheckpointCorruptError)}
        raise kinds.get(answer["error"], CheckpointCorruptError)(answer["message"])
    import io

    stream = io.BytesIO(rest)
    arrays = {name: np.load(stream, allow_pickle=False) for name in answer["arrays"]}
    return answer["meta"], arrays


def _read_hdf5(path: str, version: int, data: bytes, load_arrays: bool,
               verify: bool) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    try:
        f = _open_image(data)
    except OSError as error:
        raise CheckpointCorruptError(
            f"The checkpoint {path!r} is not a readable HDF5 file: it is truncated or damaged ({error}). "
            "Restore from an older checkpoint (restore=True falls back to one by itself)."
        ) from None
    with f:
        meta = _read_meta(f, path, version)
        arrays: dict[str, np.ndarray] = {}
        if load_arrays:
            for entry in meta["arrays"]:
                arrays[entry["name"]] = _read_array(f, path, entry, meta, data, verify and version == 1)
    return meta, arrays


def _open_image(data: bytes) -> Any:
    """An h5py File over the bytes in memory (HDF5's core driver: no Python call per read, no copy to disk)."""
    import h5py

    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_fapl_core(backing_store=False)
    fapl.set_file_image(data)
    return h5py.File(h5py.h5f.open(f"kfit-read-{next(_COUNTER)}".encode(), h5py.h5f.ACC_RDONLY, fapl=fapl))


def _read_meta(f: Any, path: str, version: int) -> dict[str, Any]:
    if f.attrs.get("format") != FORMAT_NAME:
        raise CheckpointCorruptError(
            f"{path!r} is an HDF5 file but not a kfit checkpoint (it has no format={FORMAT_NAME!r} attribute)."
        )
    stored_version = f.attrs.get("format_version")
    if not isinstance(stored_version, (int, np.integer)) or stored_version > FORMAT_VERSION:
        raise CheckpointError(
            f"The checkpoint {path!r} has format version {stored_version!r}; this kfit reads versions up to "
            f"{FORMAT_VERSION}. Upgrade kfit to read it."
        )
    if stored_version != version:
        raise CheckpointCorruptError(f"The checkpoint {path!r} is damaged: its header says format version "
                                     f"{version} and its HDF5 part {stored_version}.")
    text = f.attrs.get("meta")
    if not isinstance(text, str):
        raise CheckpointCorruptError(f"The checkpoint {path!r} is damaged: its metadata attribute is missing.")
    if version == 1:
        checksum = f.attrs.get("checksum")
        if not isinstance(checksum, str) or _checksum(text) != checksum:
            raise _damaged(path, f"the checksum of its metadata does not hold (stored {checksum!r}, computed "
                                 f"{_checksum(text)})")
    try:
        meta = json.loads(text)
    except ValueError as error:  # cannot happen with an intact file, unless written by something else
        raise CheckpointCorruptError(f"The checkpoint {path!r} has unreadable metadata ({error}).") from None
    try:
        _schema.check(meta)
    except _schema.SchemaError as error:
        raise CheckpointCorruptError(
            f"The checkpoint {path!r} has metadata that kfit did not write: {error}. Nothing was restored "
            "from it; restore from another checkpoint."
        ) from None
    return meta


def _variable_name(meta: dict[str, Any], name: str) -> str:
    """``model/3`` -> ``variable 'dense/kernel' (model/3)`` for error messages."""
    group, _, index = name.partition("/")
    paths = meta.get("variables", {}).get(group)
    if paths and index.isdigit() and int(index) < len(paths):
        return f"variable {paths[int(index)]!r} ({name})"
    return f"array {name!r}"


def _read_array(f: Any, path: str, entry: dict, meta: dict, data: bytes, verify: bool) -> np.ndarray:
    import h5py

    what = _variable_name(meta, entry["name"])
    try:  # the low-level API: a tenth of the high-level one's overhead per dataset
        dataset = h5py.h5d.open(f.id, entry["name"].encode("utf-8", "surrogateescape"))
    except (KeyError, ValueError, TypeError):
        dataset = None
    if dataset is None or list(dataset.shape) != entry["shape"]:
        raise CheckpointCorruptError(f"The checkpoint {path!r} is damaged: {what} is missing or has the wrong shape.")
    dtype = dataset.dtype
    if dtype.kind not in "biuf":
        raise CheckpointCorruptError(f"The checkpoint {path!r} holds a non-numeric {what}; kfit stores only numbers.")
    count = int(np.prod(entry["shape"], dtype=np.float64))
    declared = count * dtype.itemsize
    if declared > len(data):
        raise _damaged(path, f"{what} declares {declared} bytes (shape {tuple(entry['shape'])}), more than the "
                             f"whole file holds ({len(data)} bytes)")
    offset = dataset.get_offset()  # contiguous storage without filters, as kfit writes it
    if offset is not None and dataset.get_create_plist().get_nfilters() == 0 and offset + declared <= len(data):
        array = np.frombuffer(data, dtype, count, offset).reshape(entry["shape"]).copy()  # the checked bytes
    else:
        array = np.asarray(h5py.Dataset(dataset)[()])
    if verify and ("crc32" not in entry or _crc(array) != entry["crc32"]):
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
    """``(samples, file)`` of every ``PATH.<samples>`` file, oldest first (beside the target of a link ``PATH``)."""
    path = os.path.realpath(path) if os.path.islink(path) else os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    pattern = re.compile(re.escape(os.path.basename(path)) + r"\.(\d+)$")
    matches = filter(None, map(pattern.match, _names_in(directory)))
    return sorted((int(match.group(1)), os.path.join(os.path.dirname(path), match.string)) for match in matches)


def _names_in(directory: str) -> list[str]:
    """The names in ``directory``; none when it cannot be listed."""
    try:
        return os.listdir(directory)
    except OSError:
        return []


def remove_stale_temporaries(path: str | os.PathLike) -> list[str]:
    """Removes temporary files left beside ``path`` by interrupted writes of other processes."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    prefix = os.path.basename(path)
    own = f"{TEMP_INFIX}{os.getpid()}."
    removed = [os.path.join(directory, name) for name in _names_in(directory) if name.startswith(prefix)
               and (rest := name[len(prefix):]).startswith(".") and TEMP_INFIX in rest and own not in rest]
    for file in removed:
        _remove_quietly(file)
    return removed


def write_checkpoint(path: str | os.PathLike, arrays: dict[str, np.ndarray], meta: dict[str, Any], samples: int,
                     keep: int = 1, preserve_all: bool = False, starts_over: bool = False) -> str:
    """Writes the newest checkpoint to ``path``; with ``preserve_all`` or ``keep > 1`` also as ``PATH.<samples>``,
    then removes numbered checkpoints beyond the newest ``keep`` (none with ``preserve_all``).

    ``PATH`` holds the newest state: numbered checkpoints of more samples than this one (an earlier, longer run's)
    are removed once it is written, as a restore would take them for newer states of this run and resume the
    earlier run. ``starts_over``: the first checkpoint of a run that did not resume from ``path``: every other
    numbered checkpoint is removed too (``keep=1`` removes them in any case).

    Returns:
        The checksum of the written file.
    """
    history = preserve_all or keep > 1
    numbered = numbered_path(path, samples) if history else None
    checksum = write_file(path, arrays, meta, numbered=numbered)
    kept = []
    for saved_at, file in numbered_files(path):
        if saved_at > int(samples) or (starts_over and saved_at != int(samples)):
            _remove_quietly(file)
        else:
            kept.append(file)
    for file in [] if preserve_all else kept[: max(len(kept) - (keep if history else 0), 0)]:
        _remove_quietly(file)
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


def read_newest_intact(path: str | os.PathLike) -> tuple[str, dict[str, Any], dict[str, np.ndarray], list[str]] | None:
    """Reads the newest intact checkpoint of ``path`` (``PATH`` or a numbered ``PATH.<samples>``).

    Returns:
        ``(file, meta, arrays, damaged)``, ``damaged`` holding what was wrong with each newer file that was
        passed over; None when ``path`` has no checkpoint files.

    Raises:
        CheckpointCorruptError: every file is damaged (naming each and what is wrong).
        CheckpointError: the newest readable file has a newer format version.
    """
    found = newest_intact_image(path)
    return None if found is None else found[:3] + found[4:]


def newest_intact_image(path: str | os.PathLike) -> tuple[str, dict[str, Any], dict[str, np.ndarray], bytes,
                                                              list[str]] | None:
    """:func:`read_newest_intact`, with the file's bytes: ``(file, meta, arrays, data, damaged)``."""
    files = candidates(path)
    if not files:
        return None
    damaged = []
    for file in files:
        try:
            data = _read_bytes(file)
            meta, arrays = read_image(file, data)
        except (CheckpointCorruptError, CheckpointNotFoundError) as damage:
            damaged.append(str(damage))
            continue
        return file, meta, arrays, data, damaged
    raise CheckpointCorruptError(
        f"None of the checkpoints of {os.fspath(path)!r} is intact: {' '.join(damaged)} Move them away to start "
        "afresh, or pass restore=False."
    )
