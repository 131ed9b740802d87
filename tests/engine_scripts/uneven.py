"""Shares of unequal size on the native JAX engine (tests/test_engines.py), and where its gradient sum runs.

    torchrun --standalone --nproc_per_node 2 tests/engine_scripts/uneven.py OUT_DIR

``common.UNEVEN``: global minibatches of 9 (shares 5 and 4) over sweeps of 41 samples, one epoch per sweep, so
each epoch ends with a remainder minibatch of 5 (shares 3 and 2); sample weights, an unweighted and a weighted
metric, and one whose state is not a sum over samples (on JAX: warned about, its value keeps the padding row); then
a model with an activity regularizer (on JAX: warned about, naming the layer); then global minibatches of 1 sample
(``common.REMAINDER``: an epoch's last, and one that ``max_samples`` cuts), where rank 1 trains a padding row;
then training data that differs between the workers (in length, in dtype), and validation data (kfit.fit's, a
CrossValidation's, a Test's), which every worker refuses. Every step whose shares differ is padded to one shape by the JAX engine. Writes the weights, the
history and the epoch summaries to ``OUT_DIR/uneven.rank<r>.{npz,json}``, with what the compiled train step holds:
its HLO is checked for an all-reduce and for host callbacks.
"""

from __future__ import annotations

import os
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "horovod_scripts"))

import common  # noqa: E402  (sets one thread per worker before the backend loads)
import keras  # noqa: E402

import kfit  # noqa: E402
from kfit.data._stream import share  # noqa: E402
from kfit.distributed import _select  # noqa: E402

OUT = sys.argv[1]
rank = kfit.distributed.rank()
x, y, sample_weight = common.uneven_data()
net = common.uneven_model()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    history = kfit.fit(net, x, y, sample_weight=sample_weight, **common.uneven_kwargs())
# A layer that adds a loss in its forward pass (an activity regularizer): on JAX its mean takes in the padding rows.
regularized = keras.Sequential([keras.Input((x.shape[1],)),
                                keras.layers.Dense(4, activity_regularizer="l2", name="regularized_dense"),
                                keras.layers.Dense(y.shape[1])])
regularized.compile(optimizer="sgd", loss="mse")
with warnings.catch_warnings(record=True) as caught_losses:
    warnings.simplefilter("always")
    kfit.fit(regularized, x, y, **{**common.uneven_kwargs(), "epochs": 1})
# Global minibatches of 1 sample (an epoch's last, and one max_samples cuts): rank 1's share is empty.
remainder = common.uneven_model()
n = common.REMAINDER["num_samples"]
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    remainder_history = kfit.fit(remainder, x[:n], y[:n], sample_weight=sample_weight[:n], **common.remainder_kwargs())
# Workers given different training data (each its own length; the same length with another dtype; the same
# length, shapes and dtypes with other rows), or
# another minibatch size: refused.
refused = {}
for case, (xs, ys, size) in {"length": (x[:41 - 2 * rank], y[:41 - 2 * rank], None),
                             "dtype": (x.astype("float64") if rank == 1 else x, y, None),
                             "values": (x[::-1].copy() if rank == 1 else x, y, None),
                             "minibatch_size": (x, y, 8 + rank)}.items():
    kwargs = {**common.uneven_kwargs(), "epochs": 1}
    if size is not None:
        kwargs["minibatch_size"] = size
    try:
        kfit.fit(common.uneven_model(), xs, ys, **kwargs)
        refused[case] = None
    except ValueError as error:
        refused[case] = str(error)
# Validation data that differs between the workers: each its own shard of 20 rows (as Horovod-Keras scripts give
# model.fit), to kfit.fit's validation_data and to a CrossValidation; a Test's of another length on each worker.
mine = slice(20 * rank, 20 * (rank + 1))
for case, kwargs in {"validation_data": {"validation_data": (x[mine], y[mine])},
                     "cross_validation": {"callbacks": [kfit.callbacks.CrossValidation((x[mine], y[mine]))]},
                     "test": {"callbacks": [kfit.callbacks.Test((x[:30 + rank], y[:30 + rank]), verbose=0)]},
                     "same_validation": {"validation_data": (x[:20], y[:20]),
                                         "callbacks": [kfit.callbacks.CrossValidation((x[:20], y[:20]))]}}.items():
    try:
        kfit.fit(common.uneven_model(), x, y, **{**common.uneven_kwargs(), "epochs": 1, **kwargs})
        refused[case] = None
    except ValueError as error:
        refused[case] = str(error)
info = {
    "different_data": refused,
    "remainder_samples": kfit.get_clock(remainder).samples,
    "remainder_history": {k: [float(v) for v in values] for k, values in remainder_history.history.items()},
    "added_loss_warnings": [str(w.message) for w in caught_losses if "adds a loss in its forward pass" in str(w.message)],
    "padding_warnings": [str(w.message) for w in caught if "pads the workers' shares" in str(w.message)],
    "engine": kfit.distributed.engine(),
    "size": kfit.distributed.size(),
    "samples": kfit.get_clock(net).samples,
    "history": {k: [float(v) for v in values] for k, values in history.history.items()},
    "in_step": bool(getattr(_select.current(), "in_step", False)),
}
if keras.backend.backend() == "jax" and info["in_step"]:
    # The step kfit.fit trained with, lowered for a global minibatch of 9 (shares 5 and 4) and compiled.
    engine = _select.current()
    info["train_function"] = bool(getattr(net.make_train_function, "_kfit_in_step", False))
    step = engine.train_step_function(net, net.train_step)
    state = ([v.value for v in net.trainable_variables], [v.value for v in net.non_trainable_variables],
             [v.value for v in net.optimizer.variables], [v.value for v in net.metrics_variables])
    lo, hi = share(0, 9, rank, 2)
    data = tuple(keras.ops.convert_to_tensor(a[lo:hi]) for a in (x, y, sample_weight))
    hlo = step.jitted.lower(*step.prepare(state, data, total=9)).compile().as_text()
    info["hlo_all_reduce"] = "all-reduce" in hlo
    info["hlo_callbacks"] = sorted({line.split("custom_call_target=")[1].split(",")[0]
                                    for line in hlo.splitlines() if "custom_call_target=" in line
                                    and "callback" in line.lower()})
common.save(os.path.join(OUT, f"uneven.rank{rank}"), {**{f"w{i}": w for i, w in enumerate(common.weights(net))},
                                                    **{f"r{i}": w for i, w in enumerate(common.weights(remainder))}},
            info)
