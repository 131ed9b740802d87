"""Damage a small checkpoint byte by byte; every load runs in a subprocess with a watchdog.

Every byte of the metadata (the header, HDF5's structures, the JSON) is flipped, and a few hundred random
bytes of array data, and the file is truncated at a hundred lengths. Each damaged file lies beside an intact
older checkpoint and is restored as ``Checkpoint(restore=True)`` restores: no crash, no hang, no damaged
data loaded, and the older file used every time. The full sweep (every byte, three masks) is
``benchmarks/checkpoint_damage.py``; its counts are in the README.
"""

from __future__ import annotations

import importlib.util
import os
import random
from pathlib import Path

import pytest

SWEEP = Path(__file__).parent.parent / "benchmarks" / "checkpoint_damage.py"


def _load_sweep():
    spec = importlib.util.spec_from_file_location("checkpoint_damage", SWEEP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_no_damaged_byte_crashes_hangs_or_loads(tmp_path):
    sweep = _load_sweep()
    newest, older = sweep.make_checkpoints(str(tmp_path))
    metadata, data = sweep.split_offsets(newest)
    rng = random.Random(12)
    size = os.path.getsize(newest)
    assert len(metadata) > 4000 and len(data) > 300  # the header, HDF5's structures and the JSON; the arrays
    damages = [["flip", offset, 0x10] for offset in metadata]
    damages += [["flip", offset, rng.choice([0x01, 0x80, 0xFF])] for offset in rng.sample(data, 300)]
    damages += [["truncate", length, 0] for length in sorted(rng.sample(range(size), 100))]
    result = sweep.sweep(newest, older, damages)
    counts = result["counts"]
    assert result["bad"] == [], result["bad"][:20]
    for outcome in sweep.BAD:
        assert counts[outcome] == 0, (outcome, counts)
    # Every damage is detected (the whole file's SHA-256): the intact older file was restored every time.
    assert counts["fallback"] == len(damages), counts
