"""Before: a Keras 3 training script with the usual callbacks (see docs/migrating-from-keras.md).

Epoch-based learning-rate schedule, early stopping, plateau reduction and BackupAndRestore, which after a
crash restarts the interrupted epoch from its first batch on mid-epoch weights.
"""

import keras
from _data import SMALL, digits

(x, y), (x_val, y_val), _ = digits()
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), metrics=["accuracy"],
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(
    x, y, batch_size=32, epochs=3 if SMALL else 30, validation_data=(x_val, y_val), verbose=2,
    callbacks=[
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.05 if epoch < 10 else 0.01),
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=3, restore_best_weights=True),
        keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=2),
        keras.callbacks.BackupAndRestore("runs/before_backup"),
    ],
)
print("final val_accuracy:", history.history["val_accuracy"][-1])
