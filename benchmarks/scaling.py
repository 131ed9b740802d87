"""Scaling of kfit.fit from one worker to two (one thread each), per backend and engine.

    python benchmarks/scaling.py                      # every backend and engine, about 3-5 minutes
    python benchmarks/scaling.py --backends jax --engines native --steps 40 --model mlp --batch 256

For each backend it runs, one after the other:

* one worker:  ``python benchmarks/scaling.py --worker`` (no launcher: kfit.fit as one worker);
* the same, twice at once: two independent single workers (what the machine itself gives two processes of one
  thread: the ceiling of any data-parallel speed-up here);
* two workers, for each engine the backend has: Horovod,
  ``horovodrun --gloo -np 2 -H localhost:2 python benchmarks/scaling.py --worker``, and the native engine
  (PyTorch and JAX), ``python -m torch.distributed.run --standalone --nproc_per_node 2 benchmarks/scaling.py --worker``

on the same model and the same minibatch per worker (weak scaling: the global minibatch doubles), and
prints the training throughput (samples per second over the timed steps, after warm-up steps that compile
the step), the scaling efficiency ``throughput(2) / (2 * throughput(1))`` and the share of the machine's own
two-process throughput that the engine reaches, and, measured in the two-worker
job, the cost of one fused allreduce of the model's gradients: through the route the train step uses
(TensorFlow: the Horovod op in a ``tf.function``; PyTorch: the engine's collective on the tensors; JAX: the
native engine's psum in a compiled ``shard_map`` program, or ``io_callback`` from a jitted function into the
engine for Horovod and ``native-host``, i.e. ``KFIT_JAX_COLLECTIVES=host``), the same allreduce called directly on host arrays, and
the per-step stop-flag allreduce. Every process gets one thread (OMP, TensorFlow, XLA, torch).

The default model is a small CNN on 32x32x3 inputs (80 K parameters, 0.3 MB of gradients, about 0.1 GFLOP
per sample): its step is compute-bound on one core. ``--model mlp`` (784-1024-1024-10, 1.9 M parameters,
7 MB of gradients) shows a step where communication weighs more.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BACKENDS, RESULT, WORKER_THREADS  # noqa: E402


# -- the worker ------------------------------------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    for key, value in WORKER_THREADS.items():
        os.environ.setdefault(key, value)
    import keras
    import numpy as np

    if keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(1)
    import kfit
    import kfit.distributed as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    batch = args.batch * size  # global minibatch: args.batch samples per worker
    steps = args.warmup + args.steps
    rng = np.random.default_rng(0)  # the same data on every worker: kfit.fit reads each worker's share
    keras.utils.set_random_seed(0)
    model = build_model(args.model)
    x = rng.normal(size=(batch * 4, *model.input_shape[1:])).astype("float32")
    y = rng.integers(0, 10, size=(batch * 4,)).astype("int64")
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.marks: list = []

        def on_train_batch_end(self, step, logs=None):
            if step + 1 in (args.warmup, steps):
                keras.ops.convert_to_numpy(logs["loss"])  # wait for the step (JAX dispatches asynchronously)
                self.marks.append(time.perf_counter())

    timer = Timer()
    kfit.fit(model, x, y, minibatch_size=batch, max_samples=batch * steps, epoch_size=batch * steps, verbose=0,
             callbacks=[timer])
    throughput = batch * args.steps / (timer.marks[1] - timer.marks[0])
    result = {"rank": rank, "size": size, "throughput": throughput,
              "step_ms": 1000 * (timer.marks[1] - timer.marks[0]) / args.steps,
              "parameters": int(sum(int(np.prod(w.shape)) for w in model.trainable_weights))}
    if size > 1:
        result.update(allreduce_costs(model, args.repeats), engine=hvd.engine())
    if rank == 0:
        print(RESULT + json.dumps(result), flush=True)


def build_model(name: str):
    """``cnn``: compute-bound (80 K parameters, about 0.1 GFLOP per sample); ``mlp``: 1.9 M parameters."""
    import keras

    if name == "cnn":
        return keras.Sequential([
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ])
    return keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(1024, activation="relu"),
        keras.layers.Dense(1024, activation="relu"),
        keras.layers.Dense(10),
    ])


def allreduce_costs(model, repeats: int) -> dict:
    """Milliseconds per fused allreduce of the model's gradients: in-step route, on host, and the stop flag."""
    import keras
    import numpy as np

    from kfit.distributed import _select, _state

    engine = _select.current()

    shapes = [tuple(w.shape) for w in model.trainable_weights]
    host = [np.ones(s, np.float32) for s in shapes]
    backend = keras.backend.backend()

    def timed(function) -> float:
        function()
        function()
        start = time.perf_counter()
        for _ in range(repeats):
            function()
        return 1000 * (time.perf_counter() - start) / repeats

    if backend == "tensorflow":
        import tensorflow as tf

        tensors = [tf.constant(a) for a in host]
        step = tf.function(lambda ts: engine.step_sum(list(ts), "bench.route"))
        route = timed(lambda: [t.numpy() for t in step(tensors)])
    elif backend == "jax":
        import jax

        arrays = [jax.numpy.asarray(a) for a in host]
        if hasattr(engine, "step_sum_function"):  # the native engine: in the step (psum) or io_callback
            step = engine.step_sum_function()
        else:  # Horovod: io_callback
            step = jax.jit(lambda ts: engine.step_sum(list(ts), "bench.route"))
        route = timed(lambda: jax.block_until_ready(step(arrays)))
    else:
        import torch

        tensors = [torch.from_numpy(a) for a in host]
        route = timed(lambda: engine.step_sum(tensors, "bench.route"))
    return {
        "allreduce_route_ms": route,
        "allreduce_host_ms": timed(lambda: engine.host_sum(host, "bench.host")),
        "stop_flag_ms": timed(lambda: _state.any_true(False)),
        "gradient_mb": sum(a.nbytes for a in host) / 2**20,
    }


# -- the driver ------------------------------------------------------------------------------------------
def run(command: list, backend: str, copies: int = 1, extra_env: dict | None = None) -> list[dict]:
    """Runs ``copies`` instances of ``command`` at once; returns their results."""
    env = dict(os.environ, KERAS_BACKEND=backend, **WORKER_THREADS, **(extra_env or {}))
    processes = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for _ in range(copies)]
    results = []
    for process in processes:
        output = process.communicate()[0]
        lines = [line for line in output.splitlines() if RESULT in line]
        if not lines:
            raise RuntimeError(f"`{' '.join(command)}` printed no result (exit {process.returncode}):\n{output[-3000:]}")
        results.append(json.loads(lines[-1].split(RESULT, 1)[1]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help="run one worker (internal)")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--engines", default="horovod,native,native-host",
                        help="engines to run two workers on (native-host: JAX's native engine with "
                             "KFIT_JAX_COLLECTIVES=host, the gradients through io_callback, for comparison)")
    parser.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    parser.add_argument("--batch", type=int, default=64, help="samples per worker per step")
    parser.add_argument("--steps", type=int, default=15, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation)")
    parser.add_argument("--repeats", type=int, default=30, help="allreduce calls timed")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    horovodrun = shutil.which("horovodrun") or os.path.join(os.path.dirname(sys.executable), "horovodrun")
    me = [sys.executable, os.path.abspath(__file__), "--worker", "--model", args.model, "--batch", str(args.batch), "--steps", str(args.steps),
          "--warmup", str(args.warmup), "--repeats", str(args.repeats)]
    launchers = {
        "horovod": [horovodrun, "--gloo", "-np", "2", "-H", "localhost:2"] + me,
        "native": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"] + me[1:],
    }
    launchers["native-host"] = launchers["native"]
    engine_env = {"native-host": {"KFIT_JAX_COLLECTIVES": "host"}}
    engines = [e for e in args.engines.split(",") if e in launchers]
    env_text = " ".join(f"{k}={v!r}" if " " in v else f"{k}={v}" for k, v in WORKER_THREADS.items())
    print("Commands (each with KERAS_BACKEND=<backend> and", env_text + "):")
    print("  one worker:  " + " ".join(me))
    for engine in engines:
        prefix = " ".join(f"{k}={v}" for k, v in engine_env.get(engine, {}).items())
        print(f"  two workers ({engine}): " + (prefix + " " if prefix else "") + " ".join(launchers[engine]))
    rows = []
    started = time.perf_counter()
    for backend in args.backends.split(","):
        (one,) = run(me, backend)
        independent = sum(r["throughput"] for r in run(me, backend, copies=2))
        for engine in engines:
            if engine.startswith("native") and backend == "tensorflow":
                continue  # Horovod is TensorFlow's engine
            if engine == "native-host" and backend != "jax":
                continue  # only JAX's native engine has two routes
            (pair,) = run(launchers[engine], backend, extra_env=engine_env.get(engine))
            efficiency = pair["throughput"] / (2 * one["throughput"])
            rows.append((backend, engine, one, pair, efficiency))
            print(
                f"{backend:>10} {engine:>7}: 1 worker {one['throughput']:7.0f} samples/s ({one['step_ms']:.1f} ms/step) | "
                f"2 workers {pair['throughput']:7.0f} samples/s ({pair['step_ms']:.1f} ms/step): "
                f"speed-up {pair['throughput'] / one['throughput']:.2f}x, efficiency {100 * efficiency:.1f}% | "
                f"2 independent single workers at once: {independent:7.0f} samples/s together (the machine's own "
                f"scaling {100 * independent / (2 * one['throughput']):.1f}%; the engine reaches "
                f"{100 * pair['throughput'] / independent:.1f}% of it) | "
                f"allreduce of {pair['gradient_mb']:.2f} MB of gradients: {pair['allreduce_route_ms']:.2f} ms in-step "
                f"route, {pair['allreduce_host_ms']:.2f} ms on host; stop flag {pair['stop_flag_ms']:.2f} ms",
                flush=True,
            )
    print(f"model: {args.model} ({rows[0][2]['parameters']:,} parameters), {args.batch} samples per worker per "
          f"step, {args.steps} timed steps after {args.warmup}; total {time.perf_counter() - started:.0f} s")
    for backend, engine, _, pair, _ in rows:
        if backend == "jax":
            route = "psum in the compiled step" if engine == "native" else "io_callback"
            print(f"JAX route ({engine}: {route}) minus the same allreduce on host arrays: "
                  f"{pair['allreduce_route_ms'] - pair['allreduce_host_ms']:+.2f} ms per step")


if __name__ == "__main__":
    main()
