"""Schedules: forms, shapes, units, validation and configuration round trips (backend-independent)."""

import json
import math

import numpy as np
import pytest

from kfit import schedules as ks
from kfit.schedules import (
    HyperparameterSchedule,
    as_schedule,
    constant,
    cosine_decay,
    exponential_decay,
    from_config,
    join,
    learning_rate_per_minibatch,
    learning_rate_per_sample,
    linear_warmup,
    minibatch_size,
    momentum_as_time_constant,
    momentum_per_minibatch,
    momentum_per_sample,
    piecewise_constant,
    step_decay,
    warmup_cosine,
)

CNTK_PER_SAMPLE_MOMENTUM_1024 = 0.9990239141819757  # what CNTK printed for a time constant of 1024


@pytest.fixture(autouse=True)
def _seeded():
    """Overrides the shared Keras reset (about 0.4 s a test): these tests touch no backend state."""
    yield


# --------------------------------------------------------------------------------------------------------
# Forms: values at and around every boundary.

LIST = as_schedule([0.3, 0.2, 0.1], epoch_size=100)
PAIRS = as_schedule([(2, 0.3), (3, 0.2), (1, 0.1)], epoch_size=100)
PIECEWISE = piecewise_constant([100, 250], [3.0, 2.0, 1.0])


@pytest.mark.parametrize(
    ("schedule", "samples", "expected"),
    [
        (LIST, 0, 0.3),
        (LIST, 99, 0.3),
        (LIST, 100, 0.2),
        (LIST, 101, 0.2),
        (LIST, 199, 0.2),
        (LIST, 200, 0.1),
        (LIST, 201, 0.1),
        (LIST, 10**12, 0.1),
        (PAIRS, 0, 0.3),
        (PAIRS, 199, 0.3),
        (PAIRS, 200, 0.2),
        (PAIRS, 201, 0.2),
        (PAIRS, 499, 0.2),
        (PAIRS, 500, 0.1),
        (PAIRS, 501, 0.1),
        (PAIRS, 10**12, 0.1),
        (PIECEWISE, 0, 3.0),
        (PIECEWISE, 99, 3.0),
        (PIECEWISE, 100, 2.0),
        (PIECEWISE, 101, 2.0),
        (PIECEWISE, 249, 2.0),
        (PIECEWISE, 250, 1.0),
        (PIECEWISE, 251, 1.0),
    ],
)
def test_sample_forms_at_boundaries(schedule, samples, expected):
    assert schedule(samples) == expected
    assert schedule(samples, minibatches=12345) == expected  # a sample schedule ignores the minibatch count
    assert schedule.per_minibatch is False


PER_MINIBATCH = as_schedule([0.5, 0.25, 0.125])
PER_MINIBATCH_PAIRS = as_schedule([(2, 1.0), (3, 2.0), (1, 3.0)])


@pytest.mark.parametrize(
    ("schedule", "minibatches", "expected"),
    [
        (PER_MINIBATCH, 0, 0.5),
        (PER_MINIBATCH, 1, 0.25),
        (PER_MINIBATCH, 2, 0.125),
        (PER_MINIBATCH, 3, 0.125),
        (PER_MINIBATCH, 10**9, 0.125),
        (PER_MINIBATCH_PAIRS, 0, 1.0),
        (PER_MINIBATCH_PAIRS, 1, 1.0),
        (PER_MINIBATCH_PAIRS, 2, 2.0),
        (PER_MINIBATCH_PAIRS, 4, 2.0),
        (PER_MINIBATCH_PAIRS, 5, 3.0),
        (PER_MINIBATCH_PAIRS, 6, 3.0),
    ],
)
def test_per_minibatch_lists_follow_the_minibatch_count(schedule, minibatches, expected):
    assert schedule.per_minibatch is True
    assert schedule(0, minibatches) == expected
    assert schedule(10**6, minibatches) == expected  # the sample count is not read


def test_list_forms_equal_their_piecewise_constant():
    assert as_schedule([1.0] * 3 + [2.0] * 2 + [3.0], epoch_size=10) == piecewise_constant(
        [30, 50], [1.0, 2.0, 3.0]
    )
    assert as_schedule([(3, 1.0), (2, 2.0), (7, 3.0)], epoch_size=10) == piecewise_constant(
        [30, 50], [1.0, 2.0, 3.0]
    )
    assert as_schedule((0.1, 0.2), epoch_size=5) == as_schedule(np.array([0.1, 0.2]), epoch_size=5)
    assert as_schedule([[2, 0.1], [1, 0.2]], epoch_size=5) == as_schedule([(2, 0.1), (1, 0.2)], epoch_size=5)


def test_the_last_pair_may_have_a_count_of_zero_as_cntk_writes_it():
    # CNTK's momentum_schedule docstring: [(999, 0.99), (888, 0.88), (0, 0.77)]; the last count is never read.
    per_minibatch = as_schedule([(999, 0.99), (888, 0.88), (0, 0.77)])
    assert [per_minibatch(0, m) for m in (0, 998, 999, 999 + 888 - 1, 999 + 888, 10**6)] == [
        0.99, 0.99, 0.88, 0.88, 0.77, 0.77]
    assert as_schedule([(2, 0.1), (0, 0.01)], epoch_size=100) == piecewise_constant([200], [0.1, 0.01])
    with pytest.raises(ValueError, match=r"entry 0 is \(0, 0.1\)"):
        as_schedule([(0, 0.1), (1, 0.2)], epoch_size=10)  # only the last count may be 0
    with pytest.raises(ValueError, match=r"entry 1 is \(-1, 0.2\)"):
        as_schedule([(1, 0.1), (-1, 0.2)], epoch_size=10)


def test_scalar_schedule_and_callable_forms():
    s = ks.Schedule  # the base class is public
    existing = cosine_decay(1.0, 10)
    assert isinstance(as_schedule(0.5), s)
    assert as_schedule(0.5)(10**9) == 0.5
    assert as_schedule(3)(7) == 3.0
    assert as_schedule(existing) is existing
    assert as_schedule(0.5, epoch_size=100) == constant(0.5)  # epoch_size is used by lists only

    fn = as_schedule(lambda samples: 1.0 / (1 + samples))
    assert fn.per_minibatch is False
    assert fn(0) == 1.0
    assert fn(3) == 0.25


def test_schedules_are_pure():
    schedule = join([linear_warmup(0.0, 1.0, 100), cosine_decay(1.0, 1000)], [100])
    clock = [0, 5000, 37, 100, 99, 1100, 37, 600, 0]
    first = [schedule(s) for s in clock]
    assert [schedule(s) for s in reversed(clock)] == list(reversed(first))
    assert first[2] == first[6]


def test_clock_must_be_non_negative():
    with pytest.raises(ValueError, match="`samples`"):
        LIST(-1)
    with pytest.raises(ValueError, match="`minibatches`"):
        PER_MINIBATCH(0, -1)


# --------------------------------------------------------------------------------------------------------
# Shapes against their closed forms.


def _cosine(init, decay, alpha, s):
    return init * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * min(s, decay) / decay)) + alpha)


@pytest.mark.parametrize(
    ("schedule", "formula"),
    [
        (constant(0.25), lambda s: 0.25),
        (linear_warmup(0.0, 0.1, 1000), lambda s: 0.1 * min(s, 1000) / 1000),
        (linear_warmup(1.0, 0.5, 300), lambda s: 1.0 + (0.5 - 1.0) * min(s, 300) / 300),
        (cosine_decay(0.1, 1000), lambda s: _cosine(0.1, 1000, 0.0, s)),
        (cosine_decay(2.0, 500, alpha=0.1), lambda s: _cosine(2.0, 500, 0.1, s)),
        (exponential_decay(1.0, 0.5, 100), lambda s: 0.5 ** (s / 100)),
        (exponential_decay(0.2, 0.9, 250, staircase=True), lambda s: 0.2 * 0.9 ** math.floor(s / 250)),
        (step_decay(0.1, 0.5, 1000), lambda s: 0.1 * 0.5 ** math.floor(s / 1000)),
    ],
    ids=["constant", "warmup_up", "warmup_down", "cosine", "cosine_alpha", "exp", "exp_staircase", "step"],
)
@pytest.mark.parametrize(
    "samples", [0, 1, 99, 100, 101, 249, 250, 251, 299, 300, 301, 500, 999, 1000, 1001, 10**6]
)
def test_shapes_match_closed_forms(schedule, formula, samples):
    assert schedule(samples) == pytest.approx(formula(samples), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    ("samples", "expected"),
    [(0, 0.1), (999, 0.1), (1000, 0.05), (1001, 0.05), (1999, 0.05), (2000, 0.025), (2001, 0.025)],
)
def test_step_decay_at_its_steps(samples, expected):
    assert step_decay(0.1, 0.5, 1000)(samples) == expected


def test_shapes_reach_their_end_values_exactly():
    assert linear_warmup(0.0, 0.1, 1000)(1000) == 0.1
    assert cosine_decay(0.1, 1000)(1000) == 0.0
    assert cosine_decay(0.1, 1000)(0) == 0.1
    assert exponential_decay(1.0, 0.5, 100)(0) == 1.0


JOINED = join([linear_warmup(0.0, 1.0, 100), constant(0.5), step_decay(0.5, 0.1, 50)], [100, 300])


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        (0, 0.0),
        (50, 0.5),
        (99, 0.99),
        (100, 0.5),
        (101, 0.5),
        (299, 0.5),
        (300, 0.5),  # the step decay sees S - 300 = 0
        (349, 0.5),
        (350, 0.05),
        (351, 0.05),
    ],
)
def test_join_offsets_each_schedule_by_its_boundary(samples, expected):
    assert JOINED(samples) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("samples", [0, 1, 50, 99, 100, 101, 600, 1099, 1100, 1101, 5000])
def test_warmup_cosine(samples):
    s = warmup_cosine(0.1, 1.0, warmup_samples=100, decay_samples=1100, end_value=0.2)
    if samples < 100:
        expected = 0.1 + 0.9 * samples / 100
    else:
        expected = _cosine(1.0, 1000, 0.2, samples - 100)
    assert s(samples) == pytest.approx(expected, rel=1e-12)
    assert isinstance(s, ks.Join)


# --------------------------------------------------------------------------------------------------------
# Bad arguments: ValueError naming the argument.


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: as_schedule([]), "values"),
        (lambda: as_schedule([0.1, float("nan")], epoch_size=10), "values"),
        (lambda: as_schedule([0.1, float("inf")], epoch_size=10), "values"),
        (lambda: as_schedule(float("nan")), "values"),
        (lambda: as_schedule(float("-inf")), "values"),
        (lambda: as_schedule([0.1, "0.2"], epoch_size=10), "values"),
        (lambda: as_schedule([0.1, True], epoch_size=10), "values"),
        (lambda: as_schedule([0.1], epoch_size=0), "epoch_size"),
        (lambda: as_schedule([0.1], epoch_size=-100), "epoch_size"),
        (lambda: as_schedule([0.1], epoch_size=2.5), "epoch_size"),
        (lambda: as_schedule([0.1], epoch_size=100.0), "epoch_size"),
        (lambda: as_schedule([0.1], epoch_size="100"), "epoch_size"),
        (lambda: as_schedule(0.1, epoch_size=0), "epoch_size"),
        (lambda: as_schedule([(0, 0.1), (1, 0.2)], epoch_size=10), "values"),
        (lambda: as_schedule([(-1, 0.1)], epoch_size=10), "values"),
        (lambda: as_schedule([(1.5, 0.1)], epoch_size=10), "values"),
        (lambda: as_schedule([(1,)], epoch_size=10), "values"),
        (lambda: as_schedule([(1, 0.1, 2)], epoch_size=10), "values"),
        (lambda: as_schedule([(1, float("nan"))], epoch_size=10), "values"),
        (lambda: as_schedule([(2, 0.1), 0.2], epoch_size=10), "values"),
        (lambda: as_schedule([0.2, (2, 0.1)], epoch_size=10), "values"),
        (lambda: as_schedule([], name="lr"), "lr"),
        (lambda: as_schedule(np.zeros((2, 2))), "values"),
        (lambda: piecewise_constant([100, 200], [1.0, 2.0]), "values"),
        (lambda: piecewise_constant([100], [1.0, 2.0, 3.0]), "values"),
        (lambda: piecewise_constant([200, 100], [1.0, 2.0, 3.0]), "boundaries"),
        (lambda: piecewise_constant([100, 100], [1.0, 2.0, 3.0]), "boundaries"),
        (lambda: piecewise_constant([0, 100], [1.0, 2.0, 3.0]), "boundaries"),
        (lambda: piecewise_constant([10.5], [1.0, 2.0]), "boundaries"),
        (lambda: piecewise_constant([10], [1.0, float("nan")]), "values"),
        (lambda: constant(float("nan")), "value"),
        (lambda: linear_warmup(0.0, 1.0, 0), "warmup_samples"),
        (lambda: linear_warmup(float("inf"), 1.0, 10), "init_value"),
        (lambda: linear_warmup(0.0, float("nan"), 10), "end_value"),
        (lambda: cosine_decay(0.1, 0), "decay_samples"),
        (lambda: cosine_decay(0.1, -5), "decay_samples"),
        (lambda: cosine_decay(0.1, 1.5), "decay_samples"),
        (lambda: cosine_decay(0.1, 10, alpha=float("nan")), "alpha"),
        (lambda: exponential_decay(0.1, 0.0, 10), "decay_rate"),
        (lambda: exponential_decay(0.1, -0.5, 10), "decay_rate"),
        (lambda: exponential_decay(0.1, 0.5, 0), "decay_samples"),
        (lambda: exponential_decay(0.1, 0.5, 10, staircase="yes"), "staircase"),
        (lambda: step_decay(0.1, 0.0, 10), "factor"),
        (lambda: step_decay(0.1, 0.5, 0), "step_samples"),
        (lambda: join([constant(1.0), constant(2.0)], [10, 20]), "schedules"),
        (lambda: join([constant(1.0)], [10]), "schedules"),
        (lambda: join([], []), "schedules"),
        (lambda: join([1.0, 2.0, 3.0], [20, 10]), "boundaries"),
        (lambda: join([1.0, 2.0], [0]), "boundaries"),
        (lambda: join([as_schedule([1.0, 2.0]), constant(1.0)], [10]), "schedules"),
        (lambda: warmup_cosine(0.0, 1.0, 100, 100), "decay_samples"),
        (lambda: warmup_cosine(0.0, 1.0, 0, 100), "warmup_samples"),
        (lambda: warmup_cosine(0.0, 0.0, 10, 100, end_value=0.1), "peak_value"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(make, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        make()


def test_errors_echo_the_value():
    with pytest.raises(ValueError, match=r"Received: epoch_size=0$"):
        as_schedule([0.1], epoch_size=0)
    with pytest.raises(ValueError, match=r"len\(values\)=2, len\(boundaries\)=2"):
        piecewise_constant([100, 200], [1.0, 2.0])
    with pytest.raises(ValueError, match=r"len\(schedules\)=2, len\(boundaries\)=2"):
        join([1.0, 2.0], [10, 20])


def test_values_of_no_accepted_form_raise_type_error():
    with pytest.raises(TypeError, match="`values`"):
        as_schedule("0.1")
    with pytest.raises(TypeError, match="`values`"):
        as_schedule({"lr": 0.1})


def test_a_callable_is_checked_when_called():
    schedule = as_schedule(lambda s: float("nan") if s > 10 else 0.1, name="my_lr")
    assert schedule(10) == 0.1
    with pytest.raises(ValueError, match="`my_lr`.*samples=11"):
        schedule(11)


# --------------------------------------------------------------------------------------------------------
# Units: what a minibatch of B samples uses.

B_VALUES = [1, 2, 32, 256, 1000]


@pytest.mark.parametrize("b", B_VALUES)
def test_learning_rate_per_sample_scales_with_b(b):
    assert learning_rate_per_sample(0.001).for_minibatch(0, 0, b) == 0.001 * b


@pytest.mark.parametrize("b", B_VALUES)
def test_learning_rate_per_minibatch(b):
    assert learning_rate_per_minibatch(0.1).for_minibatch(0, 0, b) == 0.1
    assert (
        learning_rate_per_minibatch(0.1, reference_minibatch_size=32).for_minibatch(0, 0, b) == 0.1 * b / 32
    )


@pytest.mark.parametrize("b", B_VALUES)
def test_momentum_as_time_constant(b):
    m = momentum_as_time_constant(1024)
    assert m.for_minibatch(0, 0, b) == math.exp(-b / 1024)
    assert m.per_sample_momentum(0) == CNTK_PER_SAMPLE_MOMENTUM_1024
    no_momentum = momentum_as_time_constant(0)
    assert no_momentum.for_minibatch(0, 0, b) == 0.0
    assert no_momentum.per_sample_momentum(0) == 0.0


@pytest.mark.parametrize("b", B_VALUES)
def test_momentum_per_sample_is_raised_to_b(b):
    m = momentum_per_sample(0.999)
    assert m.for_minibatch(0, 0, b) == 0.999**b
    assert m.per_sample_momentum(0) == 0.999


@pytest.mark.parametrize("b", B_VALUES)
def test_momentum_per_minibatch(b):
    assert momentum_per_minibatch(0.9).for_minibatch(0, 0, b) == 0.9
    with_reference = momentum_per_minibatch(0.9, reference_minibatch_size=64)
    assert with_reference.for_minibatch(0, 0, b) == 0.9 ** (b / 64)
    assert with_reference.for_minibatch(0, 0, 64) == 0.9
    assert with_reference.per_sample_momentum(0) == 0.9 ** (1 / 64)


@pytest.mark.parametrize("b", B_VALUES)
def test_minibatch_size_ignores_b_and_returns_ints(b):
    mb = minibatch_size([256, 512.0], epoch_size=100)
    assert mb.for_minibatch(0, 0, b) == 256
    assert mb.for_minibatch(100, 1, b) == 512
    assert type(mb.for_minibatch(100, 1, b)) is int
    assert type(mb.value(0)) is int


def test_the_cntk_time_constant_value():
    assert momentum_as_time_constant(1024).per_sample_momentum(0) == 0.9990239141819757


def test_units_read_the_clock_of_their_schedule():
    lr = learning_rate_per_sample([0.001, 0.0005], epoch_size=100)
    assert (lr.value(99), lr.value(100), lr[99], lr[100]) == (0.001, 0.0005, 0.001, 0.0005)
    assert lr.for_minibatch(100, 1, 10) == 0.0005 * 10
    per_minibatch = learning_rate_per_sample([0.001, 0.0005])
    assert (per_minibatch[0], per_minibatch[1]) == (0.001, 0.0005)  # [] counts minibatches here
    assert per_minibatch.for_minibatch(10**6, 0, 10) == 0.001 * 10


@pytest.mark.parametrize(
    ("kind", "unit", "reference", "old", "new"),
    [
        ("learning_rate", "per_sample", None, 0.1, [0.05, 0.01]),
        ("learning_rate", "per_minibatch", 32, 0.1, [0.05, 0.01]),
        ("momentum", "time_constant", None, 1024, [512, 0]),
        ("momentum", "per_sample", None, 0.999, [0.99, 0.9]),
        ("momentum", "per_minibatch", 16, 0.9, [0.5, 0.25]),
        ("minibatch_size", "samples", None, 64, [128, 256]),
    ],
)
def test_with_schedule_keeps_kind_unit_and_reference(kind, unit, reference, old, new):
    original = HyperparameterSchedule(kind, unit, constant(old), reference)
    changed = original.with_schedule(new, epoch_size=10)
    assert (changed.kind, changed.unit, changed.reference_minibatch_size) == (kind, unit, reference)
    assert changed.schedule == piecewise_constant([10], new)
    assert original.schedule == constant(old)
    assert original.with_schedule(old) == original


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: learning_rate_per_sample(-0.1), "values"),
        (lambda: learning_rate_per_sample([0.1, -0.1], epoch_size=10), "values"),
        (lambda: learning_rate_per_sample([(2, 0.1), (1, -0.1)], epoch_size=10), "values"),
        (lambda: learning_rate_per_sample(float("nan")), "values"),
        (lambda: learning_rate_per_sample([0.1], epoch_size=0), "epoch_size"),
        (lambda: learning_rate_per_sample(linear_warmup(-1.0, 0.1, 10)), "values"),
        (lambda: learning_rate_per_minibatch(-0.1), "values"),
        (lambda: learning_rate_per_minibatch(0.1, reference_minibatch_size=0), "reference_minibatch_size"),
        (lambda: learning_rate_per_minibatch(0.1, reference_minibatch_size=1.5), "reference_minibatch_size"),
        (lambda: momentum_as_time_constant(-1), "values"),
        (lambda: momentum_as_time_constant(float("inf")), "values"),
        (lambda: momentum_as_time_constant([0, -5], epoch_size=10), "values"),
        (lambda: momentum_per_sample(1.0), "values"),
        (lambda: momentum_per_sample(-0.1), "values"),
        (lambda: momentum_per_sample([0.9, 1.5], epoch_size=10), "values"),
        (lambda: momentum_per_minibatch(1.0), "values"),
        (lambda: momentum_per_minibatch(0.9, reference_minibatch_size=-2), "reference_minibatch_size"),
        (lambda: minibatch_size(0), "values"),
        (lambda: minibatch_size(-32), "values"),
        (lambda: minibatch_size(2.5), "values"),
        (lambda: minibatch_size([256, 300.5], epoch_size=10), "values"),
        (lambda: minibatch_size([256], epoch_size=1.5), "epoch_size"),
        (lambda: HyperparameterSchedule("lr", "per_sample", constant(0.1)), "kind"),
        (lambda: HyperparameterSchedule("momentum", "samples", constant(0.1)), "unit"),
        (
            lambda: HyperparameterSchedule("learning_rate", "per_sample", constant(0.1), 32),
            "reference_minibatch_size",
        ),
        (lambda: HyperparameterSchedule("momentum", "per_sample", constant(1.5)), "schedule"),
        (lambda: learning_rate_per_sample(0.1).for_minibatch(0, 0, 0), "minibatch_size"),
        (lambda: learning_rate_per_sample(0.1).for_minibatch(0, 0, 2.0), "minibatch_size"),
    ],
)
def test_unit_factories_reject_out_of_range_values(make, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        make()


def test_unit_constructor_needs_a_schedule():
    with pytest.raises(TypeError, match="`schedule`"):
        HyperparameterSchedule("learning_rate", "per_sample", 0.1)


@pytest.mark.parametrize(
    ("make", "bad_at"),
    [
        (lambda: learning_rate_per_sample(lambda s: 0.1 - s / 100), 11),
        (lambda: momentum_per_sample(lambda s: 0.9 + s / 100), 10),
        (lambda: momentum_as_time_constant(lambda s: math.inf if s else 1.0), 1),
        (lambda: minibatch_size(lambda s: 256 + s / 2), 1),
        (lambda: momentum_per_minibatch(exponential_decay(0.5, 2.0, 100)), 100),
    ],
)
def test_values_from_callables_and_shapes_are_checked_when_read(make, bad_at):
    schedule = make()
    schedule.value(bad_at - 1)
    with pytest.raises(ValueError, match=f"returned an invalid value at samples={bad_at}"):
        schedule.value(bad_at)
    with pytest.raises(ValueError, match="invalid value"):
        schedule.for_minibatch(bad_at, 0, 8)


def test_per_sample_momentum_needs_a_momentum_with_a_per_sample_meaning():
    with pytest.raises(ValueError, match="momentum schedules only"):
        learning_rate_per_sample(0.1).per_sample_momentum(0)
    with pytest.raises(ValueError, match="reference_minibatch_size"):
        momentum_per_minibatch(0.9).per_sample_momentum(0)


# --------------------------------------------------------------------------------------------------------
# Configuration round trips.

ROUND_TRIP = [
    constant(0.1),
    constant(3),
    LIST,
    PAIRS,
    PER_MINIBATCH,
    PIECEWISE,
    linear_warmup(0.0, 0.1, 1000),
    cosine_decay(0.1, 1000, alpha=0.05),
    exponential_decay(1.0, 0.5, 100, staircase=True),
    step_decay(0.1, 0.5, 1000),
    JOINED,
    warmup_cosine(0.0, 1.0, 100, 1100),
    join([JOINED, constant(0.0)], [10**6]),
    learning_rate_per_sample([0.001] * 12 + [0.0005], epoch_size=100),
    learning_rate_per_minibatch(0.1, reference_minibatch_size=32),
    learning_rate_per_minibatch(cosine_decay(0.1, 1000)),
    momentum_as_time_constant([0] * 5 + [1024], epoch_size=100),
    momentum_per_sample(0.999),
    momentum_per_minibatch([0.9, 0.99], reference_minibatch_size=64),
    minibatch_size([256] * 6 + [512], epoch_size=100),
]


@pytest.mark.parametrize("schedule", ROUND_TRIP, ids=repr)
def test_get_config_round_trips_through_json(schedule):
    config = json.loads(json.dumps(schedule.get_config()))
    rebuilt = from_config(config)
    assert rebuilt == schedule
    assert type(rebuilt) is type(schedule)
    assert hash(rebuilt) == hash(schedule)
    assert rebuilt.get_config() == config
    assert repr(rebuilt) == repr(schedule)
    assert type(schedule).__name__ in repr(schedule)
    for samples in [0, 1, 99, 100, 101, 600, 1099, 1100, 10**7]:
        if isinstance(schedule, HyperparameterSchedule):
            assert rebuilt.for_minibatch(samples, samples, 64) == schedule.for_minibatch(samples, samples, 64)
        else:
            assert rebuilt(samples, samples) == schedule(samples, samples)


def test_different_schedules_are_not_equal():
    assert constant(0.1) != constant(0.2)
    assert linear_warmup(0.0, 0.1, 10) != linear_warmup(0.0, 0.1, 11)
    assert learning_rate_per_sample(0.1) != learning_rate_per_minibatch(0.1)
    assert as_schedule([0.1, 0.2]) != as_schedule([0.1, 0.2], epoch_size=1)  # per minibatch vs per sample


@pytest.mark.parametrize(
    "config",
    [
        {"type": "no_such_schedule", "value": 1.0},
        {"value": 1.0},
        {"type": None},
        {"type": "constant", "value": 1.0, "extra": 2},
        {"type": "constant"},
        {"type": "join", "schedules": [{"type": "eval", "code": "1"}], "boundaries": []},
        {
            "type": "hyperparameter_schedule",
            "kind": "learning_rate",
            "unit": "per_sample",
            "schedule": {"type": "x"},
        },
    ],
)
def test_from_config_rejects_unknown_or_malformed_configs(config):
    with pytest.raises(ValueError, match="`config`"):
        from_config(config)


def test_from_config_validates_values():
    with pytest.raises(ValueError, match="`decay_samples`"):
        from_config({"type": "cosine_decay", "init_value": 0.1, "decay_samples": 0, "alpha": 0.0})
    config = {"type": "hyperparameter_schedule", "kind": "momentum", "unit": "per_sample"}
    with pytest.raises(ValueError, match="`schedule`"):
        from_config(
            {**config, "schedule": {"type": "constant", "value": 1.0}, "reference_minibatch_size": None}
        )
    with pytest.raises(TypeError, match="`config`"):
        from_config("constant")


def test_callable_schedules_cannot_be_serialized():
    fn = as_schedule(lambda s: 0.1)
    with pytest.raises(TypeError, match="built from a Python callable cannot be serialized"):
        fn.get_config()
    with pytest.raises(TypeError, match="built from a Python callable cannot be serialized"):
        join([fn, constant(0.0)], [10]).get_config()
    with pytest.raises(TypeError, match="built from a Python callable cannot be serialized"):
        learning_rate_per_sample(fn).get_config()
    assert "FromCallable" in repr(fn)


@pytest.mark.parametrize("schedule", [
    as_schedule([0.1, 0.05, 0.01], epoch_size=30),
    as_schedule([0.1, 0.1, 0.05, 0.05, 0.05, 0.01]),  # per minibatch (no epoch_size)
    as_schedule(0.3),
    cosine_decay(1.0, 50),
])
def test_a_value_holds_as_far_as_holds_until_says_and_changes_there(schedule):
    for samples, minibatches in [(0, 0), (29, 3), (30, 1), (55, 2), (61, 7), (200, 40)]:
        value = schedule(samples, minibatches)
        until_s, until_m = schedule.holds_until(samples, minibatches)
        assert until_s > samples and until_m > minibatches
        for s in range(samples, int(min(until_s, samples + 100))):
            for m in range(minibatches, int(min(until_m, minibatches + 20))):
                assert schedule(s, m) == value
        # A finite bound is where the value changes (it claims no less than it must).
        if until_s < math.inf and until_m == math.inf:
            assert schedule(int(until_s), minibatches) != value
        if until_m < math.inf and until_s == math.inf:
            assert schedule(samples, int(until_m)) != value
