"""The shared downlink's frame: the model changes a device missed, or a whole model.

With ``downlink-kind = "shared"`` the server encodes one change per model version,
the same for every device (:mod:`fedsync.aggregation.shared_downlink`), and every
device's model follows the same sequence of *mirrors*::

    mirror_t = grid(mirror_b + decode(change_t))     (b: the version before t)

where ``grid`` rounds to the values the whole-model codec carries exactly (fp16 for
``none+fp16``): so a whole model, too, lands a device on a mirror, bit for bit.
:func:`advance` is that step; the server and the devices both take it, with the same
operations in the same order. A device ``L`` versions behind gets the ``L`` changes it
missed in one frame and applies them in order; one that holds the current version
gets an empty payload (zero bytes: nothing to send).

Layout (little-endian; ``varint`` as in :mod:`fedsync.wire.layout`):

========== ============ ==============================================================
size       field        meaning
========== ============ ==============================================================
4          magic        ``b"FSSD"``
1          version      shared-frame format version, 1
1          grid         the mirrors' grid: 0 ``fp32``, 1 ``fp16``, 2 ``bf16``
1          kind         0: changes, 1: a whole model
varint     epoch        the mirror sequence (a new one starts whenever the server has to
                        restart it: a pruning cut, a resumed run, a lag-guard reset)
varint     target       the model version the device holds once it applied the frame
(changes)  varint base  the version (of ``epoch``) the device must hold
(changes)  varint count links, >= 1; then per link: varint link target (strictly
                        increasing, the last one ``target``), varint length, that many
                        bytes of an update frame (:mod:`fedsync.wire.frame`)
(whole)    varint length, then that many bytes of the whole model's update frame
4 (u32)    crc32        CRC-32 (zlib) of every byte before it
========== ============ ==============================================================

Each link's base is the previous link's target (the first link's is ``base``). The
decoder checks the magic, the checksum, the codes, the counts, the versions and every
length before it slices a link; every fault is a :class:`~fedsync.wire.PayloadError`
subclass naming the field. What the device checks against its own state (the base it
holds, the version its task names) is the client's: :mod:`fedsync.clientapp.compressed`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from fedsync.wire.buffer import Reader, Writer, new_container, open_container, seal_container
from fedsync.wire.errors import (
    LimitExceeded,
    MalformedField,
    TrailingBytes,
    UnknownCode,
)

__all__ = [
    "GRIDS",
    "MAX_LINKS",
    "SHARED_FORMAT_VERSION",
    "SHARED_MAGIC",
    "SharedFrame",
    "advance",
    "decode_shared",
    "encode_changes",
    "encode_whole",
    "to_grid",
]

SHARED_MAGIC = b"FSSD"
SHARED_FORMAT_VERSION = 1
GRIDS: tuple[str, ...] = ("fp32", "fp16", "bf16")
"""The grids by their code (the frame's ``grid`` byte)."""
MAX_LINKS = 4096
"""Most changes one frame may carry (the server's cache holds far fewer)."""

_KIND_CHANGES, _KIND_WHOLE = 0, 1
_LIMITS = {
    "fp16": (torch.float16, 65504.0),
    "bf16": (torch.bfloat16, float(torch.finfo(torch.bfloat16).max)),
}


def to_grid(tensor: torch.Tensor, grid: str) -> torch.Tensor:
    """``tensor`` rounded to ``grid`` (nearest-even, saturating as the codec's ``fp16``
    and ``bf16`` quantizers do), in its own dtype; a new tensor, never a view."""
    if grid == "fp32":
        return tensor.clone()
    if grid not in _LIMITS:
        raise ValueError(f"unknown grid {grid!r}; valid: {', '.join(GRIDS)}")
    dtype, limit = _LIMITS[grid]
    return tensor.clamp(-limit, limit).to(dtype).to(tensor.dtype)


def advance(
    held: Mapping[str, torch.Tensor], change: Mapping[str, torch.Tensor], grid: str
) -> dict[str, torch.Tensor]:
    """One step of the mirror sequence: ``grid(held + change)``, per tensor of ``held``,
    in ``held``'s dtype and on its device (the server and every device take exactly
    this step, so they hold the same bits)."""
    return {
        name: to_grid((tensor + change[name].to(tensor.device)).to(tensor.dtype), grid)
        for name, tensor in held.items()
    }


@dataclass(frozen=True)
class SharedFrame:
    """A decoded shared frame.

    Attributes
    ----------
    grid : str
        ``fp32``, ``fp16`` or ``bf16``.
    epoch : int
        The mirror sequence the frame belongs to.
    target : int
        The model version the device holds once it applied the frame.
    base : int
        The version the device must hold (``-1`` for a whole model).
    links : tuple of (int, bytes)
        Each change's target version and update frame, in order (empty for a whole
        model).
    whole : bytes or None
        The whole model's update frame.
    """

    grid: str
    epoch: int
    target: int
    base: int = -1
    links: tuple[tuple[int, bytes], ...] = ()
    whole: bytes | None = None


def encode_changes(
    links: Sequence[tuple[int, bytes]], *, base: int, epoch: int, grid: str
) -> bytes:
    """The frame of the changes ``links`` (``(target version, update frame)`` each, in
    order) for a device at version ``base`` of sequence ``epoch``."""
    if not links:
        raise ValueError("a changes frame needs at least one change")
    writer = _head(grid, _KIND_CHANGES, epoch, links[-1][0])
    writer.varint(base)
    writer.varint(len(links))
    previous = base
    for target, frame in links:
        if target <= previous:
            raise ValueError(f"change targets must increase from base {base}: {target}")
        previous = target
        writer.varint(target)
        writer.varint(len(frame))
        writer.raw(frame)
    return seal_container(writer)


def encode_whole(frame: bytes, *, target: int, epoch: int, grid: str) -> bytes:
    """The frame of a whole model (its update frame ``frame``) at version ``target``."""
    writer = _head(grid, _KIND_WHOLE, epoch, target)
    writer.varint(len(frame))
    writer.raw(frame)
    return seal_container(writer)


def decode_shared(payload: bytes | memoryview) -> SharedFrame:
    """Validate a shared frame's container (the update frames inside are the codec's).

    Raises
    ------
    PayloadError
        As a subclass naming the fault: :class:`~fedsync.wire.TruncatedPayload`,
        :class:`~fedsync.wire.BadMagic`, :class:`~fedsync.wire.ChecksumMismatch`,
        :class:`~fedsync.wire.UnsupportedVersion`, :class:`~fedsync.wire.UnknownCode`
        (grid, kind), :class:`~fedsync.wire.MalformedField` (versions that do not
        increase), :class:`~fedsync.wire.LimitExceeded` (link count),
        :class:`~fedsync.wire.TrailingBytes`.
    """
    reader = open_container(
        payload,
        magic=SHARED_MAGIC,
        format_version=SHARED_FORMAT_VERSION,
        what="shared",
        min_bytes=len(SHARED_MAGIC) + 3 + 4,
    )
    grid_code = reader.u8("grid")
    if grid_code >= len(GRIDS):
        raise UnknownCode("unknown grid", field="grid", expected=f"< {len(GRIDS)}", got=grid_code)
    kind = reader.u8("kind")
    if kind not in (_KIND_CHANGES, _KIND_WHOLE):
        raise UnknownCode("unknown kind", field="kind", expected="0 or 1", got=kind)
    epoch = reader.varint("epoch")
    target = reader.varint("target")
    grid = GRIDS[grid_code]
    if kind == _KIND_WHOLE:
        whole = bytes(reader.take(reader.varint("length"), "whole model"))
        _at_end(reader)
        return SharedFrame(grid, epoch, target, whole=whole)
    base = reader.varint("base")
    count = reader.varint("count")
    if not 1 <= count <= MAX_LINKS:
        raise LimitExceeded(
            "change count out of range", field="count", expected=f"1..{MAX_LINKS}", got=count
        )
    links = []
    previous = base
    for position in range(count):
        label = f"change #{position}"
        link_target = reader.varint("link target", label)
        if link_target <= previous:
            raise MalformedField(
                "change targets do not increase",
                field="link target",
                tensor=label,
                expected=f"> {previous}",
                got=link_target,
            )
        previous = link_target
        frame = bytes(reader.take(reader.varint("length", label), "change", label))
        links.append((link_target, frame))
    if previous != target:
        raise MalformedField(
            "the last change does not reach the frame's target",
            field="target",
            expected=previous,
            got=target,
        )
    _at_end(reader)
    return SharedFrame(grid, epoch, target, base=base, links=tuple(links))


def _head(grid: str, kind: int, epoch: int, target: int) -> Writer:
    if grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r}; valid: {', '.join(GRIDS)}")
    writer = new_container(magic=SHARED_MAGIC, format_version=SHARED_FORMAT_VERSION)
    writer.u8(GRIDS.index(grid))
    writer.u8(kind)
    writer.varint(epoch)
    writer.varint(target)
    return writer


def _at_end(reader: Reader) -> None:
    if reader.remaining:
        raise TrailingBytes(
            "bytes after the shared frame's last field", field="crc32", got=reader.remaining
        )
