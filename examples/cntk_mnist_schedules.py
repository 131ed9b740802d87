"""CNTK's MNIST training with schedules (the CNTK 2.2 Python API guide, section 5), ported to Keras 3 + kfit.

The CNTK code:

    lrs = cntk.learning_rate_schedule([0.001]*12 + [0.0005]*6 + [0.00025]*6 + [0.000125]*3 + [0.0000625]*3
                                      + [0.00003125], cntk.learners.UnitType.sample, epoch_size=N)
    momentums = cntk.learners.momentum_as_time_constant_schedule([0]*5 + [1024], epoch_size=N)
    minibatch_sizes = cntk.minibatch_size_schedule([256]*6 + [512]*9 + [1024]*7 + [2048]*8 + [4096], epoch_size=N)
    learner = cntk.learners.momentum_sgd(model_mn.parameters, lrs, momentums)
    progress_writer = cntk.logging.ProgressPrinter()
    criterion_mn.train((X_train_mn, Y_train_mn), minibatch_size=minibatch_sizes, max_epochs=40,
                       parameter_learners=[learner], callbacks=[progress_writer])
    test_metric_mn = criterion_mn.test((X_test_mn, Y_test_mn), callbacks=[progress_writer]).metric

The same in kfit: the imports change (`kfit.cntk` has CNTK's schedule names), the learner becomes
`MomentumSGD` plus two schedule callbacks, `train` becomes `kfit.fit`, `test` becomes `model.evaluate`
(or a `Test` callback). Minibatch sizes are scaled down 8x for the 1,300 training digits.
"""

import keras
from _data import SMALL, digits

import kfit
from kfit.cntk import (
                             UnitType,
                             learning_rate_schedule,
                             minibatch_size_schedule,
                             momentum_as_time_constant_schedule,
)

(x_train, y_train), _, (x_test, y_test) = digits(flat=False)
N = len(x_train)
lrs = learning_rate_schedule([0.001] * 12 + [0.0005] * 6 + [0.00025] * 6 + [0.000125] * 3 + [0.0000625] * 3
                             + [0.00003125], UnitType.sample, epoch_size=N)
momentums = momentum_as_time_constant_schedule([0] * 5 + [1024], epoch_size=N)
minibatch_sizes = minibatch_size_schedule([32] * 6 + [64] * 9 + [128] * 7 + [256] * 8 + [512], epoch_size=N)

keras.utils.set_random_seed(0)
model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(2),
    keras.layers.Conv2D(48, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(2),
    keras.layers.Flatten(), keras.layers.Dense(96, activation="relu"), keras.layers.Dropout(0.5),
    keras.layers.Dense(10),
])
model.compile(optimizer=kfit.optimizers.MomentumSGD(), metrics=["accuracy"],
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
progress_writer = kfit.callbacks.ProgressPrinter()
history = kfit.fit(model, x_train, y_train, minibatch_size=minibatch_sizes, epoch_size=N, epochs=3 if SMALL else 40,
                   seed=0, verbose=0, callbacks=[kfit.callbacks.LearningRateSchedule(lrs),
                                                 kfit.callbacks.MomentumSchedule(momentums), progress_writer])
test_metric = 1 - model.evaluate(x_test, y_test, batch_size=512, verbose=0, return_dict=True)["accuracy"]
print(f"test error: {test_metric:.2%}")
