"""The largest batch in a memory budget (amp_adapters.services.batch_fit): the line through measured
peaks, the prediction under a budget, the check, and the sizes a user writes."""
import pytest
from hypothesis import example, assume, given, settings
from hypothesis import strategies as st

from amp_adapters import AmpConfigError
from amp_adapters.services.batch_fit import (MAX_BATCH, BatchFitError, batch_gain, check, fit_peak,
                                             format_size, parse_size)

MIB = 1 << 20
fixed_bytes = st.integers(10 * MIB, 4 << 30)
per_sample = st.integers(1 << 10, 64 * MIB)
batches = st.lists(st.integers(1, 4096), min_size=2, max_size=3, unique=True)


@settings(deadline=None)  # exact fractions; a loaded machine is not a failure
@given(fixed_bytes, per_sample, batches)
def test_exact_points_give_back_their_line(a, b, sizes):
    fit = fit_peak([(n, a + b * n) for n in sizes])
    assert fit.per_sample == pytest.approx(b, rel=1e-9)
    assert fit.fixed == pytest.approx(a, rel=1e-6, abs=1.0)
    assert fit.residual < 1.0


@settings(deadline=None)
@given(fixed_bytes, per_sample, batches, st.integers(1, 1 << 20))
def test_the_largest_batch_is_the_last_one_whose_predicted_peak_is_within_the_budget(
        a, b, sizes, room):
    fit = fit_peak([(n, a + b * n) for n in sizes])
    budget = a + room * b + b // 2          # between batch `room` and `room + 1`
    n = fit.largest_batch(budget)
    assert fit.peak_at(n) <= budget < fit.peak_at(n + 1)
    assert n == room


@settings(deadline=None)
@given(fixed_bytes, per_sample, batches, st.integers(1, 1 << 20), st.integers(1, 1 << 20))
def test_a_larger_budget_never_predicts_a_smaller_batch(a, b, sizes, x, y):
    fit = fit_peak([(n, a + b * n) for n in sizes])
    small, large = sorted((a + b * x, a + b * y))
    assert fit.largest_batch(small) <= fit.largest_batch(large)


@settings(deadline=None)
@given(fixed_bytes, per_sample, batches, st.integers(1, 1 << 30))
def test_a_budget_below_batch_1s_peak_is_an_error_that_names_that_peak(a, b, sizes, short):
    fit = fit_peak([(n, a + b * n) for n in sizes])
    budget = a + b - short
    assume(budget >= 1)
    with pytest.raises(BatchFitError, match="too small for batch 1: its predicted peak is "
                                            + format_size(fit.peak_at(1))):
        fit.largest_batch(budget)


@settings(deadline=None)
@given(fixed_bytes, st.integers(0, 1 << 30), batches)
def test_a_peak_that_does_not_grow_with_the_batch_cannot_be_fitted(a, drop, sizes):
    points = [(n, max(a - drop * i, 1)) for i, n in enumerate(sorted(sizes))]
    with pytest.raises(BatchFitError, match="does not grow with the batch.*larger batches"):
        fit_peak(points)


@settings(deadline=None)
@given(st.integers(1, 4096), st.integers(1, 1 << 34), st.integers(0, 3))
def test_one_batch_size_is_not_a_line(n, peak, repeats):
    with pytest.raises(BatchFitError, match="two batch sizes or more"):
        fit_peak([(n, peak)] * (repeats + 1))


def test_a_prediction_far_beyond_the_measured_batches_is_refused():
    fit = fit_peak([(1, 1000 * MIB), (2, 1000 * MIB + 1)])   # one byte a sample
    with pytest.raises(BatchFitError, match=f"more than {MAX_BATCH} samples"):
        fit.largest_batch(64 << 30)


@settings(deadline=None)
@given(fixed_bytes, per_sample, batches, st.integers(1, 1 << 16), st.integers(-MIB, MIB))
@example(a=10 * MIB, b=1024, sizes=[1, 2], n=1, off=2048)   # the refit's slope is 0
def test_the_check_says_whether_the_measured_peak_fits_and_how_far_the_line_was(
        a, b, sizes, n, off):
    fit = fit_peak([(m, a + b * m) for m in sizes])
    budget = int(fit.peak_at(n))
    got = check(fit, budget, n, budget + off)
    assert got.fits == (off <= 0)
    assert got.error == pytest.approx(((budget + off) - fit.peak_at(n)) / fit.peak_at(n))
    try:                                     # the check's run is one more point
        refit = got.refit(fit)
    except BatchFitError as e:               # a run far off the line can flatten it
        assert "does not grow with the batch" in str(e)
    else:
        assert len(refit.points) == len(sizes) + 1 and refit.points[-1] == (n, budget + off)


def test_mxnets_faq_example_is_a_gain_of_two():
    assert batch_gain(128, 256) == 2.0


@settings(deadline=None)
@given(st.integers(1, 1 << 20), st.sampled_from(["", "B", "K", "KiB", "kb", "M", "MiB", "MB",
                                                  "G", "GiB", "gb", "T", "TiB"]),
       st.sampled_from(["", " "]))
def test_a_size_reads_in_binary_units_whatever_the_spelling(n, unit, space):
    factor = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    assert parse_size(f"{n}{space}{unit}") == n * factor[unit[:1].lower()]


def test_a_size_may_have_a_fraction():
    assert parse_size("2.5GiB") == 5 << 29 and parse_size(".5g") == 1 << 29


@settings(deadline=None)
@given(st.text(max_size=12))
def test_a_size_that_does_not_parse_is_an_error_saying_how_to_write_one(text):
    try:
        size = parse_size(text)
    except AmpConfigError as e:
        assert repr(text) in str(e) and "4GiB" in str(e) or "more than 0 bytes" in str(e)
    else:
        assert size >= 1


@pytest.mark.parametrize("text", ["four gigs", "4 GiBs", "-1G", "0", "0MiB", "", "4e9", "G"])
def test_these_are_not_sizes(text):
    with pytest.raises(AmpConfigError, match="is not a memory size"):
        parse_size(text)
