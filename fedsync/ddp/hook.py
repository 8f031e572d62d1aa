"""A communication hook for ``DistributedDataParallel`` that sends fedsync frames.

Usage (every rank)::

    from fedsync.ddp import FedsyncHookState, fedsync_hook

    model = DistributedDataParallel(model)
    state = FedsyncHookState(spec="topk:0.01+uniform:4+ef")
    model.register_comm_hook(state, fedsync_hook)
    ...
    state.compression_stats().payload_bytes   # real bytes this rank sent last step

Each gradient bucket goes through the spec's compressor as one tensor named
``bucket<i>`` (its error-feedback memory stays on the bucket's device), the frames of
all ranks are exchanged by :func:`~fedsync.ddp.exchange.all_gather_bytes`, every
rank decodes every frame and averages them, and the average is the bucket's future.
With ``none+fp32`` the result is DDP's own average (see the tests).
"""

# No ``from __future__ import annotations`` here: DDP checks the hook's annotations
# (``bucket: dist.GradBucket``, ``-> torch.futures.Future[torch.Tensor]``) as objects.
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from fedsync.codecs import UpdateCodec
from fedsync.compression.errors import SpecError
from fedsync.compression.seeding import derive_seed
from fedsync.compression.spec import parse_spec
from fedsync.ddp.exchange import Exchange, exchange_average
from fedsync.wire import DEFAULT_LIMITS, FrameLimits

__all__ = ["DDPCompressionStats", "FedsyncHookState", "fedsync_hook"]


@dataclass(frozen=True)
class DDPCompressionStats:
    """What one rank sent in its last completed step, plus running totals.

    Attributes
    ----------
    step : int
        Completed steps (backward passes) so far.
    buckets : int
        Buckets in the last step.
    payload_bytes : int
        Sum of this rank's frame lengths in the last step (the encoded bytes).
    moved_bytes : int
        Bytes this rank put into the all-gathers in the last step (lengths and
        padding to the longest rank's frame included).
    dense_bytes : int
        The same gradients as dense float32.
    bucket_payload_bytes : tuple of int
        This rank's frame length per bucket, in bucket order.
    encode_s, exchange_s, decode_s : float
        Time spent compressing, in the all-gathers, decoding and averaging.
    total_payload_bytes, total_moved_bytes : int
        Over all steps.
    """

    step: int = 0
    buckets: int = 0
    payload_bytes: int = 0
    moved_bytes: int = 0
    dense_bytes: int = 0
    bucket_payload_bytes: tuple[int, ...] = ()
    encode_s: float = 0.0
    exchange_s: float = 0.0
    decode_s: float = 0.0
    total_payload_bytes: int = 0
    total_moved_bytes: int = 0

    @property
    def compression_ratio(self) -> float:
        """Dense float32 bytes per payload byte in the last step."""
        return self.dense_bytes / self.payload_bytes if self.payload_bytes else 0.0

    def as_dict(self) -> dict[str, float | int]:
        """Every number by name (bucket lengths summed), for logs and JSON."""
        return {
            "step": self.step,
            "buckets": self.buckets,
            "payload_bytes": self.payload_bytes,
            "moved_bytes": self.moved_bytes,
            "dense_bytes": self.dense_bytes,
            "compression_ratio": self.compression_ratio,
            "encode_s": self.encode_s,
            "exchange_s": self.exchange_s,
            "decode_s": self.decode_s,
            "total_payload_bytes": self.total_payload_bytes,
            "total_moved_bytes": self.total_moved_bytes,
        }


@dataclass
class FedsyncHookState:
    """State of :func:`fedsync_hook` on one rank.

    Parameters
    ----------
    spec : str
        The compressor pipeline (grammar: :mod:`fedsync.compression.spec`), e.g.
        ``"topk:0.01+uniform:4+ef"`` or ``"dct:8,chunk=64+fp32+demo:0.999"``.
    seed : int
        Base seed of stochastic stages; each rank derives its own from it.
    process_group : ProcessGroup, optional
        The group to average over; default the world.
    limits : FrameLimits
        What a received frame may declare (the decoder's bounds); also bounds the
        frame length a rank may announce.
    outgoing : callable, optional
        Sees this rank's bytes last before they leave (tracing, fault injection).

    Raises
    ------
    SpecError
        For an invalid spec.
    ValueError
        For a seed that is not an int, or limits that are not :class:`FrameLimits`.
    RuntimeError
        If ``torch.distributed`` is not initialised (call ``init_process_group``
        first: the state needs the rank to derive its seed).
    """

    # role: what to send
    spec: str = "topk:0.01+uniform:4+ef"
    seed: int = 0
    # role: who to send it to
    process_group: dist.ProcessGroup | None = None
    # role: what to accept
    limits: FrameLimits = DEFAULT_LIMITS
    # role: observation
    outgoing: Callable[[bytes], bytes] | None = None
    # role: runtime (built here; the codec's state holds the per-bucket EF memory)
    codec: UpdateCodec = field(init=False, repr=False)
    rank: int = field(init=False)
    world_size: int = field(init=False)
    _current: list[Exchange] = field(init=False, repr=False, default_factory=list)
    _last: tuple[Exchange, ...] = field(init=False, repr=False, default=())
    _stats: DDPCompressionStats = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.spec, str):
            raise SpecError(f"spec must be a spec string, got {type(self.spec).__name__}")
        parse_spec(self.spec)  # raises SpecError naming the stage and key
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        if not isinstance(self.limits, FrameLimits):
            raise ValueError(f"limits must be a FrameLimits, got {type(self.limits).__name__}")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "FedsyncHookState needs torch.distributed initialised (call "
                "init_process_group first): each rank derives its seed from its rank"
            )
        self.rank = dist.get_rank(self.process_group)
        self.world_size = dist.get_world_size(self.process_group)
        self.codec = UpdateCodec(
            self.spec, seed=derive_seed(self.seed, "rank", self.rank), limits=self.limits
        )
        self._stats = DDPCompressionStats()

    def compression_stats(self) -> DDPCompressionStats:
        """Numbers of the last completed step (see :class:`DDPCompressionStats`)."""
        return self._stats

    def exchange(self, name: str, tensor: torch.Tensor, where: str) -> torch.Tensor:
        """Average ``tensor`` over the group through fedsync frames (flat float32).

        DDP rebuilds its buckets once, after the first step, in the order gradients
        became ready; a bucket whose size changed then starts with an empty memory
        (what the first step left unsent in it is dropped, on every rank alike).
        """
        feedback = self.codec.state.feedback
        stored = feedback.residuals.get(name)
        if stored is not None and stored.numel() != tensor.numel():
            feedback.residuals.pop(name, None)
            feedback.momenta.pop(name, None)
        averages, numbers = exchange_average(
            self.codec,
            {name: tensor},
            group=self.process_group,
            device=tensor.device,
            where=where,
            max_bytes=self.limits.max_payload_bytes,
            outgoing=self.outgoing,
        )
        self._current.append(numbers)
        return averages[name]

    def end_step(self) -> None:
        """Close the current step's numbers (the hook calls it after the last bucket)."""
        done, self._current = self._current, []
        self._last = tuple(done)
        old = self._stats
        payload = sum(x.payload_bytes for x in done)
        moved = sum(x.moved_bytes for x in done)
        self._stats = DDPCompressionStats(
            step=old.step + 1,
            buckets=len(done),
            payload_bytes=payload,
            moved_bytes=moved,
            dense_bytes=sum(x.dense_bytes for x in done),
            bucket_payload_bytes=tuple(x.payload_bytes for x in done),
            encode_s=sum(x.encode_s for x in done),
            exchange_s=sum(x.exchange_s for x in done),
            decode_s=sum(x.decode_s for x in done),
            total_payload_bytes=old.total_payload_bytes + payload,
            total_moved_bytes=old.total_moved_bytes + moved,
        )

    def last_step_exchanges(self) -> tuple[Exchange, ...]:
        """Every bucket's exchange of the last completed step, in bucket order: what
        this rank sent and every rank's frame length as received here."""
        return self._last

    def abort_step(self) -> None:
        """Forget the numbers of a step that failed."""
        self._current.clear()


def fedsync_hook(
    state: FedsyncHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: compress, all-gather, decode, average one bucket.

    Raises
    ------
    FrameExchangeError
        On every rank alike, naming the rank and the bucket, when a rank's frame is
        broken, non-finite, of another codec's spec (``UnexpectedCodec``: every rank
        must use the same ``spec``) or could not be encoded.
    """
    buffer = bucket.buffer()
    index = bucket.index()
    try:
        average = state.exchange(f"bucket{index}", buffer, f"bucket {index}")
    except BaseException:
        state.abort_step()
        raise
    if bucket.is_last():
        state.end_step()
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(average.to(buffer.dtype))
    return future
