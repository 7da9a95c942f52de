"""The one backoff policy, with plain numbers: growth, cap, the three jitter styles, bad policies."""

from __future__ import annotations

import pytest

from llmgw.core.backoff import BackoffError, BackoffPolicy, stable_draw


def test_steps_double_from_initial_and_stop_at_the_cap() -> None:
    policy = BackoffPolicy(initial=30, cap=600)
    assert [policy.step(n) for n in (1, 2, 3, 4, 5, 6, 50)] == [30, 60, 120, 240, 480, 600, 600]


def test_another_factor_grows_by_it() -> None:
    assert [BackoffPolicy(initial=1, cap=100, factor=3).step(n) for n in (1, 2, 3, 4, 5)] == [1, 3, 9, 27, 81]


def test_an_absurd_attempt_count_is_the_cap_not_an_overflow() -> None:
    policy = BackoffPolicy(initial=0.5, cap=10, factor=16)
    assert policy.step(10**6) == 10
    assert policy.delay(10**6, 0.0) == 10


def test_a_first_try_count_of_zero_waits_the_initial_delay() -> None:
    assert BackoffPolicy(initial=2, cap=8).step(0) == 2


def test_without_jitter_the_draw_does_not_matter() -> None:
    policy = BackoffPolicy(initial=1, cap=16)
    assert policy.delay(3, 0.0) == policy.delay(3, 0.99) == 4
    assert policy.bounds(3) == (4, 4)


def test_equal_jitter_keeps_at_least_half_the_step() -> None:
    policy = BackoffPolicy(initial=0.5, cap=30, jitter=0.5)
    assert policy.bounds(3) == (1.0, 2.0)
    assert policy.delay(3, 0.0) == 2.0
    assert policy.delay(3, 0.5) == 1.5
    assert 1.0 < policy.delay(3, 0.999) < 1.01


def test_full_jitter_may_go_down_to_nothing() -> None:
    policy = BackoffPolicy(initial=1, cap=8, jitter=1.0)
    assert policy.bounds(10) == (0.0, 8)
    assert policy.delay(10, 0.25) == 6.0


def test_the_planners_rebuild_backoff_shortens_by_at_most_its_fraction() -> None:
    policy = BackoffPolicy(initial=30, cap=600, jitter=0.2)
    jittered = policy.delay(3, stable_draw("m", 3))
    assert 120 * 0.8 <= jittered <= 120
    assert jittered == policy.delay(3, stable_draw("m", 3))  # the same in every run


def test_stable_draws_differ_between_keys_and_attempts_and_stay_in_range() -> None:
    draws = {stable_draw(key, attempt) for key in ("m", "n", "o") for attempt in (1, 2, 3)}
    assert len(draws) == 9
    assert all(0 <= d < 1 for d in draws)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"initial": -1, "cap": 10}, "initial"),
        ({"initial": float("nan"), "cap": 10}, "initial"),
        ({"initial": 5, "cap": 1}, "cap"),
        ({"initial": 1, "cap": float("inf")}, "cap"),
        ({"initial": 1, "cap": 10, "factor": 0.5}, "factor"),
        ({"initial": 1, "cap": 10, "jitter": 1.5}, "jitter"),
        ({"initial": 1, "cap": 10, "jitter": -0.1}, "jitter"),
    ],
)
def test_a_policy_that_cannot_be_says_which_number_is_off(fields: dict[str, float], named: str) -> None:
    with pytest.raises(BackoffError, match=named):
        BackoffPolicy(**fields)


@pytest.mark.parametrize("draw", [-0.1, 1.5])
def test_a_draw_outside_the_unit_interval_is_refused(draw: float) -> None:
    with pytest.raises(BackoffError, match="draw"):
        BackoffPolicy(initial=1, cap=2, jitter=0.5).delay(1, draw)
