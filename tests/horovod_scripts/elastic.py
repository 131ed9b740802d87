"""An elastic horovodrun job that loses a worker, goes on with one, then gets a new one (test_distributed.py).

    horovodrun --gloo -np 2 --min-np 1 --max-np 2 --blacklist-cooldown-range 1 2 \\
        --host-discovery-script OUT_DIR/discover.sh python tests/horovod_scripts/elastic.py OUT_DIR

The discovery script lists two names of this machine, ``localhost:1`` and ``127.0.0.1:1`` (Horovod
blacklists the host of a failed worker for a while, so the two workers need two host names). The worker on
``127.0.0.1`` SIGKILLs itself after 100 samples; the state was committed every 40 samples, so the other
worker resumes alone from sample 80. It trains slowly (0.2 s a step) until the blacklist's cooldown ends and
Horovod starts a new worker on ``127.0.0.1``, which joins at the next commit; the two finish together.
Each worker that finishes writes ``OUT_DIR/elastic.<pid>.{npz,json}``.
"""

from __future__ import annotations

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (sets one thread per worker before the backend loads)
import keras  # noqa: E402

import kfit  # noqa: E402
import kfit.distributed as hvd  # noqa: E402

OUT = sys.argv[1]
ELASTIC = dict(num_samples=120, minibatch_size=10, max_samples=1200, commit=40, kill_at=100, seed=5)
hvd.init()


class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.runs: list = []

    def on_train_begin(self, logs=None):
        self.runs.append({"size": hvd.size(), "first_step_end": None})

    def on_train_batch_end(self, batch, logs=None):
        clock = kfit.get_clock(self._model)
        if self.runs[-1]["first_step_end"] is None:
            self.runs[-1]["first_step_end"] = clock.samples
        marker = os.path.join(OUT, "killed")
        if os.environ.get("HOROVOD_HOSTNAME") == "127.0.0.1" and clock.samples >= ELASTIC["kill_at"] and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if hvd.size() == 1:
            time.sleep(0.2)  # alone: wait for the new worker


x, y = common.data(ELASTIC["num_samples"], seed=4)
net = common.resume_model()
state = hvd.ElasticState(net, commit_frequency=ELASTIC["commit"])
record = Record()


@hvd.elastic.run
def train(state):
    kfit.fit(net, x, y, minibatch_size=ELASTIC["minibatch_size"], max_samples=ELASTIC["max_samples"],
             seed=ELASTIC["seed"], verbose=0, callbacks=[state, record])


train(state)
common.save(os.path.join(OUT, f"elastic.{os.getpid()}"), {f"w{i}": w for i, w in enumerate(common.weights(net))},
            {"runs": record.runs, "samples": kfit.get_clock(net).samples, "resets": state.resets})
