"""Test tools for checkpoint files: damage them, edit them and seal them again, write the old format.

Only h5py, NumPy and kfit's file module: usable in the subprocesses of the damage tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zlib
from collections.abc import Callable

import h5py
import numpy as np

from kfit.checkpoint import _format


def flip_byte(path, offset: int, mask: int = 0x10) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ mask]))


def seal(path, body: bytes, version: int = _format.FORMAT_VERSION) -> None:
    """Writes ``path`` as kfit does: a header with a correct SHA-256 of everything, then ``body`` (HDF5)."""
    length = _format.HEADER_SIZE + len(body)
    prefix = _format._HEADER.pack(_format.MAGIC, version, _format.HEADER_SIZE, length)
    note = _format._note()
    digest = hashlib.sha256(prefix + note + body).digest()
    with open(path, "wb") as f:
        f.write(prefix + digest + note + body)


def edit(path, change: Callable[[h5py.File], None]) -> None:
    """Changes the HDF5 part of a checkpoint with ``change(file)``, then seals it again (checksum recomputed):
    what a user editing the file by hand, or another program, could do."""
    with open(path, "rb") as f:
        data = f.read()
    with tempfile.TemporaryDirectory() as work:
        body = os.path.join(work, "body.h5")
        with open(body, "wb") as f:
            f.write(data[_format.HEADER_SIZE:])
        with h5py.File(body, "r+") as f:
            change(f)
        with open(body, "rb") as f:
            seal(path, f.read())


def edit_meta(path, change: Callable[[dict], None]) -> None:
    """Changes the parsed metadata with ``change(meta)``, then stores it and seals the file again."""
    def rewrite(f: h5py.File) -> None:
        meta = json.loads(f.attrs["meta"])
        change(meta)
        f.attrs["meta"] = json.dumps(meta, sort_keys=True, separators=(",", ":"))
    edit(path, rewrite)


def write_format_1(path, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """A checkpoint as kfit wrote it before format 2: plain HDF5, a CRC-32 of the metadata and of each array."""
    index = [{"name": name, "shape": list(a.shape), "dtype": a.dtype.name,
              "crc32": zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8))} for name, a in arrays.items()]
    text = json.dumps({**meta, "format_version": 1, "arrays": index}, sort_keys=True, separators=(",", ":"))
    with h5py.File(path, "w") as f:
        for name, array in arrays.items():
            f.create_dataset(name, data=array)
        f.attrs["format"] = _format.FORMAT_NAME
        f.attrs["format_version"] = 1
        f.attrs["meta"] = text
        f.attrs["checksum"] = _format._checksum(text)
