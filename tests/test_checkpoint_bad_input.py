"""The bad-input table of docs/bad-input.md, run: each row's input is made, and what the user sees checked.

Rows with an id in ``CASES`` are run here (``load_checkpoint`` raises the error named, with the text
quoted, and changes nothing; ``read_checkpoint_info`` raises too unless the row says it reads only the
metadata). The other rows name the test that keeps them true: that test must exist and assert the text.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import h5py
import keras
import numpy as np
import pytest
from checkpoint_files import edit, edit_meta, flip_byte, seal

import kfit
from kfit.checkpoint import _format, read_checkpoint_info

ROOT = Path(__file__).parent.parent
ROW = re.compile(r"^\| `(\w+)` \| (.+?) \| (.+?) \| `([^`]+)` \|$")
SEEN = re.compile(r'`(\w+)`: "([^"]+)"|(stderr): "([^"]+)"')


def table() -> dict[str, dict]:
    rows = {}
    for line in (ROOT / "docs" / "bad-input.md").read_text().splitlines():
        match = ROW.match(line)
        if match:
            key, tried, seen, test = match.groups()
            shown = SEEN.search(seen)
            kind, text = (shown.group(1) or shown.group(3), shown.group(2) or shown.group(4)) if shown else (None, None)
            rows[key] = {"tried": tried, "kind": kind, "text": text, "test": test}
    return rows


def model(hidden: int = 4):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(hidden), keras.layers.Dense(1)])
    m.compile(optimizer="sgd", loss="mse")
    m(np.zeros((1, 3), "float32"))
    m.optimizer.build(m.trainable_variables)
    return m


def saved(path) -> Path:
    keras.backend.clear_session()
    kfit.save_checkpoint(path, model(), clock=kfit.Clock(samples=30, minibatches=3))
    return Path(path)


def _set(dictionary: dict, keys: str, value) -> None:
    *parents, last = keys.split(".")
    for key in parents:
        dictionary = dictionary[key]
    dictionary[last] = value


def _dataset(name: str, **create):
    def change(f):
        meta = json.loads(f.attrs["meta"])
        del f[name]
        f.create_dataset(name, **create)
        entry = next(e for e in meta["arrays"] if e["name"] == name)
        entry["shape"] = list(f[name].shape)
        f.attrs["meta"] = json.dumps(meta)
    return change


def make(case: str, tmp_path: Path) -> Path:
    path = tmp_path / "c.ckpt"
    if case == "missing":
        return path
    if case == "directory":
        path.mkdir()
    elif case == "fifo":
        os.mkfifo(path)
    elif case == "device":
        return Path("/dev/zero")
    elif case == "symlink_loop":
        os.symlink(path, path)
    elif case in ("empty", "text"):
        path.write_text("" if case == "empty" else "hello\n" * 100)
    elif case == "plain_hdf5":
        with h5py.File(path, "w") as f:
            f["x"] = np.arange(3)
    else:
        saved(path)
        size = os.path.getsize(path)
        if case == "truncated":
            os.truncate(path, size - 100)
        elif case == "flipped_byte":
            flip_byte(path, size - 50)
        elif case == "flipped_header":
            flip_byte(path, 16, 0x01)  # the lowest byte of the file length
        elif case == "newer_format":
            seal(path, path.read_bytes()[_format.HEADER_SIZE:], version=_format.FORMAT_VERSION + 1)
        elif case == "field_removed":
            edit_meta(path, lambda meta: meta.pop("rng"))
        elif case == "wrong_type":
            edit_meta(path, lambda meta: _set(meta, "clock.samples", "many"))
        elif case == "run_status_wrong_type":
            edit_meta(path, lambda meta: meta.__setitem__("run", {"status": 5, "reason": None}))
        elif case == "dangling_array":
            edit_meta(path, lambda meta: _set(meta, "callbacks", {"early_stopping": {"__kfit_array__": "callbacks/9"}}))
        elif case == "huge_array":
            edit(path, _dataset("model/0", shape=(10**12,), dtype="float32"))
        elif case == "pickle":
            edit(path, _dataset("model/0", data=np.array([b"cos\nsystem\n"], dtype=object), dtype=h5py.string_dtype()))
    return path


CASES = ["missing", "directory", "fifo", "device", "symlink_loop", "empty", "text", "plain_hdf5", "truncated",
         "flipped_byte", "flipped_header", "newer_format", "field_removed", "wrong_type", "run_status_wrong_type",
         "dangling_array",
         "huge_array", "pickle", "other_model"]
METADATA_ONLY = ("huge_array", "pickle", "other_model")  # read_checkpoint_info reads no array and no model: no error


def test_every_row_of_the_table_is_tested():
    rows = table()
    assert set(CASES) <= rows.keys(), set(CASES) - rows.keys()
    assert len(rows) >= 25
    for key, row in rows.items():
        if key in CASES:
            assert row["test"] == f"test_bad_input_table[{key}]", row
            continue
        file, _, name = row["test"].partition("::")
        source = (ROOT / file).read_text()
        assert re.search(rf"^def {name}\(", source, re.M), f"{row['test']} does not exist"
        if row["text"]:  # the test asserts what the table says the user sees
            assert row["text"] in source, (key, row["text"], file)


@pytest.mark.parametrize("case", CASES)
def test_bad_input_table(case, tmp_path):
    row = table()[case]
    if case == "other_model":
        path = saved(tmp_path / "c.ckpt")
        keras.backend.clear_session()
        target = model(hidden=6)
    else:
        path = make(case, tmp_path)
        keras.backend.clear_session()
        target = model()
    error = getattr(kfit.checkpoint, row["kind"])
    before = [keras.ops.convert_to_numpy(v.value) for v in target.variables + target.optimizer.variables]
    with pytest.raises(error, match=re.escape(row["text"])) as raised:
        kfit.load_checkpoint(path, target)
    assert type(raised.value) is error  # the class the table names, not a broader or narrower one
    assert str(path) in str(raised.value)  # the file is named
    after = [keras.ops.convert_to_numpy(v.value) for v in target.variables + target.optimizer.variables]
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))  # nothing changed
    if case in METADATA_ONLY:
        read_checkpoint_info(path)
    else:
        with pytest.raises(error, match=re.escape(row["text"])):
            read_checkpoint_info(path)


READ_WITHOUT_KERAS = """
import sys, types
package = types.ModuleType("kfit")  # kfit's own __init__ imports Keras; the reading path must not need it
package.__path__ = [sys.argv[1]]
sys.modules["kfit"] = package
import kfit.checkpoint as checkpoint
info = checkpoint.read_checkpoint_info(sys.argv[2])
try:
    checkpoint.read_checkpoint_info(sys.argv[3])
except checkpoint.CheckpointCorruptError as error:
    damaged = str(error)
heavy = sorted(m for m in ("keras", "tensorflow", "jax", "torch") if m in sys.modules)
print(info.samples, heavy, "checksum of the file" in damaged)
"""


def test_reading_a_checkpoint_needs_neither_keras_nor_a_backend(tmp_path):
    import subprocess
    import sys

    good = saved(tmp_path / "good.ckpt")
    bad = saved(tmp_path / "bad.ckpt")
    flip_byte(bad, os.path.getsize(bad) // 2)
    out = subprocess.run([sys.executable, "-c", READ_WITHOUT_KERAS, str(ROOT / "kfit"), str(good), str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[0] == "30 [] True"


def test_a_path_that_cannot_name_a_file_is_refused_naming_the_argument(tmp_path):
    """save_checkpoint and Checkpoint check their path as every kfit writer does (kfit._checks.output_path): a NUL
    character gave Python's bare 'embedded null byte' naming no file, and save_checkpoint('') an error about the
    working directory."""
    cases = [
        ("", r"`path`: expected a path \(str or os.PathLike\). Received: path=''"),
        (str(tmp_path / "run\0.ckpt"), r"`path`: a path holds no NUL character.*Received: path='.*run\\x00.ckpt'"),
        (tmp_path, r"`path`: .* is a directory; give a file name in it, e.g. '.*model.ckpt'"),
    ]
    for path, match in cases:
        with pytest.raises(ValueError, match=match):
            kfit.save_checkpoint(path, model(), clock=kfit.Clock(samples=30, minibatches=3))
        with pytest.raises(ValueError, match=match):
            kfit.callbacks.Checkpoint(path)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_path_with_a_nul_character_is_no_checkpoint_to_every_reader(tmp_path):
    """The readers promise a CheckpointError naming the path for any path, never another exception: a NUL
    character gave Python's bare 'embedded null byte' (ValueError) from load_checkpoint and read_checkpoint_info."""
    path = str(tmp_path / "run\0.ckpt")
    match = r"No checkpoint at '.*run\\x00.ckpt': a path holds no NUL character"
    with pytest.raises(kfit.checkpoint.CheckpointNotFoundError, match=match):
        read_checkpoint_info(path)
    with pytest.raises(kfit.checkpoint.CheckpointNotFoundError, match=match):
        kfit.load_checkpoint(path, model())
