"""Why kfit.distributed exists: Horovod's own Keras integration fails under Keras 3.

Runs the unchanged Horovod-Keras MNIST script (examples/horovod_keras_mnist_before.py) under
horovodrun; it is about the TensorFlow backend (horovod.tensorflow.keras is TensorFlow's).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BACKEND

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.horovod
@pytest.mark.slow
def test_horovod_keras_script_fails_under_keras_3(tmp_path):
    assert BACKEND == "tensorflow"  # collected only in the TensorFlow run (tests/conftest.py)
    horovodrun = Path(sys.executable).parent / "horovodrun"
    assert horovodrun.exists(), "Horovod is not installed: run bash scripts/install_horovod.sh"
    env = dict(os.environ, KERAS_BACKEND="tensorflow", KFIT_EXAMPLE_SMALL="1", TF_CPP_MIN_LOG_LEVEL="3",
               OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
    result = subprocess.run(
        [str(horovodrun), "--gloo", "-np", "2", "-H", "localhost:2", sys.executable,
         str(ROOT / "examples" / "horovod_keras_mnist_before.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "horovod/_keras/callbacks.py" in output and "AttributeError" in output, output[-3000:]
    assert "rank 0 done" not in output
