"""Shared by the benchmarks: run one script once per backend, each in its own process, pinned threads."""

from __future__ import annotations

import os
import subprocess
import sys

BACKENDS = ("tensorflow", "jax", "torch")


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
