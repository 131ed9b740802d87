"""PyTorch only (collected in the torch run): cross-validation leaves the module in training mode."""

from test_cross_validation import TRAIN, VAL, classifier, digits

import kfit
from kfit.callbacks import CrossValidation, KfitCallback


def test_torch_module_stays_in_training_mode():
    modes = []

    class Mode(KfitCallback):
        def on_step_end(self, clock, logs):
            modes.append(self.training_model.training)

    model = classifier()
    cv = CrossValidation(digits(*VAL), frequency=100)
    kfit.fit(model, *digits(*TRAIN), minibatch_size=50, epoch_size=300, epochs=1, callbacks=[cv, Mode()], verbose=0)
    assert len(modes) == 6 and all(modes)
    assert len(cv.results) == 3
