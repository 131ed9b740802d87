"""A PyDataset's items fetched ahead on worker processes or threads (``kfit.data._items_ahead``): a worker that dies,
a slow read in flight when a run stops inside an epoch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import keras
import numpy as np
from helpers import assert_same_weights

import kfit

ROOT = Path(__file__).resolve().parent.parent

# kfit.fit (seed=0 moves it into kfit's own loop) over a PyDataset whose worker processes die fetching item 5: with
# os._exit(3), then killed by SIGKILL (as by the out-of-memory killer). Prints what each fit raised, then the pools'
# and kfit's threads and the child processes left.
_DIES_IN_A_WORKER = """
import multiprocessing, os, signal, sys, threading
import keras, numpy as np
import kfit

PARENT = os.getpid()


class DiesInAWorker(keras.utils.PyDataset):
    def __init__(self, how):
        super().__init__(workers=2, use_multiprocessing=True)
        self.how = how

    def __len__(self):
        return 8

    def __getitem__(self, index):
        if index == 5 and os.getpid() != PARENT:
            if self.how == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        x = np.full((8, 4), index, "float32")
        return x, x[:, :1]


for how in ("exit", "kill"):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    try:
        kfit.fit(model, DiesInAWorker(how), epochs=2, verbose=0, seed=0)
        print("RAISED nothing", flush=True)
    except Exception as error:
        print("RAISED", " ".join(str(error).split()), flush=True)
threads = [t.name for t in threading.enumerate() if "(worker)" in t.name or "(_handle" in t.name or t.name.startswith("kfit")]
print("LEFT", threads, multiprocessing.active_children(), flush=True)
os._exit(0)  # all asked is printed; the interpreter's teardown hung once after "LEFT [] []" (a loaded CI, TensorFlow)
"""


def test_a_pydataset_worker_process_that_dies_ends_kfit_fit_with_an_error_that_says_so():
    """A worker process that died (os._exit in ``__getitem__``, or SIGKILL, the out-of-memory killer's) lost the item
    it was fetching: Pool started another process, the item never came, and kfit.fit waited for it forever, as
    model.fit does (Keras 3.15's enqueuer waits on the item without a timeout). Now the read waiting for it finds the
    dead process: kfit.fit raises an error that names the dataset and how its worker died, and says what to do; no
    pool thread or worker process is left. Run in a subprocess, which a hang would keep past its timeout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    process = subprocess.Popen([sys.executable, "-c", _DIES_IN_A_WORKER], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = process.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the script and its worker processes
        out, err = process.communicate()
        raise AssertionError(f"kfit.fit hung after a worker process died; it printed:\n{out}\n{err[-3000:]}") from None
    assert process.returncode == 0, err[-3000:]
    raised = [line for line in out.splitlines() if line.startswith("RAISED")]
    where = "A worker process fetching the items of the PyDataset DiesInAWorker (workers=2, use_multiprocessing=True)"
    assert len(raised) == 2 and all(where in line for line in raised), out
    assert "exited with code 3 while items were being fetched: the item it was fetching is lost" in raised[0]
    assert "was killed by signal SIGKILL while items were being fetched" in raised[1]
    assert "lower the dataset's `workers` or `max_queue_size`" in raised[1]
    assert out.splitlines()[-1] == "LEFT [] []"


# A pool of worker processes ended (Pool.terminate: SIGTERM) while its processes start, in a training process whose
# SIGTERM handler defers the signal (a Checkpoint's guard, which saves the run at the step's end): each process is
# held 1 s just after the fork (before Pool runs its initializer), so the SIGTERM comes while it still has the
# training process's handler. Prints the time close() took and the child processes left.
_TERMINATED_AS_IT_STARTS = """
import multiprocessing, os, time
import numpy as np
from kfit.checkpoint._signals import SignalGuard
from kfit.data._items_ahead import ItemsAhead


class Rows:
    workers, use_multiprocessing, max_queue_size = 2, True, 4

    def __getitem__(self, index):
        return np.full(4, index)


SignalGuard(on_signal=lambda signum: True).install()  # defers SIGTERM, as a Checkpoint's guard does
os.register_at_fork(after_in_child=lambda: time.sleep(1))
items = ItemsAhead(Rows())
items.expect(iter([(0, i) for i in range(4)]))
items._fill(0)  # starts the pool and asks for the first items
start = time.monotonic()
items.close()
print("CLOSED", round(time.monotonic() - start, 1), multiprocessing.active_children(), flush=True)
"""


def test_a_worker_process_ended_as_it_starts_ends_even_under_a_checkpoints_signal_handler():
    """A forked worker began with the training process's SIGTERM handler until its initializer replaced it: a
    ``Pool.terminate`` (an epoch cut short just after the pool was made) in those first milliseconds was deferred by a
    Checkpoint's handler, in a process that never saves, and terminate then waited for that worker forever (seen in CI:
    a TensorFlow test hung in ``Pool._terminate_pool``'s join). Now a worker holds SIGTERM until its own handlers are
    in place: close() returns once the workers end, and none is left."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    process = subprocess.Popen([sys.executable, "-c", _TERMINATED_AS_IT_STARTS], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the script and its worker processes
        out, err = process.communicate()
        raise AssertionError(f"closing the pool hung on a worker process; it printed:\n{out}\n{err[-3000:]}") from None
    assert process.returncode == 0, err[-3000:]
    closed = out.split()
    assert closed[0] == "CLOSED" and float(closed[1]) < 10 and closed[2:] == ["[]"], out


class _SlowItems(keras.utils.PyDataset):
    """Six batches of four; reading an item of ``slow`` takes ``seconds``. Counts the reads in progress."""

    def __init__(self, slow=(), seconds=0.0, workers=2):
        super().__init__(workers=workers)
        self.slow, self.seconds, self.reading, self.read = set(slow), seconds, 0, []
        self.lock = threading.Lock()

    def __len__(self):
        return 6

    def __getitem__(self, index):
        with self.lock:
            self.reading += 1
        if index in self.slow:
            time.sleep(self.seconds)
        with self.lock:
            self.reading -= 1
            self.read.append(index)
        x = np.full((4, 3), index, "float32")
        return x, x[:, :1]


class _StopAtSecondStep(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:
            self.model.stop_training = True


def test_a_slow_read_in_flight_when_a_run_stops_inside_an_epoch_is_over_when_fit_returns():
    """A run stopped inside an epoch (after its second step) while its reader waited for item 2, slower to read than
    the 5 s the reader's close waited: kfit.fit returned with the reader thread still running, and once its pool was
    ended it read item 2 again on its own thread, after fit had returned, beside whatever read the dataset next (a
    read in flight outlived the epoch). Now close waits for the read in flight (fit returns when item 2's read
    ends, as model.fit's enqueuer waits for its items): nothing reads after, no kfit thread is left, and the next
    epoch trains on model.fit's batches."""
    dataset = _SlowItems(slow={2, 3}, seconds=6.0)

    def model():
        keras.utils.set_random_seed(3)
        made = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        made.compile(optimizer="sgd", loss="mse")
        return made

    looped, expected = model(), model()
    kfit.fit(looped, dataset, epochs=2, seed=0, shuffle=False, verbose=0, callbacks=[_StopAtSecondStep()])
    read = list(dataset.read)
    assert dataset.reading == 0 and [t.name for t in threading.enumerate() if t.name.startswith("kfit")] == []
    time.sleep(0.5)
    assert dataset.read == read  # nothing read after fit returned
    dataset.slow = set()
    kfit.fit(looped, dataset, epochs=1, seed=0, shuffle=False, verbose=0)
    # (read without workers: with workers=2 and a stop inside the epoch, model.fit (Keras 3.15) trains to other weights
    # on JAX and PyTorch than on TensorFlow, and on JAX than with workers=1)
    reference = _SlowItems(workers=1)
    expected.fit(reference, epochs=2, shuffle=False, verbose=0, callbacks=[_StopAtSecondStep()])
    expected.fit(reference, epochs=1, shuffle=False, verbose=0)
    assert_same_weights(looped, expected)
