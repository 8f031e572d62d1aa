"""A stand-in for a created :class:`~fedsync.deploy.netns.ShapedNetwork` (no root needed)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedsync.deploy.netns import LinkShape, NodeLink


@dataclass
class LoopbackNetwork:
    """Quacks like a created ShapedNetwork, on loopback (no namespace is built)."""

    shapes: list[LinkShape | None]
    links: list[NodeLink] = field(default_factory=list)
    server_address: str = "127.0.0.1"

    def __post_init__(self) -> None:
        self.links = [
            NodeLink(i, f"fedsync-t-{i}", f"h{i}", f"n{i}", "127.0.0.1", "127.0.0.2", shape)
            for i, shape in enumerate(self.shapes)
        ]
