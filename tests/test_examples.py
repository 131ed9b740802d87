"""Every example runs (scaled down by KFIT_EXAMPLE_SMALL=1), so that none can rot."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BACKEND

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXPECTED_OUTPUT = {
    "cntk_advanced_mnist.py": "test error =",
    "cntk_mnist_schedules.py": "test error:",
    "migrate_model_fit_before.py": "final val_accuracy:",
    "migrate_model_fit_after.py": "final val_accuracy:",
    "model_fit_with_kfit_callbacks.py": "test accuracy:",
    "lasagne_early_stopping.py": "its weights restored",
    "kill_and_resume.py": "bit-identical to the uninterrupted run",
}
DEMO = "cntk_advanced_mnist.py"  # what scripts/demo.sh runs: tested (twice over) by test_demo_writes_...


def run_example(name: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, KERAS_BACKEND=BACKEND, KFIT_EXAMPLE_SMALL="1", TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_every_example_is_tested():
    # the Horovod examples run under horovodrun in test_distributed.py and test_horovod_keras_before.py
    examples = {p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_") and not p.name.startswith("horovod_")}
    assert examples == set(EXPECTED_OUTPUT)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(EXPECTED_OUTPUT) - {DEMO}))
def test_example_runs(name, tmp_path):
    result = run_example(name, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert EXPECTED_OUTPUT[name] in result.stdout, result.stdout[-3000:]


@pytest.mark.slow
def test_demo_writes_its_log_tensorboard_csv_and_checkpoints(tmp_path):
    result = run_example(DEMO, tmp_path, "--out", "demo")
    assert result.returncode == 0, result.stderr[-3000:]
    assert EXPECTED_OUTPUT[DEMO] in result.stdout, result.stdout[-3000:]
    out = tmp_path / "demo"
    log = (out / "my.log").read_text()
    assert "Finished Epoch[1]" in log and "Minibatch[" in log
    assert list((out / "tensorboard").rglob("events.out.tfevents.*"))
    assert (out / "history.csv").read_text().count("\n") >= 4
    assert list(out.glob("model_mn.h5*"))
    # the curves, as a PNG, and where they are
    assert f"curves (loss, metric, learning rate, minibatch size against samples): {os.path.join('demo', 'curves.png')}" in result.stdout
    assert (out / "curves.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    # a second run restores the newest checkpoint: the run is complete, it says so and trains nothing
    epochs = log.count("Finished Epoch")
    again = run_example(DEMO, tmp_path, "--out", "demo")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "kfit: run already complete at sample 5200 (reached epochs=4); nothing to train." in again.stderr
    assert "(This run had ended: `--fresh` starts it over.)" in again.stdout
    assert (out / "my.log").read_text().count("Finished Epoch") == epochs
    assert "test error =" in again.stdout
