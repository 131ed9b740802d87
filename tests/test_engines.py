"""kfit.distributed's engines: choosing one, and the native engines (``torch.distributed``, ``jax.distributed``) at work.

The native tests launch real workers on loopback, with the backend of this pytest run and one thread each:

* ``killed.py`` (from ``tests/horovod_scripts``) as two processes started here with torchrun's environment
  (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and no launcher to watch them: rank 1 is
  SIGKILLed after a checkpoint, and rank 0 must fail on its own within seconds;
* ``engine_scripts/scenarios.py`` under ``python -m torch.distributed.run --standalone --nproc_per_node 2``:
  the engine's own collectives, then the Horovod scenarios unchanged (data-parallel ``kfit.fit``, stops,
  plain ``model.fit`` with Horovod's API, ``load_model``, resuming the killed run on two workers, SIGTERM on one
  worker with ``save_on_preemption``, what ``verbose=1`` prints, the Horovod example);
* ``engine_scripts/uneven.py`` under torchrun: global minibatches that do not divide between the two workers
  (padded to one shape on JAX), ones of 1 sample (one worker trains a padding row), workers given different training data (refused), and on JAX the compiled step's
  HLO (an all-reduce, no host callback);
* ``engine_scripts/resume.py``: the killed run's checkpoint (written by two workers) resumed by one worker, and
  under torchrun, the checkpoint that one worker wrote (``engine_scripts/partial.py``) resumed by two.

Results are checked against single-process references computed here, as in tests/test_distributed.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import BACKEND

import kfit
from kfit.distributed import _launch

TESTS = Path(__file__).parent
SCRIPTS = TESTS / "engine_scripts"
HOROVOD_SCRIPTS = TESTS / "horovod_scripts"
sys.path.insert(0, str(HOROVOD_SCRIPTS))

import common  # noqa: E402
import test_distributed as horovod_checks  # noqa: E402  (the Horovod tests' checks, reused on the same outputs)

#: Backends with a native engine in kfit (JAX: see the README's engine table).
NATIVE_BACKENDS = ("torch", "jax")
native_only = pytest.mark.skipif(
    BACKEND not in NATIVE_BACKENDS,
    reason=f"kfit's native engine covers the {', '.join(NATIVE_BACKENDS)} backend(s); {BACKEND} has Horovod only",
)
JOB_TIMEOUT = 300
KILL_BOUND_SECONDS = 10.0
HANG_TIMEOUT_SECONDS = 3.0
# A checkpoint resumed on another number of workers: its metric states summed into rank 0 (see
# _assert_same_training_metrics), against the uninterrupted run's float32 sums.
RESHARDED_METRICS_RTOL = 1e-5
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "TORCHELASTIC_USE_AGENT_STORE", _launch.ENGINE_VARIABLE, *_launch.HOROVOD_VARIABLES)


# -- running workers --------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env.update(KERAS_BACKEND=BACKEND, PYTHONUNBUFFERED="1", KFIT_COLLECTIVE_TIMEOUT="60",
               PYTHONPATH=os.pathsep.join(p for p in (str(TESTS.parent), env.get("PYTHONPATH")) if p))
    env.update(extra)
    return env


def _torchrun(script: Path, *args: str) -> tuple[int, str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
               *args]
    try:
        done = subprocess.run(command, env=_environment(), capture_output=True, text=True, timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"`{' '.join(command)}` did not end within {JOB_TIMEOUT} s:\n{error.stdout}\n{error.stderr}")
    return done.returncode, done.stdout + done.stderr


def _spawn_workers(script: Path, out: Path, **extra: str) -> list[subprocess.Popen]:
    """Two workers with torchrun's environment on loopback, started here (no launcher watches them)."""
    port = str(_free_port())
    workers = []
    for rank in (0, 1):
        env = _environment(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **extra)
        log = open(out / f"{script.stem}.log{rank}", "w")  # noqa: SIM115 - closed when the worker ends
        workers.append(subprocess.Popen([sys.executable, str(script), str(out)], env=env, stdout=log,
                                        stderr=subprocess.STDOUT))
        log.close()
    return workers


def _wait(worker: subprocess.Popen, timeout: float) -> tuple[int | None, float]:
    """The worker's exit status and when it ended (None: still running after ``timeout``)."""
    try:
        rc = worker.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, time.time()
    return rc, time.time()


def _end(workers: list[subprocess.Popen]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGKILL)
            worker.wait()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp(f"native_{BACKEND}")
    # 1. Two workers, no launcher; rank 1 kills itself after step 6 (a checkpoint at 40 samples exists).
    workers = _spawn_workers(HOROVOD_SCRIPTS / "killed.py", out)
    try:
        killed = _wait(workers[0], JOB_TIMEOUT)
        workers[1].wait(timeout=JOB_TIMEOUT)
    finally:
        _end(workers)
    logs = [(out / f"killed.log{r}").read_text() for r in (0, 1)]
    # 2. The checkpoint two workers wrote, kept for one worker to resume (scenario "resume" goes on from it).
    if (out / "resume").exists():
        shutil.copytree(out / "resume", out / "resume_alone")
    # 3. torchrun: the engine's collectives, then every Horovod scenario, unchanged.
    rc, output = _torchrun(SCRIPTS / "scenarios.py", str(out))
    if rc != 0:
        pytest.fail(f"engine_scripts/scenarios.py failed under torchrun (exit {rc}):\n{output[-6000:]}")
    # 4. One worker resumes the two workers' checkpoint.
    _one_worker(SCRIPTS / "resume.py", str(out / "resume_alone" / "model.ckpt"), str(out / "resume_alone_result"))
    # 5. One worker trains half the run; two workers resume its checkpoint under torchrun.
    _one_worker(SCRIPTS / "partial.py", str(out / "partial" / "model.ckpt"))
    shutil.copytree(out / "partial", out / "local0")  # for 6., before 5. goes on from it
    rc, output = _torchrun(SCRIPTS / "resume.py", str(out / "partial" / "model.ckpt"), str(out / "resume_two_result"))
    if rc != 0:
        pytest.fail(f"engine_scripts/resume.py failed under torchrun (exit {rc}):\n{output[-6000:]}")
    # 6. The same, with the checkpoint on rank 0's disk only: rank 1's directory is empty (no shared file system).
    (out / "local1").mkdir()
    rc, output = _torchrun(SCRIPTS / "resume.py", str(out / "local{rank}" / "model.ckpt"), str(out / "resume_local"))
    if rc != 0:
        pytest.fail(f"engine_scripts/resume.py on local disks failed under torchrun (exit {rc}):\n{output[-6000:]}")
    return {"out": out, "killed": (killed, logs)}


def _one_worker(script: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, str(script), *args], env=_environment(), capture_output=True, text=True,
                          timeout=JOB_TIMEOUT)
    if done.returncode != 0:
        pytest.fail(f"{script.name} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-6000:]}")


# -- the engine ------------------------------------------------------------------------------------------
@native_only
def test_torchrun_selects_the_native_engine_and_its_collectives_agree(jobs):
    infos = [common.load(str(jobs["out"] / f"engine.rank{r}"))[1] for r in (0, 1)]
    for rank, info in enumerate(infos):
        assert info["engine"] == "native" and info["class"] == {"torch": "TorchEngine", "jax": "JaxEngine"}[BACKEND]
        assert (info["rank"], info["size"], info["local_rank"], info["local_size"]) == (rank, 2, rank, 2)
        assert info["is_chief"] is (rank == 0)
        assert info["sum_int"] == [3] and info["sum_float"] == [[1.5] * 3] * 2
        assert info["sum_dtypes"] == ["int32", "float64"]
        assert info["bytes"] == "rank zero's bytes"
        assert info["any_true"] == [True, False]


# -- data-parallel training --------------------------------------------------------------------------------
@native_only
def test_workers_end_identical_and_equal_to_one_process_on_the_same_global_minibatches(jobs):
    (a0, _), (a1, _) = horovod_checks._results(jobs, "fit")
    x, y = common.data(common.FIT["num_samples"])
    reference = common.fit_model(init_seed=0)
    kfit.fit(reference, x, y, **common.fit_kwargs())
    for i, w in enumerate(common.weights(reference)):
        np.testing.assert_array_equal(a0[f"w{i}"], a1[f"w{i}"])
        np.testing.assert_allclose(a0[f"w{i}"], w, atol=1e-6, rtol=0)
    # ... and everything else the Horovod test checks (optimizer state, metrics, epoch summaries).
    horovod_checks.test_workers_end_identical_and_equal_to_one_process_on_the_same_global_minibatches(jobs)


@native_only
def test_the_epochs_training_metrics_are_one_processs_where_their_states_add_up(jobs):
    horovod_checks.test_the_epochs_training_metrics_are_one_processs_where_their_states_add_up(jobs)


@native_only
def test_pad_remainders_is_refused_under_data_parallel_training(jobs):
    horovod_checks.test_pad_remainders_is_refused_under_data_parallel_training(jobs)


@native_only
def test_the_workers_shares_cover_every_sweep_exactly_once(jobs):
    horovod_checks.test_the_workers_shares_cover_every_sweep_exactly_once(jobs)


@native_only
def test_a_stop_on_one_worker_ends_both_after_the_same_step(jobs):
    horovod_checks.test_a_stop_on_rank_zero_ends_both_workers_after_the_same_step(jobs)
    horovod_checks.test_a_cross_validation_stop_decided_on_rank_zero_ends_both_workers(jobs)


@native_only
def test_model_fit_with_horovods_api_runs_on_the_native_engine(jobs):
    horovod_checks.test_model_fit_with_distributed_optimizer_broadcast_and_warmup_equals_one_process(jobs)
    horovod_checks.test_metric_average_callback_weights_each_worker_by_its_samples(jobs)


@native_only
def test_load_model_gives_every_worker_the_saved_model_on_the_native_engine(jobs):
    horovod_checks.test_load_model_gives_every_worker_the_saved_model_and_state_with_the_optimizer_distributed(jobs)


@native_only
def test_the_horovod_example_runs_unchanged_under_torchrun(jobs):
    horovod_checks.test_the_horovod_example_trains_on_two_workers(jobs)


# -- shares of unequal size (padded on JAX) and where the JAX engine sums the gradients ----------------------
@pytest.fixture(scope="module")
def uneven(tmp_path_factory) -> tuple:
    out = tmp_path_factory.mktemp(f"uneven_{BACKEND}")
    rc, output = _torchrun(SCRIPTS / "uneven.py", str(out))
    if rc != 0:
        pytest.fail(f"engine_scripts/uneven.py failed under torchrun (exit {rc}):\n{output[-6000:]}")
    return tuple(common.load(str(out / f"uneven.rank{r}")) for r in (0, 1))


@native_only
def test_uneven_shares_and_a_sweeps_remainder_train_as_one_process(uneven):
    """Global minibatches of 9 (shares 5 and 4) and each sweep's remainder of 5 (3 and 2): on JAX every such step
    is padded to one shape; weights, loss and unweighted metric equal one process's."""
    (a0, i0), (a1, i1) = uneven
    x, y, sample_weight = common.uneven_data()
    reference = common.uneven_model()
    history = kfit.fit(reference, x, y, sample_weight=sample_weight, **common.uneven_kwargs())
    for rank, info in enumerate((i0, i1)):
        assert (info["engine"], info["size"]) == ("native", 2)
        assert info["samples"] == common.UNEVEN["epochs"] * common.UNEVEN["num_samples"]
        for key in ("loss", "mae"):  # the epochs' values (the padding rows taken out)
            np.testing.assert_allclose(info["history"][key], history.history[key], rtol=1e-5, err_msg=key)
        # Padding stays in a metric whose state is not a sum over samples: said once per job, on rank 0, naming it
        # (JAX only).
        once = 1 if BACKEND == "jax" and rank == 0 else 0
        assert len(info["padding_warnings"]) == once, info["padding_warnings"]
        assert all("'last_mean' (LastMean)" in w for w in info["padding_warnings"])
        # A layer's add_loss averages over the padding rows too: said once, naming the layer (JAX only).
        assert len(info["added_loss_warnings"]) == once, info["added_loss_warnings"]
        assert all("'regularized_dense'" in w for w in info["added_loss_warnings"])
    for i, w in enumerate(common.weights(reference)):
        np.testing.assert_array_equal(a0[f"w{i}"], a1[f"w{i}"])
        np.testing.assert_allclose(a0[f"w{i}"], w, atol=1e-6, rtol=0)


@native_only
def test_a_minibatch_of_fewer_samples_than_workers_trains_as_one_process(uneven):
    """An epoch's last minibatch of 1 sample, and one that max_samples cuts to 1, on 2 workers: rank 1's share is
    empty, it trains a padding row of weight 0, and both workers end with one process's weights and metrics."""
    (a0, i0), (a1, i1) = uneven
    x, y, sample_weight = common.uneven_data()
    n = common.REMAINDER["num_samples"]
    reference = common.uneven_model()
    history = kfit.fit(reference, x[:n], y[:n], sample_weight=sample_weight[:n], **common.remainder_kwargs())
    assert kfit.get_clock(reference).samples == common.REMAINDER["max_samples"]
    for info in (i0, i1):
        assert info["remainder_samples"] == common.REMAINDER["max_samples"]
        for key in ("loss", "mae"):  # (a weighted metric is averaged by rows, not weights: as in the test above)
            np.testing.assert_allclose(info["remainder_history"][key], history.history[key], rtol=1e-5, err_msg=key)
    for i, w in enumerate(common.weights(reference)):
        np.testing.assert_array_equal(a0[f"r{i}"], a1[f"r{i}"])
        np.testing.assert_allclose(a0[f"r{i}"], w, atol=1e-6, rtol=0)


@native_only
def test_workers_given_different_training_data_or_minibatches_refuse_them_naming_what_differs(uneven):
    for _, info in uneven:
        length, dtype = info["different_data"]["length"], info["different_data"]["dtype"]
        assert length is not None and "different lengths (rank 0: 41, rank 1: 39 samples)" in length, length
        assert "give every worker the same full data" in length and "kfit shards it itself" in length
        assert dtype is not None and "41 samples each, but with arrays of different shapes or dtypes" in dtype, dtype
    assert "float32" in uneven[0][1]["different_data"]["dtype"] and "float64" in uneven[1][1]["different_data"]["dtype"]
    for rank, (_, info) in enumerate(uneven):  # (the same length, shapes and dtypes, other rows: it trained apart)
        values = info["different_data"]["values"]
        assert values is not None and "training data of 41 samples each with the same shapes and dtypes, but different " \
            f"values: rows 0, 20 and 40 of rank {rank}'s differ from rank(s) {1 - rank}'" in values, values
    for rank, (_, info) in enumerate(uneven):  # (it ended in a collective's failure or a timeout blaming a lost worker)
        size = info["different_data"]["minibatch_size"]
        assert size is not None and "The workers were given different kfit.fit settings: rank " in size, size
        assert f"rank {rank} has minibatch_size={8 + rank} (the first), epoch_size=41" in size, size
        assert "give every worker the same minibatch_size, epoch_size, epochs, max_samples, shuffle and seed" in size


@native_only
def test_workers_given_different_validation_data_refuse_it_naming_what_differs(uneven):
    for rank, (_, info) in enumerate(uneven):  # (each worker validated its own shard, sharded again by kfit, silently)
        refused = info["different_data"]
        shard = refused["validation_data"]
        assert shard is not None and "validation_data of 20 samples each with the same shapes and dtypes, but " \
            f"different values: rows 0, 10 and 19 of rank {rank}'s differ from rank(s) {1 - rank}'" in shard, shard
        assert "give every worker the same full validation_data (do not shard it yourself)" in shard, shard
        cv = refused["cross_validation"]
        assert cv is not None and "`data` of CrossValidation of 20 samples each with the same shapes" in cv, cv
        test = refused["test"]
        assert test is not None and "`data` of Test of different lengths (rank 0: 30, rank 1: 31 samples)" in test
        assert refused["same_validation"] is None  # the same data on every worker trains


@pytest.mark.skipif(BACKEND != "jax", reason="the JAX engine's in-step collective")
def test_the_jax_engines_gradient_sum_is_an_all_reduce_inside_the_compiled_step(uneven):
    for _, info in uneven:
        assert info["in_step"] and info["train_function"]  # kfit.fit trained with the sharded step
        assert info["hlo_all_reduce"]  # the psum, compiled into the step
        assert info["hlo_callbacks"] == []  # no io_callback: the gradients never visit the host


def test_a_share_is_padded_with_copies_of_its_last_row_of_weight_zero():
    from kfit.distributed._jax_engine import pad_share

    x = {"a": np.arange(6, dtype="float32").reshape(3, 2), "b": np.arange(3, dtype="float32")}
    y = np.array([1.0, 2.0, 3.0], "float32")
    x2, y2, w2 = pad_share((x, y), 4, weights=True)
    np.testing.assert_array_equal(x2["a"], [[0, 1], [2, 3], [4, 5], [4, 5]])
    np.testing.assert_array_equal(x2["b"], [0, 1, 2, 2])
    np.testing.assert_array_equal(y2, [1, 2, 3, 3])
    np.testing.assert_array_equal(w2, [1, 1, 1, 0])
    _, _, w3 = pad_share((x, y, np.array([0.5, 0.0, 2.0], "float32")), 4, weights=True)
    np.testing.assert_array_equal(w3, [0.5, 0.0, 2.0, 0.0])  # a user's zero weight stays a real row
    _, _, w4 = pad_share((x, y), 3, weights=True)  # the longer share of an uneven step: weights, no padding
    np.testing.assert_array_equal(w4, [1, 1, 1])
    assert pad_share((x, y), 3, weights=False) == (x, y)  # an even step: the batch as it is
    _, _, w5 = pad_share((x, y, np.array([0.5, 1.5, 2.0], "float32")), 4, weights=True, real=2)
    np.testing.assert_array_equal(w5, [0.5, 1.5, 0.0, 0.0])  # rows after `real` are padding already: weight 0
    x6, _, w6 = pad_share((x["b"][2:], y[2:]), 1, weights=True, real=0)  # an empty share read as one padding row
    np.testing.assert_array_equal(x6, [2])
    np.testing.assert_array_equal(w6, [0])


# -- failures and resumption ---------------------------------------------------------------------------------
@native_only
def test_a_killed_worker_ends_the_job_within_seconds_without_a_launcher(jobs):
    (rc, ended), logs = jobs["killed"]
    killed_at = jobs["out"] / "killed_at"
    assert killed_at.exists(), f"rank 1 never reached its kill step:\n{logs[1][-4000:]}"
    assert rc is not None and rc != 0, logs[0][-4000:]
    assert ended - float(killed_at.read_text()) < KILL_BOUND_SECONDS
    assert "WorkerLostError: kfit.distributed: the collective" in logs[0] and "another worker died" in logs[0], logs[0][-4000:]
    assert "AgreedStopCallback() last" in logs[0], logs[0][-4000:]  # the other cause it names, and its fix
    assert "finished without being killed" not in logs[0] + logs[1]


@native_only
def test_a_hung_worker_fails_the_job_after_the_collective_timeout(tmp_path):
    workers = _spawn_workers(SCRIPTS / "hung.py", tmp_path, KFIT_COLLECTIVE_TIMEOUT=str(HANG_TIMEOUT_SECONDS))
    try:
        rc, ended = _wait(workers[0], JOB_TIMEOUT)
    finally:
        _end(workers)  # rank 1 is stopped: killed here
    log = (tmp_path / "hung.log0").read_text()
    stopped_at = tmp_path / "stopped_at"
    assert stopped_at.exists(), (tmp_path / "hung.log1").read_text()[-4000:]
    assert rc is not None and rc != 0, log[-4000:]
    waited = ended - float(stopped_at.read_text())
    assert HANG_TIMEOUT_SECONDS - 0.5 < waited < HANG_TIMEOUT_SECONDS + KILL_BOUND_SECONDS, log[-4000:]
    assert "WorkerLostError" in log and f"KFIT_COLLECTIVE_TIMEOUT={HANG_TIMEOUT_SECONDS:g} seconds" in log, log[-4000:]
    assert "finished without hanging" not in log


@native_only
def test_kill_and_resume_on_two_workers_ends_bit_identical_to_an_uninterrupted_run(jobs):
    horovod_checks.test_kill_and_resume_ends_bit_identical_to_an_uninterrupted_run(jobs)


@native_only
def test_sigterm_on_one_worker_saves_that_step_stops_every_worker_and_resumes_exactly(jobs):
    horovod_checks.test_sigterm_on_one_worker_saves_that_step_stops_every_worker_and_resumes_exactly(jobs)


@native_only
def test_sigterm_on_one_worker_under_model_fit_is_agreed_by_agreed_stop_callback(jobs):
    horovod_checks.test_sigterm_on_one_worker_under_model_fit_is_agreed_by_agreed_stop_callback(jobs)


@native_only
def test_a_stop_rank_one_alone_decides_mid_epoch_under_model_fit_is_saved_and_the_rerun_stays_stopped(jobs):
    horovod_checks.test_a_stop_rank_one_alone_decides_mid_epoch_under_model_fit_is_saved_and_the_rerun_stays_stopped(jobs)


@native_only
def test_horovods_allreduce_allgather_and_broadcast_work_on_values_on_every_worker(jobs):
    horovod_checks.test_horovods_allreduce_allgather_and_broadcast_work_on_values_on_every_worker(jobs)


@native_only
def test_a_run_continued_from_a_stop_inside_an_epoch_on_one_worker_has_the_uninterrupted_history(jobs):
    horovod_checks.test_a_run_continued_from_a_stop_inside_an_epoch_on_one_worker_has_the_uninterrupted_history(jobs)


@native_only
def test_kfits_early_stopping_and_plateau_under_model_fit_decide_the_same_on_every_worker(jobs):
    horovod_checks.test_kfits_early_stopping_and_plateau_under_model_fit_decide_the_same_on_every_worker(jobs)


@native_only
def test_a_stop_one_worker_decides_under_model_fit_is_agreed_by_agreed_stop_callback(jobs):
    horovod_checks.test_a_stop_one_worker_decides_under_model_fit_is_agreed_by_agreed_stop_callback(jobs)


@native_only
def test_verbose_decisions_of_kfits_callbacks_print_once_per_job(jobs):
    horovod_checks.test_verbose_decisions_of_kfits_callbacks_print_once_per_job(jobs)


@native_only
def test_kfits_warnings_about_the_job_show_once_per_job_and_an_error_filter_raises_on_every_worker(jobs):
    horovod_checks.test_kfits_warnings_about_the_job_show_once_per_job_and_an_error_filter_raises_on_every_worker(jobs)


def _uninterrupted_resume_run() -> tuple[list[np.ndarray], dict]:
    r = common.RESUME
    x, y = common.data(r["num_samples"], seed=4)
    reference = common.resume_model()
    h = kfit.fit(reference, x, y, minibatch_size=r["minibatch_size"], max_samples=r["max_samples"], seed=r["seed"],
                 verbose=0)
    return common.weights(reference), common.history(h)


def _assert_same_training_metrics(history: dict, reference: dict) -> None:
    """The History's training metrics (the first epoch is the one resumed in its middle) to float rounding: the
    workers' saved metric states are summed into rank 0 on another number of workers, and the workers' shares
    are added in another order than one worker adds its minibatches."""
    assert history.keys() == reference.keys() == {"loss", "mae"}
    for key in history:
        np.testing.assert_allclose(history[key], reference[key], rtol=RESHARDED_METRICS_RTOL, atol=0, err_msg=key)


@native_only
def test_a_checkpoint_of_two_workers_resumes_on_one_to_the_uninterrupted_result(jobs):
    arrays, info = common.load(str(jobs["out"] / "resume_alone_result.rank0"))
    r = common.RESUME
    assert (info["engine"], info["size"]) == ("none", 1)
    assert info["restored_samples"] == r["frequency"]  # the two workers' last checkpoint before the kill
    assert info["samples"] == r["max_samples"]
    weights, history = _uninterrupted_resume_run()
    for i, w in enumerate(weights):
        np.testing.assert_allclose(arrays[f"w{i}"], w, atol=1e-6, rtol=0)
    _assert_same_training_metrics(info["history"], history)
    (two, two_info), _ = horovod_checks._results(jobs, "resume")
    for i in range(sum(1 for k in arrays if k.startswith("w"))):  # and to the uninterrupted run on two workers
        np.testing.assert_allclose(arrays[f"w{i}"], two[f"fresh_w{i}"], atol=1e-6, rtol=0)
    _assert_same_training_metrics(info["history"], two_info["history"]["fresh"])


@native_only
def test_a_checkpoint_of_one_worker_resumes_on_two_to_the_uninterrupted_result(jobs):
    (a0, i0), (a1, i1) = [common.load(str(jobs["out"] / f"resume_two_result.rank{r}")) for r in (0, 1)]
    r = common.RESUME
    for info in (i0, i1):
        assert (info["engine"], info["size"]) == ("native", 2)
        assert info["restored_samples"] == 80  # where the one worker stopped (partial.py)
        assert info["samples"] == r["max_samples"]
    for key in a0:
        np.testing.assert_array_equal(a0[key], a1[key], err_msg=key)
    assert i0["history"] == i1["history"]
    weights, history = _uninterrupted_resume_run()
    for i, w in enumerate(weights):
        np.testing.assert_allclose(a0[f"w{i}"], w, atol=1e-6, rtol=0)
    _assert_same_training_metrics(i0["history"], history)


@native_only
def test_a_checkpoint_on_rank_zeros_disk_only_resumes_both_workers(jobs):
    results = [common.load(str(jobs["out"] / f"resume_local.rank{r}")) for r in (0, 1)]
    for _, info in results:
        assert info["restored_samples"] == 80 and info["samples"] == common.RESUME["max_samples"]
    assert os.listdir(jobs["out"] / "local1") == []  # rank 1 never had (nor wrote) a file
    (a0, _), (a1, _) = results
    for key in a0:
        np.testing.assert_array_equal(a0[key], a1[key], err_msg=key)
    shared, _ = common.load(str(jobs["out"] / "resume_two_result.rank0"))  # as when both read one shared file
    for key in a0:
        np.testing.assert_array_equal(a0[key], shared[key], err_msg=key)


# -- choosing an engine (every backend) ----------------------------------------------------------------------
def _select_in_a_new_process(**env: str) -> subprocess.CompletedProcess:
    script = "import kfit.distributed as d; print(d.engine()); d.init(); print(d.rank(), d.size())"
    return subprocess.run([sys.executable, "-c", script], env=_environment(**env), capture_output=True, text=True,
                          timeout=JOB_TIMEOUT)


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, "none"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "native"),
        ({"RANK": "0", "WORLD_SIZE": "1"}, "none"),  # a launcher with one worker: nothing to start
        ({"HOROVOD_RANK": "0"}, "horovod"),
        ({"HOROVOD_RANK": "0", "RANK": "0", "WORLD_SIZE": "2"}, "horovod"),  # horovodrun wins
        ({"RANK": "0", "WORLD_SIZE": "2", "KFIT_ENGINE": "none"}, "none"),
        ({"HOROVOD_RANK": "0", "KFIT_ENGINE": " Native "}, "native"),
        ({"KFIT_ENGINE": "horovod"}, "horovod"),
    ],
)
def test_the_launchers_environment_and_kfit_engine_choose_the_engine(monkeypatch, env, expected):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _launch.requested_engine() == expected


def test_a_bad_kfit_engine_is_refused_with_its_value_and_the_choices(monkeypatch):
    monkeypatch.setenv("KFIT_ENGINE", "mpi")
    with pytest.raises(ValueError, match=r"KFIT_ENGINE.*'horovod', 'native', 'none'.*KFIT_ENGINE='mpi'"):
        _launch.requested_engine()


@pytest.mark.parametrize(
    "env, match",
    [
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1234"}, "MASTER_ADDR"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "MASTER_PORT"),
        ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK=2"),
        ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK='x'"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "MASTER_PORT=70000"),
        ({"KFIT_ENGINE": "native"}, "WORLD_SIZE"),
    ],
)
def test_a_bad_launcher_environment_is_refused_naming_the_variable(monkeypatch, env, match):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=match):
        _launch.launch_environment()


def test_a_bad_collective_timeout_is_refused(monkeypatch):
    monkeypatch.setenv(_launch.TIMEOUT_VARIABLE, "soon")
    with pytest.raises(ValueError, match="KFIT_COLLECTIVE_TIMEOUT='soon'"):
        _launch.timeout_seconds()
    monkeypatch.setenv(_launch.TIMEOUT_VARIABLE, "2.5")
    assert _launch.timeout_seconds() == 2.5


def test_a_bad_kfit_jax_collectives_is_refused_with_its_value(monkeypatch):
    from kfit.distributed import _jax_engine

    monkeypatch.setenv(_jax_engine.COLLECTIVES_VARIABLE, "nccl")
    with pytest.raises(ValueError, match=r"KFIT_JAX_COLLECTIVES.*'step'.*'host'.*KFIT_JAX_COLLECTIVES='nccl'"):
        _jax_engine.collectives_mode()
    monkeypatch.setenv(_jax_engine.COLLECTIVES_VARIABLE, " Host ")
    assert _jax_engine.collectives_mode() == "host"
    monkeypatch.delenv(_jax_engine.COLLECTIVES_VARIABLE)
    assert _jax_engine.collectives_mode() == "step"


def test_a_bad_kfit_engine_fails_the_first_call_with_a_clear_error():
    result = _select_in_a_new_process(KFIT_ENGINE="gloo")
    assert result.returncode != 0
    assert "Invalid value for environment variable KFIT_ENGINE" in result.stderr and "'gloo'" in result.stderr


@pytest.mark.skipif(BACKEND != "tensorflow", reason="the TensorFlow backend has no native engine (Horovod only)")
def test_the_native_engine_on_tensorflow_says_horovod_is_its_engine():
    result = _select_in_a_new_process(KFIT_ENGINE="native", RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                      MASTER_PORT=str(_free_port()))
    assert result.returncode != 0
    assert "Horovod is the TensorFlow engine" in result.stderr and "KFIT_ENGINE='native'" in result.stderr


def test_elastic_mode_without_horovod_installed_says_what_to_install():
    """Where Horovod is missing (here made so by blocking its import), ElasticState is a clear ImportError."""
    script = ("import sys; sys.modules['horovod'] = None\n"
              "import kfit.distributed as d\n"
              "try:\n    d.ElasticState\nexcept ImportError as error:\n    print('ImportError:', error)\n")
    result = subprocess.run([sys.executable, "-c", script], env=_environment(), capture_output=True, text=True,
                            timeout=JOB_TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ImportError: Horovod's elastic mode" in result.stdout and "install_horovod.sh" in result.stdout, result.stdout


def test_horovods_elastic_mode_is_refused_under_the_native_engine():
    script = ("import keras, kfit.distributed as d\n"
              "m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]); m.compile(optimizer='sgd', loss='mse')\n"
              "d.ElasticState(m, commit_frequency=10)\n")
    result = subprocess.run([sys.executable, "-c", script], env=_environment(RANK="0", WORLD_SIZE="2"),
                            capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert result.returncode != 0
    assert "elastic mode" in result.stderr and "needs the Horovod engine" in result.stderr, result.stderr[-3000:]
