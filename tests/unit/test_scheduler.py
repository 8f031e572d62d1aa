"""The work scheduler: first come first served, at most C busy, bounded retries."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.aggregation import DeviceState, SchedulerError, TaskScheduler


def test_applications_are_granted_in_order_up_to_c() -> None:
    scheduler = TaskScheduler([1, 2, 3, 4], concurrency=2)
    for node in (3, 1, 4, 2):
        scheduler.apply(node)
    assert scheduler.ready == (3, 1, 4, 2)
    assert scheduler.next_device() == 3
    assert scheduler.next_device() == 1
    assert scheduler.next_device() is None  # C = 2 busy
    assert scheduler.in_flight == 2
    scheduler.finish(1)
    assert scheduler.next_device() == 4  # the slot goes to the oldest application
    scheduler.apply(1)
    assert scheduler.ready == (2, 1)


def test_retries_are_bounded_then_the_device_is_retired() -> None:
    scheduler = TaskScheduler([7, 8], concurrency=2, max_retries=2)
    outcomes = []
    for _ in range(3):
        scheduler.apply(7)
        assert scheduler.next_device() == 7
        outcomes.append(scheduler.fail(7, "code 2"))
    assert outcomes == [False, False, True]
    assert scheduler.state(7) is DeviceState.RETIRED
    assert scheduler.retired == [7]
    scheduler.apply(7)  # a late wake-up of a retired device is ignored
    assert scheduler.next_device() is None
    assert not scheduler.exhausted  # node 8 is still there
    stats = scheduler.summary()["7"]
    assert stats["failures"] == 3 and stats["state"] == "retired"


def test_success_resets_the_retry_budget_and_loss_does_not_count() -> None:
    scheduler = TaskScheduler([1], concurrency=1, max_retries=1)
    for outcome in ("fail", "finish", "fail", "lose", "lose", "finish", "fail"):
        scheduler.apply(1)
        assert scheduler.next_device() == 1
        if outcome == "fail":
            assert scheduler.fail(1, "x") is False
        elif outcome == "lose":
            scheduler.lose(1)
        else:
            scheduler.finish(1)
    assert scheduler.state(1) is DeviceState.IDLE
    assert scheduler.summary()["1"]["lost"] == 2


def test_exhausted_when_every_device_is_retired() -> None:
    scheduler = TaskScheduler([1, 2], concurrency=2, max_retries=0)
    for node in (1, 2):
        scheduler.apply(node)
    for node in (1, 2):
        assert scheduler.next_device() == node
    assert scheduler.fail(1, "boom") and scheduler.fail(2, "boom")
    assert scheduler.exhausted and scheduler.active == 0
    assert TaskScheduler([], concurrency=1).exhausted


def test_wrong_transitions_raise() -> None:
    scheduler = TaskScheduler([1], concurrency=1)
    with pytest.raises(SchedulerError, match="no task in flight"):
        scheduler.finish(1)
    scheduler.apply(1)
    with pytest.raises(SchedulerError, match="applied for work while ready"):
        scheduler.apply(1)
    with pytest.raises(SchedulerError, match="unknown node"):
        scheduler.apply(99)
    with pytest.raises(ValueError, match="concurrency"):
        TaskScheduler([1], concurrency=0)
    with pytest.raises(ValueError, match="max-retries"):
        TaskScheduler([1], concurrency=1, max_retries=-1)


def test_join_and_retire() -> None:
    scheduler = TaskScheduler([1], concurrency=3)
    assert scheduler.join(2) and not scheduler.join(2)
    scheduler.apply(2)
    scheduler.retire(2, "left")
    assert scheduler.ready == () and scheduler.state(2) is DeviceState.RETIRED


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 8),
    concurrency=st.integers(1, 5),
    max_retries=st.integers(0, 3),
    script=st.lists(
        st.tuples(st.sampled_from(["apply", "next", "end"]), st.integers(0, 99)), max_size=200
    ),
)
def test_never_more_than_c_in_flight(
    nodes: int, concurrency: int, max_retries: int, script: list[tuple[str, int]]
) -> None:
    scheduler = TaskScheduler(range(nodes), concurrency=concurrency, max_retries=max_retries)
    busy: set[int] = set()
    for action, pick in script:
        if action == "apply":
            idle = [n for n in range(nodes) if scheduler.state(n) is DeviceState.IDLE]
            if idle:
                scheduler.apply(idle[pick % len(idle)])
        elif action == "next":
            node = scheduler.next_device()
            if node is not None:
                assert node not in busy
                busy.add(node)
        elif busy:
            node = sorted(busy)[pick % len(busy)]
            busy.discard(node)
            [scheduler.finish, scheduler.lose, lambda n: scheduler.fail(n, "e")][pick % 3](node)
        assert scheduler.in_flight == len(busy) <= concurrency
        # a device is never both waiting and busy
        assert not set(scheduler.ready) & busy
