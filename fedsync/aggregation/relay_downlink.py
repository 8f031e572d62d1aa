"""The relay downlink (``downlink-kind = "relay"``): every device's model is the server's.

The shared downlink re-encodes the model's change per version (``global - mirror``,
2-bit on the cross-site scenario), so every device trains from a lossy copy; that cost
0.12 nats there. The relay sends no new encoding at all: it forwards what made each
version -- the uplink payloads its aggregation took, already compressed, with their
weights and the factor the aggregate was scaled by -- and every device replays those
aggregations on its own copies of the model and of the server optimizer's state::

    for each version u+1 .. v:
        buffer = UpdateBuffer(K of them, the run's mean)     (the server's class)
        for each update: buffer.add(decode(payload), weight)
        step   = buffer.take() * factor
        optimizer.step(model, step)                          (the server's optimizer)

with the server's operations in the server's order, so the device holds the global
model of version ``v`` bit for bit (``tests/unit/test_relay_downlink.py`` checks it).
A device that was sent nothing new gets an empty payload.

What it needs: every device starts from the seeded initial model, version 0
(``downlink-seeded-start``), and a device whose state is unknown (its first task, a
failed or lost one) replays from version 0 again, so the server keeps every
aggregation's bytes for the run (the run's uplink bytes: 3.6 MB for the cross-site
scenario's 120 updates). Pruning and AB-Training change the model outside the
aggregations, and ``fedasync-mix`` mixes models rather than adding updates: the engine
refuses the relay with them. The server optimizer must be one of fedsync's kinds (its
:meth:`~fedsync.aggregation.server_optimizer.ServerOptimizer.hyperparameters` travel in
the frame), not a subclass of one. A relay run does not resume from a checkpoint (the
devices would need the aggregations from version 0, which the checkpoint does not keep),
and a device whose seeded model differs from the server's fails its tasks (there is no
whole-model fallback: the replay needs the exact start). Bit for bit holds where the
server and the devices compute alike: the server on the CPU (``server-device = "cpu"``,
the default) and devices on the CPU, which ``tests/unit/test_relay_downlink.py`` checks;
a CUDA server's or device's kernels may round otherwise, and so may low-rank updates'
matrix products.

Bytes: a device ``L`` versions behind gets those ``L`` aggregations' payloads, except
its own: the device keeps each uplink frame it sends
(:func:`fedsync.clientapp.compressed.keep_sent_uplink`, the last
:data:`~fedsync.clientapp.compressed.RELAY_SENT_KEPT`) and the frame names those by their
digest (16 bytes in place of the payload), so the fleet's downlink is about ``C - 1``
times its uplink, what SparseLoCo's all-gather moves. A device the server knows nothing
of (its first task, a replay from version 0) gets every payload, its own among them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch

from fedsync.aggregation.buffer import NORMALIZATIONS, Normalization, UpdateBuffer
from fedsync.aggregation.downlink import DownlinkPayload
from fedsync.aggregation.server_optimizer import ServerOptimizer, optimizer_from_hyperparameters
from fedsync.aggregation.validation import validate_update
from fedsync.updates import TensorSpec
from fedsync.wire.relay import (
    OWN_DIGEST_BYTES,
    RelayEntry,
    RelayFrame,
    check_step,
    encode_relay,
    encode_step,
)

__all__ = ["RelayDownlink", "frame_optimizer", "replay"]


class RelayDownlink:
    """Keeps every aggregation's bytes and which version each device holds; encodes
    each task's relay frame (see the module docstring).

    Parameters
    ----------
    mean : {"count", "weight", "selected"}
        The run's buffer mean.
    optimizer : ServerOptimizer
        The run's server optimizer (its hyper-parameters go into every frame).
    initial_digest : str
        The seeded initial model's digest: a device at version 0 builds that model.
    """

    kind = "relay"

    def __init__(
        self, *, mean: Normalization, optimizer: ServerOptimizer, initial_digest: str
    ) -> None:
        if not initial_digest:
            raise ValueError("the relay downlink needs the seeded initial model's digest")
        self.mean = mean
        self.optimizer = json.dumps(optimizer.hyperparameters(), sort_keys=True)
        self.initial_digest = initial_digest
        self.version = 0
        """The model version of the last aggregation recorded."""
        self._made: list[tuple[float, tuple[RelayEntry, ...], tuple[int, ...]]] = []
        """Version ``v``'s factor, entries and their senders' node ids, at ``v - 1``
        (encoded per frame: a device's own entries are named, not carried)."""
        self.own_named = 0
        """Updates a frame named by digest to their sender instead of carrying them."""
        self.own_bytes_saved = 0
        """Bytes those names saved (the payloads less their digests)."""
        self._held: dict[int, int] = {}
        self._pending: dict[int, int] = {}
        self.resyncs = 0
        """Devices replayed from version 0 after their state was lost (a failed task)."""
        self.payloads: Counter[str] = Counter()
        """Payloads by what they carried: ``seeded`` / ``stay`` (empty), ``replay``."""
        self.links_sent: Counter[int] = Counter()
        """Replay payloads by their number of aggregations."""
        self._lost: set[int] = set()

    # --- what the engine tells it ---------------------------------------------------------------
    def record(
        self,
        version: int,
        factor: float,
        entries: Sequence[RelayEntry],
        senders: Sequence[int] | None = None,
    ) -> None:
        """Version ``version`` was made from ``entries`` (in the order the buffer took
        them, sent by the nodes ``senders``; unknown: every device gets every payload),
        the aggregate scaled by ``factor``."""
        if version != self.version + 1:
            raise ValueError(f"aggregation of version {version} after version {self.version}")
        if senders is not None and len(senders) != len(entries):
            raise ValueError(f"{len(entries)} relay entries with {len(senders)} senders")
        check_step(factor, entries)
        self._made.append((factor, tuple(entries), tuple(senders or ())))
        self.version = version

    # --- the downlink interface (as DownlinkEncoder's) -----------------------------------------
    def prepare(
        self, node_id: int, state: Mapping[str, torch.Tensor], version: int
    ) -> DownlinkPayload:
        """The payload of a task to ``node_id`` from ``version``: empty, or the
        aggregations since the version it holds (from 0 when that is unknown)."""
        if version != self.version:
            raise ValueError(f"a task from version {version}, the relay is at {self.version}")
        self._pending.pop(node_id, None)
        held = self._held.get(node_id)
        fresh = held is None
        base = 0 if held is None else held
        if fresh and node_id in self._lost:
            self.resyncs += 1
        self._pending[node_id] = version
        digest = self.initial_digest if fresh else ""
        if base == version:
            detail = "seeded" if fresh else "stay"
            self.payloads[detail] += 1
            return DownlinkPayload(b"", "relay", detail=detail, initial_digest=digest)
        payload = encode_relay(
            self._encoded(None if fresh else node_id, base, version),
            base=base,
            target=version,
            mean=self.mean,
            optimizer=self.optimizer,
        )
        self.payloads["replay"] += 1
        self.links_sent[version - base] += 1
        return DownlinkPayload(
            payload, "relay", detail="replay", links=version - base, initial_digest=digest
        )

    def _encoded(self, node_id: int | None, base: int, version: int) -> list[bytes]:
        """Versions ``base + 1 .. version`` encoded for ``node_id``: its own updates named
        by their digest (it kept what it sent); ``None``, every update carried."""
        steps = []
        for factor, entries, senders in self._made[base:version]:
            named = []
            for entry, sender in zip(entries, senders or (None,) * len(entries), strict=True):
                if node_id is not None and sender == node_id:
                    named.append(entry.as_own())
                    self.own_named += 1
                    self.own_bytes_saved += len(entry.payload) - OWN_DIGEST_BYTES
                else:
                    named.append(entry)
            steps.append(encode_step(factor, named))
        return steps

    def commit(self, node_id: int) -> None:
        """The device's reply is in: it holds what its last payload replayed to."""
        pending = self._pending.pop(node_id, None)
        if pending is not None:
            self._held[node_id] = pending

    def reset(self, node_id: int) -> None:
        """The device's state is unknown (failed or lost task): it replays from 0 next."""
        self._pending.pop(node_id, None)
        self._held.pop(node_id, None)
        self._lost.add(node_id)

    def rebase(self, full_codec: object) -> None:
        """Not for the relay: the model changes only by its aggregations."""
        raise RuntimeError("the relay downlink cannot follow a model changed outside its steps")

    @property
    def replicas(self) -> int:
        """Devices whose version the server knows."""
        return len(self._held)

    def describe(self) -> dict[str, Any]:
        """The counters, for ``summary.json``."""
        return {
            "kind": self.kind,
            "version": self.version,
            "mean": self.mean,
            "optimizer": json.loads(self.optimizer),
            "payloads": dict(sorted(self.payloads.items())),
            "aggregations_per_payload": {str(k): v for k, v in sorted(self.links_sent.items())},
            "kept_bytes": sum(len(e.payload) for _, entries, _ in self._made for e in entries),
            "resyncs": self.resyncs,
            "own_named": self.own_named,
            "own_bytes_saved": self.own_bytes_saved,
        }


def frame_optimizer(frame: RelayFrame) -> ServerOptimizer:
    """A fresh server optimizer as the frame describes it (the device's copy at version
    0, before it loads what it kept).

    Raises
    ------
    ValueError
        If the frame's optimizer is not JSON of a kind fedsync knows.
    """
    try:
        described = json.loads(frame.optimizer)
    except json.JSONDecodeError as err:
        raise ValueError(f"relay frame's optimizer is not JSON: {err}") from None
    if not isinstance(described, dict):
        raise ValueError("relay frame's optimizer is not a JSON object")
    return optimizer_from_hyperparameters(described)


def replay(
    frame: RelayFrame,
    model: Mapping[str, torch.Tensor],
    optimizer: ServerOptimizer,
    specs: Mapping[str, TensorSpec],
    *,
    codecs: dict[str, Any] | None = None,
) -> dict[str, torch.Tensor]:
    """Replay a relay frame's aggregations on a copy of ``model``.

    Parameters
    ----------
    frame : RelayFrame
        The decoded frame.
    model : mapping of str to torch.Tensor
        The model at ``frame.base`` (the device's copy; not changed).
    optimizer : ServerOptimizer
        The device's copy of the server optimizer at ``frame.base``
        (:func:`frame_optimizer` at version 0); stepped in place.
    specs : mapping of str to TensorSpec
        The model's floating-point tensors.
    codecs : dict, optional
        Codec spec -> codec, reused across calls.

    Returns
    -------
    dict of str to torch.Tensor
        The model at ``frame.target``.

    Raises
    ------
    fedsync.wire.PayloadError
        An update frame that is broken or not of the codec its entry names.
    fedsync.aggregation.InvalidUpdate
        A decoded update that is not one of ``specs`` (or not finite).
    ValueError
        The frame's mean is not one fedsync knows, its optimizer not ``optimizer``'s, or
        it names an own update (:meth:`RelayFrame.with_own` fills those in first).
    """
    from fedsync.codecs import UpdateCodec  # the codec pulls in numba kernels: load late

    mean = cast(Normalization, frame.mean)
    if mean not in NORMALIZATIONS:
        raise ValueError(f"relay frame with unknown buffer mean {frame.mean!r}")
    wanted = frame_optimizer(frame).hyperparameters()
    if optimizer.hyperparameters() != wanted:
        raise ValueError(f"relay frame steps with {wanted}, this device's copy is {optimizer!r}")
    known = codecs if codecs is not None else {}
    state = {name: model[name].detach().clone() for name in specs}
    for step in frame.steps:
        buffer = UpdateBuffer(specs, capacity=len(step.entries), normalization=mean)
        for entry in step.entries:
            if entry.own:
                raise ValueError("relay frame names an own update: fill it in before replaying")
            codec = known.get(entry.codec)
            if codec is None:
                codec = known[entry.codec] = UpdateCodec(entry.codec, specs=specs)
            decoded = codec.decode(entry.payload, specs, own_spec_only=True)
            buffer.add(validate_update(decoded, specs), entry.weight)
        aggregate = buffer.take()
        if step.factor != 1.0:
            for tensor in aggregate.update.values():
                tensor.mul_(step.factor)
        optimizer.step(state, aggregate.update)
    return state
