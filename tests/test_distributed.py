"""kfit.distributed: Horovod data-parallel training on the current backend, and its single-worker fallbacks.

The ``horovod`` tests launch two jobs with ``horovodrun --gloo -np 2 -H localhost:2`` (the backend of this
pytest run, one thread per worker): ``killed.py``, whose rank 1 is SIGKILLed after a checkpoint, then
``scenarios.py``, which runs every other scenario in one job and resumes the killed run. The tests check
what the workers wrote against single-process references computed here from the same data and weights.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
from conftest import BACKEND

import kfit
import kfit.distributed as hvd

SCRIPTS = Path(__file__).parent / "horovod_scripts"
sys.path.insert(0, str(SCRIPTS))

import common  # noqa: E402

INSTALL = "Horovod is not installed: run `bash scripts/install_horovod.sh` (CI installs it before the tests)."
JOB_TIMEOUT = 300
KILL_BOUND_SECONDS = 20.0


# -- running the jobs ----------------------------------------------------------------------------------
def _horovodrun() -> str:
    # Looked up without importing Horovod into this process (a test checks that kfit does not import it).
    spec = importlib.util.find_spec("horovod")
    plugin = "tensorflow" if BACKEND == "tensorflow" else "torch"
    if spec is None or not any(Path(p, plugin).glob("mpi_lib*.so") for p in spec.submodule_search_locations or []):
        pytest.fail(f"{INSTALL} (missing horovod.{plugin} with its compiled library)", pytrace=False)
    for candidate in (Path(sys.executable).parent / "horovodrun", shutil.which("horovodrun")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    pytest.fail(f"{INSTALL} (no horovodrun next to {sys.executable} nor on PATH)", pytrace=False)


def _run(script: str, out: Path, hosts: list | None = None) -> tuple[int, str, float]:
    env = dict(os.environ, KERAS_BACKEND=BACKEND, PYTHONUNBUFFERED="1")
    hosts = hosts or ["-np", "2", "-H", "localhost:2"]
    command = [_horovodrun(), "--gloo", *hosts, sys.executable, str(SCRIPTS / script), str(out)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"`{' '.join(command)}` did not end within {JOB_TIMEOUT} s:\n{error.stdout}\n{error.stderr}")
    return done.returncode, done.stdout + done.stderr, time.time()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp(f"horovod_{BACKEND}")
    killed_rc, killed_output, killed_end = _run("killed.py", out)
    rc, output, _ = _run("scenarios.py", out)
    if rc != 0:
        pytest.fail(f"scenarios.py failed under horovodrun (exit {rc}):\n{output[-6000:]}")
    return {"out": out, "killed": (killed_rc, killed_output, killed_end)}


def _results(jobs: dict, scenario: str) -> list[tuple[dict, dict]]:
    return [common.load(str(jobs["out"] / f"{scenario}.rank{r}")) for r in (0, 1)]


def _listed(arrays: dict, prefix: str) -> list[np.ndarray]:
    return [arrays[f"{prefix}{i}"] for i in range(sum(1 for k in arrays if k[len(prefix):].isdigit() and k.startswith(prefix)))]


# -- data-parallel kfit.fit ------------------------------------------------------------------------------
@pytest.mark.horovod
def test_workers_end_identical_and_equal_to_one_process_on_the_same_global_minibatches(jobs):
    (a0, i0), (a1, i1) = _results(jobs, "fit")
    # Different initial models on the two workers: training starts from rank 0's (broadcast).
    assert any(not np.array_equal(w0, w1) for w0, w1 in zip(_listed(a0, "init"), _listed(a1, "init")))
    for key in a0:
        if key.startswith(("w", "opt")):
            np.testing.assert_array_equal(a0[key], a1[key], err_msg=key)
    x, y = common.data(common.FIT["num_samples"])
    reference = common.fit_model(init_seed=0)
    history = kfit.fit(reference, x, y, **common.fit_kwargs())
    for i, w in enumerate(common.weights(reference)):
        np.testing.assert_allclose(a0[f"w{i}"], w, atol=1e-5, rtol=0)
    for i, v in enumerate(reference.optimizer.variables):
        np.testing.assert_allclose(a0[f"opt{i}"], keras.ops.convert_to_numpy(v.value), atol=1e-5, rtol=0)
    assert i0["samples"] == i1["samples"] == common.FIT["max_samples"]
    # Epoch metrics averaged over the workers, weighted by their samples: the single process's values.
    for key in ("loss", "mae"):
        assert i0["history"][key] == i1["history"][key]
        np.testing.assert_allclose(i0["history"][key], history.history[key], rtol=1e-5, atol=1e-6)
    assert i0["summaries"] == [s.samples for s in history.epoch_summaries]


@pytest.mark.horovod
def test_the_epochs_training_metrics_are_one_processs_where_their_states_add_up(jobs):
    """AUC and an accuracy weighted by sample weights: no mean of the workers' results, but their states summed
    over the workers give the single process's epoch logs (with and without a validation that resets them)."""
    (_, i0), (_, i1) = _results(jobs, "fit")
    reference = common.metrics_fit(common.metrics_model())
    assert i0["metrics_history"] == i1["metrics_history"]
    assert sorted(i0["metrics_history"]) == sorted(reference)
    for key, values in reference.items():
        np.testing.assert_allclose(i0["metrics_history"][key], values, rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.horovod
def test_pad_remainders_is_refused_under_data_parallel_training(jobs):
    (_, i0), (_, i1) = _results(jobs, "fit")
    assert i0["pad_remainders"] == i1["pad_remainders"] == (
        "Argument `pad_remainders` is for one-process training: under data-parallel training each worker trains its "
        "share of the global minibatch. Received: pad_remainders=True")


@pytest.mark.horovod
def test_the_workers_shares_cover_every_sweep_exactly_once(jobs):
    (a0, _), (a1, _) = _results(jobs, "fit")
    positions = np.concatenate([a0["read_positions"], a1["read_positions"]])
    indices = np.concatenate([a0["read_indices"], a1["read_indices"]])
    covered = np.concatenate([np.arange(lo, hi) for _, _, lo, hi in positions])
    order = np.argsort(covered, kind="stable")
    covered, indices = covered[order], indices[order]
    total, n = common.FIT["max_samples"], common.FIT["num_samples"]
    np.testing.assert_array_equal(covered, np.arange(total))  # no position read twice, none skipped
    for sweep in range(total // n):
        assert sorted(indices[sweep * n : (sweep + 1) * n].tolist()) == list(range(n))
    # Each global minibatch was split between the two workers, with shares differing by at most one.
    starts = {}
    for start, size, lo, hi in positions:
        starts.setdefault((start, size), []).append(hi - lo)
    assert all(len(shares) == 2 and sum(shares) == size and max(shares) - min(shares) <= 1 for (_, size), shares in starts.items())
    assert {size for _, size in starts} >= {15, 22, 2}


@pytest.mark.horovod
def test_a_stop_on_rank_zero_ends_both_workers_after_the_same_step(jobs):
    (_, i0), (_, i1) = _results(jobs, "stop")
    assert i0["user_stop"]["samples"] == i1["user_stop"]["samples"] == 40
    assert i0["user_stop"]["steps"] == i1["user_stop"]["steps"] == 4
    # A stop decided on rank 1 only, as its second epoch (of 60 samples) ends: both end there.
    assert i0["epoch_end_stop"] == i1["epoch_end_stop"] == {"samples": 120, "epochs": [0, 1]}


@pytest.mark.horovod
def test_a_cross_validation_stop_decided_on_rank_zero_ends_both_workers(jobs):
    (_, i0), (_, i1) = _results(jobs, "stop")
    if "unavailable" in i0["cv_stop"]:
        pytest.fail(f"kfit.callbacks.CrossValidation is not available: {i0['cv_stop']['unavailable']}")
    # Evaluations every 20 samples; rank 0's callback stops at the third (after 60 samples); rank 1's never.
    assert i0["cv_stop"]["samples"] == i1["cv_stop"]["samples"] == 60
    assert i0["cv_stop"]["calls"] == i1["cv_stop"]["calls"] == [0, 1, 2]


@pytest.mark.horovod
def test_a_run_continued_from_a_stop_inside_an_epoch_on_one_worker_has_the_uninterrupted_history(jobs):
    # Three epochs of 40 samples; a stop at sample 60 (epoch 2) decided on rank 0 only, then on rank 1 only; the run
    # continued from the Checkpoint. A stop on rank 1 was saved as the end of an epoch (the History held epoch 2
    # twice), one on rank 0 with rank 0's training metrics only (epoch 2's loss left out rank 1's first 10 samples).
    # With the stop on rank 1 the Checkpoint saves every 30 samples, which falls at the stop's step too (written twice
    # there): its writes are at 30, 60 and at epoch 2's end (the stopped step with the partial epoch's History).
    for rank, (_, info) in enumerate(_results(jobs, "stop")):
        runs = info["checkpointed_stop"]
        if rank == 0:
            assert runs["rank1"]["stopped_writes"] == 3
        for who in ("rank0", "rank1"):
            assert {k for k in runs[who] if "writes" not in k} == {k for k in runs["fresh"] if k != "writes"} == {"loss", "mae"}
            for key in ("loss", "mae"):
                assert len(runs[who][key]) == 3, (who, runs[who])
                np.testing.assert_allclose(runs[who][key], runs["fresh"][key], rtol=1e-6, atol=0, err_msg=f"{who} {key}")


# -- plain model.fit with Horovod's API ------------------------------------------------------------------
@pytest.mark.horovod
def test_model_fit_with_distributed_optimizer_broadcast_and_warmup_equals_one_process(jobs):
    (a0, i0), (a1, i1) = _results(jobs, "model_fit")
    m = common.MODEL_FIT
    assert any(not np.array_equal(w0, w1) for w0, w1 in zip(_listed(a0, "init"), _listed(a1, "init")))
    for i in range(len(_listed(a0, "w"))):
        np.testing.assert_array_equal(a0[f"w{i}"], a1[f"w{i}"])
    # The learning rate of every step: Horovod's warm-up from lr to lr * size over warmup_epochs.
    steps = m["per_worker"] // m["batch_size"]
    expected, lr = [], m["lr"]
    for epoch in range(m["epochs"]):
        for batch in range(steps):
            scheduled = common.warmup_lr(epoch, batch, 2)
            lr = lr if scheduled is None else scheduled
            expected.append(lr)
    np.testing.assert_allclose(i0["lr"], expected, rtol=1e-6)
    assert i0["lr"] == i1["lr"]
    # One process on the global minibatches (the two workers' minibatches side by side) at those rates.
    x, y = common.data(2 * m["per_worker"], seed=1)
    reference = common.model(init_seed=10)
    reference.compile(optimizer=keras.optimizers.SGD(learning_rate=m["lr"]), loss="mse")
    step = 0
    for _ in range(m["epochs"]):
        for batch in range(steps):
            rows = np.concatenate([np.arange(r * m["per_worker"], (r + 1) * m["per_worker"])[batch * m["batch_size"]:(batch + 1) * m["batch_size"]] for r in (0, 1)])
            reference.optimizer.learning_rate.assign(expected[step])
            reference.train_on_batch(x[rows], y[rows])
            step += 1
    for i, w in enumerate(common.weights(reference)):
        np.testing.assert_allclose(a0[f"w{i}"], w, atol=1e-5, rtol=0)


@pytest.mark.horovod
def test_kfits_early_stopping_and_plateau_under_model_fit_decide_the_same_on_every_worker(jobs):
    # Each worker's loss is its own under plain model.fit: rank 1's is far above EarlyStopping's baseline. Without
    # the average, rank 1 stopped after its first epoch while rank 0 went on and failed in the gradient allreduce
    # (WorkerLostError); ReduceLROnPlateau would halve the rate on some workers only.
    (_, i0), (_, i1) = _results(jobs, "model_fit")
    m0, m1 = i0["monitors"], i1["monitors"]
    assert m0["early_stopping"]["epochs"] == m1["early_stopping"]["epochs"] == [0]  # the baseline is never beaten
    assert m0["plateau"]["epochs"] == m1["plateau"]["epochs"] == [0, 1, 2, 3]
    assert m0["plateau"]["lr"] == m1["plateau"]["lr"] == pytest.approx(0.001 * 0.5 ** 3, rel=1e-6)  # (the first: a best)
    for name in m0:
        assert m0[name]["weights"] == m1[name]["weights"], name


@pytest.mark.horovod
def test_a_stop_one_worker_decides_under_model_fit_is_agreed_by_agreed_stop_callback(jobs):
    # Rank 1 alone stops: TerminateOnNaN at its second step (a NaN label), an EarlyStopping at the second epoch's end
    # (given to rank 1 only). With AgreedStopCallback last both workers stop there; without it rank 0 went on alone
    # and failed in its next gradient allreduce.
    (_, i0), (_, i1) = _results(jobs, "model_fit")
    assert i0["agreed_stops"] == i1["agreed_stops"] == {"nan": {"epochs": [0], "steps": 2},
                                                        "early_stopping": {"epochs": [0, 1], "steps": 8}}


@pytest.mark.horovod
def test_metric_average_callback_weights_each_worker_by_its_samples(jobs):
    (_, i0), (_, i1) = _results(jobs, "model_fit")
    m = common.MODEL_FIT
    assert i0["averaged"] == i1["averaged"]
    for epoch, averaged in enumerate(i0["averaged"]):
        local = (i0["local"][epoch], i1["local"][epoch])
        assert local[0]["loss"] != local[1]["loss"]  # the workers' own values differ
        for key in ("loss", "mae"):  # 32 training samples on each worker (their float32 states summed)
            assert averaged[key] == pytest.approx((local[0][key] + local[1][key]) / 2, rel=1e-6)
        for key in ("val_loss", "val_mae"):  # 20 and 12 validation samples
            n0, n1 = m["val_sizes"]
            assert averaged[key] == pytest.approx((n0 * local[0][key] + n1 * local[1][key]) / (n0 + n1), rel=1e-9)


@pytest.mark.horovod
def test_the_horovod_example_trains_on_two_workers(jobs):
    (_, i0), (_, i1) = _results(jobs, "example")
    assert i1["stdout"].strip() == ""  # only rank 0 prints
    line = i0["stdout"].strip().splitlines()[-1]
    assert line.startswith(f"2 worker(s), backend {BACKEND}: final training loss"), i0["stdout"]
    assert float(line.rsplit("test accuracy", 1)[1]) > 0.5


@pytest.mark.horovod
def test_load_model_gives_every_worker_the_saved_model_and_state_with_the_optimizer_distributed(jobs):
    """hvd.load_model of the file rank 0's ModelCheckpoint saved (a model compiled with DistributedOptimizer): every
    worker holds the file's weights and optimizer state, and plain model.fit on the workers' halves goes on as one
    process trains the file's model on the whole data in minibatches of both halves."""
    (a0, i0), (a1, i1) = _results(jobs, "load_model")
    assert i0["distributed"] is i1["distributed"] is True and i0["optimizer"] == i1["optimizer"] == "Adam"
    for key in a0:
        np.testing.assert_array_equal(a0[key], a1[key], err_msg=key)
    m = common.LOAD_MODEL
    reference = keras.models.load_model(jobs["out"] / "load_model.keras")
    for i, w in enumerate(common.weights(reference)):
        np.testing.assert_array_equal(a0[f"loaded_w{i}"], w)
    for i, v in enumerate(reference.optimizer.variables):
        np.testing.assert_array_equal(a0[f"loaded_opt{i}"], keras.ops.convert_to_numpy(v.value))
    assert int(a0["loaded_opt0"]) == m["per_worker"] // m["batch_size"]  # iterations: the saved run's steps
    x, y = common.data(2 * m["per_worker"], seed=m["seed"])
    reference.fit(x, y, batch_size=2 * m["batch_size"], epochs=m["epochs"], shuffle=False, verbose=0)
    for i, w in enumerate(common.weights(reference)):
        np.testing.assert_allclose(a0[f"w{i}"], w, atol=1e-5, rtol=0)
    for i, v in enumerate(reference.optimizer.variables):
        np.testing.assert_allclose(a0[f"opt{i}"], keras.ops.convert_to_numpy(v.value), atol=1e-5, rtol=0)
    # A file that rank 1 cannot read: rank 1 raises Keras's error, rank 0 says another worker could not load it.
    assert i1["unreadable"][0] == "ValueError" and "missing.keras" in i1["unreadable"][1]
    assert i0["unreadable"][0] == "RuntimeError" and "another worker could not load the model" in i0["unreadable"][1]


# -- failures and resumption -----------------------------------------------------------------------------
@pytest.mark.horovod
def test_a_killed_worker_ends_the_job_promptly_with_a_clear_message(jobs):
    rc, output, ended = jobs["killed"]
    killed_at = jobs["out"] / "killed_at"
    assert killed_at.exists(), f"rank 1 never reached its kill step:\n{output[-4000:]}"
    assert rc != 0
    assert ended - float(killed_at.read_text()) < KILL_BOUND_SECONDS
    assert "exited with non-zero status" in output and "Exit code: 137" in output
    assert "finished without being killed" not in output


@pytest.mark.horovod
def test_kill_and_resume_ends_bit_identical_to_an_uninterrupted_run(jobs):
    (a0, i0), (a1, i1) = _results(jobs, "resume")
    assert "unavailable" not in i0, i0.get("unavailable")
    r = common.RESUME
    assert i0["restored_samples"] == r["frequency"]  # the last checkpoint before the kill
    assert i0["samples"] == i1["samples"] == [r["max_samples"], r["max_samples"]]
    for key in a0:
        if key.startswith("resumed_"):
            np.testing.assert_array_equal(a0[key], a0["fresh_" + key[len("resumed_"):]], err_msg=key)
            np.testing.assert_array_equal(a0[key], a1[key], err_msg=key)
    # The History too, bit for bit: the loss and mae of the epoch resumed in its middle count what both workers
    # trained in it before the checkpoint (each worker's metric state is saved and restored to it).
    history = i0["history"]
    assert history["resumed"].keys() == {"loss", "mae"} and len(history["resumed"]["loss"]) == 2, history
    assert history["resumed"] == history["fresh"]
    assert i1["history"] == history


@pytest.mark.horovod
def test_sigterm_on_one_worker_saves_that_step_stops_every_worker_and_resumes_exactly(jobs):
    # Checkpoint(save_on_preemption=True); SIGTERM reaches rank 1 alone (one node of a job preempted) after the step
    # that ends at sample 100, mid-epoch; only rank 0 writes checkpoints.
    (a0, i0), (a1, i1) = _results(jobs, "preempt")
    at, path = common.PREEMPT["at"], str(jobs["out"] / "preempt" / "model.ckpt")
    # Every worker stopped there and ended as SIGTERM ends a process (the scenario's handler raises instead).
    assert i0["preempted"] and i1["preempted"]
    # Rank 0, which the signal never reached, had written that step's state, as a run still under way.
    assert i0["saved"] == {"samples": at, "status": "running"}
    # Said once, by the writer, once written.
    assert i0["stderr"] == (f"kfit: saved the checkpoint {path!r} at sample {at}; stopping every worker (SIGTERM "
                            "reached 1 of 2 workers).\n")
    assert i1["stderr"] == ""
    # The rerun resumes there and ends bit-identical to the run that was never stopped.
    end = common.PREEMPT["epochs"] * common.PREEMPT["num_samples"]
    assert i0["samples"] == i1["samples"] == [end, end]
    for key in a0:
        if key.startswith("resumed_"):
            np.testing.assert_array_equal(a0[key], a0["fresh_" + key[len("resumed_"):]], err_msg=key)
            np.testing.assert_array_equal(a0[key], a1[key], err_msg=key)
    # So are the training metrics of the epoch it was stopped in: the checkpoint held every worker's partial sums.
    history = i0["history"]
    assert history["resumed"].keys() == {"loss", "mae"} and len(history["resumed"]["loss"]) == common.PREEMPT["epochs"]
    assert history["resumed"] == history["fresh"] and i1["history"] == history


@pytest.mark.horovod
def test_sigterm_on_one_worker_under_model_fit_is_agreed_by_agreed_stop_callback(jobs):
    # The same under plain model.fit with a SampleClock and AgreedStopCallback last: SIGTERM reaches rank 1 alone after
    # the step ending at its sample 40 (mid-epoch). Without the agreement rank 1 ended alone, saving nothing, and rank 0
    # failed in its next gradient allreduce.
    (_, i0), (_, i1) = _results(jobs, "preempt")
    m0, m1 = i0["model_fit"], i1["model_fit"]
    path = str(jobs["out"] / "preempt_model_fit" / "model.ckpt")
    assert m0["preempted"] and m1["preempted"]
    assert m0["saved"] == {"samples": 40, "status": "running"}
    assert m0["stderr"] == (f"kfit: saved the checkpoint {path!r} at sample 40; stopping every worker (SIGTERM "
                            "reached 1 of 2 workers).\n")
    assert m1["stderr"] == ""
    # The rerun resumes from that file (at its epoch's start, as model.fit does) and trains to the end on both workers.
    assert m0["resumed"] == m1["resumed"]
    assert {k: m0["resumed"][k] for k in ("from", "samples", "epochs")} == {"from": 40, "samples": 90, "epochs": [0, 1, 2]}


@pytest.mark.horovod
def test_a_stop_rank_one_alone_decides_mid_epoch_under_model_fit_is_saved_and_the_rerun_stays_stopped(jobs):
    # Plain model.fit with a SampleClock, Checkpoint(epochs=1) and AgreedStopCallback last; rank 1's own callback stops
    # after the step ending at its sample 40 (the second epoch's second step). Both workers stop after that step, and
    # rank 0 saves it as a stopped run inside its epoch (Checkpoint._stop_agreed; without that call the file was the
    # epoch end's save, and the continued run below had the partial epoch twice in its History: [0, 1, 1, 2]).
    (_, i0), (_, i1) = _results(jobs, "preempt")
    s0, s1 = i0["stop_model_fit"], i1["stop_model_fit"]
    path = str(jobs["out"] / "stop_model_fit" / "model.ckpt")
    for s in (s0, s1):
        assert {k: s["stopped"][k] for k in ("samples", "epochs", "steps")} == {"samples": 40, "epochs": [0, 1], "steps": 8}
    assert s0["stopped"]["weights"] == s1["stopped"]["weights"]
    assert s0["saved"] == {"samples": 40, "status": "stopped", "reason": "stopped by a callback (model.stop_training = True)"}
    # The rerun trains nothing, says so on rank 0, and holds the final state, its clock at sample 40 too (it read 30,
    # the epoch's start where model.fit would have restarted that epoch).
    for s in (s0, s1):
        assert {k: s["rerun"][k] for k in ("from", "samples", "steps")} == {"from": 40, "samples": 40, "steps": 8}
        assert s["rerun"]["weights"] == s0["stopped"]["weights"]
    assert s0["rerun"]["stderr"] == (
        f"kfit: run already complete at sample 40 (stopped by a callback (model.stop_training = True)); nothing to "
        f"train. Restored its final state from {path}. Pass restore=False or delete {path} to start over, or pass "
        "Checkpoint(..., resume_finished=True) to continue it.\n")
    assert s1["rerun"]["stderr"] == s1["resume_finished"]["stderr"] == ""
    # resume_finished=True goes on to the end on both workers, restarting the stopped epoch as model.fit does
    # (2 steps of it trained again: 20 steps in all).
    assert s0["resume_finished"]["stderr"].startswith(f"kfit: resumed from {path} at sample 40 (epoch 2, 10 samples in; ")
    assert s0["resume_finished"]["stderr"].endswith(
        "; it had stopped by a callback (model.stop_training = True): going on (resume_finished=True)\n")
    for s in (s0, s1):
        assert {k: s["resume_finished"][k] for k in ("from", "samples", "epochs", "steps")} == {
            "from": 40, "samples": 90, "epochs": [0, 1, 2], "steps": 20}
    assert s0["resume_finished"]["weights"] == s1["resume_finished"]["weights"]


@pytest.mark.horovod
def test_horovods_allreduce_allgather_and_broadcast_work_on_values_on_every_worker(jobs):
    infos = [info for _, info in _results(jobs, "collectives")]
    assert infos[0] == infos[1]
    info = infos[0]
    assert info["mean"] == [1.5, 3.0] and info["sum"] == 3 and info["sum_average_false"] == 3.0
    assert info["scaled"] == [3.0]  # (2 * 1 + 2 * 2) * 0.5
    assert info["tensor"] == [True, "float32", [1.5, 3.0]]  # a tensor of the backend comes back as one
    assert info["gathered"] == [0, 1, 10, 11, 12] and info["gathered_scalar"] == [0, 1]
    assert info["broadcast"] == [6, 7]


@pytest.mark.horovod
def test_verbose_decisions_of_kfits_callbacks_print_once_per_job(jobs):
    # ReduceLROnPlateau and EarlyStopping (verbose=1) decide the same on both workers (averaged logs) at the second
    # epoch's end: the job's combined output has each line once.
    (_, i0), (_, i1) = _results(jobs, "verbose")
    assert i0["samples"] == i1["samples"] == 80
    lines = (i0["stdout"] + i1["stdout"]).splitlines()
    assert len(lines) == 3, lines
    assert [line.split(": ")[1] for line in lines] == ["ReduceLROnPlateau", "EarlyStopping", "EarlyStopping"]
    assert "learning rate 0.05 -> 0.025" in lines[0] and "stopping" in lines[1] and "restored the weights" in lines[2]
    assert i0["stderr"] == i1["stderr"] == ""


@pytest.mark.horovod
def test_kfits_warnings_about_the_job_show_once_per_job_and_an_error_filter_raises_on_every_worker(jobs):
    # model.fit resumed from a kfit Checkpoint, and kfit.fit resumed with a callback the checkpoint holds no state
    # for: every worker resumes alike, and each warning was shown once per worker.
    (_, i0), (_, i1) = _results(jobs, "verbose")
    shown = [line for line in (i0["warned"] + i1["warned"]).splitlines() if "UserWarning" in line]
    assert sum("Checkpoint under plain model.fit" in line for line in shown) == 1, shown
    assert sum("holds no state for callback 'reduce_lr_on_plateau'" in line for line in shown) == 1, shown
    assert all("UserWarning" not in line for line in i1["warned"].splitlines()), i1["warned"]  # rank 0 shows them
    for info in (i0, i1):  # the program's filters act alike on every worker (one raising alone would hang the other)
        assert info["raised"] is not None and info["raised"].startswith("Checkpoint under plain model.fit"), info


# -- elastic mode ---------------------------------------------------------------------------------------
@pytest.mark.horovod
def test_elastic_mode_goes_on_after_losing_a_worker_and_takes_a_new_one(tmp_path):
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\necho localhost:1\necho 127.0.0.1:1\n")
    discover.chmod(0o755)
    elastic = ["-np", "2", "--min-np", "1", "--max-np", "2", "--blacklist-cooldown-range", "1", "2",
               "--host-discovery-script", str(discover)]
    rc, output, _ = _run("elastic.py", tmp_path, hosts=elastic)
    assert rc == 0, output[-6000:]
    assert (tmp_path / "killed").exists()
    finished = [common.load(str(path)[: -len(".json")]) for path in sorted(tmp_path.glob("elastic.*.json"))]
    assert len(finished) == 2, output[-6000:]  # the survivor and the new worker; the killed one never finishes
    survivor = next(f for f in finished if len(f[1]["runs"]) == 3)
    newcomer = next(f for f in finished if len(f[1]["runs"]) == 1)
    # Two workers until the kill after 100 samples; then one, from the commit at 80 (its first step ends at
    # 90); then two again from a later commit, where the new worker starts too.
    assert [run["size"] for run in survivor[1]["runs"]] == [2, 1, 2]
    assert survivor[1]["runs"][1]["first_step_end"] == 90
    joined = survivor[1]["runs"][2]["first_step_end"]
    assert newcomer[1]["runs"] == [{"size": 2, "first_step_end": joined}]
    assert (joined - 10) % 40 == 0 and survivor[1]["resets"] == 2
    assert survivor[1]["samples"] == newcomer[1]["samples"] == 1200
    for key in survivor[0]:
        np.testing.assert_array_equal(survivor[0][key], newcomer[0][key])
    x, y = common.data(120, seed=4)
    reference = common.resume_model()
    kfit.fit(reference, x, y, minibatch_size=10, max_samples=1200, seed=common.RESUME["seed"], verbose=0)
    for i, w in enumerate(common.weights(reference)):
        np.testing.assert_allclose(survivor[0][f"w{i}"], w, atol=1e-5, rtol=0)


# -- one worker: no Horovod --------------------------------------------------------------------------------
def test_without_horovodrun_a_script_is_one_worker_and_horovod_is_not_imported():
    assert not any(k in os.environ for k in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"))
    hvd.init()
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.is_chief()) == (0, 1, 0, 1, True)
    assert hvd.any_true(True) is True and hvd.any_true(False) is False
    x, y = common.data(40)
    model = common.fit_model(0)
    hvd.prepare_model(model)
    hvd.broadcast_training_state(model)
    kfit.fit(model, x, y, minibatch_size=8, max_samples=40, verbose=0)
    assert hvd.average_metrics({"loss": 1.5}, model) == {"loss": 1.5}
    assert not hvd.is_distributed(model.optimizer)
    # In a fresh process (other tests of this session may have imported Horovod): a single-worker kfit.fit
    # never imports it.
    script = (
        "import sys, numpy as np, keras, kfit, kfit.distributed as hvd\n"
        "hvd.init()\n"
        "m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]); m.compile(optimizer='sgd', loss='mse')\n"
        "kfit.fit(m, np.ones((16, 3), 'float32'), np.ones((16, 1), 'float32'), minibatch_size=4, seed=0, verbose=0)\n"
        "print(sorted(n for n in sys.modules if n == 'horovod' or n.startswith('horovod.')))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_distributed_optimizer_trains_one_worker_exactly_like_its_optimizer():
    x, y = common.data(40)
    runs = []
    for distributed in (False, True):
        model = common.model(0)
        optimizer = kfit.optimizers.MomentumSGD(0.05, momentum=0.9)
        if distributed:
            optimizer = hvd.DistributedOptimizer(optimizer, compression=hvd.Compression.fp16, num_groups=2)
        model.compile(optimizer=optimizer, loss="mse")
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        runs.append(common.weights(model))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_distributed_optimizer_keeps_the_class_name_and_config():
    optimizer = keras.optimizers.Adam(0.01)
    wrapped = hvd.DistributedOptimizer(optimizer)
    assert wrapped is optimizer and hvd.is_distributed(wrapped)
    assert type(wrapped).__name__ == "Adam" and isinstance(wrapped, keras.optimizers.Adam)
    assert hvd.DistributedOptimizer(wrapped) is wrapped  # wrapping twice changes nothing
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(wrapped))
    assert type(restored).__name__ == "Adam" and not hvd.is_distributed(restored)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(optimizer="sgd"), "optimizer"),
        (dict(compression="bf16"), "compression"),
        (dict(op="max"), "op"),
        (dict(num_groups=-1), "num_groups"),
        (dict(name=""), "name"),
        # Horovod's arguments that kfit cannot honour: refused, naming the value and what to use instead.
        (dict(op=hvd.Adasum), r"`op`.*no Adasum.*op=Adasum.*Average"),
        (dict(backward_passes_per_step=4), r"backward_passes_per_step=4.*gradient_accumulation_steps=4"),
        (dict(gradient_predivide_factor=2.0, op=hvd.Sum), r"gradient_predivide_factor=2\.0.*op=Sum"),
        (dict(gradient_predivide_factor=0), "gradient_predivide_factor=0"),
        (dict(process_set=object()), "process_set=.*Leave process_set out"),
        (dict(groups=[[0], [1]]), r"groups=\[\[0\], \[1\]\].*num_groups"),
        (dict(groups=2, num_groups=3), "groups=2, num_groups=3"),
        (dict(sparse_as_dense="yes"), "sparse_as_dense"),
    ],
)
def test_distributed_optimizer_refuses_bad_arguments(kwargs, match):
    arguments = dict(optimizer=keras.optimizers.SGD())
    arguments.update(kwargs)
    with pytest.raises((TypeError, ValueError), match=match):
        hvd.DistributedOptimizer(**arguments)


def test_distributed_optimizer_accepts_horovods_other_arguments():
    # A Horovod-Keras script's DistributedOptimizer call ports by changing its import (test_distributed's
    # model_fit scenario checks the predivide factor's average over two workers).
    optimizer = hvd.DistributedOptimizer(
        keras.optimizers.SGD(), name=None, device_dense="", device_sparse="", compression=hvd.Compression.none,
        sparse_as_dense=True, gradient_predivide_factor=2.0, op=hvd.Average, backward_passes_per_step=1,
        average_aggregated_gradients=True, num_groups=0, groups=2, process_set=None, scale_local_gradients=True)
    options = optimizer._kfit_horovod_options
    assert (options.num_groups, options.predivide) == (2, 2.0)


def test_gradient_groups_split_evenly():
    from kfit.distributed._optimizer import _groups

    assert _groups(list(range(5)), 0) == [[0, 1, 2, 3, 4]]
    assert _groups(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert _groups(list(range(2)), 4) == [[0], [1]]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(initial_lr=0.0), "initial_lr"),
        (dict(initial_lr=0.1, warmup_epochs=-1), "warmup_epochs"),
        (dict(initial_lr=0.1, steps_per_epoch=0), "steps_per_epoch"),
        (dict(initial_lr=0.1, warmup_samples=0), "warmup_samples"),
        (dict(initial_lr=0.1, momentum_correction="yes"), "momentum_correction"),
    ],
)
def test_learning_rate_warmup_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hvd.LearningRateWarmupCallback(**kwargs)


def test_collectives_on_values_return_the_value_on_one_worker_and_refuse_what_they_cannot_do():
    value = np.array([[1.5, 2.0]], np.float32)
    for result in (hvd.allreduce(value), hvd.allreduce(value, op=hvd.Sum), hvd.allgather(value), hvd.broadcast(value, 0)):
        assert isinstance(result, np.ndarray) and result.dtype == np.float32
        np.testing.assert_array_equal(result, value)
    tensor = hvd.allreduce(keras.ops.ones((2,)), postscale_factor=3.0)
    assert not isinstance(tensor, np.ndarray) and keras.ops.convert_to_numpy(tensor).tolist() == [3.0, 3.0]
    with pytest.raises(ValueError, match="`op`: expected kfit.distributed.Average or Sum .kfit has no Adasum"):
        hvd.allreduce(1.0, op=hvd.Adasum)
    with pytest.raises(ValueError, match="Arguments `average` and `op` both say how to reduce"):
        hvd.allreduce(1.0, average=True, op=hvd.Sum)
    with pytest.raises(ValueError, match="`root_rank`: expected an integer in .0, 1.. Received: root_rank=1"):
        hvd.broadcast(1.0, root_rank=1)


def test_broadcast_callback_refuses_a_rank_that_does_not_exist():
    with pytest.raises(ValueError, match="root_rank"):
        hvd.BroadcastGlobalVariablesCallback(1)


class _Rates(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.values = []
        self.momenta = []

    def on_train_batch_begin(self, batch, logs=None):
        from kfit import _backend

        optimizer = self._model.optimizer
        self.values.append(float(_backend.read_variable(self._model, optimizer._learning_rate)))
        self.momenta.append(float(_backend.read_variable(self._model, optimizer.momentum)))


def test_warmup_in_samples_follows_the_linear_scaling_rule_with_momentum_correction(monkeypatch):
    from kfit.distributed import _callbacks

    monkeypatch.setattr(_callbacks, "size", lambda: 4)  # the formula as on 4 workers
    x, y = common.data(50)
    model = common.model(0)
    model.compile(optimizer=kfit.optimizers.MomentumSGD(0.01, momentum=0.9, variant="keras"), loss="mse")
    warmup = hvd.LearningRateWarmupCallback(initial_lr=0.4, warmup_samples=60)
    rates = _Rates()
    kfit.fit(model, x, y, minibatch_size=20, max_samples=120, verbose=0, callbacks=[warmup, rates])
    # Steps start at 0, 20, 40 (with an epoch of 50: 40 + 10), 50, ...: p = (S + B) / 60, clipped to 1.
    starts_sizes = [(0, 20), (20, 20), (40, 10), (50, 20), (70, 20), (90, 10), (100, 20)]
    expected, lr = [], None
    for start, size in starts_sizes:
        if start < 60:
            lr = 0.1 * (1 + 3 * min((start + size) / 60, 1.0))
        expected.append(lr)
    np.testing.assert_allclose(rates.values, expected, rtol=1e-6)
    # Momentum corrected (mu * lr' / lr) in each step where the rate changed, restored after it.
    previous = [0.01] + expected[:-1]
    corrected = [0.9 * new / old if new != old else 0.9 for new, old in zip(expected, previous)]
    np.testing.assert_allclose(rates.momenta, corrected, rtol=1e-6)
    assert float(keras.ops.convert_to_numpy(model.optimizer.momentum)) == pytest.approx(0.9)


def test_horovods_callbacks_namespace_holds_kfits_callbacks():
    # `hvd.callbacks.<Name>(...)` as Horovod-Keras writes it ports by changing the import only.
    for name in ("BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback",
                 "LearningRateScheduleCallback"):
        assert getattr(hvd.callbacks, name) is getattr(hvd, name)


def test_learning_rate_schedule_callback_follows_horovods_formula_with_momentum_correction():
    x, y = common.data(40)
    histories, recorded = [], []
    for schedule in (
        # Staircase, a number as multiplier: 0.2 * 0.5 ** (epoch - 1) in epochs 1 and 2, then left alone.
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.2, multiplier=0.5, start_epoch=1, end_epoch=3),
        # Before every step: 0.2 * multiplier(epoch + batch / steps_per_epoch).
        hvd.callbacks.LearningRateScheduleCallback(0.2, lambda epoch: 1 / (1 + epoch), staircase=False),
    ):
        model = common.model(0)
        model.compile(optimizer=kfit.optimizers.MomentumSGD(0.1, momentum=0.9, variant="keras"), loss="mse")
        rates = _Rates()
        histories.append(model.fit(x, y, batch_size=8, epochs=4, shuffle=False, verbose=0, callbacks=[schedule, rates]))
        recorded.append(rates)
        assert float(keras.ops.convert_to_numpy(model.optimizer.momentum)) == pytest.approx(0.9)
    steps = 5
    staircase = [[0.1, 0.2, 0.1, 0.1][epoch] for epoch in range(4) for _ in range(steps)]
    smooth = [0.2 / (1 + epoch + batch / steps) for epoch in range(4) for batch in range(steps)]
    for rates, expected, history in zip(recorded, (staircase, smooth), histories):
        np.testing.assert_allclose(rates.values, expected, rtol=1e-6)
        previous = [0.1] + expected[:-1]
        corrected = [0.9 * new / old if not np.isclose(new, old) else 0.9 for new, old in zip(expected, previous)]
        np.testing.assert_allclose(rates.momenta, corrected, rtol=1e-5)
        np.testing.assert_allclose(history.history["lr"], expected[steps - 1 :: steps], rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(initial_lr=None, multiplier=0.5), "initial_lr=None"),
        (dict(initial_lr=0.1, multiplier="fast"), "multiplier='fast'"),
        (dict(initial_lr=0.1, multiplier=0.5, start_epoch=2, end_epoch=2), "end_epoch=2"),
        (dict(initial_lr=0.1, multiplier=0.5, steps_per_epoch=0), "steps_per_epoch=0"),
    ],
)
def test_learning_rate_schedule_callback_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hvd.LearningRateScheduleCallback(**kwargs)


def test_warmup_refuses_momentum_correction_it_cannot_apply():
    x, y = common.data(16)
    model = common.model(0)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse")
    with pytest.raises(ValueError, match="momentum_correction=False"):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[hvd.LearningRateWarmupCallback(0.02)])


@pytest.mark.parametrize("agreement", ["missing", "before", "last"])
def test_save_on_preemption_under_data_parallel_model_fit_needs_agreed_stop_callback_last(agreement, monkeypatch,
                                                                                          tmp_path):
    """Plain model.fit on several workers with Checkpoint(save_on_preemption=True) and no AgreedStopCallback after it:
    a SIGTERM that reached one worker ended that worker alone (saving nothing unless it was rank 0), and the others
    failed in their next gradient allreduce. Now refused as training begins, before any collective, alike on every
    worker (checked on one process that takes itself for one of 2 workers)."""
    from kfit import distributed

    monkeypatch.setattr(distributed, "size", lambda: 2)

    class Began(Exception):
        pass

    class StopAtBegin(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            raise Began  # past the check (one process cannot train as one of 2 workers)

    x, y = common.data(40)
    model = common.model(0)
    model.compile(optimizer="sgd", loss="mse")
    checkpoint = kfit.callbacks.Checkpoint(str(tmp_path / "model.ckpt"), save_on_preemption=True, restore=False)
    callbacks = {"missing": [checkpoint], "before": [hvd.AgreedStopCallback(), checkpoint],
                 "last": [checkpoint, hvd.AgreedStopCallback()]}[agreement]
    expected = (pytest.raises(Began) if agreement == "last" else pytest.raises(
        ValueError, match=r"save_on_preemption=True\) under plain model.fit on 2 workers needs "
                          r"kfit.distributed.AgreedStopCallback\(\) last in model.fit's callbacks"))
    try:
        with expected:
            model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[*callbacks, StopAtBegin()])
    finally:
        checkpoint.release()
