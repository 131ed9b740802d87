"""Test setup shared by every test: one backend per run, seeded, one CPU thread.

The suite runs once per backend: ``KERAS_BACKEND=tensorflow|jax|torch pytest``. Thread counts are pinned
before any backend is imported so that results repeat bit for bit.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# Quiet TensorFlow and absl (also in the subprocesses the tests start, which inherit this environment):
# TF_CPP_MIN_LOG_LEVEL drops C++ INFO/WARNING lines; TensorFlow's oneDNN notices are printed before absl's
# logging is set up, whatever the level, and go only when oneDNN's custom ops are off.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
if os.environ["KERAS_BACKEND"] == "jax" and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    # JAX's persistent compilation cache, one per test run, shared by pytest-xdist's workers and the subprocesses
    # the tests start (they inherit this environment): Keras jits a new step for every model, and the suite's
    # many small models are mostly the same XLA programs, compiled once each instead of once per test (the
    # JAX tier in CI: 14.5 -> 8 minutes). A size limit turns on the cache's file lock, which keeps readers from half-written
    # entries. The process that makes the folder (pytest's, or xdist's controller) removes it when it exits.
    import atexit
    import shutil
    import tempfile

    _jax_cache = tempfile.mkdtemp(prefix="kfit-tests-jax-cache-")
    atexit.register(shutil.rmtree, _jax_cache, ignore_errors=True)
    os.environ.update(JAX_COMPILATION_CACHE_DIR=_jax_cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0", JAX_COMPILATION_CACHE_MAX_SIZE=str(4 << 30))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

BACKEND = keras.backend.backend()

try:  # absl's Python logger (used by TensorFlow and JAX): warnings and above only
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)
except ImportError:
    pass

# Scripts that tests run in subprocesses (under horovodrun, or to be killed): not test modules.
collect_ignore_glob = ["scripts/*", "horovod_scripts/*", "engine_scripts/*"]
# Tests about one backend are collected only in that backend's run.
collect_ignore = []
if BACKEND != "tensorflow":
    collect_ignore.append("test_horovod_keras_before.py")
    # The every-byte damage sweep reads files with h5py and NumPy only (no backend): it runs once, in this run.
    collect_ignore.append("test_checkpoint_damage.py")
if BACKEND != "torch":
    collect_ignore.append("test_torch_training_mode.py")

if BACKEND == "torch":
    import torch

    torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    """Marks ``jobs`` the tests that read their module's ``jobs`` fixture (the multi-worker scenario runs of
    test_distributed.py and test_engines.py), so that a tier can leave them out (``-m "not jobs"``)."""
    for item in items:
        if "jobs" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.jobs)


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same seeds and a clean Keras session (names, uids, global state).

    ``free_memory=False`` skips the garbage collection that makes ``clear_session`` cost ~0.2 s a test.
    """
    keras.backend.clear_session(free_memory=False)
    keras.utils.set_random_seed(1234)
    yield


@pytest.fixture
def backend() -> str:
    return BACKEND


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
