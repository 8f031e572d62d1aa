"""The errors the compressor pipeline raises.

Two families, kept apart on purpose:

* programming and configuration errors are plain :class:`ValueError` subclasses
  (:class:`SpecError` for a bad spec string or config, :class:`NonFiniteInputError`
  for an update that cannot be encoded);
* faults in *received* bytes are :class:`fedsync.wire.PayloadError` subclasses, so a
  server that catches ``PayloadError`` around ``decode`` catches every bad payload,
  whether the frame itself was broken (the wire decoder's errors) or a well-formed
  frame disagrees with the codec it names, with the expected model, or carries
  non-finite values (these).
"""

from __future__ import annotations

from fedsync.wire.errors import PayloadError

__all__ = [
    "CodecMismatch",
    "NonFiniteInputError",
    "NonFiniteUpdate",
    "SpecError",
    "UnknownCodec",
    "UpdateMismatch",
]


class SpecError(ValueError):
    """A compressor spec string or typed config is malformed or out of range.

    The message names the stage and the offending key or value and lists what is
    valid (stage names, keys, ranges).
    """


class NonFiniteInputError(ValueError):
    """An update to encode holds NaN or Inf among the values it would send."""


class UnknownCodec(PayloadError):
    """The frame's codec description is not a valid spec (or needs masks we lack)."""


class CodecMismatch(PayloadError):
    """A tensor's index mode, count, scheme, bits, params or codes contradict the
    codec the frame names (e.g. 4-bit codes under ``uniform:8``, a code outside the
    quantizer's alphabet, more values than the sparsifier can send)."""


class UpdateMismatch(PayloadError):
    """The decoded tensors are not the ones expected (a name missing or extra, a
    shape or dtype that differs)."""


class NonFiniteUpdate(PayloadError):
    """A decoded value is NaN or infinite."""
