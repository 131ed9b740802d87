"""Resumes the run of ``common.RESUME`` from a checkpoint, on however many workers it is launched as.

    python tests/engine_scripts/resume.py CHECKPOINT OUT_PREFIX                       # one worker
    torchrun --standalone --nproc_per_node 2 tests/engine_scripts/resume.py CHECKPOINT OUT_PREFIX

``tests/test_engines.py`` resumes on one worker the checkpoint that two workers wrote (``killed.py``), and on
two workers the one that one worker wrote (``partial.py``). ``{rank}`` in CHECKPOINT is the worker's rank: each
worker then has a directory of its own, as workers on machines without a shared file system have. Each worker writes its weights, optimizer
variables, clock, History and the restored sample count to ``OUT_PREFIX.rank<r>.{npz,json}``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "horovod_scripts"))

import common  # noqa: E402  (sets one thread per worker before the backend loads)
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kfit  # noqa: E402

checkpoint_path, out = sys.argv[1].format(rank=kfit.distributed.rank()), sys.argv[2]
r = common.RESUME
x, y = common.data(r["num_samples"], seed=4)
net = common.resume_model()
checkpoint = kfit.callbacks.Checkpoint(checkpoint_path, frequency=r["frequency"], restore=True, async_write=False)
h = kfit.fit(net, x, y, minibatch_size=r["minibatch_size"], max_samples=r["max_samples"], seed=r["seed"], verbose=0,
             callbacks=[checkpoint])
arrays = {f"w{i}": w for i, w in enumerate(common.weights(net))}
arrays.update({f"opt{i}": np.asarray(keras.ops.convert_to_numpy(v.value)) for i, v in enumerate(net.optimizer.variables)})
common.save(f"{out}.rank{kfit.distributed.rank()}", arrays, {
    "restored_samples": getattr(checkpoint.restored_from, "samples", None),
    "samples": kfit.get_clock(net).samples,
    "engine": kfit.distributed.engine(),
    "size": kfit.distributed.size(),
    "history": common.history(h),  # the resumed epoch's training metrics
})
