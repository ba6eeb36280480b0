"""The number checks every settings class and entry point shares (``common.checks``): an int that
is not a bool and at least its bound, a number that is finite (unless its range is not) and not
NaN, and a wrong kind that is both a TypeError and a ValueError."""

from __future__ import annotations

import math

import pytest

from common.checks import KindError, check_int, check_number


@pytest.mark.parametrize(("value", "low"), [(1, 1), (0, 0), (-3, None), (10**20, 1)])
def test_an_int_at_its_bound_passes_through(value, low):
    assert check_int("n", value, low=low) == value


@pytest.mark.parametrize(("value", "error", "said"), [
    (True, KindError, "n must be an int, got bool True"),  # bool is an int subclass
    (2.0, KindError, "n must be an int, got float 2.0"),
    ("3", KindError, "n must be an int, got str '3'"),
    (0, ValueError, "n must be at least 1, got 0"),
    (-1, ValueError, "n must be at least 1, got -1"),
])
def test_an_int_of_the_wrong_kind_or_below_its_bound_is_named(value, error, said):
    with pytest.raises(error) as info:
        check_int("n", value, low=1)
    assert str(info.value) == said


def test_a_wrong_kind_is_a_type_error_and_a_value_error():
    """A command that turns ValueError into a usage error sees a wrong kind too."""
    for call in (lambda: check_int("n", 1.5), lambda: check_number("x", "1")):
        with pytest.raises(TypeError):
            call()
        with pytest.raises(ValueError):
            call()


@pytest.mark.parametrize(("value", "kwargs"), [
    (1e-300, {}), (5, {}), (0.0, dict(low_closed=True)), (0.999, dict(high=1.0)),
    (0.0, dict(high=1.0, low_closed=True)),
])
def test_a_number_inside_its_range_passes_through(value, kwargs):
    assert check_number("x", value, **kwargs) == value


@pytest.mark.parametrize(("value", "kwargs", "said"), [
    (0.0, {}, "x must be positive and finite, got 0.0"),
    (math.inf, {}, "x must be positive and finite, got inf"),
    (math.nan, {}, "x must be positive and finite, got nan"),
    (-0.1, dict(low_closed=True), "x must be finite and >= 0, got -0.1"),
    (1.0, dict(high=1.0, low_closed=True), "x must be in [0, 1), got 1.0"),
    (math.nan, dict(high=1.0), "x must be in (0, 1), got nan"),
])
def test_a_number_outside_its_range_or_not_finite_is_named(value, kwargs, said):
    with pytest.raises(ValueError) as info:
        check_number("x", value, **kwargs)
    assert str(info.value) == said


def test_a_bool_is_not_a_number():
    with pytest.raises(KindError, match="x must be a number, got bool True"):
        check_number("x", True)
