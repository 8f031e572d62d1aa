"""The relay downlink's frame: the aggregations a device missed, as the server made them.

With ``downlink-kind = "relay"`` the server does not re-encode the model for its devices:
it forwards, per model version, the uplink payloads that version's aggregation took
(already compressed, each in its own codec), their weights, the factor the step was
scaled by, and how the buffer averaged them and the server optimizer stepped. A device
replays those aggregations on its own copy of the model and of the optimizer's state
(:mod:`fedsync.aggregation.relay_downlink`), with the server's operations in the server's
order, so its model is the server's, bit for bit -- what SparseLoCo's all-gather gives a
synchronous site, here through the server and asynchronously. A device's own uplink
payloads are not sent back to it: the frame names each by its digest
(:func:`uplink_digest`, BLAKE2b of 16 bytes) and the device replays the copy it kept
when it sent it.

Layout (little-endian; ``varint`` and ``text`` as in :mod:`fedsync.wire.buffer`):

========== ============ ==============================================================
size       field        meaning
========== ============ ==============================================================
4          magic        ``b"FSRY"``
1          version      relay-frame format version, 2
varint     base         the model version the device must hold
varint     target       the version it holds once it replayed the frame
text       mean         the buffer's mean (``count``, ``weight``, ``selected``)
text       optimizer    the server optimizer, as JSON of
                        :meth:`~fedsync.aggregation.server_optimizer.ServerOptimizer.
                        hyperparameters`
varint     count        aggregations, ``target - base`` (1..:data:`MAX_STEPS`); then per
                        aggregation:
8 (f64)    factor       what the aggregate was multiplied by before the step (1: nothing)
varint     entries      updates it took (1..:data:`MAX_ENTRIES`); then per update:
8 (f64)    weight       its weight in the buffer
text       codec        the codec spec it was decoded with (its task's)
1          source       0: the frame carries the update; 1: it is the receiving device's own
source 0:
varint     length       then that many bytes: its uplink frame (:mod:`fedsync.wire.frame`)
source 1:
16         digest       :func:`uplink_digest` of the uplink frame the device sent
4 (u32)    crc32        CRC-32 (zlib) of every byte before it
========== ============ ==============================================================

The aggregations are those of versions ``base + 1 .. target`` in order. The decoder
checks the magic, the checksum, every count against its bound and every length against
the bytes left before it slices anything; every fault is a
:class:`~fedsync.wire.PayloadError` subclass naming the field. A device that holds the
target already gets an empty payload (nothing to send).
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fedsync.wire.buffer import Reader, Writer, new_container, open_container, seal_container
from fedsync.wire.errors import LimitExceeded, MalformedField, TrailingBytes

__all__ = [
    "MAX_ENTRIES",
    "MAX_STEPS",
    "OWN_DIGEST_BYTES",
    "RELAY_FORMAT_VERSION",
    "RELAY_MAGIC",
    "RelayEntry",
    "RelayFrame",
    "RelayStep",
    "check_step",
    "decode_relay",
    "encode_relay",
    "encode_step",
    "uplink_digest",
]

RELAY_MAGIC = b"FSRY"
RELAY_FORMAT_VERSION = 2
MAX_STEPS = 1 << 20
"""Most aggregations in one frame (a device that missed more is resynced by the server)."""
MAX_ENTRIES = 4096
"""Most updates in one aggregation (the buffer's ``K``)."""
MAX_MEAN_LEN = 16
MAX_OPTIMIZER_LEN = 1024
MAX_CODEC_LEN = 512
OWN_DIGEST_BYTES = 16
"""Length of the digest that names a device's own uplink payload."""
_F64 = struct.Struct("<d")
_INLINE, _OWN = 0, 1


def uplink_digest(payload: bytes | memoryview) -> bytes:
    """The digest a relay frame names a device's own uplink frame by (BLAKE2b, 16 bytes)."""
    return hashlib.blake2b(payload, digest_size=OWN_DIGEST_BYTES).digest()


@dataclass(frozen=True)
class RelayEntry:
    """One update of an aggregation: its weight, codec spec and uplink frame.

    ``own`` non-empty: the update is the receiving device's own, named by its
    :func:`uplink_digest`; ``payload`` is then empty (the device kept what it sent).
    """

    weight: float
    codec: str
    payload: bytes
    own: bytes = b""

    def as_own(self) -> RelayEntry:
        """The entry as its sender receives it: named by its digest, without its bytes."""
        return RelayEntry(self.weight, self.codec, b"", uplink_digest(self.payload))


@dataclass(frozen=True)
class RelayStep:
    """One aggregation: the factor its aggregate was scaled by and the updates it took."""

    factor: float
    entries: tuple[RelayEntry, ...]


@dataclass(frozen=True)
class RelayFrame:
    """A decoded relay frame (see the module docstring)."""

    base: int
    target: int
    mean: str
    optimizer: str
    steps: tuple[RelayStep, ...]

    @property
    def own(self) -> set[bytes]:
        """The digests of the receiving device's own updates the frame names."""
        return {entry.own for step in self.steps for entry in step.entries if entry.own}

    def with_own(self, sent: Mapping[bytes, bytes]) -> RelayFrame:
        """The frame with each own update's bytes filled in from ``sent`` (digest ->
        uplink frame, what the device kept).

        Raises
        ------
        KeyError
            If the frame names an update ``sent`` does not hold.
        """
        missing = self.own - set(sent)
        if missing:
            raise KeyError(f"{len(missing)} own update(s) named by the frame are not kept")
        steps = tuple(
            RelayStep(
                step.factor,
                tuple(
                    RelayEntry(entry.weight, entry.codec, sent[entry.own]) if entry.own else entry
                    for entry in step.entries
                ),
            )
            for step in self.steps
        )
        return RelayFrame(self.base, self.target, self.mean, self.optimizer, steps)


def check_step(factor: float, entries: Sequence[RelayEntry]) -> None:
    """Raise ``ValueError`` if ``entries`` scaled by ``factor`` cannot be an aggregation
    of a frame (none or too many, a weight or factor not finite, an own entry that is not
    a bare digest)."""
    if not entries:
        raise ValueError("an aggregation takes at least one update")
    if len(entries) > MAX_ENTRIES:
        raise ValueError(f"an aggregation of {len(entries)} updates exceeds {MAX_ENTRIES}")
    _finite("factor", factor)
    for entry in entries:
        _finite("weight", entry.weight)
        if entry.own and (len(entry.own) != OWN_DIGEST_BYTES or entry.payload):
            raise ValueError(
                f"an own entry names a digest of {OWN_DIGEST_BYTES} bytes and carries no payload"
            )


def encode_step(factor: float, entries: Sequence[RelayEntry]) -> bytes:
    """One aggregation's bytes, as a frame carries them (:func:`check_step` first)."""
    check_step(factor, entries)
    writer = Writer()
    writer.raw(_F64.pack(factor))
    writer.varint(len(entries))
    for entry in entries:
        writer.raw(_F64.pack(entry.weight))
        writer.text(entry.codec)
        if entry.own:
            writer.raw(bytes([_OWN]))
            writer.raw(entry.own)
            continue
        writer.raw(bytes([_INLINE]))
        writer.varint(len(entry.payload))
        writer.raw(entry.payload)
    return b"".join(bytes(part) for part in writer.parts)


def encode_relay(
    steps: Sequence[bytes], *, base: int, target: int, mean: str, optimizer: str
) -> bytes:
    """The frame of the aggregations ``steps`` (:func:`encode_step` bytes, versions
    ``base + 1 .. target``) for a device at version ``base``."""
    if not steps or len(steps) != target - base:
        raise ValueError(
            f"a relay frame from version {base} to {target} needs {target - base} "
            f"aggregations, got {len(steps)}"
        )
    writer = new_container(magic=RELAY_MAGIC, format_version=RELAY_FORMAT_VERSION)
    writer.varint(base)
    writer.varint(target)
    writer.text(mean)
    writer.text(optimizer)
    writer.varint(len(steps))
    for step in steps:
        writer.raw(step)
    return seal_container(writer)


def decode_relay(payload: bytes | memoryview) -> RelayFrame:
    """Validate a relay frame (the uplink frames inside are the codecs').

    Raises
    ------
    PayloadError
        As a subclass naming the fault: :class:`~fedsync.wire.TruncatedPayload`,
        :class:`~fedsync.wire.BadMagic`, :class:`~fedsync.wire.ChecksumMismatch`,
        :class:`~fedsync.wire.UnsupportedVersion`, :class:`~fedsync.wire.LimitExceeded`
        (counts, text lengths), :class:`~fedsync.wire.MalformedField` (versions, a
        count that is not ``target - base``, a weight or factor that is not finite),
        :class:`~fedsync.wire.TrailingBytes`.
    """
    reader = open_container(
        payload,
        magic=RELAY_MAGIC,
        format_version=RELAY_FORMAT_VERSION,
        what="relay",
        min_bytes=len(RELAY_MAGIC) + 1 + 4,
    )
    base = reader.varint("base")
    target = reader.varint("target")
    if target <= base:
        raise MalformedField(
            "the target version is not after the base", field="target", expected=f"> {base}"
        )
    mean = reader.text("mean", MAX_MEAN_LEN, "relay mean")
    optimizer = reader.text("optimizer", MAX_OPTIMIZER_LEN, "relay optimizer")
    count = reader.varint("count")
    if not 1 <= count <= MAX_STEPS:
        raise LimitExceeded(
            "aggregation count out of range", field="count", expected=f"1..{MAX_STEPS}", got=count
        )
    if count != target - base:
        raise MalformedField(
            "the aggregation count is not target - base",
            field="count",
            expected=target - base,
            got=count,
        )
    steps = []
    for position in range(count):
        label = f"aggregation #{position}"
        factor = _f64(reader, "factor", label)
        entries_count = reader.varint("entries", label)
        if not 1 <= entries_count <= MAX_ENTRIES:
            raise LimitExceeded(
                "update count out of range",
                field="entries",
                tensor=label,
                expected=f"1..{MAX_ENTRIES}",
                got=entries_count,
            )
        entries = []
        for index in range(entries_count):
            where = f"{label} update #{index}"
            weight = _f64(reader, "weight", where)
            codec = reader.text("codec", MAX_CODEC_LEN, "relay codec", where)
            (source,) = bytes(reader.take(1, "source", where))
            if source == _OWN:
                own = bytes(reader.take(OWN_DIGEST_BYTES, "digest", where))
                entries.append(RelayEntry(weight, codec, b"", own))
                continue
            if source != _INLINE:
                raise MalformedField(
                    "unknown update source",
                    field="source",
                    tensor=where,
                    expected="0 or 1",
                    got=source,
                )
            frame = bytes(reader.take(reader.varint("length", where), "update frame", where))
            entries.append(RelayEntry(weight, codec, frame))
        steps.append(RelayStep(factor, tuple(entries)))
    if reader.remaining:
        raise TrailingBytes(
            "bytes after the relay frame's last field", field="crc32", got=reader.remaining
        )
    return RelayFrame(base, target, mean, optimizer, tuple(steps))


def _f64(reader: Reader, field: str, where: str) -> float:
    (value,) = _F64.unpack(bytes(reader.take(8, field, where)))
    if not math.isfinite(value):
        raise MalformedField(f"{field} is not finite", field=field, tensor=where, got=value)
    return float(value)


def _finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"a relay {name} must be finite, got {value}")
    return float(value)
