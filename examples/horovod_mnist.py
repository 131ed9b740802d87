"""Horovod data-parallel training of a digit classifier with kfit, on TensorFlow, JAX or PyTorch.

The data is scikit-learn's ``load_digits`` (1,797 8x8 images, shipped inside the package: no download).
The script is a Horovod script: ``kfit.distributed`` takes the place of ``horovod.keras``.

One machine, two workers (one thread each):

    KERAS_BACKEND=jax OMP_NUM_THREADS=1 horovodrun --gloo -np 2 -H localhost:2 python examples/horovod_mnist.py

Several machines, four workers on each (the same environment and script path on every host, and
passwordless ssh from the first one; add ``--network-interface eth0`` if the hosts have several):

    horovodrun --gloo -np 8 -H host1:4,host2:4 python examples/horovod_mnist.py --checkpoint /shared/digits.h5

One process, no Horovod: ``python examples/horovod_mnist.py``. A small, quick run (CI):
``KFIT_EXAMPLE_SMALL=1`` or ``--small``. With ``--checkpoint PATH`` (a path on rank 0's machine: only rank 0
reads and writes it), rank 0 saves the training state every epoch, and the same command run again after a failure
resumes from it.
"""

from __future__ import annotations

import argparse
import os

for _name, _value in (("OMP_NUM_THREADS", "1"), ("TF_NUM_INTRAOP_THREADS", "1"), ("TF_NUM_INTEROP_THREADS", "1"),
                      ("TF_CPP_MIN_LOG_LEVEL", "2"),
                      ("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")):
    os.environ.setdefault(_name, _value)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import kfit  # noqa: E402
import kfit.distributed as hvd  # noqa: E402

if keras.backend.backend() == "torch":
    import torch

    torch.set_num_threads(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-per-worker", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate of one worker")
    parser.add_argument("--checkpoint", default=None, help="checkpoint file (resumes from it if it exists)")
    parser.add_argument("--small", action="store_true", default=os.environ.get("KFIT_EXAMPLE_SMALL") == "1")
    args = parser.parse_args()

    hvd.init()
    keras.utils.set_random_seed(42)  # the same initial model everywhere (rank 0's is broadcast anyway)

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    x_train, y_train, x_test, y_test = x[:1500], y[:1500], x[1500:], y[1500:]
    epochs = args.epochs
    if args.small:
        x_train, y_train, epochs = x_train[:400], y_train[:400], 2

    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
    # Horovod's recipe: the global minibatch grows with the workers, so does the learning rate (linear
    # scaling rule), reached by a warm-up. kfit.fit averages the gradients by itself (no need to wrap the
    # optimizer, though hvd.DistributedOptimizer(...) does no harm); every worker reads its own share of each
    # global minibatch of batch_per_worker * size() samples.
    model.compile(
        optimizer=kfit.optimizers.MomentumSGD(args.lr * hvd.size(), momentum=0.9, variant="keras"),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    callbacks = [
        hvd.LearningRateWarmupCallback(initial_lr=args.lr * hvd.size(), warmup_epochs=min(2, epochs), verbose=1),
        kfit.callbacks.ProgressPrinter(tag="digits"),  # prints on rank 0 only
    ]
    if args.checkpoint:
        callbacks.append(kfit.callbacks.Checkpoint(args.checkpoint, epochs=1))  # written by rank 0 only
    history = kfit.fit(
        model, x_train, y_train,
        minibatch_size=args.batch_per_worker * hvd.size(),
        epochs=epochs,
        seed=1,
        callbacks=callbacks,
        verbose=0,
    )
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if hvd.is_chief():
        print(f"{hvd.size()} worker(s), backend {keras.backend.backend()}: "
              f"final training loss {history.history['loss'][-1]:.4f}, test accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()
