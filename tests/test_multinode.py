"""Two machines for real: two workers in two network namespaces, each with its own address, over TCP.

``tests/engine_scripts/two_hosts.sh`` makes them without root (``unshare -rn`` and a veth pair; see there) and
runs one worker of the native engine on each; they end identical, and equal to one process on the same global
minibatches. (Horovod's launcher reaches other hosts by ssh, which these namespaces do not have: its multi-host
path is not tested here.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS / "horovod_scripts"))

import common  # noqa: E402

import kfit  # noqa: E402

BACKEND = keras.backend.backend()
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "KFIT_ENGINE", "GLOO_SOCKET_IFNAME")


@pytest.mark.slow
@pytest.mark.skipif(BACKEND == "tensorflow", reason="kfit's native engine covers the torch and jax backends; "
                    "TensorFlow's engine is Horovod, whose launcher reaches other hosts over ssh")
@pytest.mark.skipif(shutil.which("unshare") is None or shutil.which("ip") is None,
                    reason="needs util-linux's unshare and iproute2's ip")
def test_two_workers_on_two_addresses_train_as_one_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env.update(KERAS_BACKEND=BACKEND, PYTHONUNBUFFERED="1", KFIT_COLLECTIVE_TIMEOUT="60",
               PYTHONPATH=os.pathsep.join(p for p in (str(TESTS.parent), env.get("PYTHONPATH")) if p))
    out = tmp_path / "multinode"
    done = subprocess.run(["unshare", "-rn", "bash", str(TESTS / "engine_scripts" / "two_hosts.sh"), sys.executable,
                           str(TESTS / "engine_scripts" / "multinode.py"), str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    (a0, i0), (a1, i1) = [common.load(f"{out}.rank{r}") for r in (0, 1)]
    assert i0["interfaces"] == ["lo", "veth0"] and i1["interfaces"] == ["lo", "veth1"]  # two hosts, one link
    for info in (i0, i1):
        assert (info["engine"], info["size"]) == ("native", 2)
        assert info["samples"] == common.FIT["max_samples"]
    x, y = common.data(common.FIT["num_samples"])
    reference = common.fit_model(init_seed=0)
    kfit.fit(reference, x, y, **common.fit_kwargs())
    for i, w in enumerate(common.weights(reference)):
        np.testing.assert_array_equal(a0[f"w{i}"], a1[f"w{i}"])
        np.testing.assert_allclose(a0[f"w{i}"], w, atol=1e-6, rtol=0)
