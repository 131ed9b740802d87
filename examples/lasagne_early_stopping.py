"""A Lasagne-style training run (the trainer proposed to Lasagne with britefury-lasagne-helpers): early
stopping with a minimum number of epochs and a patience in epochs, keeping the best state.

Lasagne's proposed trainer: `min_epochs` before any stop, stop after `val_improve_num_epochs` epochs
without improvement of the validation loss, then restore the parameters of the best epoch. In kfit these
are EarlyStopping's `min_epochs`, `patience` with `unit="epochs"`, and `restore_best_weights`.
"""

import keras
import numpy as np
from _data import SMALL, digits

import kfit

(x, y), (x_val, y_val), _ = digits()
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                          keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
model.compile(optimizer=keras.optimizers.Adam(3e-3), metrics=["accuracy"],
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
stopper = kfit.callbacks.EarlyStopping(monitor="val_loss", min_epochs=2 if SMALL else 10, patience=2 if SMALL else 5,
                                       unit="epochs", restore_best_weights=True, verbose=1)
history = kfit.fit(model, x, y, batch_size=64, epochs=4 if SMALL else 100, seed=0, verbose=0,
                   callbacks=[kfit.callbacks.CrossValidation((x_val, y_val), minibatch_size=256), stopper,
                              kfit.callbacks.ProgressPrinter()])
val_losses = history.history["val_loss"]
best = int(np.argmin(val_losses))
print(f"trained {len(val_losses)} epochs; best epoch {best + 1} (val_loss {val_losses[best]:.4f}); its weights restored")
