"""Real, rate-limited links: each SuperNode in its own network namespace behind a veth pair.

:class:`ShapedNetwork` builds, for node ``i``::

    host namespace                          namespace fedsync-<tag>-<i>
    veth <tag>h<i>  10.213.0.(4i+1)/30  <->  veth <tag>n<i>  10.213.0.(4i+2)/30
    tbf: downlink rate (egress, to node)     tbf: uplink rate (egress, to SuperLink)

The SuperLink's Fleet API listens on the host end of link 0 (:attr:`server_address`);
node ``i > 0`` routes that one address through its own veth, so every node's traffic
crosses only its own, separately shaped link (the host delivers it locally; no
forwarding, no NAT, no change to the host's routes or sysctls). Only addresses of the
private /30s and the namespaces' loopbacks are used.

What this kernel (6.18 here, a minimal config) can and cannot do -- checked by running
``tc``, not assumed:

* **rate** -- ``tbf`` (token bucket) and ``htb`` work. Rate is shaped in *both*
  directions by putting a ``tbf`` on the egress of each end of the veth pair. Ingress
  shaping through ``ifb`` also works here (``ingress`` qdisc, ``u32`` filter, ``mirred``
  redirect to an ``ifb`` with a ``tbf``) but is not needed; ingress *policing* is not
  possible (``police`` and ``gact`` are not built: "Failed to load TC action module";
  no ``matchall`` classifier either).
* **delay, jitter, loss** -- need ``netem`` ("Specified qdisc kind is unknown"); ``fq``
  (which could honour per-packet departure times set by BPF) is not built either. Links
  here therefore have the veth's own round-trip time (tens of microseconds) and no
  loss; :class:`LinkShape` has no delay or loss fields rather than pretending. Where
  ``netem`` exists, ``tc qdisc add dev <if> parent <tbf>:1 netem delay 50ms loss 1%``
  under the ``tbf`` adds them.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import math
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

__all__ = [
    "DEFAULT_SUBNET",
    "LinkCounters",
    "LinkShape",
    "NetnsUnavailable",
    "NetworkCommandError",
    "NodeLink",
    "ShapedNetwork",
    "netns_unavailable_reason",
]

DEFAULT_SUBNET = "10.213.0.0/24"
"""Private range carved into one /30 per node (64 nodes)."""

_MBIT = 1e6


class NetworkCommandError(RuntimeError):
    """An ``ip`` / ``tc`` command failed; the message has its stderr."""


class NetnsUnavailable(RuntimeError):
    """Network namespaces or ``tbf`` cannot be used here (not root, no ``ip``, a kernel
    without them); the message says which."""


@dataclass(frozen=True)
class LinkShape:
    """Rates of one node's link, in Mbit/s (``inf``: unshaped).

    Parameters
    ----------
    uplink_mbit : float
        Node -> SuperLink.
    downlink_mbit : float
        SuperLink -> node.
    """

    uplink_mbit: float
    downlink_mbit: float

    def __post_init__(self) -> None:
        for name, value in (("uplink", self.uplink_mbit), ("downlink", self.downlink_mbit)):
            if not value > 0.0:  # also refuses NaN
                raise ValueError(f"{name} rate must be > 0 Mbit/s, got {value}")

    @classmethod
    def symmetric(cls, mbit: float) -> LinkShape:
        """The same rate both ways."""
        return cls(uplink_mbit=mbit, downlink_mbit=mbit)

    def describe(self) -> dict[str, float]:
        """The rates for a report."""
        return {"uplink_mbit": self.uplink_mbit, "downlink_mbit": self.downlink_mbit}


def tbf_args(rate_mbit: float) -> list[str]:
    """``tc ... tbf`` parameters for a rate: a small bucket, a deep queue.

    The bucket (burst) is 5 ms of traffic but at least two full frames, so the rate
    holds over short windows and a 1500-byte frame always fits. The queue holds 1 s of
    traffic (at least 64 KiB): gRPC sends in bursts of whole messages, and a shallow
    queue would turn them into drops and TCP backoff that a real access link's buffer
    would not cause.
    """
    bytes_per_s = rate_mbit * _MBIT / 8.0
    burst = max(int(bytes_per_s * 0.005), 2 * 1514)
    limit = max(int(bytes_per_s * 1.0), 64 * 1024)
    rate_bit = max(round(rate_mbit * _MBIT), 8)
    return ["rate", f"{rate_bit}bit", "burst", str(burst), "limit", str(limit)]


@dataclass(frozen=True)
class NodeLink:
    """One node's namespace and veth pair.

    Attributes
    ----------
    index : int
        The node's position in the deployment.
    namespace : str
        Its network namespace.
    host_if, node_if : str
        The veth ends (host namespace / node namespace).
    host_address, node_address : str
        Their IPv4 addresses (one private /30).
    shape : LinkShape or None
        The rates (``None``: unshaped).
    """

    index: int
    namespace: str
    host_if: str
    node_if: str
    host_address: str
    node_address: str
    shape: LinkShape | None

    def wrap(self, command: Sequence[str]) -> list[str]:
        """``command`` run inside this node's namespace (``ip netns exec`` keeps the
        pid, so the process is still stopped by its own process group)."""
        return [_ip(), "netns", "exec", self.namespace, *command]


@dataclass(frozen=True)
class LinkCounters:
    """Bytes and packets that crossed one link, read from the host end's counters.

    ``downlink`` is what the host end sent (to the node), ``uplink`` what it received;
    they include everything on the wire: TLS, HTTP/2, gRPC framing, TCP/IP headers,
    the SuperNode's polling.
    """

    downlink_bytes: int
    uplink_bytes: int
    downlink_packets: int
    uplink_packets: int
    dropped_downlink: int = 0
    dropped_uplink: int = 0

    def minus(self, earlier: LinkCounters) -> LinkCounters:
        """The traffic since ``earlier``."""
        return LinkCounters(
            self.downlink_bytes - earlier.downlink_bytes,
            self.uplink_bytes - earlier.uplink_bytes,
            self.downlink_packets - earlier.downlink_packets,
            self.uplink_packets - earlier.uplink_packets,
            self.dropped_downlink - earlier.dropped_downlink,
            self.dropped_uplink - earlier.dropped_uplink,
        )

    def as_dict(self) -> dict[str, int]:
        """For a JSON report."""
        return {
            "downlink_bytes": self.downlink_bytes,
            "uplink_bytes": self.uplink_bytes,
            "downlink_packets": self.downlink_packets,
            "uplink_packets": self.uplink_packets,
            "tbf_dropped_downlink": self.dropped_downlink,
            "tbf_dropped_uplink": self.dropped_uplink,
        }


@dataclass
class ShapedNetwork:
    """Namespaces, veth pairs and ``tbf`` shaping for N nodes; removed on :meth:`destroy`.

    Use as a context manager, or call :meth:`create` and, in a ``finally``,
    :meth:`destroy` (which removes whatever was created, also after a partial create).
    Stop the processes running in the namespaces first.

    Parameters
    ----------
    shapes : sequence of LinkShape or None
        One entry per node (``None``: an unshaped link).
    subnet : str
        A private IPv4 range with room for one /30 per node; refused when it overlaps
        a route of the host namespace.
    tag : str
        Short name part that keeps concurrent networks apart (default: random).
    """

    shapes: Sequence[LinkShape | None]
    subnet: str = DEFAULT_SUBNET
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    links: list[NodeLink] = field(default_factory=list, init=False)
    _namespaces: list[str] = field(default_factory=list, init=False, repr=False)
    _host_ifs: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.shapes:
            raise ValueError("a shaped network needs at least one node")
        if re.fullmatch(r"[a-z0-9]{1,6}", self.tag) is None:
            raise ValueError(f"tag must be 1-6 lowercase letters/digits, got {self.tag!r}")
        network = ipaddress.ip_network(self.subnet)
        if not isinstance(network, ipaddress.IPv4Network) or not network.is_private:
            raise ValueError(f"subnet must be a private IPv4 range, got {self.subnet}")
        self._blocks = list(network.subnets(new_prefix=30))
        if len(self._blocks) < len(self.shapes):
            raise ValueError(
                f"subnet {self.subnet} has room for {len(self._blocks)} /30 links, "
                f"{len(self.shapes)} needed"
            )

    @property
    def server_address(self) -> str:
        """The address the SuperLink's Fleet API listens on (host end of link 0)."""
        return str(next(self._blocks[0].hosts()))

    # --- lifecycle ------------------------------------------------------------------------
    def create(self) -> ShapedNetwork:
        """Create every namespace, veth pair, address, route and shaper.

        Raises
        ------
        NetnsUnavailable
            When namespaces or ``tbf`` cannot be used here (nothing is left behind).
        """
        reason = netns_unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        self._refuse_overlap()
        try:
            for index, shape in enumerate(self.shapes):
                self.links.append(self._create_link(index, shape))
        except BaseException:
            self.destroy()
            raise
        return self

    def destroy(self) -> None:
        """Remove every veth and namespace this object created (idempotent)."""
        for host_if in reversed(self._host_ifs):
            # Deleting one end of a veth pair deletes both.
            _run([_ip(), "link", "del", host_if], check=False)
        for namespace in reversed(self._namespaces):
            _run([_ip(), "netns", "del", namespace], check=False)
        self._host_ifs.clear()
        self._namespaces.clear()
        self.links.clear()

    def __enter__(self) -> ShapedNetwork:
        return self.create()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()

    # --- measurement ----------------------------------------------------------------------
    def counters(self) -> list[LinkCounters]:
        """Per-link byte/packet counters, read from the host ends (see LinkCounters)."""
        result = []
        for link in self.links:
            out = _run([_ip(), "-s", "-j", "link", "show", "dev", link.host_if]).stdout
            stats = json.loads(out)[0]["stats64"]
            result.append(
                LinkCounters(
                    downlink_bytes=int(stats["tx"]["bytes"]),
                    uplink_bytes=int(stats["rx"]["bytes"]),
                    downlink_packets=int(stats["tx"]["packets"]),
                    uplink_packets=int(stats["rx"]["packets"]),
                    dropped_downlink=_tbf_drops(None, link.host_if),
                    dropped_uplink=_tbf_drops(link.namespace, link.node_if),
                )
            )
        return result

    def describe(self) -> list[dict[str, object]]:
        """Per link: namespace, addresses, rates -- for a report."""
        return [
            {
                "index": link.index,
                "namespace": link.namespace,
                "host_address": link.host_address,
                "node_address": link.node_address,
                "shape": link.shape.describe() if link.shape else None,
            }
            for link in self.links
        ]

    # --- helpers --------------------------------------------------------------------------
    def _create_link(self, index: int, shape: LinkShape | None) -> NodeLink:
        block = self._blocks[index]
        host_address, node_address = (str(a) for a in list(block.hosts())[:2])
        link = NodeLink(
            index=index,
            namespace=f"fedsync-{self.tag}-{index}",
            host_if=f"fs{self.tag}h{index}",
            node_if=f"fs{self.tag}n{index}",
            host_address=host_address,
            node_address=node_address,
            shape=shape,
        )
        ip, ns = _ip(), link.namespace
        _run([ip, "netns", "add", ns])
        self._namespaces.append(ns)
        _run([ip, "link", "add", link.host_if, "type", "veth", "peer", "name", link.node_if])
        self._host_ifs.append(link.host_if)
        _run([ip, "link", "set", link.node_if, "netns", ns])
        _run([ip, "addr", "add", f"{host_address}/30", "dev", link.host_if])
        _run([ip, "link", "set", link.host_if, "up"])
        _run([ip, "-n", ns, "link", "set", "lo", "up"])
        _run([ip, "-n", ns, "addr", "add", f"{node_address}/30", "dev", link.node_if])
        _run([ip, "-n", ns, "link", "set", link.node_if, "up"])
        if host_address != self.server_address:
            # The SuperLink's one address, reached through this node's own link.
            _run([ip, "-n", ns, "route", "add", f"{self.server_address}/32", "via", host_address])
        if shape is not None:
            tc = _tc()
            if math.isfinite(shape.downlink_mbit):
                _run([tc, "qdisc", "add", "dev", link.host_if, "root", "tbf",
                      *tbf_args(shape.downlink_mbit)])  # fmt: skip
            if math.isfinite(shape.uplink_mbit):
                _run([tc, "-n", ns, "qdisc", "add", "dev", link.node_if, "root", "tbf",
                      *tbf_args(shape.uplink_mbit)])  # fmt: skip
        return link

    def _refuse_overlap(self) -> None:
        wanted = ipaddress.ip_network(self.subnet)
        routes = json.loads(_run([_ip(), "-j", "-4", "route", "show", "table", "all"]).stdout)
        for route in routes:
            dst = route.get("dst", "")
            if dst in ("", "default") or route.get("type") in ("broadcast", "local"):
                continue
            with contextlib.suppress(ValueError):
                if ipaddress.ip_network(dst, strict=False).overlaps(wanted):
                    raise NetnsUnavailable(
                        f"subnet {self.subnet} overlaps the host route {dst} "
                        f"({route.get('dev', '?')}); pick another with subnet=..."
                    )


def _tbf_drops(namespace: str | None, interface: str) -> int:
    command = [_tc(), "-s", "-j", "qdisc", "show", "dev", interface]
    if namespace is not None:
        command[1:1] = ["-n", namespace]
    try:
        qdiscs = json.loads(_run(command).stdout)
    except (NetworkCommandError, json.JSONDecodeError):
        return 0
    return sum(int(q.get("drops", 0)) for q in qdiscs if q.get("kind") == "tbf")


@functools.cache
def netns_unavailable_reason() -> str:
    """Why shaped links cannot be built here, or ``""`` when they can.

    Probes for real (root, ``ip``/``tc``, creating a namespace, a veth and a ``tbf``)
    and removes what the probe created; the answer is cached for the process.
    """
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"{tool} (iproute2) is not installed"
    tag = secrets.token_hex(2)
    namespace, host_if, node_if = f"fedsync-probe-{tag}", f"fsp{tag}h", f"fsp{tag}n"
    try:
        steps = [
            ([_ip(), "netns", "add", namespace], "ip netns add"),
            ([_ip(), "link", "add", host_if, "type", "veth", "peer", "name", node_if], "veth"),
            ([_ip(), "link", "set", node_if, "netns", namespace], "moving a veth end"),
            ([_tc(), "qdisc", "add", "dev", host_if, "root", "tbf", *tbf_args(1.0)], "tc tbf"),
        ]
        for command, what in steps:
            result = _run(command, check=False)
            if result.returncode != 0:
                return f"{what} is not permitted here: {result.stderr.strip()}"
        return ""
    finally:
        _run([_ip(), "link", "del", host_if], check=False)
        _run([_ip(), "netns", "del", namespace], check=False)


def _ip() -> str:
    return shutil.which("ip") or "/usr/sbin/ip"


def _tc() -> str:
    return shutil.which("tc") or "/usr/sbin/tc"


def _run(command: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(command), capture_output=True, text=True, check=False, timeout=30)
    if check and result.returncode != 0:
        raise NetworkCommandError(
            f"{' '.join(command)} failed (exit {result.returncode}): {result.stderr.strip()}"
        )
    return result
