"""What the presence float costs: the gradient allreduce of kfit's Horovod step, with and without it, side by side.

    python benchmarks/horovod_presence.py                    # TensorFlow, JAX, PyTorch: about 30 s each
    python benchmarks/horovod_presence.py --backends torch --repeats 4000

Under plain ``model.fit`` over Horovod, each worker's gradient allreduce carries one more float, 1 (its presence), so
that a step some worker left (a stop it decided alone) fails instead of hanging (``kfit/distributed/_horovod.py``).
For each backend this runs one job, ``horovodrun --gloo -np 2 -H localhost:2 python benchmarks/horovod_presence.py
--worker`` (one thread per worker), which times, for the gradients of two models (all ones, float32):

* ``small``: the MLP of ``overhead.py`` (32 -> 64 -> 64 -> 10: 6 tensors, 6,922 floats, 27 KB);
* ``large``: the MLP of ``scaling.py --model mlp`` (784 -> 1024 -> 1024 -> 10: 6 tensors, 1.9 M floats, 7.1 MB),

two sides, through the route of the train step (TensorFlow: the Horovod op in a ``tf.function``; JAX: ``io_callback``
from a jitted function into ``horovod.torch``; PyTorch: ``horovod.torch`` on the tensors), both one grouped allreduce
(``op=Sum``, as under ``kfit.fit``), which Horovod fuses into one buffer:

* ``kfit``: kfit's own route, ``engine.step_sum`` (the gradients and the presence float, and the check of its sum);
* ``bare``: the same grouped allreduce of the gradients alone (the route written out here, without the float and
  its check).

The two sides alternate call by call (``kfit, bare, bare, kfit, ...``), so drift of the machine hits both alike.
Printed per model: the median milliseconds per call of each side over ``--repeats`` calls on rank 0, their ratio
``kfit / bare`` (1.00 = as fast), the median of the per-pair ratios (each ``kfit`` call against the ``bare`` call next to
it) and the middle half of those.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BACKENDS, RESULT, WORKER_THREADS, middle_half  # noqa: E402

MODELS = {"small": (32, 64, 64, 10), "large": (784, 1024, 1024, 10)}  # Dense widths: kernels and biases


# -- the worker ------------------------------------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    for key, value in WORKER_THREADS.items():
        os.environ.setdefault(key, value)
    import keras
    import numpy as np

    if keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(1)
    import kfit.distributed as hvd
    from kfit.distributed import _select

    hvd.init()
    engine = _select.current()
    if engine.name != "horovod" or hvd.size() != 2:
        raise SystemExit(f"run under horovodrun -np 2 (engine {engine.name!r}, {hvd.size()} workers)")
    results = {}
    for model, widths in MODELS.items():
        shapes = [s for a, b in zip(widths, widths[1:]) for s in ((a, b), (b,))]
        host = [np.ones(s, np.float32) for s in shapes]
        kfit_side, bare_side = routes(engine, host, model)
        repeats = args.repeats if model == "small" else max(args.repeats // 4, 20)
        for side in (kfit_side, bare_side, kfit_side, bare_side):  # compile, warm up
            side()
        times: dict[str, list[float]] = {"kfit": [], "bare": []}
        for r in range(repeats):
            for name in (("kfit", "bare") if r % 2 == 0 else ("bare", "kfit")):
                function = kfit_side if name == "kfit" else bare_side
                start = time.perf_counter()
                function()
                times[name].append(1000 * (time.perf_counter() - start))
        results[model] = {"times": times, "floats": int(sum(a.size for a in host)), "megabytes": sum(a.nbytes for a in host) / 2**20}
    if hvd.rank() == 0:
        print(RESULT + json.dumps(results), flush=True)


def routes(engine, host: list, model: str) -> tuple:
    """``(kfit, bare)``: functions that each run one grouped allreduce of ``host``'s arrays (as backend tensors)
    through the train step's route, with (kfit's ``step_sum``) and without the presence float."""
    import keras
    import numpy as np

    from kfit.distributed import _horovod

    hvd = _horovod.plugin()
    backend = keras.backend.backend()
    kfit_name, bare_name = f"bench.{model}.kfit", f"bench.{model}.bare"
    if backend == "tensorflow":
        import tensorflow as tf

        tensors = [tf.constant(a) for a in host]
        kfit_step = tf.function(lambda ts: engine.step_sum(list(ts), kfit_name))
        bare_step = tf.function(lambda ts: hvd.grouped_allreduce(list(ts), op=hvd.Sum, name=_horovod._tf_name(bare_name),
                                                                 ignore_name_scope=True))
        return (lambda: kfit_step(tensors)[-1].numpy()), (lambda: bare_step(tensors)[-1].numpy())
    if backend == "jax":
        import jax
        import torch
        from jax.experimental import io_callback

        arrays = [jax.numpy.asarray(a) for a in host]
        shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]

        def bare_on_host(*values):  # _horovod._jax_step_sum's callback without the presence float
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                tensors = [torch.from_numpy(_horovod._contiguous(np.asarray(v))) for v in values]
            out = _horovod._torch_wait(hvd.grouped_allreduce_async(tensors, op=hvd.Sum, name=bare_name))
            return [o.numpy() for o in out]

        kfit_step = jax.jit(lambda ts: engine.step_sum(list(ts), kfit_name))
        bare_step = jax.jit(lambda ts: list(io_callback(bare_on_host, shapes, *ts, ordered=True)))
        return (lambda: jax.block_until_ready(kfit_step(arrays))), (lambda: jax.block_until_ready(bare_step(arrays)))
    import torch

    tensors = [torch.from_numpy(a) for a in host]
    return ((lambda: engine.step_sum(tensors, kfit_name)),
            (lambda: _horovod._torch_wait(hvd.grouped_allreduce_async([t.contiguous() for t in tensors], op=hvd.Sum,
                                                                      name=bare_name))))


# -- the driver ------------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help="run one worker (internal)")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--repeats", type=int, default=1000, help="calls per side for the small model (a quarter for the large)")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    horovodrun = shutil.which("horovodrun") or os.path.join(os.path.dirname(sys.executable), "horovodrun")
    command = [horovodrun, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, os.path.abspath(__file__),
               "--worker", "--repeats", str(args.repeats)]
    print("Command (with KERAS_BACKEND=<backend> and " + " ".join(f"{k}={v!r}" if " " in v else f"{k}={v}"
                                                                  for k, v in WORKER_THREADS.items()) + "):")
    print("  " + " ".join(command))
    print(f"\n{'backend':>10} {'model':>6} {'MB':>5} {'calls':>6} {'kfit ms':>8} {'bare ms':>8} {'kfit/bare':>10} "
          f"{'pairs':>6} {'middle half':>12}")
    status = 0
    for backend in args.backends.split(","):
        done = subprocess.run(command, env=dict(os.environ, KERAS_BACKEND=backend, **WORKER_THREADS), capture_output=True,
                              text=True)
        lines = [line for line in done.stdout.splitlines() if RESULT in line]
        if done.returncode or not lines:
            print(f"{backend}: the job failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}", flush=True)
            status = 1
            continue
        for model, result in json.loads(lines[-1].split(RESULT, 1)[1]).items():
            kfit, bare = result["times"]["kfit"], result["times"]["bare"]
            pairs = [a / b for a, b in zip(kfit, bare)]
            low, high = middle_half(pairs)
            print(f"{backend:>10} {model:>6} {result['megabytes']:>5.2f} {len(kfit):>6} {statistics.median(kfit):>8.3f} "
                  f"{statistics.median(bare):>8.3f} {statistics.median(kfit) / statistics.median(bare):>10.3f} "
                  f"{statistics.median(pairs):>6.3f} {f'{low:.3f}-{high:.3f}':>12}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
