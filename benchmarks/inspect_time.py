"""How long ``kfit inspect`` and ``kfit runs`` take, from the shell, on a small and a larger checkpoint.

Each command runs as a user runs it: a fresh ``python -m kfit.cli ...`` process (interpreter start-up and
imports included), ``--repeats`` times, alternating; the median and the best are reported. Beside it, the
time of ``python -c "import keras"`` on the same backend: what every command paid before ``import kfit``
became lazy. Target: ``kfit inspect`` under 1 s on a small checkpoint.

The checkpoints are written first, in a separate process: a small one (an MLP of about 10k parameters,
2 epochs) and one of about 40 MB of variables (with MomentumSGD's momentum buffers); ``inspect`` reads
and checks every array, so the second one shows the cost of the checksums.

Run:  python benchmarks/inspect_time.py [--repeats 7] [--backend tensorflow] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _common import pinned_env  # noqa: E402

WRITE = r"""
import sys, numpy as np, keras, kfit
out, hidden, layers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((32,))] + [keras.layers.Dense(hidden, activation="tanh") for _ in range(layers)]
                         + [keras.layers.Dense(10)])
model.compile(optimizer=kfit.optimizers.MomentumSGD(learning_rate=0.01), loss="mse")
x, y = np.ones((64, 32), "float32"), np.zeros((64, 10), "float32")
kfit.fit(model, x, y, minibatch_size=32, epochs=2, seed=0, verbose=0,
         callbacks=[kfit.callbacks.Checkpoint(out, preserve_all=True, async_write=False)])
"""


def timed(command: list[str], env: dict) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    if result.returncode not in (0,):
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}): {result.stderr[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--backend", default=os.environ.get("KERAS_BACKEND", "tensorflow"))
    parser.add_argument("--keep", default=None, help="write the checkpoints here and keep them")
    args = parser.parse_args()

    env = pinned_env(args.backend)
    env.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    work = args.keep or tempfile.mkdtemp(prefix="kfit-inspect-")
    os.makedirs(work, exist_ok=True)
    sizes = {"small (~10k parameters)": ("small", 64, 2), "~40 MB of variables": ("large", 1024, 6)}
    files = {}
    for label, (name, hidden, layers) in sizes.items():
        run = os.path.join(work, name)
        os.makedirs(run, exist_ok=True)
        path = os.path.join(run, "model.ckpt")
        if not os.path.exists(path):
            subprocess.run([sys.executable, "-c", WRITE, path, str(hidden), str(layers)], env=env, check=True, cwd=ROOT)
        files[label] = (path, os.path.getsize(path))

    commands = {"import keras (for comparison)": [sys.executable, "-c", "import keras"]}
    for label, (path, _) in files.items():
        commands[f"kfit inspect --json, {label}"] = [sys.executable, "-m", "kfit.cli", "inspect", path, "--json"]
        commands[f"kfit runs, {label}"] = [sys.executable, "-m", "kfit.cli", "runs", os.path.dirname(path)]
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.repeats):  # alternating, so that load on the machine hits every command alike
        for name, command in commands.items():
            times[name].append(timed(command, env))

    print(f"backend {args.backend}, {args.repeats} runs each, a fresh process per run")
    for label, (path, size) in files.items():
        print(f"  {label}: {path} ({size / 1e6:.2f} MB)")
    width = max(len(name) for name in times)
    print(f"{'command':<{width}}  median    best")
    for name, values in times.items():
        print(f"{name:<{width}}  {statistics.median(values):6.3f}s {min(values):6.3f}s")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
