"""What the server sends each device: the global model, compressed.

Two modes (``downlink-kind``):

* ``full`` -- every task carries the whole global model through the downlink codec
  (``"none+fp16"`` halves the bytes; the device trains from exactly what it decoded).
  The payload depends only on the model version, so it is encoded once per version.
* ``delta`` -- the server keeps, per device, a *replica* of the model that device holds
  and sends ``encode(global - replica)`` with the (sparsifying) delta codec; the replica
  advances by exactly what the device will decode. Whatever the codec left out stays in
  ``global - replica`` and goes out with the next task: a server-side residual, so
  nothing is lost over time. A device with no known replica (its first task, or after
  any failed or lost task, when it may or may not have applied the last delta) gets a
  ``full`` payload instead, which replaces whatever it held; so does a device whose delta
  would leave it more than ``max_lag`` (relative L2) away from the global model. With a
  seeded start (``initial``: the run starts at version 0 from the model every device
  builds itself, :mod:`fedsync.models.initial`) a device's first task takes that model
  as its replica instead: nothing to send while the global model is still version 0, a
  delta against version 0 later (with the model's digest, which the device checks).

Replicas are committed only when the device's reply is in: until then the server
cannot know the device applied the payload.

A third mode, ``shared`` (one change per model version for every device, no replica
per device), is :class:`fedsync.aggregation.shared_downlink.SharedDownlink`.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from fedsync.updates import SparseUpdate, TensorSpec, densify

__all__ = [
    "CodecFactory",
    "DownlinkEncoder",
    "DownlinkKind",
    "DownlinkPayload",
    "UpdateCodecLike",
    "relative_gap",
]

DownlinkKind = Literal["full", "delta", "shared", "relay"]
"""``shared`` is :class:`fedsync.aggregation.shared_downlink.SharedDownlink`'s."""


class UpdateCodecLike(Protocol):
    """The part of :class:`fedsync.codecs.UpdateCodec` the server uses."""

    def encode(self, update: Mapping[str, torch.Tensor]) -> bytes:
        """Compress dense tensors into one payload."""
        ...

    def decode(
        self,
        payload: bytes,
        expected: Mapping[str, TensorSpec],
        *,
        device: torch.device | str = "cpu",
        own_spec_only: bool = False,
    ) -> SparseUpdate:
        """Decode a payload onto ``device``, checking it against the expected tensors;
        with ``own_spec_only``, refuse a payload of another codec than this one
        (:class:`~fedsync.wire.UnexpectedCodec`) before decoding anything of it."""
        ...


CodecFactory = Callable[[str], UpdateCodecLike]
"""Builds a codec from a spec string (``"topk:0.01+uniform:8+ef"``)."""


@dataclass(frozen=True)
class DownlinkPayload:
    """One task's downlink: the bytes, how the device must apply them, and (when the
    encoder keeps starts) the model the device will hold once it has applied them."""

    payload: bytes
    kind: DownlinkKind
    start: dict[str, torch.Tensor] | None = None
    lag: float = 0.0
    """``||global - device model|| / ||global||`` once the device applied the payload:
    what the device trains without (0 for a full payload, apart from its codec's
    rounding; the server-side residual of a delta)."""
    change: float = 0.0
    """A delta's ``||global - device model|| / ||global||`` before the device applies it:
    the change it carries, relative to the model (0 for the other payloads)."""
    detail: str = ""
    """A shared or relay payload's content: ``seeded`` or ``stay`` (empty: the device
    holds its start already), ``changes`` or ``replay``, ``whole`` (``""`` for the other
    kinds)."""
    links: int = 0
    """A shared payload's number of changes (the versions the device missed)."""
    broadcast_bytes: int | None = None
    """Bytes this payload adds if each shared change were broadcast once (``None``: not
    a shared payload)."""
    initial_digest: str = ""
    """The seeded initial model's digest, when the device is to start from its own
    version 0 (:mod:`fedsync.models.initial`)."""
    codecs: tuple[str, ...] = ()
    """The codec spec of each update frame the payload holds, in order (the task names
    them, and the device decodes each with that codec only); empty: not known (a codec
    without a ``spec``), or no frame."""


def codec_spec(codec: object) -> str:
    """A codec's spec string (``""`` for a codec that names none)."""
    spec = getattr(codec, "spec", "")
    return spec if isinstance(spec, str) else ""


class DownlinkEncoder:
    """Encodes downlinks and keeps the per-device replicas of delta mode.

    Parameters
    ----------
    specs : mapping of str to TensorSpec
        The model's floating-point tensors (what the payloads carry).
    full_codec : UpdateCodecLike
        Codec for whole-model payloads (``downlink-codec``).
    kind : {"full", "delta"}
        Downlink mode (see the module docstring).
    delta_codec : callable, optional
        Model version -> codec for delta payloads (``downlink-delta-codec`` with the
        downlink schedule's density and bits filled in); required with ``"delta"``.
    initial : mapping of str to torch.Tensor, optional
        Delta mode: the seeded initial model every device builds itself, the global
        model's version 0; a device's first task then starts from it (plus a delta once
        the version moved on), not from a full payload.
    initial_digest : str
        :func:`fedsync.models.initial.state_digest` of ``initial``, sent with the tasks
        that start from it (required with ``initial``).
    keep_start : bool
        Return with each payload the model it decodes to on the device
        (:attr:`DownlinkPayload.start`), for strategies that mix models.
    max_lag : float
        A delta whose lag (see :attr:`DownlinkPayload.lag`) would exceed this is
        replaced by a full payload: a codec too coarse for the change (4-bit dense
        deltas on heavy-tailed updates, say) cannot then let devices drift away from
        the global model while the server-side residual grows.
    device : str or torch.device
        Where the replicas and starts live (the global model's device): payloads are
        decoded there, so only their bytes cross.
    """

    def __init__(
        self,
        specs: Mapping[str, TensorSpec],
        *,
        full_codec: UpdateCodecLike,
        kind: DownlinkKind = "full",
        delta_codec: Callable[[int], UpdateCodecLike] | None = None,
        keep_start: bool = False,
        max_lag: float = math.inf,
        device: str | torch.device = "cpu",
        initial: Mapping[str, torch.Tensor] | None = None,
        initial_digest: str = "",
    ) -> None:
        if kind not in ("full", "delta"):
            raise ValueError(f"downlink-kind must be 'full' or 'delta', got {kind!r}")
        if kind == "delta" and delta_codec is None:
            raise ValueError("downlink-kind 'delta' needs a delta codec")
        if initial is not None and (kind != "delta" or not initial_digest):
            raise ValueError("a seeded start needs downlink-kind 'delta' and the initial digest")
        self.specs = dict(specs)
        self.kind: DownlinkKind = kind
        self._full_codec = full_codec
        self._delta_codec = delta_codec
        self.keep_start = keep_start
        self.max_lag = max_lag
        self.device = torch.device(device)
        self.resyncs = 0
        """Delta payloads replaced by a full one because their lag exceeded ``max_lag``."""
        # --- caches and per-device state ---
        self._full: tuple[int, bytes, dict[str, torch.Tensor] | None] | None = None
        self._replicas: dict[int, dict[str, torch.Tensor]] = {}
        self._pending: dict[int, dict[str, torch.Tensor]] = {}
        self._initial = (
            {name: initial[name].detach().to(self.device, copy=True) for name in self.specs}
            if initial is not None
            else None
        )
        self.initial_digest = initial_digest if initial is not None else ""
        self._known: set[int] = set()
        """Devices that had a task: only a first task starts from the seeded model."""
        self.payloads: Counter[str] = Counter()
        """Payloads by kind: ``full``, ``delta``, ``seeded`` (a first task from the seeded
        initial model: empty at version 0, else a delta against it)."""
        self._changes = array("d")
        self._lags = array("d")
        """Every delta's change and lag (:class:`DownlinkPayload`), 16 bytes a task."""

    def prepare(
        self, node_id: int, state: Mapping[str, torch.Tensor], version: int
    ) -> DownlinkPayload:
        """Encode the downlink for a task to ``node_id`` starting from ``version``.

        Parameters
        ----------
        node_id : int
            The device (one task in flight per device).
        state : mapping of str to torch.Tensor
            The global model's floating-point tensors now.
        version : int
            The global model's version (full payloads are cached by it).
        """
        replica = self._replicas.get(node_id) if self.kind == "delta" else None
        seeded = replica is None and self._initial is not None and node_id not in self._known
        if seeded:
            assert self._initial is not None
            replica = self._initial
            if version == 0:
                # The global model is the initial one: the device holds its start already.
                self._pending[node_id] = {name: t.clone() for name, t in replica.items()}
                self.payloads["seeded"] += 1
                return self._payload(b"", "delta", self._pending[node_id], seeded=True)
        if replica is not None:
            delta = self._delta(node_id, state, replica, version, seeded=seeded)
            if delta.lag <= self.max_lag:
                self.payloads["seeded" if seeded else "delta"] += 1
                self._changes.append(delta.change)
                self._lags.append(delta.lag)
                return delta
            # The codec left too much of the model behind: resynchronise with a full one.
            self.resyncs += 1
        self.payloads["full"] += 1
        payload, decoded = self._full_payload(state, version)
        start = None
        if decoded is not None:
            start = {name: t.to(state[name].dtype, copy=True) for name, t in decoded.items()}
        if self.kind == "delta":
            assert start is not None
            self._pending[node_id] = start
        return DownlinkPayload(
            payload,
            "full",
            start if self.keep_start else None,
            codecs=named_codecs(codec_spec(self._full_codec)),
        )

    def _payload(
        self,
        payload: bytes,
        kind: DownlinkKind,
        start: dict[str, torch.Tensor],
        lag: float = 0.0,
        *,
        seeded: bool,
        change: float = 0.0,
        codec: str = "",
    ) -> DownlinkPayload:
        return DownlinkPayload(
            payload,
            kind,
            start if self.keep_start else None,
            lag,
            change=change,
            detail="seeded" if seeded else "",
            initial_digest=self.initial_digest if seeded else "",
            codecs=named_codecs(codec) if payload else (),
        )

    def _delta(
        self,
        node_id: int,
        state: Mapping[str, torch.Tensor],
        replica: Mapping[str, torch.Tensor],
        version: int,
        *,
        seeded: bool = False,
    ) -> DownlinkPayload:
        assert self._delta_codec is not None
        codec = self._delta_codec(version)
        # The difference in the model's own dtype: the frame's tensor table then matches
        # the specs the device decodes against.
        diff = {name: (state[name] - replica[name]).to(state[name].dtype) for name in self.specs}
        payload = codec.encode(diff)
        decoded = densify(codec.decode(payload, self.specs, device=self.device))
        start = {
            name: (replica[name] + decoded[name]).to(replica[name].dtype) for name in self.specs
        }
        self._pending[node_id] = start
        lag = relative_gap(state, start)
        change = relative_gap(state, replica)
        return self._payload(
            payload, "delta", start, lag, seeded=seeded, change=change, codec=codec_spec(codec)
        )

    def commit(self, node_id: int) -> None:
        """The device's reply is in: it holds what its last payload decoded to."""
        self._known.add(node_id)
        pending = self._pending.pop(node_id, None)
        if pending is not None:
            self._replicas[node_id] = pending

    def reset(self, node_id: int) -> None:
        """The device's state is unknown (failed/lost task): next payload is full."""
        self._known.add(node_id)
        self._pending.pop(node_id, None)
        self._replicas.pop(node_id, None)

    def rebase(self, full_codec: UpdateCodecLike) -> None:
        """The model changed outside the update path (pruned): forget every replica and
        the cached payload, and encode whole-model payloads with ``full_codec`` now.

        Every device's next payload is then a full one, so no delta is ever taken
        against a replica from before the change.
        """
        self._full_codec = full_codec
        self._full = None
        self._initial = None
        self.initial_digest = ""
        self._replicas.clear()
        self._pending.clear()

    def holds(self, node_id: int) -> dict[str, torch.Tensor] | None:
        """The model the server expects the device to hold once it has applied its last
        payload (delta mode; ``None``: unknown, its next payload is full)."""
        pending = self._pending.get(node_id)
        return pending if pending is not None else self._replicas.get(node_id)

    @property
    def replicas(self) -> int:
        """Devices whose model the server mirrors (delta mode)."""
        return len(self._replicas)

    def describe(self) -> dict[str, object]:
        """Payload counts, resyncs, and the deltas' change and lag (10th, 50th and 90th
        percentiles), for ``summary.json``."""
        return {
            "kind": self.kind,
            "seeded_start": bool(self.initial_digest) or self.payloads["seeded"] > 0,
            "payloads": dict(sorted(self.payloads.items())),
            "resyncs": self.resyncs,
            "delta_change": _percentiles(self._changes),
            "delta_lag": _percentiles(self._lags),
        }

    def _full_payload(
        self, state: Mapping[str, torch.Tensor], version: int
    ) -> tuple[bytes, dict[str, torch.Tensor] | None]:
        if self._full is None or self._full[0] != version:
            payload = self._full_codec.encode({name: state[name] for name in self.specs})
            decoded = (
                densify(self._full_codec.decode(payload, self.specs, device=self.device))
                if self.kind == "delta" or self.keep_start
                else None
            )
            self._full = (version, payload, decoded)
        return self._full[1], self._full[2]


def _percentiles(values: Sequence[float]) -> dict[str, float] | None:
    """The 10th, 50th and 90th percentiles (nearest rank), rounded; ``None`` if empty."""
    if not values:
        return None
    ranked = sorted(values)
    return {
        f"p{q}": round(ranked[min(len(ranked) - 1, (q * len(ranked)) // 100)], 6)
        for q in (10, 50, 90)
    }


def named_codecs(*specs: str) -> tuple[str, ...]:
    """``specs``, or nothing when one of them is unknown (no check is better than a
    wrong one)."""
    return specs if all(specs) else ()


def relative_gap(state: Mapping[str, torch.Tensor], held: Mapping[str, torch.Tensor]) -> float:
    """``||state - held|| / ||state||`` over all tensors (float64 sums)."""
    gap = sum(float((state[n].double() - held[n].double()).square().sum()) for n in held)
    norm = sum(float(state[n].double().square().sum()) for n in held)
    return math.sqrt(gap / norm) if norm > 0 else 0.0
