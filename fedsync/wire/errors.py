"""The one typed error the wire decoder raises, and its subclasses.

Every fault a hostile or damaged payload can carry maps to exactly one subclass of
:class:`PayloadError` (itself a :class:`ValueError`), so callers that only care
"was the payload bad?" catch one type while tests and logs can tell faults apart.
The message always names the fault: which field, which tensor, expected vs got.
"""

from __future__ import annotations

__all__ = [
    "BadMagic",
    "ChecksumMismatch",
    "CountMismatch",
    "IndexOutOfRange",
    "LimitExceeded",
    "MalformedField",
    "PayloadError",
    "SchemaMismatch",
    "SchemaRequired",
    "TrailingBytes",
    "TruncatedPayload",
    "UnexpectedCodec",
    "UnknownCode",
    "UnorderedIndices",
    "UnsupportedVersion",
]


class PayloadError(ValueError):
    """A payload that is not a valid fedsync frame.

    Parameters
    ----------
    problem : str
        What is wrong, in words.
    field : str, optional
        The frame field at fault (``"magic"``, ``"bits"``, ``"index section"``, ...).
    tensor : str, optional
        The tensor at fault, as ``"#<position> '<name>'"`` (or just ``"#<position>"``
        when its name has not been read yet).
    expected, got : object, optional
        What the decoder expected and what it found.

    Attributes
    ----------
    problem, field, tensor, expected, got
        The parameters, kept so callers and tests need not parse the message.
    """

    def __init__(
        self,
        problem: str,
        *,
        field: str | None = None,
        tensor: str | None = None,
        expected: object = None,
        got: object = None,
    ) -> None:
        self.problem = problem
        self.field = field
        self.tensor = tensor
        self.expected = expected
        self.got = got
        super().__init__(self._compose())

    def _compose(self) -> str:
        where = []
        if self.tensor is not None:
            where.append(f"tensor {self.tensor}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        text = f"{', '.join(where)}: {self.problem}" if where else self.problem
        if self.expected is not None or self.got is not None:
            text += f" (expected {self.expected}, got {self.got})"
        return text


class TruncatedPayload(PayloadError):
    """The payload ends before a field or section it declares."""


class TrailingBytes(PayloadError):
    """Bytes are left over after the last field a section or frame declares."""


class ChecksumMismatch(PayloadError):
    """The CRC32 at the end of the frame does not match its contents."""


class BadMagic(PayloadError):
    """The payload does not start with the frame magic."""


class UnsupportedVersion(PayloadError):
    """The frame's format version is not one this decoder reads."""


class LimitExceeded(PayloadError):
    """A declared size is beyond the decoder's :class:`~fedsync.wire.FrameLimits`."""


class MalformedField(PayloadError):
    """A field holds a value the format does not allow (bad varint, bad UTF-8, ...)."""


class UnknownCode(MalformedField):
    """An enumerated field (dtype, scheme, index mode, index coding) has an unknown code."""


class CountMismatch(MalformedField):
    """A count disagrees with what the tensor's spec or its index section implies."""


class IndexOutOfRange(PayloadError):
    """A decoded position is outside ``[0, numel)``."""


class UnorderedIndices(PayloadError):
    """Decoded positions are not strictly increasing (out of order or duplicated)."""


class UnexpectedCodec(PayloadError):
    """A well-formed frame names a codec other than the one the receiver expects (a
    reply in another codec than its task assigned). Raised on the frame's header,
    before its schema, its table or any pipeline for that codec."""


class SchemaMismatch(PayloadError):
    """The frame's tensors (its schema digest or its tensor table) are not the model
    the receiver expects: a name missing or extra, a shape or dtype that differs."""


class SchemaRequired(PayloadError):
    """The frame carries only its schema digest and the receiver was given no model
    specs to resolve it: decode with ``expected=`` (the model's tensor specs)."""
