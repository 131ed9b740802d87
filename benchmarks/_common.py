"""Shared by the benchmarks: run one script once per backend, each in its own process, pinned threads."""

from __future__ import annotations

import os
import subprocess
import sys

BACKENDS = ("tensorflow", "jax", "torch")
# One thread per worker of a ``horovodrun`` job (``scaling.py``, ``horovod_presence.py``), set in its environment.
WORKER_THREADS = {
    "OMP_NUM_THREADS": "1",
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
}
# The prefix of the line on which a ``horovodrun`` worker prints its results as JSON.
RESULT = "KFIT_BENCHMARK_RESULT "


def pinned_env(backend: str, threads: int = 1) -> dict:
    env = dict(os.environ)
    env.update(
        KERAS_BACKEND=backend,
        TF_CPP_MIN_LOG_LEVEL="3",
        OMP_NUM_THREADS=str(threads),
        TF_NUM_INTRAOP_THREADS=str(threads),
        TF_NUM_INTEROP_THREADS="1",
        XLA_FLAGS=f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} intra_op_parallelism_threads={threads}",
    )
    return env


def run_per_backend(script: str, args: list[str], backends: list[str] | None = None) -> int:
    """Runs ``script --backend B args`` for each backend; returns the worst exit status."""
    status = 0
    for backend in backends or BACKENDS:
        print(f"\n=== KERAS_BACKEND={backend} ===", flush=True)
        result = subprocess.run([sys.executable, script, "--backend", backend, *args], env=pinned_env(backend))
        status = max(status, result.returncode)
    return status


def setup_threads() -> None:
    import keras

    if keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


def small_mlp_task(samples: int) -> tuple:
    """The small MLP task of ``overhead.py`` and ``epoch_boundary.py``: ``(x, y, make_model)``, ``samples`` rows of 32
    features and 10 classes, and a function that builds the 32 -> 64 -> 64 -> 10 MLP (compiled with kfit's
    ``MomentumSGD``) from the same initial weights at every call. Prints the versions first."""
    import keras
    import numpy as np

    import kfit

    setup_threads()
    print(f"keras {keras.__version__}, backend {keras.backend.backend()}, kfit from {os.path.dirname(kfit.__file__)}",
          flush=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 32)).astype("float32")
    y = (x[:, :10].argmax(axis=1)).astype("int64")

    def make_model() -> keras.Model:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer=kfit.optimizers.MomentumSGD(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    return x, y, make_model


def middle_half(values: list[float]) -> tuple[float, float]:
    """The first and third quartiles of ``values``: the middle half of a benchmark's per-round ratios."""
    import statistics

    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return quartiles[0], quartiles[2]
