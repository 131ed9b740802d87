"""Before: Horovod's own Keras MNIST example (horovod/examples/tensorflow2/tensorflow2_keras_mnist.py),
on the digits that ship with scikit-learn instead of a download. Read docs/migrating-from-horovod.md.

Under Keras 3 this script does not work: Horovod's Keras callbacks call APIs that Keras 3 removed
(`keras.backend.get_value`, `Variable.ref`) and fail at the first batch, and its `DistributedOptimizer`
wraps methods that Keras 3 no longer calls, so even without the callbacks the workers would train
unsynchronised. The test suite runs it to show this (tests/test_horovod_keras_before.py). The ported
script is examples/horovod_mnist.py.

    horovodrun --gloo -np 2 -H localhost:2 python examples/horovod_keras_mnist_before.py
"""

import os
import sys

import horovod.tensorflow.keras as hvd
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _data import SMALL, digits  # noqa: E402

# Horovod: initialize Horovod.
hvd.init()

(x, y), _, _ = digits()
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(1000, seed=hvd.rank()).batch(32)

keras = tf.keras
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])

# Horovod: adjust learning rate based on number of workers.
scaled_lr = 0.001 * hvd.size()
opt = keras.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(opt)

model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=opt, metrics=["accuracy"])

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),
    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final accuracy.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=1),
]

# Horovod: write logs on worker 0.
verbose = 1 if hvd.rank() == 0 else 0
model.fit(dataset, steps_per_epoch=40 // hvd.size(), callbacks=callbacks, epochs=2 if SMALL else 10, verbose=verbose)

print(f"rank {hvd.rank()} done")
