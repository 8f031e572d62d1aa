"""The model's schema: which tensors a frame holds, agreed once instead of sent each time.

Both ends of a federated run know the model, so a frame need not spell out every
tensor's name, shape and dtype. It carries an 8-byte digest of them instead
(:func:`schema_digest`), and the receiver, which holds the same specs, checks the
digest and takes names, shapes and dtypes from its own copy. The digest is over the
specs in canonical order (sorted by name), so two ends that list the model's tensors
in different orders still agree; a digest-only frame holds its tensors in that
order. A frame for a receiver that does not know the model yet carries the table
itself (see :mod:`fedsync.wire.layout`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from fedsync.updates import TensorSpec
from fedsync.wire.buffer import encode_varint
from fedsync.wire.registry import DTYPE_CODES

__all__ = ["DIGEST_BYTES", "as_spec_list", "canonical", "schema_digest"]

DIGEST_BYTES = 8
"""Bytes of the schema digest (BLAKE2b-64): a chance collision between two different
models is about 2**-64."""


def as_spec_list(specs: Mapping[str, TensorSpec] | Iterable[TensorSpec]) -> list[TensorSpec]:
    """The specs of a mapping (its values) or an iterable, as a list."""
    if isinstance(specs, Mapping):
        return list(specs.values())
    return list(specs)


def canonical(specs: Mapping[str, TensorSpec] | Iterable[TensorSpec]) -> list[TensorSpec]:
    """The specs sorted by name (the order of a digest-only frame's tensors)."""
    return sorted(as_spec_list(specs), key=lambda spec: spec.name)


def schema_digest(specs: Mapping[str, TensorSpec] | Iterable[TensorSpec]) -> bytes:
    """The 8-byte digest of names, shapes and dtypes, independent of their order.

    Raises
    ------
    ValueError
        For a dtype the format does not carry or a negative dimension.
    """
    h = hashlib.blake2b(digest_size=DIGEST_BYTES, person=b"fedsync-schema")
    ordered = canonical(specs)
    h.update(encode_varint(len(ordered)))
    for spec in ordered:
        name = spec.name.encode("utf-8")
        if spec.dtype not in DTYPE_CODES:
            raise ValueError(f"tensor {spec.name!r}: unknown dtype {spec.dtype!r}")
        h.update(encode_varint(len(name)) + name)
        h.update(bytes((DTYPE_CODES[spec.dtype], len(spec.shape))))
        for dim in spec.shape:
            h.update(encode_varint(int(dim)))
    return h.digest()
