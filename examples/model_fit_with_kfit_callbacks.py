"""kfit's callbacks in a plain `model.fit` (no kfit.fit): a SampleClock tells them the minibatch size.

Everything but minibatch-size schedules and exact mid-epoch resumption works here (see docs/migrating-from-keras.md).
"""

import keras
from _data import SMALL, digits

import kfit

(x, y), (x_val, y_val), (x_test, y_test) = digits()
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
model.compile(optimizer=kfit.optimizers.MomentumSGD(), metrics=["accuracy"],
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
batch_size = 32
history = model.fit(
    x, y, batch_size=batch_size, epochs=3 if SMALL else 20, verbose=0,
    callbacks=[
        kfit.callbacks.SampleClock(batch_size=batch_size, num_samples=len(x)),  # first: the samples per step
        # per-sample rate: linear warm-up over 2,000 samples, then cosine decay to sample 26,000
        kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(
            kfit.schedules.warmup_cosine(0.0, 0.002, 2_000, 26_000))),
        kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant(1024)),
        kfit.callbacks.CrossValidation((x_val, y_val), frequency=1000, minibatch_size=256),
        kfit.callbacks.EarlyStopping(monitor="val_average_error", patience=5_000, burn_in=3_000, unit="samples"),
        kfit.callbacks.ProgressPrinter(freq=20, first=3),
        kfit.callbacks.Test((x_test, y_test), minibatch_size=256),
    ],
)
print("samples trained:", kfit.get_clock(model).samples, "test accuracy:", history.history["test_accuracy"][-1])
