"""The byte-exact wire format of a compressed model update.

:func:`encode_frame` turns a codec description and the compressor's
:class:`~fedsync.updates.CompressedTensor` list into one self-checking frame;
:func:`decode_frame` turns bytes back into the same objects, trusting nothing: any
fault raises a :class:`PayloadError` subclass that names it.

Modules, one job each: :mod:`~fedsync.wire.layout` (the byte layout, documented
field by field), :mod:`~fedsync.wire.encoder` and :mod:`~fedsync.wire.decoder`,
:mod:`~fedsync.wire.index_coding` (choosing and coding positions),
:mod:`~fedsync.wire.schema` (the model digest a frame carries instead of its table),
:mod:`~fedsync.wire.buffer` (varints, bounded reads), :mod:`~fedsync.wire.mask` (the
pruning masks of a pruned run, as bitmaps), :mod:`~fedsync.wire.registry`
(the one-byte codes), :mod:`~fedsync.wire.limits`, :mod:`~fedsync.wire.errors`, and
:mod:`~fedsync.wire.testing` (building broken frames on purpose).
"""

from fedsync.wire.errors import (
    BadMagic,
    ChecksumMismatch,
    CountMismatch,
    IndexOutOfRange,
    LimitExceeded,
    MalformedField,
    PayloadError,
    SchemaMismatch,
    SchemaRequired,
    TrailingBytes,
    TruncatedPayload,
    UnexpectedCodec,
    UnknownCode,
    UnorderedIndices,
    UnsupportedVersion,
)
from fedsync.wire.frame import (
    FORMAT_VERSION,
    MAGIC,
    TensorLayout,
    decode_frame,
    encode_frame,
    inspect_frame,
)
from fedsync.wire.index_coding import index_bits_for
from fedsync.wire.limits import DEFAULT_LIMITS, FrameLimits
from fedsync.wire.schema import schema_digest

__all__ = [
    "DEFAULT_LIMITS",
    "FORMAT_VERSION",
    "MAGIC",
    "BadMagic",
    "ChecksumMismatch",
    "CountMismatch",
    "FrameLimits",
    "IndexOutOfRange",
    "LimitExceeded",
    "MalformedField",
    "PayloadError",
    "SchemaMismatch",
    "SchemaRequired",
    "TensorLayout",
    "TrailingBytes",
    "TruncatedPayload",
    "UnexpectedCodec",
    "UnknownCode",
    "UnorderedIndices",
    "UnsupportedVersion",
    "decode_frame",
    "encode_frame",
    "index_bits_for",
    "inspect_frame",
    "schema_digest",
]
