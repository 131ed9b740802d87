"""The main horovodrun job of tests/test_distributed.py: several scenarios in one run of two workers.

    horovodrun --gloo -np 2 -H localhost:2 python tests/horovod_scripts/scenarios.py OUT_DIR

Each worker writes ``OUT_DIR/<scenario>.rank<r>.{npz,json}``; the test checks them. Scenarios:

* ``fit``: kfit.fit data-parallel from different initial weights per worker (broadcast), uneven shares,
  a minibatch-size schedule, minibatches spanning sweeps; records what each worker read.
* ``stop``: a user's stop on rank 0 only, and a cross-validation stop decided on rank 0 only; a stop inside an epoch
  on rank 0 only, then on rank 1 only, with a Checkpoint, and the runs continued from its file.
* ``model_fit``: plain model.fit with DistributedOptimizer and Horovod's callbacks (broadcast, metric
  averaging weighted by samples, learning-rate warm-up); kfit's EarlyStopping and ReduceLROnPlateau on each
  worker's own loss.
* ``load_model``: Horovod-Keras's ``hvd.load_model`` of the file a ModelCheckpoint on rank 0 saved; every worker
  trains on from it (no broadcast); a file that one worker cannot read.
* ``resume``: kfit.fit resumed from the checkpoint of the job that killed.py killed, and the same run
  uninterrupted.
* ``preempt``: ``Checkpoint(save_on_preemption=True)``, SIGTERM reaching rank 1 alone; the run resumed from the
  checkpoint, and the same run uninterrupted.
* ``verbose``: what kfit's callbacks print with ``verbose=1`` on each worker, and kfit's warnings about the job.
* ``collectives``: Horovod-Keras's ``hvd.allreduce``, ``hvd.allgather`` and ``hvd.broadcast`` on values.
* ``example``: ``examples/horovod_mnist.py --small``.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import threading
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (sets one thread per worker before the backend loads)
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kfit  # noqa: E402
import kfit.distributed as hvd  # noqa: E402
from kfit import _backend  # noqa: E402
from kfit.data._stream import SampleStream, share  # noqa: E402

OUT = sys.argv[1]
hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()


def out(name: str) -> str:
    return os.path.join(OUT, f"{name}.rank{RANK}")


def optimizer_arrays(net: keras.Model) -> dict:
    return {f"opt{i}": np.asarray(keras.ops.convert_to_numpy(v.value)) for i, v in enumerate(net.optimizer.variables)}


# -- fit ---------------------------------------------------------------------------------------------
class RecordReads:
    """Records the positions and samples this worker's stream reads once training has begun (``rows`` gives the
    sample indices of every minibatch read: by ``read`` on a reader thread, or gathered by tf.data)."""

    def __init__(self):
        self.reads: list = []
        self.on = False
        self.lock = threading.Lock()
        original = SampleStream.rows
        recorder = self

        def rows(stream, start, size):
            indices = original(stream, start, size)
            if recorder.on:
                lo, hi = share(start, size, stream.rank, stream.num_workers)
                with recorder.lock:
                    recorder.reads.append((start, size, lo, hi, indices))
            return indices

        SampleStream.rows = rows


class StartRecording(keras.callbacks.Callback):
    def __init__(self, recorder):
        super().__init__()
        self.recorder = recorder

    def on_train_begin(self, logs=None):
        self.recorder.on = True


def scenario_fit() -> None:
    x, y = common.data(common.FIT["num_samples"])
    net = common.fit_model(init_seed=RANK)  # a different initial model on each worker
    if RANK == 1:
        net.optimizer.iterations.assign(7)  # and optimizer state (a scalar)
    initial = common.weights(net)
    recorder = RecordReads()
    history = kfit.fit(net, x, y, callbacks=[StartRecording(recorder)], **common.fit_kwargs())
    recorder.on = False
    reads = sorted(recorder.reads)
    arrays = {f"w{i}": w for i, w in enumerate(common.weights(net))}
    arrays.update({f"init{i}": w for i, w in enumerate(initial)})
    arrays.update(optimizer_arrays(net))
    arrays["read_positions"] = np.array([r[:4] for r in reads], dtype=np.int64)
    arrays["read_indices"] = np.concatenate([r[4] for r in reads]).astype(np.int64)
    info = {
        "history": history.history,
        "samples": kfit.get_clock(net).samples if kfit.get_clock(net) else None,
        "summaries": [s.samples for s in history.epoch_summaries],
    }
    try:  # padding is for one process: refused on every worker alike, before anything trains
        kfit.fit(net, x, y, pad_remainders=True, **common.fit_kwargs())
        info["pad_remainders"] = "trained"
    except ValueError as error:
        info["pad_remainders"] = str(error)
    info["metrics_history"] = common.metrics_fit(common.metrics_model())
    common.save(out("fit"), arrays, info)


# -- stop --------------------------------------------------------------------------------------------
class StopOnRankZero(keras.callbacks.Callback):
    def __init__(self, at_step: int):
        super().__init__()
        self.at_step = at_step
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if RANK == 0 and self.steps == self.at_step:
            self.model.stop_training = True


class StopAtAnEpochEndOnRankOne(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if RANK == 1 and epoch == 1:
            self.model.stop_training = True


def scenario_stop() -> None:
    x, y = common.data(60, seed=6)
    info: dict = {}
    net = common.fit_model(init_seed=0)
    stopper = StopOnRankZero(at_step=4)
    kfit.fit(net, x, y, minibatch_size=10, epochs=5, seed=1, verbose=0, callbacks=[stopper])
    info["user_stop"] = {"samples": kfit.get_clock(net).samples, "steps": stopper.steps}
    net = common.fit_model(init_seed=0)
    history = kfit.fit(net, x, y, minibatch_size=10, epochs=5, seed=1, verbose=0, callbacks=[StopAtAnEpochEndOnRankOne()])
    info["epoch_end_stop"] = {"samples": kfit.get_clock(net).samples, "epochs": history.epoch}

    try:
        cross_validation = kfit.callbacks.CrossValidation
    except (AttributeError, ImportError) as error:
        info["cv_stop"] = {"unavailable": repr(error)}
    else:
        # Every worker validates its share of the same data; only rank 0's callback decides to stop, at the third
        # evaluation.
        xv, yv = common.data(20, seed=20)
        calls = []

        def steer(index, average_error, num_samples, num_minibatches):
            calls.append(index)
            return not (RANK == 0 and index == 2)

        net = common.fit_model(init_seed=0)
        cv = cross_validation((xv, yv), frequency=20, minibatch_size=10, callback=steer)
        kfit.fit(net, x, y, minibatch_size=10, epochs=5, seed=1, verbose=0, callbacks=[cv])
        info["cv_stop"] = {"samples": kfit.get_clock(net).samples, "calls": calls}
    # A stop decided inside an epoch on one worker, with a Checkpoint: the run continued from its file
    # (resume_finished=True) has the History of a run that never stopped.
    x, y = common.data(40, seed=14)

    def checkpointed(path: str, callbacks: list, resume_finished: bool = False, frequency: str | None = None) -> dict:
        checkpoint = kfit.callbacks.Checkpoint(path, epochs=None if frequency else 1, frequency=frequency, async_write=False,
                                               resume_finished=resume_finished)
        h = kfit.fit(common.resume_model(), x, y, minibatch_size=10, epochs=3, seed=1, verbose=0,
                     callbacks=[*callbacks, checkpoint])
        return dict(common.history(h), writes=checkpoint.saves)

    info["checkpointed_stop"] = {"fresh": checkpointed(os.path.join(OUT, "stop_fresh", "model.ckpt"), [])}
    for who in (0, 1):
        path = os.path.join(OUT, f"stop_on_rank{who}", "model.ckpt")
        # On rank 1 a checkpoint every 30 samples: its frequency also falls at the stop's step, written once.
        stopped = checkpointed(path, [StopInsideAnEpochOn(who, samples=60)], frequency="30sp" if who else None)
        info["checkpointed_stop"][f"rank{who}"] = checkpointed(path, [], resume_finished=True)
        info["checkpointed_stop"][f"rank{who}"]["stopped_writes"] = stopped["writes"]
    common.save(out("stop"), {}, info)


class StopInsideAnEpochOn(keras.callbacks.Callback):
    def __init__(self, rank: int, samples: int):
        super().__init__()
        self.rank, self.samples = rank, samples

    def on_train_batch_end(self, batch, logs=None):
        if RANK == self.rank and kfit.get_clock(self.model).samples == self.samples:
            self.model.stop_training = True


# -- model_fit ---------------------------------------------------------------------------------------
class Logs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs: list = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({k: float(v) for k, v in (logs or {}).items()})


class LearningRates(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.values: list = []

    def on_train_batch_begin(self, batch, logs=None):
        variable = kfit.optimizers.hyperparameter_variable(self._model.optimizer, "learning_rate")
        self.values.append(float(_backend.read_variable(self._model, variable)))


def scenario_model_fit() -> None:
    m = common.MODEL_FIT
    x, y = common.data(SIZE * m["per_worker"], seed=1)
    mine = slice(RANK * m["per_worker"], (RANK + 1) * m["per_worker"])
    xv, yv = common.data(sum(m["val_sizes"]), seed=2)
    lo = sum(m["val_sizes"][:RANK])
    val = (xv[lo : lo + m["val_sizes"][RANK]], yv[lo : lo + m["val_sizes"][RANK]])
    net = common.model(init_seed=10 + RANK)
    initial = common.weights(net)
    # Horovod's arguments as a ported script gives them: the predivide factor splits the average's division
    # around the sum (the same average), the others are accepted and change nothing.
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=m["lr"]), device_dense="", sparse_as_dense=True,
                                         gradient_predivide_factor=4.0, average_aggregated_gradients=True)
    net.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
    local, averaged, rates = Logs(), Logs(), LearningRates()
    callbacks = [  # under Horovod-Keras's names
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        local,
        hvd.callbacks.MetricAverageCallback(),
        averaged,
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=m["lr"] * hvd.size(), warmup_epochs=m["warmup_epochs"], verbose=0),
        rates,
    ]
    net.fit(x[mine], y[mine], batch_size=m["batch_size"], epochs=m["epochs"], shuffle=False, validation_data=val,
            verbose=0, callbacks=callbacks)
    arrays = {f"w{i}": w for i, w in enumerate(common.weights(net))}
    arrays.update({f"init{i}": w for i, w in enumerate(initial)})
    # kfit's EarlyStopping on the loss of each worker's own shard (no MetricAverageCallback): rank 1's is far above the
    # baseline, rank 0's below it; then ReduceLROnPlateau likewise. Each decides on the loss averaged over the workers.
    y_far = y[mine] + (100.0 if RANK == 1 else 0.0)
    stops = {}
    for name, monitor in {"early_stopping": kfit.callbacks.EarlyStopping("loss", baseline=50.0, patience=1),
                          "plateau": kfit.callbacks.ReduceLROnPlateau("loss", patience=0, factor=0.5, min_delta=1e6,
                                                                      min_delta_mode="absolute")}.items():
        net = common.model(init_seed=10)
        net.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.001)), loss="mse")
        net.fit(x[mine], y_far, batch_size=m["batch_size"], epochs=4, shuffle=False, verbose=0, callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            kfit.callbacks.SampleClock(batch_size=m["batch_size"], num_samples=m["per_worker"]), monitor])
        lr = kfit.optimizers.hyperparameter_variable(net.optimizer, "learning_rate")
        stops[name] = {"epochs": list(net.history.epoch), "lr": float(_backend.read_variable(net, lr)),
                       "weights": [w.tolist() for w in common.weights(net)]}
    # A stop that rank 1 alone decides, with AgreedStopCallback last: at a step's end (Keras's TerminateOnNaN on a NaN
    # in rank 1's second minibatch), and at an epoch's end (Keras's EarlyStopping on rank 1 only, stopping after the
    # second epoch). Every worker stops after the same step; without it, rank 0 failed in its next gradient allreduce.
    y_nan = y[mine].copy()
    y_nan[m["batch_size"] + 1] = np.nan if RANK == 1 else y_nan[m["batch_size"] + 1]
    early = keras.callbacks.EarlyStopping("loss", mode="max", min_delta=1e6, patience=1)
    agreed = {}
    for name, (labels, stopper) in {"nan": (y_nan, keras.callbacks.TerminateOnNaN()),
                                    "early_stopping": (y[mine], early if RANK == 1 else Logs())}.items():
        net = common.model(init_seed=10)
        net.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.001)), loss="mse")
        net.fit(x[mine], labels, batch_size=m["batch_size"], epochs=3, shuffle=False, verbose=0,
                callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), stopper, hvd.AgreedStopCallback()])
        agreed[name] = {"epochs": list(net.history.epoch), "steps": int(_backend.read_variable(net, net.optimizer.iterations))}
    common.save(out("model_fit"), arrays, {"local": local.epochs, "averaged": averaged.epochs, "lr": rates.values,
                                           "monitors": stops, "agreed_stops": agreed})


# -- load_model --------------------------------------------------------------------------------------
def scenario_load_model() -> None:
    m = common.LOAD_MODEL
    x, y = common.data(SIZE * m["per_worker"], seed=m["seed"])
    path = os.path.join(OUT, "load_model.keras")
    net = common.model(init_seed=20 + RANK)
    net.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(m["lr"])), loss="mse")
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    if RANK == 0:  # a migrant's script: only rank 0 saves
        callbacks.append(keras.callbacks.ModelCheckpoint(path))
    net.fit(x[RANK::SIZE], y[RANK::SIZE], batch_size=m["batch_size"], shuffle=False, verbose=0, callbacks=callbacks)
    hvd.allreduce(0)  # rank 0 has written the file
    # Every worker loads the file and trains on its half: no broadcast, the file gives every worker the same state.
    loaded = hvd.load_model(path)
    arrays = {f"loaded_w{i}": w for i, w in enumerate(common.weights(loaded))}
    arrays.update({f"loaded_{k}": v for k, v in optimizer_arrays(loaded).items()})
    loaded.fit(x[RANK::SIZE], y[RANK::SIZE], batch_size=m["batch_size"], epochs=m["epochs"], shuffle=False, verbose=0)
    arrays.update({f"w{i}": w for i, w in enumerate(common.weights(loaded))})
    arrays.update(optimizer_arrays(loaded))
    # A file that rank 1 cannot read: every worker raises, none waits for the others.
    try:
        hvd.load_model(path if RANK == 0 else os.path.join(OUT, "missing.keras"))
        unreadable = None
    except Exception as error:  # noqa: BLE001 - recorded for the test
        unreadable = [type(error).__name__, str(error)]
    common.save(out("load_model"), arrays, {"distributed": hvd.is_distributed(loaded.optimizer),
                                            "optimizer": type(loaded.optimizer).__name__, "unreadable": unreadable})


# -- resume ------------------------------------------------------------------------------------------
def run_resume(path: str) -> tuple[keras.Model, object, dict]:
    r = common.RESUME
    x, y = common.data(r["num_samples"], seed=4)
    net = common.resume_model()
    checkpoint = kfit.callbacks.Checkpoint(path, frequency=r["frequency"], restore=True, async_write=False)
    h = kfit.fit(net, x, y, minibatch_size=r["minibatch_size"], max_samples=r["max_samples"], seed=r["seed"],
                 verbose=0, callbacks=[checkpoint])
    return net, checkpoint, common.history(h)


def scenario_resume() -> None:
    try:
        kfit.callbacks.Checkpoint  # noqa: B018
    except (AttributeError, ImportError) as error:
        common.save(out("resume"), {}, {"unavailable": repr(error)})
        return
    resumed, checkpoint, resumed_history = run_resume(os.path.join(OUT, "resume", "model.ckpt"))
    fresh, _, fresh_history = run_resume(os.path.join(OUT, "fresh", "model.ckpt"))
    arrays = {f"resumed_w{i}": w for i, w in enumerate(common.weights(resumed))}
    arrays.update({f"resumed_{k}": v for k, v in optimizer_arrays(resumed).items()})
    arrays.update({f"fresh_w{i}": w for i, w in enumerate(common.weights(fresh))})
    arrays.update({f"fresh_{k}": v for k, v in optimizer_arrays(fresh).items()})
    info = {
        "restored_samples": getattr(checkpoint.restored_from, "samples", None),
        "samples": [kfit.get_clock(resumed).samples, kfit.get_clock(fresh).samples],
        "history": {"resumed": resumed_history, "fresh": fresh_history},  # the resumed epoch's training metrics
    }
    common.save(out("resume"), arrays, info)


# -- preempt -----------------------------------------------------------------------------------------
class Preempted(Exception):
    """Raised by this scenario's SIGTERM handler, where SIGTERM's default would end the worker: the job goes on to
    resume the run (the Checkpoint passes SIGTERM on to the program's handler after saving)."""


def raise_preempted(signum, frame):
    raise Preempted()


class SigtermOnRankOne(keras.callbacks.Callback):
    def __init__(self, at: int = common.PREEMPT["at"]):
        super().__init__()
        self.at = at

    def on_train_batch_end(self, batch, logs=None):
        if RANK == 1 and kfit.get_clock(self.model).samples == self.at:
            os.kill(os.getpid(), signal.SIGTERM)  # one node of a multi-node job preempted


def run_preempt(path: str, callbacks: list) -> tuple[keras.Model, dict]:
    p = common.PREEMPT
    x, y = common.data(p["num_samples"], seed=12)
    net = common.resume_model()
    checkpoint = kfit.callbacks.Checkpoint(path, epochs=1, save_on_preemption=True, async_write=False)
    h = kfit.fit(net, x, y, minibatch_size=p["minibatch_size"], epochs=p["epochs"], seed=p["seed"], verbose=0,
                 callbacks=[*callbacks, checkpoint])
    return net, common.history(h)


class StopOnRankOne(keras.callbacks.Callback):
    def __init__(self, at: int):
        super().__init__()
        self.at = at

    def on_train_batch_end(self, batch, logs=None):
        if RANK == 1 and kfit.get_clock(self.model).samples == self.at:
            self.model.stop_training = True  # a user's callback on one worker only


def run_preempt_model_fit(path: str, callbacks: list, **checkpoint_args) -> tuple[keras.Model, kfit.callbacks.Checkpoint]:
    """Plain model.fit on each worker's half of the data, with a SampleClock and AgreedStopCallback last."""
    p = common.PREEMPT
    x, y = common.data(p["num_samples"], seed=12)
    per = p["num_samples"] // SIZE
    net = common.model(init_seed=7)
    net.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.01)), loss="mse")
    checkpoint = kfit.callbacks.Checkpoint(path, epochs=1, save_on_preemption=True, async_write=False, **checkpoint_args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # plain model.fit's resume note
        net.fit(x[RANK * per : (RANK + 1) * per], y[RANK * per : (RANK + 1) * per], batch_size=p["minibatch_size"] // SIZE,
                epochs=p["epochs"], shuffle=False, verbose=0, callbacks=[
                    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                    kfit.callbacks.SampleClock(batch_size=p["minibatch_size"] // SIZE, num_samples=per), checkpoint,
                    *callbacks, hvd.AgreedStopCallback()])  # (after the checkpoint, which has counted the step)
    return net, checkpoint


def preempted(run, path: str) -> dict:
    """Runs ``run()`` (SIGTERM reaching rank 1 in it): whether this worker ended as SIGTERM would, what it printed,
    and on rank 0 the file it wrote."""
    info: dict = {"preempted": False}
    printed = io.StringIO()
    previous = signal.signal(signal.SIGTERM, raise_preempted)
    try:
        with contextlib.redirect_stderr(printed):
            run()
    except Preempted:
        info["preempted"] = True
    finally:
        signal.signal(signal.SIGTERM, previous)
    info["stderr"] = printed.getvalue()
    if RANK == 0:  # the file rank 0 wrote, before anything else touches it
        saved = kfit.checkpoint.read_checkpoint_info(path)
        info["saved"] = {"samples": saved.samples, "status": saved.status}
    return info


def stop_model_fit(path: str) -> dict:
    def ran(net: keras.Model, checkpoint: kfit.callbacks.Checkpoint) -> dict:
        return {"from": getattr(checkpoint.restored_from, "samples", None), "samples": kfit.get_clock(net).samples,
                "epochs": list(net.history.epoch), "steps": int(_backend.read_variable(net, net.optimizer.iterations)),
                "weights": [w.tolist() for w in common.weights(net)]}

    info = {"stopped": ran(*run_preempt_model_fit(path, [StopOnRankOne(at=40)]))}
    if RANK == 0:  # the file rank 0 wrote
        saved = kfit.checkpoint.read_checkpoint_info(path)
        info["saved"] = {"samples": saved.samples, "status": saved.status, "reason": saved.status_reason}
    for name, args in {"rerun": {}, "resume_finished": {"resume_finished": True}}.items():
        printed = io.StringIO()
        with contextlib.redirect_stderr(printed):
            info[name] = ran(*run_preempt_model_fit(path, [], **args))
        info[name]["stderr"] = printed.getvalue()
    return info


def scenario_preempt() -> None:
    path = os.path.join(OUT, "preempt", "model.ckpt")
    info = preempted(lambda: run_preempt(path, [SigtermOnRankOne()]), path)
    # The same under plain model.fit (each worker's clock counts its own samples: 30 an epoch), SIGTERM on rank 1
    # after the step ending at its sample 40, in the second epoch; then the run resumed from the file.
    model_fit_path = os.path.join(OUT, "preempt_model_fit", "model.ckpt")
    info["model_fit"] = preempted(lambda: run_preempt_model_fit(model_fit_path, [SigtermOnRankOne(at=40)]), model_fit_path)
    net, checkpoint = run_preempt_model_fit(model_fit_path, [])
    info["model_fit"]["resumed"] = {"from": checkpoint.restored_from.samples, "samples": kfit.get_clock(net).samples,
                                    "epochs": list(net.history.epoch),
                                    "weights": [w.tolist() for w in common.weights(net)]}
    # A stop rank 1 alone decides (its own callback) after the step ending at its sample 40, mid-epoch: every worker
    # stops after that step and rank 0 saves it; the rerun trains nothing (a stopped run), resume_finished=True goes on.
    info["stop_model_fit"] = stop_model_fit(os.path.join(OUT, "stop_model_fit", "model.ckpt"))
    resumed, resumed_history = run_preempt(path, [])
    fresh, fresh_history = run_preempt(os.path.join(OUT, "preempt_fresh", "model.ckpt"), [])
    info["history"] = {"resumed": resumed_history, "fresh": fresh_history}  # the preempted epoch's training metrics
    arrays = {f"resumed_w{i}": w for i, w in enumerate(common.weights(resumed))}
    arrays.update({f"resumed_{k}": v for k, v in optimizer_arrays(resumed).items()})
    arrays.update({f"fresh_w{i}": w for i, w in enumerate(common.weights(fresh))})
    arrays.update({f"fresh_{k}": v for k, v in optimizer_arrays(fresh).items()})
    info["samples"] = [kfit.get_clock(resumed).samples, kfit.get_clock(fresh).samples]
    common.save(out("preempt"), arrays, info)


# -- verbose -----------------------------------------------------------------------------------------
def scenario_verbose() -> None:
    """kfit's own EarlyStopping and ReduceLROnPlateau with verbose=1; each decides at every epoch end (the loss,
    falling, never improves in mode "max")."""
    x, y = common.data(40, seed=14)
    net = common.resume_model()
    callbacks = [kfit.callbacks.ReduceLROnPlateau("loss", mode="max", patience=0, factor=0.5, verbose=1),
                 kfit.callbacks.EarlyStopping("loss", mode="max", patience=1, restore_best_weights=True, verbose=1)]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        kfit.fit(net, x, y, minibatch_size=10, epochs=5, seed=1, verbose=0, callbacks=callbacks)
    # kfit's warnings about the job: plain model.fit resumed from a kfit Checkpoint (its note), kfit.fit resumed with a
    # callback the checkpoint holds no state for; then an "error" filter for the first, which must raise on every worker.
    warned = io.StringIO()
    model_fit_path, fit_path = os.path.join(OUT, "verbose_model_fit", "model.ckpt"), os.path.join(OUT, "verbose_fit", "model.ckpt")
    with contextlib.redirect_stderr(warned), warnings.catch_warnings():
        warnings.simplefilter("always")
        for epochs in (1, 2):
            common.resume_model().fit(x, y, batch_size=10, epochs=epochs, verbose=0, callbacks=[
                kfit.callbacks.Checkpoint(model_fit_path, restore=True, async_write=False)])
        for extra in ([], [kfit.callbacks.ReduceLROnPlateau("loss")]):
            kfit.fit(common.resume_model(), x, y, minibatch_size=10, epochs=1 + len(extra), seed=1, verbose=0,
                     callbacks=[kfit.callbacks.Checkpoint(fit_path, async_write=False), kfit.callbacks.EarlyStopping("loss"),
                                *extra])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Checkpoint under plain model.fit")
        try:
            common.resume_model().fit(x, y, batch_size=10, epochs=3, verbose=0, callbacks=[
                kfit.callbacks.Checkpoint(model_fit_path, restore=True, async_write=False)])
            raised = None
        except UserWarning as error:
            raised = str(error)
    common.save(out("verbose"), {}, {"stdout": stdout.getvalue(), "stderr": stderr.getvalue(),
                                     "samples": kfit.get_clock(net).samples, "warned": warned.getvalue(),
                                     "raised": raised})


# -- collectives -------------------------------------------------------------------------------------
def scenario_collectives() -> None:
    """Horovod-Keras's hvd.allreduce / allgather / broadcast on values: a number, NumPy arrays and a backend tensor."""
    tensor = hvd.allreduce(keras.ops.convert_to_tensor(np.array([1.0, 2.0], np.float32) * (RANK + 1)))
    info = {
        "mean": hvd.allreduce(np.array([1.0, 2.0]) * (RANK + 1)).tolist(),
        "sum": hvd.allreduce(RANK + 1, op=hvd.Sum).tolist(),
        "sum_average_false": hvd.allreduce(np.float32(RANK + 1), average=False).tolist(),
        "scaled": hvd.allreduce(np.array([RANK + 1.0]), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5).tolist(),
        "tensor": [type(tensor).__name__ == type(keras.ops.ones(1)).__name__, str(keras.ops.convert_to_numpy(tensor).dtype),
                   keras.ops.convert_to_numpy(tensor).tolist()],
        "gathered": hvd.allgather(np.arange(RANK + 2) + 10 * RANK).tolist(),  # 2 rows on rank 0, 3 on rank 1
        "gathered_scalar": hvd.allgather(RANK).tolist(),
        "broadcast": hvd.broadcast(np.array([RANK + 5, 7]), root_rank=1).tolist(),
    }
    common.save(out("collectives"), {}, info)


# -- example -----------------------------------------------------------------------------------------
def scenario_example() -> None:
    """examples/horovod_mnist.py --small, in this job (its imports are done): what CI runs of the example."""
    import contextlib
    import importlib.util
    import io

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "horovod_mnist.py")
    spec = importlib.util.spec_from_file_location("horovod_mnist", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    argv, sys.argv = sys.argv, [path, "--small"]
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            example.main()
    finally:
        sys.argv = argv
    common.save(out("example"), {}, {"stdout": printed.getvalue()})


for scenario in sys.argv[2:] or ["fit", "stop", "model_fit", "load_model", "resume", "preempt", "verbose", "collectives", "example"]:
    globals()[f"scenario_{scenario}"]()
print(f"rank {RANK}: done", flush=True)
