"""Bounds the decoder checks before it allocates anything a payload asks for."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_LIMITS", "MAX_FORMAT_NUMEL", "FrameLimits"]

MAX_FORMAT_NUMEL = (1 << 56) - 1
"""The format's own ceiling on a tensor's element count, whatever the limits say:
positions then fit the 56-bit bit-reader window of the index kernels."""


@dataclass(frozen=True)
class FrameLimits:
    """Largest sizes a frame may declare; anything larger is rejected unread.

    Every count the decoder reads is checked against these bounds before it allocates
    memory for it, so a hostile frame cannot make the server allocate more than a
    small multiple of ``max_total_values`` and ``max_payload_bytes``: decoding
    holds the payload plus at most 12 bytes per value (an int64 position and a code
    of up to 4 bytes) plus a copy of the largest Rice section. A codec that derives
    positions from the frame's shape (``mask:<density>``) draws them in at most 32
    bytes per value, never in proportion to the declared element count. A
    context-coded index section (:mod:`fedsync.kernels.context_coding`) costs three bytes per
    element of its tensor's widest row, at most ``2**24`` elements per tensor. Its work,
    a step per element, is bounded by the bytes the frame carries
    (``max_context_numel_per_byte``) as well as in all (``max_context_numel``).

    Parameters
    ----------
    max_payload_bytes : int
        Largest frame, in bytes (checked first, on the raw payload length).
    max_tensors : int
        Most tensors in one frame.
    max_numel : int
        Most elements of one tensor's dense shape (also bounds each dimension).
    max_total_values : int
        Most kept values (codes) summed over all tensors of a frame.
    max_name_length : int
        Longest tensor or parameter name, in UTF-8 bytes.
    max_codec_length : int
        Longest codec description, in UTF-8 bytes.
    max_ndim : int
        Most dimensions of one tensor.
    max_params : int
        Most float parameter arrays attached to one tensor's values.
    max_context_numel : int
        Most elements, summed over a frame's context-coded index sections. Their
        decoding costs a step per element (not per byte of the frame), so this
        bounds the work a frame can ask for; encoders stay within the default.
    max_context_numel_per_byte : int
        Most elements a context-coded index section may cover per byte it has: a
        tensor of ``numel`` elements needs a section of at least
        ``ceil(numel / max_context_numel_per_byte)`` bytes (0 refuses the coding). The
        table declares each section's length and the decoder checks that the frame
        holds exactly those bytes before it decodes any, so a frame's context work is
        at most this many steps per byte of it: a small frame cannot declare large
        context-coded tensors. Real supports stay far below the default (the context
        coder's densest real section, top-k 0.1 % on the Fashion-MNIST CNN, covers
        about 900 elements per byte); the encoder codes a sparser one otherwise.
    """

    max_payload_bytes: int = 1 << 30
    max_tensors: int = 65_536
    max_numel: int = 1 << 34
    max_total_values: int = 1 << 28
    max_name_length: int = 1024
    max_codec_length: int = 4096
    max_ndim: int = 32
    max_params: int = 64
    max_context_numel: int = 1 << 26
    max_context_numel_per_byte: int = 4096

    def __post_init__(self) -> None:
        for name in (
            "max_payload_bytes",
            "max_tensors",
            "max_numel",
            "max_total_values",
            "max_name_length",
            "max_codec_length",
            "max_ndim",
            "max_params",
            "max_context_numel",
            "max_context_numel_per_byte",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"FrameLimits.{name} must be a non-negative int, got {value!r}")
        if self.max_numel > MAX_FORMAT_NUMEL:
            raise ValueError(
                f"FrameLimits.max_numel must be at most {MAX_FORMAT_NUMEL} (2**56 - 1, the "
                f"format's ceiling), got {self.max_numel}"
            )
        if self.max_ndim > 255:
            raise ValueError(
                f"FrameLimits.max_ndim must be at most 255 (ndim is one byte), got {self.max_ndim}"
            )


DEFAULT_LIMITS = FrameLimits()
"""Limits generous enough for any model fedsync trains (2**34 elements per tensor)."""
