"""CNTK's schedule names: the advanced MNIST sample's schedules, and each alias's kfit meaning."""

import math
import re

import keras
import pytest

from kfit import cntk as C
from kfit.schedules import (
    as_schedule,
    learning_rate_per_minibatch,
    learning_rate_per_sample,
    minibatch_size,
    momentum_as_time_constant,
    momentum_per_minibatch,
    momentum_per_sample,
)

N = 60000  # samples in one epoch of the MNIST training set


@pytest.fixture(autouse=True)
def _seeded():
    """Overrides the shared Keras reset (about 0.4 s a test): these tests touch no backend state."""
    yield


def _at_epoch_starts(schedule, table):
    """Checks `schedule` at the first sample of each epoch in `table`, and at the last sample before it."""
    previous = None
    for epoch, expected in table:
        assert schedule[epoch * N] == expected, epoch
        if previous is not None and epoch > 0:
            assert schedule[epoch * N - 1] == previous, epoch
        previous = expected


LR_TABLE = [
    (0, 0.001),
    (11, 0.001),
    (12, 0.0005),
    (17, 0.0005),
    (18, 0.00025),
    (23, 0.00025),
    (24, 0.000125),
    (26, 0.000125),
    (27, 0.0000625),
    (29, 0.0000625),
    (30, 0.00003125),
    (100, 0.00003125),
]

MINIBATCH_TABLE = [
    (0, 256),
    (5, 256),
    (6, 512),
    (14, 512),
    (15, 1024),
    (21, 1024),
    (22, 2048),
    (29, 2048),
    (30, 4096),
    (1000, 4096),
]


def test_the_advanced_sample_learning_rate():
    lrs = C.learning_rate_schedule(
        [0.001] * 12 + [0.0005] * 6 + [0.00025] * 6 + [0.000125] * 3 + [0.0000625] * 3 + [0.00003125],
        C.UnitType.sample,
        epoch_size=N,
    )
    assert (lrs.kind, lrs.unit) == ("learning_rate", "per_sample")
    _at_epoch_starts(lrs, LR_TABLE)
    for epoch, lr in LR_TABLE:
        for b in (256, 512, 4096):
            assert lrs.for_minibatch(epoch * N, 0, b) == lr * b


def test_the_advanced_sample_momentum():
    momentums = C.momentum_as_time_constant_schedule([0] * 5 + [1024], epoch_size=N)
    assert (momentums.kind, momentums.unit) == ("momentum", "time_constant")
    _at_epoch_starts(momentums, [(0, 0), (4, 0), (5, 1024), (6, 1024), (100, 1024)])
    assert momentums.per_sample_momentum(5 * N - 1) == 0.0
    assert momentums.for_minibatch(5 * N - 1, 0, 256) == 0.0
    assert momentums.per_sample_momentum(5 * N) == 0.9990239141819757
    for b in (256, 512, 4096):
        assert momentums.for_minibatch(5 * N, 0, b) == math.exp(-b / 1024)


def test_the_advanced_sample_minibatch_sizes():
    sizes = C.minibatch_size_schedule([256] * 6 + [512] * 9 + [1024] * 7 + [2048] * 8 + [4096], epoch_size=N)
    _at_epoch_starts(sizes, MINIBATCH_TABLE)
    for epoch, size in MINIBATCH_TABLE:
        assert sizes.for_minibatch(epoch * N, 0, 1) == size
        assert type(sizes[epoch * N]) is int


@pytest.mark.parametrize(
    ("alias", "native"),
    [
        (
            lambda: C.learning_parameter_schedule_per_sample([0.1, 0.01], 100),
            learning_rate_per_sample([0.1, 0.01], 100),
        ),
        (
            lambda: C.learning_parameter_schedule([0.1, 0.01], 32, 100),
            learning_rate_per_minibatch([0.1, 0.01], 100, 32),
        ),
        (lambda: C.learning_parameter_schedule(0.1), learning_rate_per_minibatch(0.1)),
        (
            lambda: C.learning_parameter_schedule(0.1, minibatch_size=C.IGNORE),
            learning_rate_per_minibatch(0.1),
        ),
        (lambda: C.learning_rate_schedule(0.1, C.UnitType.sample), learning_rate_per_sample(0.1)),
        (lambda: C.learning_rate_schedule(0.1, "sample"), learning_rate_per_sample(0.1)),
        (
            lambda: C.learning_rate_schedule([0.1, 0.2], C.UnitType.minibatch, 10),
            learning_rate_per_minibatch([0.1, 0.2], 10),
        ),
        (lambda: C.momentum_as_time_constant_schedule(1100), momentum_as_time_constant(1100)),
        (lambda: C.momentum_schedule_per_sample(0.99, 10), momentum_per_sample(0.99, 10)),
        (lambda: C.momentum_schedule([0.99, 0.9], 1000), momentum_per_minibatch([0.99, 0.9], 1000)),
        (
            lambda: C.momentum_schedule(0.9, minibatch_size=64),
            momentum_per_minibatch(0.9, reference_minibatch_size=64),
        ),
        (lambda: C.momentum_schedule(0.9, minibatch_size=C.IGNORE), momentum_per_minibatch(0.9)),
        (lambda: C.minibatch_size_schedule([64, 128], 10), minibatch_size([64, 128], 10)),
        (lambda: C.training_parameter_schedule(0.1), learning_rate_per_minibatch(0.1)),
        (
            lambda: C.training_parameter_schedule([0.1, 0.01], C.UnitType.sample, 100),
            learning_rate_per_sample([0.1, 0.01], 100),
        ),
    ],
)
def test_aliases_build_the_kfit_schedules(alias, native):
    assert alias() == native


def test_cntk_docstring_examples():
    s = C.learning_rate_schedule([(12, 0.1), (15, 0.01), (1, 0.001)], C.UnitType.sample, 100)
    assert (s[0], s[1199], s[1200], s[2699], s[2700], s[5000]) == (0.1, 0.1, 0.01, 0.01, 0.001, 0.001)
    m = C.momentum_schedule([0.99, 0.9], 1000)
    assert (m[0], m[999], m[1000], m[1001]) == (0.99, 0.99, 0.9, 0.9)
    assert C.learning_parameter_schedule(0.1, minibatch_size=32).for_minibatch(0, 0, 64) == 0.1 * 64 / 32
    assert C.momentum_schedule(0.9, minibatch_size=32).for_minibatch(0, 0, 64) == 0.9**2
    # The last pair's count is 0 in CNTK's own example (it is never read).
    m = C.momentum_schedule([(999, 0.99), (888, 0.88), (0, 0.77)])
    assert (m[0], m[998], m[999], m[999 + 888 - 1], m[999 + 888]) == (0.99, 0.99, 0.88, 0.88, 0.77)


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: C.learning_rate_schedule(0.1, "epoch"), "unit"),
        (lambda: C.learning_rate_schedule(0.1, None), "unit"),
        (lambda: C.learning_parameter_schedule(0.1, minibatch_size=-1), "reference_minibatch_size"),
        (lambda: C.momentum_schedule(1.2), "values"),
        (lambda: C.minibatch_size_schedule([256], epoch_size=0), "epoch_size"),
        (lambda: C.momentum_as_time_constant_schedule(-1), "values"),
    ],
)
def test_aliases_validate(make, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        make()


def test_minibatch_size_schedule_list_is_per_sample_by_default_as_in_cntk():
    # CNTK's minibatch_size_schedule(schedule, epoch_size=1): one list entry per SAMPLE. [32, 64, 128] gives the
    # minibatch drawn at sample 0 the size 32 and every later one (drawn at sample 32, 160, ...) 128.
    sizes = C.minibatch_size_schedule([32, 64, 128])
    assert [sizes.value(samples, index) for index, samples in enumerate((0, 32, 160))] == [32, 128, 128]
    assert sizes == minibatch_size([32, 64, 128], epoch_size=1)
    # CNTK's own docstring examples.
    s = C.minibatch_size_schedule([32, 64], 1000)
    assert (s[0], s[1], s[1000], s[1001]) == (32, 32, 64, 64)
    s = C.minibatch_size_schedule([(12, 32), (15, 64), (1, 128)], 100)
    assert (s[0], s[1199], s[1200], s[2699], s[2700], s[5000]) == (32, 32, 64, 64, 128, 128)
    # epoch_size=None keeps kfit's per-minibatch reading.
    assert C.minibatch_size_schedule([32, 64, 128], epoch_size=None) == minibatch_size([32, 64, 128])


def test_minibatch_size_schedule_trains_the_minibatches_cntk_draws():
    import keras
    import numpy as np

    import kfit

    class Sizes(kfit.callbacks.KfitCallback):
        default_name = "sizes"

        def __init__(self):
            super().__init__()
            self.sizes = []

        def on_step_end(self, clock, logs):
            self.sizes.append(clock.minibatch_size)

    x = np.arange(40, dtype="float32").reshape(20, 2) / 40
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    sizes = Sizes()
    kfit.fit(model, x, y, minibatch_size=C.minibatch_size_schedule([2, 3, 8]), epochs=1, callbacks=[sizes], verbose=0)
    assert sizes.sizes == [2, 8, 8, 2]  # samples 0-1, then 8 from sample 2 on, the last cut at the epoch's end


@pytest.mark.parametrize(
    "make",
    [
        lambda: C.minibatch_size_schedule([256, 512], C.FULL_DATA_SWEEP),
        lambda: C.learning_parameter_schedule_per_sample([0.1, 0.01], epoch_size=C.FULL_DATA_SWEEP),
        lambda: C.learning_parameter_schedule([0.1, 0.01], 32, C.FULL_DATA_SWEEP),
        lambda: C.learning_rate_schedule([0.1, 0.01], C.UnitType.sample, C.FULL_DATA_SWEEP),
        lambda: C.training_parameter_schedule([0.1, 0.01], epoch_size=C.FULL_DATA_SWEEP),
        lambda: C.momentum_as_time_constant_schedule([0, 1024], C.FULL_DATA_SWEEP),
        lambda: C.momentum_schedule_per_sample([0.9, 0.99], C.FULL_DATA_SWEEP),
        lambda: C.momentum_schedule([0.9, 0.99], C.FULL_DATA_SWEEP),
        # kfit's own schedules, which docs/migrating-from-cntk.md gives as the same functions
        lambda: learning_rate_per_sample([0.1, 0.01], epoch_size=C.FULL_DATA_SWEEP),
        lambda: momentum_as_time_constant([0, 1024], C.FULL_DATA_SWEEP),
        lambda: minibatch_size([256, 512], C.FULL_DATA_SWEEP),
        lambda: as_schedule([0.1, 0.01], C.FULL_DATA_SWEEP),
    ],
)
def test_full_data_sweep_as_epoch_size_is_refused_saying_what_to_pass(make):
    assert repr(C.FULL_DATA_SWEEP) == "FULL_DATA_SWEEP" and "FULL_DATA_SWEEP" in C.__all__
    with pytest.raises(ValueError, match=r"`epoch_size`.*FULL_DATA_SWEEP.*epoch_size=len\(x_train\).*Received: epoch_size=FULL_DATA_SWEEP"):
        make()


def test_cntk_frequency_pairs_with_a_data_unit():
    """CNTK 2.7's CheckpointConfig/CrossValidationConfig(frequency=(n, DataUnit.x))."""
    import numpy as np

    import kfit
    from kfit.interval import Interval

    data = (np.zeros((10, 3), "float32"), np.zeros((10,), "int64"))
    cv = kfit.callbacks.CrossValidation(data, (5, C.DataUnit.minibatch))
    assert cv.interval == Interval(5, "mb")
    checkpoint = kfit.callbacks.Checkpoint("unused.ckpt", (3000, C.DataUnit.sample))
    assert (checkpoint.interval, checkpoint.frequency) == (Interval(3000, "sp"), 3000)
    with pytest.raises(ValueError, match=r"`frequency`: CNTK's DataUnit.sweep.*frequency='2ep'.*Received: frequency=\(2, "):
        kfit.callbacks.CrossValidation(data, (2, C.DataUnit.sweep))
    with pytest.raises(ValueError, match=r"`frequency`"):
        kfit.callbacks.CrossValidation(data, (0, C.DataUnit.sample))


def _tiny_classifier():
    import keras

    import kfit

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer=kfit.optimizers.MomentumSGD(0.05), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _tiny_data():
    import numpy as np

    x = np.random.default_rng(0).normal(size=(48, 4)).astype("float32")
    return x, x[:, :3].argmax(axis=1)


def test_function_train_keywords_and_misspelt_ones_in_kfit_fit_say_what_to_write():
    """CNTK's Function.train(..., max_epochs=5, parameter_learners=[learner]) ported to kfit.fit: a TypeError that
    names the keyword and says what to write; a misspelt keyword gets the closest argument's name."""
    import kfit

    model, (x, y) = _tiny_classifier(), _tiny_data()
    for keywords, match in [
        ({"max_epochs": 5}, r"`max_epochs`: CNTK's Function.train name of `epochs`: give epochs=5\. Received: max_epochs=5"),
        ({"parameter_learners": ["learner"]}, r"`parameter_learners`.*model.compile\(optimizer=.*MomentumSGD.*"
                                              r"LearningRateSchedule.*Received: parameter_learners=\['learner'\]"),
        ({"progress_frequency": 10}, r"`progress_frequency`.*ProgressPrinter\(freq\)"),
        ({"epoch": 2}, r"unexpected keyword argument `epoch`: did you mean `epochs`\? Received: epoch=2"),
        ({"minibatchsize": 16}, r"did you mean `minibatch_size`\?"),
        ({"zzz": 1}, r"`zzz`: kfit.fit takes model.fit's arguments and `minibatch_size`, `epoch_size`.*Received: zzz=1"),
    ]:
        with pytest.raises(TypeError, match=match):
            kfit.fit(model, x, y, verbose=0, **keywords)
    assert kfit.get_clock(model) is None or kfit.get_clock(model).samples == 0  # refused before training


def test_epoch_summaries_have_cntks_loss_metric_and_samples():
    """The CNTK guide reads progress.epoch_summaries[-1].loss, .metric and .samples after Function.train; the metric
    is CNTK's error: 1 - accuracy."""
    import kfit

    model, (x, y) = _tiny_classifier(), _tiny_data()
    history = kfit.fit(model, x, y, minibatch_size=16, epochs=2, verbose=0)
    summaries = history.epoch_summaries
    assert [s.samples for s in summaries] == [48, 48]
    assert [s.loss for s in summaries] == pytest.approx(history.history["loss"])
    assert [s.metric for s in summaries] == pytest.approx([1 - a for a in history.history["accuracy"]])
    assert kfit.training.EpochSummary(0, 1.0, {"val_accuracy": 0.5, "lr": 0.1}).metric is None  # no training metric
    assert kfit.training.EpochSummary(0, 1.0, {"lr": 0.1, "mae": 0.25}).metric == 0.25  # other metrics as they are


def test_momentum_sgd_says_how_a_cntk_learner_is_written_in_kfit():
    with pytest.raises(TypeError, match=r"MomentumSGD\(unit_gain=False\).*LearningRateSchedule\(lr\).*MomentumSchedule"
                                        r"\(momentum\).*CNTK's l2_regularization_weight: see kfit.optimizers.MomentumSGD"):
        C.momentum_sgd([], C.learning_parameter_schedule(0.1), C.momentum_schedule(0.9), unit_gain=False,
                       l2_regularization_weight=0.01)


def test_the_guide_gives_checkpoint_configs_arguments_in_cntks_order():
    """docs/migrating-from-cntk.md named ``CheckpointConfig(filename, frequency, preserve_all, restore)``; CNTK's order
    is ``(filename, frequency, restore, preserve_all)`` (cntk/train/training_session.py), the one Checkpoint's refusal
    of a positional port names. What the guide writes for kfit (by keyword) keeps both meanings."""
    from pathlib import Path

    import kfit

    guide = (Path(__file__).parent.parent / "docs" / "migrating-from-cntk.md").read_text()
    assert "| `CheckpointConfig(filename, frequency, restore, preserve_all)` |" in guide
    assert "`kfit.callbacks.Checkpoint(path, frequency, restore=..., preserve_all=...)`" in guide
    with pytest.raises(ValueError, match=r"CheckpointConfig\(filename, frequency, restore, preserve_all\)"):
        kfit.callbacks.Checkpoint("model_mn.cmf", 60000, False, True)  # CNTK: restore=False, preserve_all=True
    ported = kfit.callbacks.Checkpoint("model_mn.cmf", 60000, restore=False, preserve_all=True)
    assert (ported.restore, ported.preserve_all) == (False, True)


@pytest.mark.parametrize("learner, optimizer, said", [
    (lambda: C.sgd([], C.learning_rate_schedule(0.1, C.UnitType.minibatch)), "kfit.optimizers.MomentumSGD(momentum=0.0)",
     r"LearningRateSchedule\(lr\)\]"),
    (lambda: C.nesterov([], 0.1, 0.9, unit_gain=False), "kfit.optimizers.MomentumSGD(nesterov=True, unit_gain=False)",
     r"MomentumSchedule\(momentum\)"),
    (lambda: C.adam([], 0.1, 0.9, variance_momentum=0.9999986111120757, l2_regularization_weight=0.01),
     "kfit.optimizers.Adam(variant='cntk', unit_gain=True, epsilon=1e-08)",
     r"sets beta_1.*beta_2=m_s, beta_2_minibatch_size=1.*CNTK's l2_regularization_weight: see kfit.optimizers.Adam"),
    (lambda: C.adam([], 0.1, 0.9, unit_gain=False), "kfit.optimizers.Adam(variant='cntk', unit_gain=False, epsilon=1e-08, "
     "beta_2=0.9999986111120757, beta_2_minibatch_size=1)", r"MomentumSchedule\(momentum\) \(it sets beta_1\)"),
])
def test_cntks_other_learners_say_what_to_write(learner, optimizer, said):
    """The CNTK guide's cntk.sgd (sections 5 and 6) and the migration guide's nesterov and adam were missing from
    kfit.cntk (AttributeError after changing the imports); like momentum_sgd they raise a TypeError that writes the
    kfit lines, and the optimizer it writes is one kfit builds."""
    import kfit

    with pytest.raises(TypeError, match=r"model\.compile\(optimizer=" + re.escape(optimizer) + ".*" + said) as raised:
        learner()
    written = re.search(r"optimizer=(.*?), loss=", str(raised.value)).group(1)
    assert isinstance(eval(written, {"kfit": kfit}), keras.optimizers.Optimizer)
