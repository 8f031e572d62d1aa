"""Device profiles, fleets and the clocks: simulated durations and the release order."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.clock import (
    DeviceProfile,
    FleetSpec,
    TaskWork,
    VirtualClock,
    WallClock,
    load_fleet,
)

MBIT = 1e6


def profile(**kwargs: object) -> DeviceProfile:
    base: dict[str, object] = {
        "name": "p",
        "seconds_per_sample": 0.0,
        "uplink_bps": 8 * MBIT,  # 1 MB/s: bytes / 1e6 = seconds
        "downlink_bps": 8 * MBIT,
        "latency": 0.0,
    }
    base.update(kwargs)
    return DeviceProfile(**base)  # type: ignore[arg-type]


def fixed(profiles: dict[int, DeviceProfile]):
    return profiles.__getitem__


def drain(clock: VirtualClock) -> list:
    events = []
    while (event := clock.pop()) is not None:
        events.append(event)
    return events


# --- profiles -------------------------------------------------------------------------------
def test_profile_durations_use_real_bytes() -> None:
    p = DeviceProfile(
        seconds_per_sample=0.01,
        seconds_per_batch=0.1,
        uplink_bps=1 * MBIT,
        downlink_bps=4 * MBIT,
        latency=0.05,
    )
    assert p.compute_seconds(samples=100, steps=4) == pytest.approx(1.4)
    assert p.uplink_seconds(125_000) == pytest.approx(1.0)  # 1 Mbit at 1 Mbit/s
    assert p.downlink_seconds(125_000) == pytest.approx(0.25)


def test_profile_from_fleet_keys() -> None:
    p = DeviceProfile.from_mapping(
        {"name": "phone", "uplink-mbit": 2, "downlink-mbit": 8, "latency-ms": 80, "dropout": 0.1}
    )
    assert (p.uplink_bps, p.downlink_bps, p.latency, p.dropout) == (2e6, 8e6, 0.08, 0.1)
    with pytest.raises(ValueError, match="unknown keys"):
        DeviceProfile.from_mapping({"uplink-mbps": 3})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"uplink_bps": 0.0}, "bandwidth"),
        ({"latency": -1.0}, "latency"),
        ({"dropout": 1.0}, "dropout"),
        ({"offline_seconds": 5.0}, "finite online-seconds"),
        ({"online_seconds": 0.0}, "online-seconds"),
        ({"offline_behavior": "pause"}, "offline-behavior"),
    ],
)
def test_profile_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DeviceProfile(**kwargs)


def test_availability_cycle() -> None:
    p = profile(online_seconds=10.0, offline_seconds=5.0)  # on [0,10), off [10,15), ...
    assert p.is_online(0.0) and p.is_online(9.9) and not p.is_online(12.0)
    assert p.next_online(12.0) == pytest.approx(15.0)
    assert p.online_until(3.0) == pytest.approx(10.0)
    # 12 s of work from t=4: 6 s until 10, pause to 15, 6 s more -> 21
    assert p.finish(4.0, 12.0) == (pytest.approx(21.0), False)
    # 30 s of work from t=0: 10 + 10 + 10 -> ends at 40 (two pauses)
    assert p.finish(0.0, 30.0)[0] == pytest.approx(40.0)
    # with a phase of 5 s the cycle is shifted: t=0 is position 5, offline from t=5 to 10
    assert p.finish(0.0, 6.0, phase=5.0)[0] == pytest.approx(11.0)
    dropper = profile(online_seconds=10.0, offline_seconds=5.0, offline_behavior="drop")
    assert dropper.finish(4.0, 5.0) == (pytest.approx(9.0), False)
    assert dropper.finish(4.0, 7.0) == (pytest.approx(10.0), True)
    assert profile().finish(3.0, 2.0) == (5.0, False)


# --- the virtual clock's order ---------------------------------------------------------------
def test_early_real_reply_waits_for_its_simulated_turn() -> None:
    fast = profile(seconds_per_sample=0.001)
    slow = profile(seconds_per_sample=0.1)
    clock = VirtualClock(fixed({1: fast, 2: slow}))
    assert clock.start("a", 1, downlink_bytes=1_000_000)  # 1 s down
    assert clock.start("b", 2, downlink_bytes=1_000_000)
    # The slow device's reply comes back first in real time ...
    clock.reply("b", TaskWork(uplink_bytes=2_000_000, samples=100))  # 1 + 10 + 2 = 13 s
    # ... but task a may still arrive earlier (its lower bound is 1 s): hold b back.
    assert clock.pop() is None
    clock.reply("a", TaskWork(uplink_bytes=500_000, samples=100))  # 1 + 0.1 + 0.5 = 1.6 s
    events = drain(clock)
    assert [(e.kind, e.task_id) for e in events] == [("reply", "a"), ("reply", "b")]
    assert [e.time for e in events] == [pytest.approx(1.6), pytest.approx(13.0)]
    assert clock.now() == pytest.approx(13.0)
    assert events[1].timing["compute_s"] == pytest.approx(10.0)


def test_a_reply_is_released_once_no_outstanding_task_can_precede_it() -> None:
    clock = VirtualClock(fixed({1: profile(latency=5.0), 2: profile()}))
    clock.start("slow", 1, downlink_bytes=0)  # lower bound 5 s
    clock.start("quick", 2, downlink_bytes=0)
    clock.reply("quick", TaskWork(uplink_bytes=1_000_000))  # arrives at 1 s < 5 s
    event = clock.pop()
    assert event is not None and event.task_id == "quick" and event.time == pytest.approx(1.0)
    assert clock.pop() is None and clock.waiting == 1


def test_compute_lower_bound_learnt_from_previous_replies() -> None:
    clock = VirtualClock(fixed({1: profile(seconds_per_sample=0.01)}))
    clock.start("t1", 1, downlink_bytes=0)
    clock.reply("t1", TaskWork(uplink_bytes=0, samples=500))  # 5 s compute
    assert drain(clock)[0].time == pytest.approx(5.0)
    clock.start("t2", 1, downlink_bytes=0)
    clock.wake(1)  # a wake at now = 5 s
    # The wake (5 s) precedes t2's lower bound (5 + 5 s): released without t2's reply.
    event = clock.pop()
    assert event is not None and event.kind == "wake"
    assert clock.pop() is None


@settings(max_examples=50, deadline=None)
@given(
    data=st.data(),
    specs=st.lists(
        st.tuples(
            st.integers(0, 3_000_000),  # downlink bytes
            st.integers(0, 3_000_000),  # uplink bytes
            st.integers(0, 2_000),  # samples
            st.floats(0.0, 2.0),  # latency
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_release_order_is_simulated_order_whatever_the_real_order(data, specs) -> None:
    profiles = {
        i: profile(seconds_per_sample=0.001 * (1 + i % 3), latency=lat)
        for i, (_, _, _, lat) in enumerate(specs)
    }

    def run(real_order: list[int]) -> list[tuple[str, float]]:
        clock = VirtualClock(fixed(profiles))
        for i, (down, _, _, _) in enumerate(specs):
            assert clock.start(f"t{i}", i, down)
        released = []
        for i in real_order:
            _, up, samples, _ = specs[i]
            clock.reply(f"t{i}", TaskWork(uplink_bytes=up, samples=samples))
            released += [(e.task_id, e.time) for e in drain(clock)]
        assert clock.waiting == 0
        return released

    order_a = data.draw(st.permutations(range(len(specs))))
    order_b = data.draw(st.permutations(range(len(specs))))
    released_a, released_b = run(order_a), run(order_b)
    assert released_a == released_b
    times = [t for _, t in released_a]
    assert times == sorted(times)
    assert len(released_a) == len(specs)


def test_errors_are_released_at_the_lower_bound() -> None:
    clock = VirtualClock(fixed({1: profile(latency=2.0)}))
    clock.start("t", 1, downlink_bytes=1_000_000)
    clock.error("t", "clientapp-exception (code 2): boom")
    event = clock.pop()
    assert event is not None and event.kind == "error" and event.time == pytest.approx(3.0)
    with pytest.raises(ValueError, match="not outstanding"):
        clock.reply("t", TaskWork(uplink_bytes=0))


def test_dropout_is_seeded_and_per_device() -> None:
    p = profile(dropout=0.5)

    def outcomes(seed: int) -> list[bool]:
        clock = VirtualClock(fixed({1: p, 2: p}), seed=seed)
        result = []
        for i in range(40):
            sent = clock.start(f"t{i}", 1 + i % 2, 0)
            result.append(sent)
            if sent:
                clock.reply(f"t{i}", TaskWork(uplink_bytes=0))
            drain(clock)
        return result

    assert outcomes(3) == outcomes(3)
    assert outcomes(3) != outcomes(4)
    assert 5 < sum(outcomes(3)) < 35


def test_offline_devices_delay_or_drop_tasks() -> None:
    delayed = profile(online_seconds=10.0, offline_seconds=10.0)
    dropped = profile(online_seconds=10.0, offline_seconds=10.0, offline_behavior="drop")
    clock = VirtualClock(fixed({1: delayed, 2: dropped}), seed=0)
    # A 15 s download cannot fit one 10 s online window: the delaying device pauses
    # through an offline period, the dropping one is known to lose the task at once.
    assert clock.start("d1", 1, downlink_bytes=15_000_000) is True
    assert clock.start("d2", 2, downlink_bytes=15_000_000) is False  # not worth sending
    clock.reply("d1", TaskWork(uplink_bytes=0))
    events = {e.task_id: e for e in drain(clock)}
    assert events["d2"].kind == "drop" and events["d2"].reason == "offline"
    assert events["d2"].time == pytest.approx(dropped.online_until(0.0, clock.phase_of(2)))
    assert events["d1"].kind == "reply"
    expected, lost = delayed.finish(0.0, 15.0, clock.phase_of(1))
    assert not lost and events["d1"].time == pytest.approx(expected)
    assert events["d1"].time >= 15.0 + 10.0 - 1e-9  # at least one offline pause
    assert events["d1"].timing["waited_s"] >= 10.0 - 1e-9


def test_offline_wake_waits_for_the_device() -> None:
    p = profile(online_seconds=5.0, offline_seconds=100.0)
    clock = VirtualClock(fixed({1: p}), seed=1)
    clock.wake(1)
    event = clock.pop()
    assert event is not None
    assert p.is_online(event.time, clock.phase_of(1))
    assert event.time == pytest.approx(p.next_online(0.0, clock.phase_of(1)))


def test_the_loops_record_and_reply_ride_on_the_tasks_events() -> None:
    """What the loop hands start() and reply() comes back on the task's event, whatever
    ends it: nothing to park and look up again by task id."""
    dropper = profile(online_seconds=10.0, offline_seconds=10.0, offline_behavior="drop")
    clock = VirtualClock(fixed({1: profile(), 2: profile(), 3: dropper}), seed=0)
    records = {name: object() for name in ("ok", "failed", "lost")}
    assert clock.start("ok", 1, downlink_bytes=0, task=records["ok"])
    assert clock.start("failed", 2, downlink_bytes=0, task=records["failed"])
    assert not clock.start("lost", 3, downlink_bytes=15_000_000, task=records["lost"])
    reply = object()
    clock.reply("ok", TaskWork(uplink_bytes=0), reply=reply)
    clock.error("failed", "clientapp-exception (code 2): boom")
    clock.wake(1)
    events = {e.task_id or "wake": e for e in drain(clock)}
    assert [events[n].kind for n in ("ok", "failed", "lost")] == ["reply", "error", "drop"]
    for name, record in records.items():
        assert events[name].task is record
    assert events["ok"].reply is reply
    assert events["failed"].reply is None and events["lost"].reply is None
    assert events["wake"].task is None


# --- the wall clock ------------------------------------------------------------------------------
def test_wall_clock_releases_in_real_order() -> None:
    now = [100.0]
    clock = WallClock(time_fn=lambda: now[0])
    clock.wake(5)
    clock.start("a", 1, 10)
    clock.start("b", 2, 10)
    now[0] = 103.0
    clock.reply("b", TaskWork(uplink_bytes=1))
    clock.error("a", "ttl-expired: x")
    events = drain(clock)  # type: ignore[arg-type]
    assert [(e.kind, e.node_id) for e in events] == [("wake", 5), ("reply", 2), ("error", 1)]
    assert events[1].time == pytest.approx(3.0) and events[1].timing["round_trip_s"] == 3.0
    assert clock.waiting == 0 and clock.queued == 0
    record, reply = object(), object()
    clock.start("c", 3, 10, task=record)
    clock.reply("c", TaskWork(uplink_bytes=1), reply=reply)
    event = clock.pop()
    assert event is not None and event.task is record and event.reply is reply


# --- fleets --------------------------------------------------------------------------------------
def test_shipped_fleets_load() -> None:
    edge = load_fleet("edge-mixed")
    names = {p.name for p in edge.profiles}
    assert {"gpu-box", "cpu-board", "phone"} <= names
    assert any(p.intermittent for p in edge.profiles)
    rates = [p.uplink_bps for p in edge.profiles] + [p.downlink_bps for p in edge.profiles]
    assert min(rates) >= 1e6 and max(rates) <= 50e6
    digits = load_fleet("digits-stragglers")
    assert len(digits) == 10
    per_sample = sorted(p.seconds_per_sample for p in digits.profiles)
    assert per_sample[-1] == pytest.approx(10 * per_sample[0])
    assert load_fleet("").name == "uniform"


def test_fleet_assignment_by_order_and_by_seeded_draw() -> None:
    spec = load_fleet("digits-stragglers")
    nodes = [905, 17, 300, 42, 8, 77, 1000, 5, 66, 12, 13, 14]  # 12 nodes, 10 devices
    by_order = spec.assign(nodes)
    ordered = sorted(nodes)
    assert [by_order.profile_for(n).name for n in ordered[:7]] == ["ordinary"] * 7
    assert [by_order.profile_for(n).name for n in ordered[7:10]] == ["straggler"] * 3
    assert by_order.profile_for(ordered[10]).name == "ordinary"  # cycles
    draw1 = spec.assign(nodes, how="random", seed=1).describe()
    assert draw1 == spec.assign(list(reversed(nodes)), how="random", seed=1).describe()
    assert any(spec.assign(nodes, how="random", seed=s).describe() != draw1 for s in range(2, 6))
    with pytest.raises(KeyError, match="no device profile"):
        by_order.profile_for(123456)
    assert by_order.add(123456).name in {"ordinary", "straggler"}


def test_fleet_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\n[[group]]\ncount = 0\n')
    with pytest.raises(ValueError, match="count must be an integer >= 1"):
        load_fleet(str(bad))
    empty = tmp_path / "empty.toml"
    empty.write_text('name = "e"\n')
    with pytest.raises(ValueError, match="at least one"):
        FleetSpec.from_toml(empty)
    with pytest.raises(FileNotFoundError, match="no-such-fleet"):
        load_fleet("no-such-fleet")
    assert math.isinf(DeviceProfile().period)
