"""Data for the examples: the handwritten digits that ship with scikit-learn (no download)."""

from __future__ import annotations

import os

import numpy as np
from sklearn.datasets import load_digits

SMALL = os.environ.get("KFIT_EXAMPLE_SMALL") == "1"


def digits(flat: bool = True) -> tuple:
    """``(x_train, y_train), (x_val, y_val), (x_test, y_test)``, shuffled once with a fixed seed."""
    data = load_digits()
    x = (data.images / 16.0).astype("float32")
    x = x.reshape(len(x), -1) if flat else x[..., None]
    y = data.target.astype("int64")
    idx = np.random.default_rng(0).permutation(len(x))
    x, y = x[idx], y[idx]
    return (x[:1300], y[:1300]), (x[1300:1550], y[1300:1550]), (x[1550:], y[1550:])
