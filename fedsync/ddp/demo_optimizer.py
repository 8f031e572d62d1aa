"""DeMo: decoupled momentum, DCT top-k exchange per step, sign of the update.

The optimizer of the DeMo paper in its own data-parallel setting (no DDP wrapper and
no gradient all-reduce: the optimizer is the only communication). Each step, on
every rank and for every parameter::

    m      = beta * m + grad                 the local momentum (never all-reduced)
    q      = DCT top-k of m, per chunk       k coefficients of every chunk
    m      = m - idct(q)                     what was sent leaves the momentum
    u      = mean over ranks of idct(q_r)    every rank decodes every rank's frame
    p      = p * (1 - lr * weight_decay) - lr * sign(u)     (or lr * u without sign)

The first three lines are exactly the ``dct:<k>,chunk=<n>+<quantizer>+demo:<beta>``
pipeline (:mod:`fedsync.compression.sparsifiers.dct`, and
:mod:`fedsync.compression.demo_memory`, the momentum as the codec's error-feedback
memory), and the exchange is :func:`fedsync.ddp.exchange.exchange_average`: one frame
per rank per step with every parameter in it, so the bytes per step are real frame lengths
(:meth:`DeMo.compression_stats`). All ranks apply the same average, so replicas that
start equal stay equal; the constructor broadcasts rank 0's parameters to make them
start equal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from fedsync.codecs import UpdateCodec
from fedsync.compression.demo_memory import DeMoConfig
from fedsync.compression.errors import SpecError
from fedsync.compression.seeding import derive_seed
from fedsync.compression.sparsifiers.dct import DCTConfig
from fedsync.compression.spec import PipelineConfig
from fedsync.ddp.exchange import exchange_average
from fedsync.ddp.hook import DDPCompressionStats
from fedsync.wire import DEFAULT_LIMITS, FrameLimits

__all__ = ["DeMo"]


class DeMo(torch.optim.Optimizer):
    """Decoupled Momentum Optimization over ``torch.distributed``.

    Parameters
    ----------
    params : iterable
        Parameters or parameter groups (``lr`` and ``weight_decay`` per group).
    lr : float
        Step size (> 0); with ``sign=True`` every coordinate moves by ``lr`` or 0.
    beta : float
        Momentum decay in [0, 1).
    k, chunk : int
        DCT coefficients kept per chunk, and the chunk length (``1 <= k <= chunk``).
    quantizer : str
        How the kept coefficients travel: a quantizer spec (``fp32``, ``fp16``,
        ``uniform:8``, ...).
    sign : bool
        Apply the sign of the averaged update (DeMo's choice) rather than the average.
    weight_decay : float
        Decoupled weight decay (>= 0).
    seed : int
        Base seed of stochastic quantizers; each rank derives its own.
    process_group : ProcessGroup, optional
        The group to average over; default the world.
    limits : FrameLimits
        Bounds on received frames.

    Raises
    ------
    SpecError
        For ``beta``, ``k``, ``chunk`` or ``quantizer`` out of range (the message
        names the field).
    ValueError
        For ``lr <= 0`` or ``weight_decay < 0``.
    RuntimeError
        If ``torch.distributed`` is not initialised.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        *,
        beta: float = 0.999,
        k: int = 8,
        chunk: int = 64,
        quantizer: str = "fp32",
        sign: bool = True,
        weight_decay: float = 0.0,
        seed: int = 0,
        process_group: dist.ProcessGroup | None = None,
        limits: FrameLimits = DEFAULT_LIMITS,
    ) -> None:
        if not lr > 0:
            raise ValueError(f"DeMo: lr must be > 0, got {lr!r}")
        if not weight_decay >= 0:
            raise ValueError(f"DeMo: weight_decay must be >= 0, got {weight_decay!r}")
        if not isinstance(quantizer, str) or "+" in quantizer:
            raise SpecError(f"DeMo: quantizer must be one quantizer stage, got {quantizer!r}")
        base = PipelineConfig.from_spec(f"none+{quantizer}")
        config = PipelineConfig(
            sparsifier=DCTConfig(k=k, chunk=chunk),
            quantizer=base.quantizer,
            feedback=DeMoConfig(beta=beta),  # type: ignore[arg-type]  # a feedback stage
        )
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("DeMo needs torch.distributed initialised (init_process_group)")
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})
        self.sign = bool(sign)
        self.process_group = process_group
        self.limits = limits
        self.rank = dist.get_rank(process_group)
        self.codec = UpdateCodec(config, seed=derive_seed(seed, "rank", self.rank), limits=limits)
        self._stats = DDPCompressionStats()
        self._broadcast_parameters()

    @property
    def spec(self) -> str:
        """The pipeline each step's frame is encoded with."""
        return self.codec.spec

    def _broadcast_parameters(self) -> None:
        src = dist.get_global_rank(self.process_group, 0) if self.process_group else 0
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    dist.broadcast(p.data, src=src, group=self.process_group)

    def compression_stats(self) -> DDPCompressionStats:
        """Numbers of the last step (one frame per step: ``buckets == 1``)."""
        return self._stats

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Exchange the compressed momentum and apply the averaged (sign) update.

        Every parameter takes part every step (a missing gradient counts as zero), so
        every rank's frame holds the same tensors.

        Raises
        ------
        FrameExchangeError
            On every rank alike when a rank's frame is bad (names the rank).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads: dict[str, torch.Tensor] = {}
        targets: list[tuple[torch.Tensor, str, dict[str, Any]]] = []
        device = None
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                name = f"{gi}.{pi}"
                grads[name] = p.grad if p.grad is not None else torch.zeros_like(p)
                targets.append((p, name, group))
                device = device or p.device
        if device is None:
            return loss
        averages, numbers = exchange_average(
            self.codec,
            grads,
            group=self.process_group,
            device=device,
            where=f"DeMo step {self._stats.step}",
            max_bytes=self.limits.max_payload_bytes,
        )
        for p, name, group in targets:
            update = averages[name].view_as(p).to(p.dtype)
            if self.sign:
                update = update.sign()
            if group["weight_decay"]:
                p.mul_(1.0 - group["lr"] * group["weight_decay"])
            p.add_(update, alpha=-group["lr"])
        old = self._stats
        self._stats = DDPCompressionStats(
            step=old.step + 1,
            buckets=1,
            payload_bytes=numbers.payload_bytes,
            moved_bytes=numbers.moved_bytes,
            dense_bytes=numbers.dense_bytes,
            bucket_payload_bytes=(numbers.payload_bytes,),
            encode_s=numbers.encode_s,
            exchange_s=numbers.exchange_s,
            decode_s=numbers.decode_s,
            total_payload_bytes=old.total_payload_bytes + numbers.payload_bytes,
            total_moved_bytes=old.total_moved_bytes + numbers.moved_bytes,
        )
        return loss
