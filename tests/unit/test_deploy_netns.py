"""Shaped links: rates, tbf parameters, address plan and checks (no namespace is built)."""

from __future__ import annotations

import math

import pytest

from fedsync.deploy.netns import LinkCounters, LinkShape, NodeLink, ShapedNetwork, tbf_args


def test_link_shape_rates() -> None:
    assert LinkShape.symmetric(5) == LinkShape(uplink_mbit=5, downlink_mbit=5)
    assert LinkShape(1, 8).describe() == {"uplink_mbit": 1, "downlink_mbit": 8}
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="Mbit/s"):
            LinkShape.symmetric(bad)


def test_tbf_parameters_scale_with_the_rate() -> None:
    slow = dict(zip(*[iter(tbf_args(1.0))] * 2, strict=True))
    fast = dict(zip(*[iter(tbf_args(20.0))] * 2, strict=True))
    assert slow["rate"] == "1000000bit" and fast["rate"] == "20000000bit"
    # A full frame always fits the bucket; the queue holds a second of traffic.
    assert int(slow["burst"]) >= 2 * 1514
    assert int(fast["burst"]) == int(20e6 / 8 * 0.005)
    assert int(slow["limit"]) == 125_000 and int(fast["limit"]) == 2_500_000


def test_address_plan_is_one_private_slash30_per_node() -> None:
    network = ShapedNetwork([LinkShape.symmetric(1)] * 3, subnet="10.77.0.0/28", tag="ab12")
    assert network.server_address == "10.77.0.1"
    assert network.links == []  # nothing is created before create()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"subnet": "8.8.8.0/24"}, "private"),
        ({"subnet": "10.0.0.0/30", "shapes": [None, None]}, "room"),
        ({"tag": "Bad-Tag"}, "tag"),
        ({"tag": "toolong7"}, "tag"),
        ({"shapes": []}, "at least one"),
    ],
)
def test_bad_networks_are_refused(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"shapes": [None]} | kwargs
    with pytest.raises(ValueError, match=message):
        ShapedNetwork(**arguments)  # type: ignore[arg-type]


def test_node_link_runs_commands_in_its_namespace() -> None:
    link = NodeLink(0, "fedsync-ab12-0", "fsab12h0", "fsab12n0", "10.0.0.1", "10.0.0.2", None)
    command = link.wrap(["flower-supernode", "--insecure"])
    assert command[1:4] == ["netns", "exec", "fedsync-ab12-0"]
    assert command[-2:] == ["flower-supernode", "--insecure"]


def test_counters_difference() -> None:
    later = LinkCounters(1000, 200, 10, 5, 1, 0)
    earlier = LinkCounters(400, 50, 4, 2, 1, 0)
    assert later.minus(earlier) == LinkCounters(600, 150, 6, 3, 0, 0)
    assert later.as_dict()["downlink_bytes"] == 1000
