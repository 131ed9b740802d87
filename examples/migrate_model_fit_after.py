"""After: the same script on kfit (see docs/migrating-from-keras.md).

`model.fit(` became `kfit.fit(model, `; the learning rate is per sample (the same schedule means the same
thing at any minibatch size) and follows the sample clock; momentum is a time constant that the
optimizer keeps in a variable; the minibatch size grows; early stopping and plateau reduction count in
samples and their counters survive a restart; the checkpoint resumes mid-epoch, bit for bit.
"""

import keras
from _data import SMALL, digits

import kfit
from kfit.schedules import learning_rate_per_sample, minibatch_size, momentum_as_time_constant

(x, y), (x_val, y_val), _ = digits()
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
model.compile(optimizer=kfit.optimizers.MomentumSGD(), metrics=["accuracy"],
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
n = len(x)
history = kfit.fit(
    model, x, y, minibatch_size=minibatch_size([32] * 10 + [64], epoch_size=n), epochs=3 if SMALL else 30,
    seed=0, verbose=0,
    callbacks=[
        kfit.callbacks.LearningRateSchedule(learning_rate_per_sample([0.05 / 32] * 10 + [0.01 / 32], epoch_size=n)),
        kfit.callbacks.MomentumSchedule(momentum_as_time_constant(32 / (1 - 0.9))),  # tau = B / (1 - mu)
        kfit.callbacks.CrossValidation((x_val, y_val), frequency=n // 2, minibatch_size=256),  # twice per epoch
        kfit.callbacks.EarlyStopping(monitor="val_loss", patience=6, restore_best_weights=True),
        kfit.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=4),
        kfit.callbacks.Checkpoint("runs/after_checkpoint/model.h5", frequency=n // 2),
        kfit.callbacks.ProgressPrinter(),
    ],
)
print("final val_accuracy:", history.history["val_accuracy"][-1])
