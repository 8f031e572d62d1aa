"""Exchanging fedsync frames between data-parallel ranks, and averaging what they hold.

Every rank encodes its tensors into one frame, the frames travel by an all-gather of
variable-length byte tensors (the lengths first, then the frames padded to the
longest), and every rank decodes *every* frame, its own included, and averages them
in rank order. Because all ranks decode the same bytes with the same code, they all
compute the same average, and a frame that does not decode fails on every rank alike:
:class:`FrameExchangeError` names the rank that sent it and the bucket (or step) it
belongs to, so no rank goes on with a different model.

Every rank is configured with the same spec, so a rank decodes only frames of its own
codec's spec (``UpdateCodec.decode(own_spec_only=True)``): a frame written by a codec of
another spec (a rank started with another ``spec=``, or bytes from elsewhere) is refused
on its header as :class:`~fedsync.wire.UnexpectedCodec`, before a pipeline is built for
it, and fails the step like any other bad frame (:attr:`FrameExchangeError.error`).

A rank that cannot even encode (NaN or Inf in its gradient) still takes part in the
all-gather: it sends an error record instead of a frame (bytes that do not start
with the frame magic, so no decoder could mistake them for one), which tells every
other rank what went wrong.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from fedsync.codecs import UpdateCodec
from fedsync.compression.pipeline import flatten
from fedsync.updates import TensorSpec
from fedsync.wire import PayloadError
from fedsync.wire.layout import MAGIC

__all__ = [
    "ERROR_RECORD",
    "Exchange",
    "FrameExchangeError",
    "all_gather_bytes",
    "decode_and_average",
    "error_record",
    "exchange_average",
]

ERROR_RECORD = b"FSX!"
"""First bytes of what a rank sends when it could not encode (not the frame magic)."""

assert ERROR_RECORD[: len(MAGIC)] != MAGIC


class FrameExchangeError(RuntimeError):
    """A rank's frame could not be used; raised on every rank alike.

    Attributes
    ----------
    rank : int
        The rank (within the process group) that sent the bad frame.
    where : str
        The bucket (``"bucket 3"``) or step the frame belonged to.
    reason : str
        What was wrong.
    error : PayloadError or None
        The typed decoder error when the frame did not decode (e.g.
        :class:`~fedsync.wire.UnexpectedCodec` for a frame of another codec, also the
        exception's ``__cause__``); ``None`` for an error record or a bad length.
    """

    def __init__(
        self, rank: int, where: str, reason: str, error: PayloadError | None = None
    ) -> None:
        self.rank = rank
        self.where = where
        self.reason = reason
        self.error = error
        super().__init__(f"fedsync DDP exchange failed: rank {rank}, {where}: {reason}")


def error_record(reason: str) -> bytes:
    """What a rank sends instead of a frame it could not encode."""
    return ERROR_RECORD + reason.encode("utf-8", "replace")[:4000]


def all_gather_bytes(
    payload: bytes,
    *,
    group: dist.ProcessGroup | None,
    device: torch.device,
    max_bytes: int,
    where: str,
) -> tuple[list[bytes], int]:
    """All-gather variable-length byte strings: lengths first, then padded bytes.

    Parameters
    ----------
    payload : bytes
        This rank's bytes (not empty).
    group : ProcessGroup or None
        The process group (``None``: the default group).
    device : torch.device
        Where the byte tensors live (CPU for gloo, the rank's GPU for NCCL).
    max_bytes : int
        Longest payload any rank may announce; a longer one fails on every rank
        before anything that large is allocated.
    where : str
        The bucket or step, for errors.

    Returns
    -------
    frames : list of bytes
        Every rank's bytes, in rank order.
    moved : int
        Bytes this rank put into the two all-gathers (8-byte length + padded frame).
    """
    world = dist.get_world_size(group)
    length = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    lengths = [torch.empty_like(length) for _ in range(world)]
    dist.all_gather(lengths, length, group=group)
    sizes = [int(t.item()) for t in lengths]
    for rank, size in enumerate(sizes):
        if not 0 < size <= max_bytes:
            raise FrameExchangeError(
                rank, where, f"announced a frame of {size} bytes (allowed 1..{max_bytes})"
            )
    longest = max(sizes)
    send = torch.zeros(longest, dtype=torch.uint8)
    send[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    send = send.to(device)
    received = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(received, send, group=group)
    frames = [bytes(t[:size].cpu().numpy()) for t, size in zip(received, sizes, strict=True)]
    return frames, 8 + longest


def decode_and_average(
    codec: UpdateCodec,
    frames: list[bytes],
    expected: Mapping[str, TensorSpec],
    *,
    device: torch.device,
    where: str,
) -> dict[str, torch.Tensor]:
    """Decode every rank's frame and average them, in rank order (float32, flat).

    Parameters
    ----------
    codec : UpdateCodec
        The codec every rank was configured with: only frames naming its spec are
        decoded (``own_spec_only=True``).
    frames : list of bytes
        Every rank's frame (or error record), in rank order.
    expected : mapping of str to TensorSpec
        The tensors every frame must hold.
    device : torch.device
        Where the decoded values and the averages go.
    where : str
        The bucket or step, for errors.

    Raises
    ------
    FrameExchangeError
        If a rank sent an error record or a frame that does not decode (broken,
        non-finite, another model's tensors, another codec's spec); names the first
        such rank, and carries the decoder's typed error as ``error`` (and
        ``__cause__``), e.g. :class:`~fedsync.wire.UnexpectedCodec`.
    """
    totals = {
        name: torch.zeros(spec.numel, dtype=torch.float32, device=device)
        for name, spec in expected.items()
    }
    for rank, frame in enumerate(frames):
        if frame.startswith(ERROR_RECORD):
            reason = frame[len(ERROR_RECORD) :].decode("utf-8", "replace")
            raise FrameExchangeError(rank, where, f"could not encode: {reason}")
        try:
            update = codec.decode(frame, expected=expected, device=device, own_spec_only=True)
        except PayloadError as exc:
            raise FrameExchangeError(rank, where, f"{type(exc).__name__}: {exc}", exc) from exc
        for name, sparse in update.items():
            total = totals[name]
            if sparse.nnz == total.numel():  # sorted unique: every position, in order
                total.add_(sparse.values)
            else:
                total.index_add_(0, sparse.indices, sparse.values)
    for total in totals.values():
        total.div_(len(frames))
    return totals


@dataclass(frozen=True)
class Exchange:
    """One exchange's numbers: what this rank sent and how long each part took.

    Attributes
    ----------
    payload_bytes : int
        Length of this rank's frame (the real encoded bytes).
    moved_bytes : int
        Bytes this rank put into the all-gathers (8-byte length + frame padded to the
        longest rank's).
    received_lengths : tuple of int
        Every rank's frame length as this rank received it.
    dense_bytes : int
        The same tensors as dense float32.
    encode_s, exchange_s, decode_s : float
        Wall time of compressing + framing, of the two all-gathers, of decoding and
        averaging all frames.
    """

    payload_bytes: int
    moved_bytes: int
    received_lengths: tuple[int, ...]
    dense_bytes: int
    encode_s: float
    exchange_s: float
    decode_s: float


def exchange_average(
    codec: UpdateCodec,
    tensors: Mapping[str, torch.Tensor],
    *,
    group: dist.ProcessGroup | None,
    device: torch.device,
    where: str,
    max_bytes: int,
    outgoing: Callable[[bytes], bytes] | None = None,
) -> tuple[dict[str, torch.Tensor], Exchange]:
    """Encode ``tensors``, all-gather every rank's frame, decode and average them all.

    Parameters
    ----------
    codec : UpdateCodec
        This rank's codec (its sender state holds the error-feedback memory).
    tensors : mapping of str to torch.Tensor
        What to average across ranks (every rank the same names and shapes).
    group, device, where, max_bytes
        As for :func:`all_gather_bytes`.
    outgoing : callable, optional
        Sees this rank's bytes last before they leave (tracing, fault injection).

    Returns
    -------
    averages : dict of str to torch.Tensor
        Flat float32 averages by name, on ``device``; the same on every rank.
    exchange : Exchange
        The numbers.
    """
    start = time.perf_counter()
    expected = {name: flatten(name, tensor)[0] for name, tensor in tensors.items()}
    dense = sum(4 * spec.numel for spec in expected.values())
    try:
        payload = codec.encode(tensors)
    except (ValueError, TypeError) as exc:  # NaN/Inf gradient, or a broken tensor
        payload = error_record(f"{type(exc).__name__}: {exc}")
    if outgoing is not None:
        payload = outgoing(payload)
    encoded = time.perf_counter()
    frames, moved = all_gather_bytes(
        payload, group=group, device=device, max_bytes=max_bytes, where=where
    )
    gathered = time.perf_counter()
    averages = decode_and_average(codec, frames, expected, device=device, where=where)
    done = time.perf_counter()
    return averages, Exchange(
        payload_bytes=len(payload),
        moved_bytes=moved,
        received_lengths=tuple(len(f) for f in frames),
        dense_bytes=dense,
        encode_s=encoded - start,
        exchange_s=gathered - encoded,
        decode_s=done - gathered,
    )
