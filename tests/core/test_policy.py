import pickle
import random

import pytest

from retryfs import RetryPolicy
from retryfs.core.policy import resolve_overrides


def test_defaults_match_the_contract():
    p = RetryPolicy()
    assert (p.max_attempts, p.initial_delay, p.multiplier, p.max_delay, p.jitter, p.deadline,
            p.throttle_delay) == (10, 0.1, 2.0, 32.0, True, None, 1.0)


def test_policy_is_immutable_and_hashable():
    p = RetryPolicy(max_attempts=3)
    with pytest.raises(AttributeError):
        p.max_attempts = 5  # type: ignore[misc]
    assert hash(p) == hash(RetryPolicy(max_attempts=3))
    assert pickle.loads(pickle.dumps(p)) == p


@pytest.mark.parametrize(("field", "value", "error"), [
    ("max_attempts", 0, ValueError),
    ("max_attempts", 2.5, TypeError),
    ("max_attempts", True, TypeError),
    ("initial_delay", -1, ValueError),
    ("initial_delay", float("nan"), ValueError),
    ("multiplier", 0.5, ValueError),
    ("max_delay", float("inf"), ValueError),
    ("deadline", 0, ValueError),
    ("deadline", "10", TypeError),
    ("jitter", "yes", TypeError),
    ("throttle_factor", 0.1, ValueError),
    ("throttle_delay", -0.5, ValueError),
    ("throttle_delay", float("nan"), ValueError),
])
def test_bad_values_are_rejected_naming_the_field(field, value, error):
    with pytest.raises(error, match=field):
        RetryPolicy(**{field: value})


@pytest.mark.parametrize(("field", "value", "allowed"), [
    ("max_attempts", 0, "an int in [1, "),
    ("max_attempts", 2.5, "an int in [1, "),
    ("initial_delay", -1, "a number in [0, "),
    ("deadline", 0, "a number in (0, "),  # more than 0: the low end is excluded
])
def test_a_rejected_value_names_the_allowed_range(field, value, allowed):
    with pytest.raises((ValueError, TypeError)) as raised:
        RetryPolicy(**{field: value})
    assert str(raised.value).startswith(f"RetryPolicy.{field} must be {allowed}"), raised.value


@pytest.mark.parametrize(("field", "high"), [("max_attempts", 1_000_000),
                                             ("max_delay", 86_400), ("deadline", 31_536_000)])
def test_the_upper_bound_of_a_range_is_allowed_and_one_past_it_is_not(field, high):
    changes = {field: high, "initial_delay": 0} if field == "max_delay" else {field: high}
    assert getattr(RetryPolicy(**changes), field) == high
    with pytest.raises(ValueError, match=field):
        RetryPolicy(**{**changes, field: high + 1})


def test_a_value_of_the_wrong_type_is_named_with_its_type():
    with pytest.raises(TypeError) as raised:
        RetryPolicy(deadline="10")
    assert str(raised.value).endswith(", got str '10'")


def test_no_retries_is_one_attempt():
    assert RetryPolicy.no_retries() == RetryPolicy(max_attempts=1)


def test_max_delay_below_initial_delay_is_rejected():
    with pytest.raises(ValueError, match="max_delay"):
        RetryPolicy(initial_delay=5, max_delay=1)


def test_exponential_schedule_capped_without_jitter():
    p = RetryPolicy(initial_delay=0.5, multiplier=2, max_delay=3, jitter=False)
    assert [p.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_the_schedule_grows_by_the_multiplier():
    p = RetryPolicy(initial_delay=1, multiplier=3, max_delay=100, jitter=False)
    assert [p.delay(n) for n in range(1, 7)] == [1.0, 3.0, 9.0, 27.0, 81.0, 100.0]


def test_throttled_schedule_is_longer_but_capped():
    p = RetryPolicy(initial_delay=0.5, multiplier=2, max_delay=10, jitter=False, throttle_delay=2)
    assert [p.delay(n, throttled=True) for n in range(1, 5)] == [2.0, 4.0, 8.0, 10.0]


def test_the_default_schedules_by_kind_of_failure():
    """A transient fault is retried in 100 ms, doubling (object_store's base); a throttle in
    1 s, doubling (botocore's throttling base); both stop at 32 s."""
    p = RetryPolicy(jitter=False)
    assert [p.delay(n) for n in range(1, 11)] == [
        0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 32.0]
    assert [p.delay(n, throttled=True) for n in range(1, 8)] == [
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 32.0]


def test_throttle_factor_is_deprecated_and_keeps_its_meaning():
    with pytest.warns(DeprecationWarning, match="throttle_delay"):
        p = RetryPolicy(initial_delay=0.5, max_delay=10, jitter=False, throttle_factor=4)
    assert p.throttle_delay == 2.0 and p.delay(1, throttled=True) == 2.0
    assert p.throttle_factor is None  # folded into throttle_delay: a copy does not warn again
    assert pickle.loads(pickle.dumps(p)) == p and p.replace(max_attempts=3).throttle_delay == 2.0


def test_full_jitter_stays_within_the_schedule():
    p = RetryPolicy(initial_delay=1, multiplier=2, max_delay=8)
    rng = random.Random(7)
    draws = [p.delay(3, rng=rng) for _ in range(200)]
    assert all(0 <= d <= 4 for d in draws)
    assert len(set(draws)) > 150  # really random, not a constant
    assert min(draws) < 0.1 and max(draws) > 3.9  # the whole of [0, delay], from 0


def test_replace_validates_and_names_unknown_fields():
    p = RetryPolicy()
    assert p.replace(max_attempts=3).max_attempts == 3
    with pytest.raises(ValueError) as raised:
        p.replace(max_tries=3)
    assert str(raised.value) == (
        "unknown RetryPolicy field(s) ['max_tries']; valid: max_attempts, initial_delay, "
        "multiplier, max_delay, jitter, deadline, throttle_delay, throttle_factor, "
        "fast_throttle_retries")
    with pytest.raises(ValueError, match="max_attempts"):
        p.replace(max_attempts=0)


def test_per_operation_overrides_by_group_and_method():
    base = RetryPolicy(max_attempts=4)
    resolved = resolve_overrides(base, {"write": {"max_attempts": 20},
                                        "get_file_info": RetryPolicy(max_attempts=2)})
    assert resolved["write"].max_attempts == 20
    assert resolved["write"].initial_delay == base.initial_delay
    assert resolved["get_file_info"].max_attempts == 2
    with pytest.raises(ValueError) as raised:
        resolve_overrides(base, {"writes": {"max_attempts": 2}})
    assert str(raised.value).startswith(
        "per_operation key 'writes' is neither a group (metadata, read, write, delete, move) "
        "nor an operation (close, commit, copy_file, copy_files, create_dir, ")
    with pytest.raises(TypeError) as raised:
        resolve_overrides(base, {"read": 3})
    assert str(raised.value) == (
        "per_operation['read'] must be a RetryPolicy or a mapping of its fields, got int")
