"""Staleness weights: values, parsing, and the shape every weight function must have."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedsync.aggregation.staleness import (
    Constant,
    Hinge,
    NormalizedPolynomial,
    Polynomial,
    parse_staleness,
)


def test_constant_is_one() -> None:
    assert [Constant()(s) for s in (0, 1, 10, 1000)] == [1.0, 1.0, 1.0, 1.0]


def test_polynomial_values() -> None:
    poly = Polynomial(0.5)
    assert poly(0) == 1.0
    assert poly(3) == pytest.approx(0.5)  # (1 + 3) ** -0.5
    assert poly(8) == pytest.approx(1 / 3)
    assert Polynomial(1.0)(4) == pytest.approx(0.2)
    assert Polynomial(0.0)(100) == 1.0


def test_hinge_values() -> None:
    hinge = Hinge(a=10, b=4)
    assert [hinge(s) for s in (0, 2, 4)] == [1.0, 1.0, 1.0]
    assert hinge(5) == pytest.approx(1 / 11)  # 1 / (10 * (5 - 4) + 1)
    assert hinge(6) == pytest.approx(1 / 21)


def test_normalized_polynomial_is_one_at_average() -> None:
    norm = NormalizedPolynomial(a=0.5, average=3)
    assert norm(3) == pytest.approx(1.0)
    assert norm(0) == pytest.approx(2.0)  # sqrt(4 / 1)
    assert norm(15) == pytest.approx(0.5)  # sqrt(4 / 16)
    # average 0 is the plain polynomial
    assert NormalizedPolynomial(0.5, 0)(8) == pytest.approx(Polynomial(0.5)(8))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("constant", Constant()),
        ("const", Constant()),
        ("polynomial:0.5", Polynomial(0.5)),
        ("poly:2", Polynomial(2.0)),
        ("polynomial", Polynomial(0.5)),
        ("hinge:10:4", Hinge(10.0, 4.0)),
        ("hinge:b=2:a=3", Hinge(3.0, 2.0)),
        ("hinge: 5", Hinge(5.0, 4.0)),
        ("normalized-polynomial:0.5:3", NormalizedPolynomial(0.5, 3.0)),
        ("normpoly:average=2", NormalizedPolynomial(0.5, 2.0)),
    ],
)
def test_parse(spec: str, expected: object) -> None:
    assert parse_staleness(spec) == expected


def test_spec_round_trips() -> None:
    for fn in (Constant(), Polynomial(0.25), Hinge(3, 7), NormalizedPolynomial(1, 2)):
        assert parse_staleness(fn.spec()) == fn


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("exponential:1", "unknown staleness function"),
        ("polynomial:x", "must be a number"),
        ("polynomial:1:2", "at most 1 parameter"),
        ("hinge:c=1", "no parameter 'c'"),
        ("polynomial:-1", ">= 0"),
        ("hinge:1:-2", ">= 0"),
        ("polynomial:nan", "finite"),
    ],
)
def test_parse_rejects(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_staleness(spec)


def test_negative_staleness_is_a_bug() -> None:
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        Polynomial(0.5)(-1)


functions = st.one_of(
    st.just(Constant()),
    st.builds(Polynomial, st.floats(0, 4)),
    st.builds(Hinge, st.floats(0, 50), st.floats(0, 20)),
    st.builds(NormalizedPolynomial, st.floats(0, 4), st.floats(0, 20)),
)


@given(functions, st.integers(0, 10_000), st.integers(0, 100))
def test_weights_positive_finite_and_non_increasing(fn, staleness: int, extra: int) -> None:
    now, later = fn(staleness), fn(staleness + extra)
    assert math.isfinite(now) and now > 0.0
    assert later <= now + 1e-12
