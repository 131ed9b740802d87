"""Kill training with SIGKILL, start it again, and get the run that was never interrupted, bit for bit.

The script trains in a child process with a Checkpoint every 150 samples (mid-epoch), kills it twice
at random moments (perhaps while a checkpoint is being written), restarts it each time until it
finishes, then trains the same run uninterrupted and compares the final weights and optimizer state.

Run:  python examples/kill_and_resume.py     (any KERAS_BACKEND)
"""

import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = os.environ.get("KFIT_EXAMPLE_SMALL") == "1"


def child(folder: str) -> None:
    """The training run: restores from folder/model.h5 when a checkpoint is there."""
    import keras

    import kfit

    sys.path.insert(0, HERE)
    from _data import digits

    (x, y), _, _ = digits()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dropout(0.2), keras.layers.Dense(10)])
    model.compile(optimizer=kfit.optimizers.MomentumSGD(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    kfit.fit(model, x, y, minibatch_size=kfit.schedules.minibatch_size([16, 32, 64], epoch_size=1300),
             epochs=3 if SMALL else 6, seed=0, verbose=0,
             callbacks=[kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(0.002)),
                        kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant(256)),
                        kfit.callbacks.Checkpoint(os.path.join(folder, "model.h5"), frequency=150)])
    np.savez(os.path.join(folder, "final.npz"), *[keras.ops.convert_to_numpy(v) for v in model.variables + model.optimizer.variables])


def run(folder: str, kill_after: float | None) -> bool:
    """Runs the child; kills it after ``kill_after`` seconds. True when it finished."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1",
               TF_CPP_MIN_LOG_LEVEL="3", XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    process = subprocess.Popen([sys.executable, __file__, "--child", folder], env=env)
    if kill_after is None:
        return process.wait() == 0
    try:
        process.wait(timeout=kill_after)
        return process.returncode == 0
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        process.wait()
        print(f"killed the run after {kill_after:.1f} s")
        return False


def main() -> int:
    random.seed(1)
    with tempfile.TemporaryDirectory() as interrupted, tempfile.TemporaryDirectory() as straight:
        start = time.perf_counter()
        run(straight, None)
        duration = time.perf_counter() - start
        kills = 0
        while not run(interrupted, random.uniform(0.5, 1.0) * duration if kills < 2 else None):
            kills += 1
        a = np.load(os.path.join(interrupted, "final.npz"))
        b = np.load(os.path.join(straight, "final.npz"))
        same = all(np.array_equal(a[k], b[k]) for k in a.files)
        print(f"{kills} kills; final state {'bit-identical to' if same else 'DIFFERENT from'} the uninterrupted run")
        return 0 if same else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        sys.exit(main())
