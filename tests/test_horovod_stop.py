"""A stop that one worker alone decides under plain model.fit over Horovod: the job fails promptly, saying why.

Runs tests/horovod_scripts/lone_stop.py under ``horovodrun --gloo -np 2`` (the backend of this pytest run): a stop on
both workers after the same step ends model.fit on both; a stop on rank 1 alone, inside an epoch or at an epoch's
end, makes the job fail within the timeout (before kfit's fix, rank 0 hung in its next allreduce, or failed with
Horovod's "Horovod has been shut down"), with kfit's message naming AgreedStopCallback on both workers. With no kfit
callback listed, the job fails with Horovod's error, to which kfit adds that hint.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BACKEND
from test_distributed import _horovodrun

SCRIPT = Path(__file__).parent / "horovod_scripts" / "lone_stop.py"
JOB_TIMEOUT = 240


@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.parametrize("when", ["step", "epoch"])
def test_a_stop_one_worker_decides_alone_under_model_fit_fails_the_job_naming_agreed_stop_callback(when, tmp_path):
    env = dict(os.environ, KERAS_BACKEND=BACKEND, PYTHONUNBUFFERED="1")
    command = [_horovodrun(), "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, str(SCRIPT), str(tmp_path), when]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the job hung: it did not end within {JOB_TIMEOUT} s:\n{error.stdout}\n{error.stderr}")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-4000:]
    for rank in (0, 1):  # the stop both workers decided after step 3 ended both model.fit calls there
        assert f"rank {rank}: stopped together after 3 steps" in output, output[-4000:]
    assert "trained on after rank 1 stopped alone" not in output
    # Rank 0, which trained on, fails in its next step; rank 1 says where it stopped (horovodrun may end it first).
    assert "the train step of rank 0 found 1 of the 2 workers gone" in output, output[-4000:]
    assert "AgreedStopCallback() after the callbacks that stop training" in output
    stopped = "after step 3 of epoch 1 of 4" if when == "step" else "after step 4 of epoch 2 of 4"
    if "rank 1 of 2 stopped training alone" in output:
        assert f"rank 1 of 2 stopped training alone (model.fit stopped {stopped})" in output


@pytest.mark.horovod
@pytest.mark.slow
def test_a_lone_stop_under_distributed_optimizer_alone_fails_with_horovods_error_and_a_hint(tmp_path):
    # No kfit callback listed: rank 1 stops alone after its third step and its script ends; rank 0's next gradient
    # allreduce fails with Horovod's error, to which kfit adds a hint naming AgreedStopCallback at no cost per step:
    # on PyTorch and JAX where horovod.torch's call fails, on TensorFlow where model.fit's call of the compiled step
    # (whose op failed) does.
    env = dict(os.environ, KERAS_BACKEND=BACKEND, PYTHONUNBUFFERED="1")
    command = [_horovodrun(), "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, str(SCRIPT), str(tmp_path), "bare"]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the job hung: it did not end within {JOB_TIMEOUT} s:\n{error.stdout}\n{error.stderr}")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-4000:]
    assert "rank 1: trained on after rank 1 stopped alone" in output and "rank 0: trained on" not in output, output[-4000:]
    assert "Horovod has been shut down" in output, output[-4000:]
    assert "kfit.distributed: the gradient allreduce of rank 0 failed: another worker left" in output, output[-4000:]
    assert "list kfit.distributed.AgreedStopCallback() after the callbacks that stop training" in output
