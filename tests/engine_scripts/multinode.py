"""One worker of a two-machine job (tests/test_multinode.py): the run of ``common.FIT`` on the native engine.

    RANK=r WORLD_SIZE=2 MASTER_ADDR=10.77.0.1 MASTER_PORT=P python tests/engine_scripts/multinode.py OUT_PREFIX

Each worker lives in a network namespace of its own, with its own address on a veth pair: the workers reach
each other over TCP between two addresses, as on two machines. It writes its weights and what it saw to
``OUT_PREFIX.rank<r>.{npz,json}``.
"""

from __future__ import annotations

import os
import socket
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "horovod_scripts"))

import common  # noqa: E402  (sets one thread per worker before the backend loads)

import kfit  # noqa: E402

out = sys.argv[1]
kfit.distributed.init()
x, y = common.data(common.FIT["num_samples"])
net = common.fit_model(init_seed=0)
kfit.fit(net, x, y, **common.fit_kwargs())
common.save(f"{out}.rank{kfit.distributed.rank()}", {f"w{i}": w for i, w in enumerate(common.weights(net))}, {
    "engine": kfit.distributed.engine(),
    "size": kfit.distributed.size(),
    "samples": kfit.get_clock(net).samples,
    "interfaces": sorted(name for _, name in socket.if_nameindex()),  # this process's network namespace
})
