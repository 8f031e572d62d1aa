"""The pruning-mask frame: which positions of each tensor a pruned model keeps, as bitmaps.

A run that prunes its global model (run config ``prune-at-version``) sends each device
this frame once, with its next task; from then on the update frames of both directions
carry values at the kept positions only (index mode ``mask``, no positions), and both
ends take the positions from the masks this frame delivered.

Layout (little-endian; ``varint`` and ``text`` as in :mod:`fedsync.wire.layout`):

========== ============ ==============================================================
size       field        meaning
========== ============ ==============================================================
4          magic        ``b"FSMK"``
1          version      mask format version, 1
varint     model version the global model version the masks were cut at
8          schema       the model's schema digest (:func:`fedsync.wire.schema_digest`)
varint     count        masked tensors (at most the model's tensor count)
...        tensors      per masked tensor, names strictly increasing: ``text`` name,
                        varint ``numel`` (must be the tensor's), varint ``kept``, then
                        ``ceil(numel / 8)`` bytes of bitmap (bit ``j`` is bit ``j % 8``
                        of byte ``j // 8``; set: kept; padding bits zero; exactly
                        ``kept`` bits set)
4 (u32)    crc32        CRC-32 (zlib) of every byte before it
========== ============ ==============================================================

A tensor of the model without an entry is not pruned (its updates travel whole). The
decoder checks the magic, the checksum, the model's schema, each name, each length and
each count before it allocates a tensor's mask; every fault is a
:class:`~fedsync.wire.PayloadError` subclass naming the field and the tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from fedsync.updates import TensorSpec
from fedsync.wire.buffer import new_container, open_container, seal_container
from fedsync.wire.errors import (
    CountMismatch,
    MalformedField,
    SchemaMismatch,
    TrailingBytes,
)
from fedsync.wire.schema import DIGEST_BYTES, schema_digest

__all__ = ["MASK_FORMAT_VERSION", "MASK_MAGIC", "MaskSet", "decode_masks", "encode_masks"]

MASK_MAGIC = b"FSMK"
MASK_FORMAT_VERSION = 1
_MAX_NAME = 1024
"""Longest tensor name the decoder reads (bytes)."""


@dataclass(frozen=True)
class MaskSet:
    """Decoded pruning masks.

    Attributes
    ----------
    version : int
        The model version the masks were cut at.
    masks : dict of str to torch.Tensor
        Name -> bool tensor of the tensor's shape (True: kept).
    """

    version: int
    masks: dict[str, torch.Tensor]


def encode_masks(
    masks: Mapping[str, torch.Tensor], specs: Mapping[str, TensorSpec], version: int
) -> bytes:
    """The mask frame of ``masks`` (a subset of the model ``specs``), cut at ``version``.

    Raises
    ------
    ValueError
        For a mask of a tensor the model does not have, or of another element count.
    """
    writer = new_container(magic=MASK_MAGIC, format_version=MASK_FORMAT_VERSION)
    writer.varint(version)
    writer.raw(schema_digest(specs))
    writer.varint(len(masks))
    for name in sorted(masks):
        if name not in specs:
            raise ValueError(f"mask for {name!r}, a tensor the model does not have")
        flat = masks[name].detach().to("cpu").reshape(-1).numpy() != 0
        if flat.size != specs[name].numel:
            raise ValueError(
                f"mask for {name!r} has {flat.size} entries, the tensor {specs[name].numel}"
            )
        writer.text(name)
        writer.varint(int(flat.size))
        writer.varint(int(flat.sum()))
        writer.raw(np.packbits(flat, bitorder="little").tobytes())
    return seal_container(writer)


def decode_masks(payload: bytes | memoryview, specs: Mapping[str, TensorSpec]) -> MaskSet:
    """Validate and decode a mask frame against the receiver's model ``specs``.

    Raises
    ------
    PayloadError
        As a subclass naming the fault: :class:`~fedsync.wire.BadMagic`,
        :class:`~fedsync.wire.UnsupportedVersion`, :class:`~fedsync.wire.ChecksumMismatch`,
        :class:`~fedsync.wire.SchemaMismatch` (masks of another model, or of a tensor it
        does not have), :class:`~fedsync.wire.CountMismatch` (a length or kept count
        that is not the tensor's), :class:`~fedsync.wire.TruncatedPayload`,
        :class:`~fedsync.wire.TrailingBytes`, :class:`~fedsync.wire.MalformedField`.
    """
    reader = open_container(
        payload,
        magic=MASK_MAGIC,
        format_version=MASK_FORMAT_VERSION,
        what="mask",
        min_bytes=len(MASK_MAGIC) + 1 + 4,
    )
    version = reader.varint("model version")
    digest = bytes(reader.take(DIGEST_BYTES, "schema"))
    if digest != schema_digest(specs):
        raise SchemaMismatch(
            "the masks are for another model (schema digest differs)",
            field="schema",
            expected=schema_digest(specs).hex(),
            got=digest.hex(),
        )
    count = reader.varint("count")
    if count > len(specs):
        raise CountMismatch(
            "more masked tensors than the model has", field="count", expected=len(specs), got=count
        )
    masks: dict[str, torch.Tensor] = {}
    previous = ""
    for position in range(count):
        label = f"#{position}"
        name = reader.text("name", _MAX_NAME, "mask name", label)
        label = f"#{position} {name!r}"
        if name not in specs:
            raise SchemaMismatch(
                "mask for a tensor the model does not have", field="name", tensor=label
            )
        if masks and name <= previous:
            raise MalformedField(
                "mask names are not strictly increasing", field="name", tensor=label
            )
        previous = name
        spec = specs[name]
        numel = reader.varint("numel", label)
        if numel != spec.numel:
            raise CountMismatch(
                "mask length is not the tensor's element count",
                field="numel",
                tensor=label,
                expected=spec.numel,
                got=numel,
            )
        kept = reader.varint("kept", label)
        if kept > numel:
            raise CountMismatch(
                "more kept positions than elements",
                field="kept",
                tensor=label,
                expected=f"<= {numel}",
                got=kept,
            )
        nbytes = (numel + 7) // 8
        raw = np.frombuffer(reader.take(nbytes, "bitmap", label), dtype=np.uint8)
        bits = np.unpackbits(raw, bitorder="little")
        if bits[numel:].any():
            raise MalformedField("bitmap padding bits are not zero", field="bitmap", tensor=label)
        flat = bits[:numel].astype(bool)
        if int(flat.sum()) != kept:
            raise CountMismatch(
                "bitmap does not set the declared kept count",
                field="bitmap",
                tensor=label,
                expected=kept,
                got=int(flat.sum()),
            )
        masks[name] = torch.from_numpy(flat.reshape(spec.shape).copy())
    if reader.remaining:
        raise TrailingBytes(
            "bytes left after the last mask", field="mask frame", got=f"{reader.remaining} bytes"
        )
    return MaskSet(version, masks)
