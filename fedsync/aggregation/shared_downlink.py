"""The shared downlink (``downlink-kind = "shared"``): one compressed change per model
version, the same for every device.

Where ``delta`` keeps a replica and a residual per device, ``shared`` keeps one
*mirror* of the model and one residual for the whole fleet. When a task is planned
from a model version ``v`` the mirror has not reached yet, the server encodes::

    c_v      = encode(global_v - mirror_u)           (u: the mirror's version)
    mirror_v = grid(mirror_u + decode(c_v))           (fedsync.wire.shared.advance)

The residual ``global_v - mirror_v`` is what the codec left out; it is part of the
next change (error feedback on the server, one memory for all). Every device replays
the same steps, so every device's model is a mirror, bit for bit, and no device
drifts from the others. ``grid`` rounds to what the whole-model codec carries exactly
(``none+fp16``: fp16 values), so a whole model lands a device on the mirror too.

What a device is sent, given the version ``u`` the server knows it holds:

* ``u == v``: nothing (an empty payload, zero bytes);
* ``u < v``: the changes it missed, ``c_{u+1} .. c_v``, each encoded once when its
  version was reached and cached, in one frame (:mod:`fedsync.wire.shared`); unless
  they are no longer cached (:class:`VersionEvicted`: only the last ``max_versions``
  are) or together outweigh a whole model: then the whole model, counted as a resync;
* nothing known (its first task, or after a failed or lost task): the whole model --
  except on its first contact in a run that started from the seeded initial model
  (``downlink-seeded-start``, off by default), where it is assumed to hold version 0
  (it can build it: :mod:`fedsync.models.initial`) and its task carries that model's
  digest; a device whose own version 0 differs refuses the task and the server resyncs
  it with a whole model next time.

A device's version is committed when its reply is in. When a change would leave the
mirror further than ``max_lag`` (relative L2) from the global model, the server
restarts the sequence at the global model (a new *epoch*; devices then get a whole
model once); so does a pruning cut (:meth:`SharedDownlink.rebase`) and a resumed run.

Memory on the server: the mirror (one copy of the model, on the server's device), at
most ``max_versions`` encoded changes (bytes), the current whole-model payload, and two
integers per device; not a model per device as ``delta`` keeps.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fedsync.aggregation.downlink import (
    DownlinkPayload,
    UpdateCodecLike,
    codec_spec,
    named_codecs,
    relative_gap,
)
from fedsync.compression.spec import parse_spec
from fedsync.updates import TensorSpec, densify
from fedsync.wire.shared import GRIDS, advance, encode_changes, encode_whole, to_grid

__all__ = ["SharedDownlink", "VersionEvicted", "grid_of"]


class VersionEvicted(LookupError):
    """The changes since a version are no longer cached: the device that holds it gets
    a whole model instead (a resync)."""


def grid_of(spec: str) -> str:
    """The grid a whole-model codec spec carries exactly (``fp32``, ``fp16``, ``bf16``).

    Raises
    ------
    ValueError
        For a spec that does not reproduce a model on its grid exactly (a sparsifier
        other than ``none`` or ``mask``, a rotation, another quantizer, error feedback).
    """
    config = parse_spec(spec)
    sparsifier = config.sparsifier.name if config.sparsifier is not None else "none"
    quantizer = config.quantizer.name if config.quantizer is not None else "fp32"
    if (
        sparsifier not in ("none", "mask")
        or quantizer not in GRIDS
        or config.rotation is not None
        or config.feedback is not None
    ):
        raise ValueError(
            f"downlink-kind 'shared' needs a whole-model downlink-codec that carries a "
            f"model exactly on its grid (none+fp16, none+bf16 or none+fp32), got {spec!r}"
        )
    return quantizer


class SharedDownlink:
    """Encodes the shared downlink and keeps the mirror, its cached changes and which
    version each device holds (see the module docstring).

    Parameters
    ----------
    specs : mapping of str to TensorSpec
        The model's floating-point tensors (what the payloads carry).
    full_codec : UpdateCodecLike
        Codec for whole-model payloads (``downlink-codec``).
    grid : {"fp32", "fp16", "bf16"}
        What ``full_codec`` carries exactly (:func:`grid_of` of its spec).
    delta_codec : callable
        Model version -> codec of that version's change (``downlink-delta-codec`` with
        the downlink schedule's density and bits filled in); no error feedback (the
        server keeps the residual itself).
    initial : mapping of str to torch.Tensor, optional
        The model at version 0, when the run starts there: the first mirror. Without
        it the sequence starts at the first task's model (a resumed run).
    initial_digest : str
        :func:`fedsync.models.initial.state_digest` of ``initial``: devices on their
        first contact are assumed to hold it (empty: they get a whole model).
    max_versions : int
        Changes kept (the longest a device may lag and still get changes).
    max_lag : float
        Restart the sequence when the mirror would be further than this from the
        global model (relative L2).
    keep_start : bool
        Return with each payload the model it decodes to on the device.
    device : str or torch.device
        Where the mirror lives (the global model's device).
    """

    kind = "shared"

    def __init__(
        self,
        specs: Mapping[str, TensorSpec],
        *,
        full_codec: UpdateCodecLike,
        grid: str,
        delta_codec: Callable[[int], UpdateCodecLike],
        initial: Mapping[str, torch.Tensor] | None = None,
        initial_digest: str = "",
        max_versions: int = 8,
        max_lag: float = math.inf,
        keep_start: bool = False,
        device: str | torch.device = "cpu",
    ) -> None:
        if grid not in GRIDS:
            raise ValueError(f"unknown grid {grid!r}; valid: {', '.join(GRIDS)}")
        if max_versions < 1:
            raise ValueError(f"max_versions must be >= 1, got {max_versions}")
        self.specs = dict(specs)
        self.grid = grid
        self.max_versions = max_versions
        self.max_lag = max_lag
        self.keep_start = keep_start
        self.device = torch.device(device)
        self._full_codec = full_codec
        self._delta_codec = delta_codec
        # --- the sequence ---
        self.epoch = -1
        """The mirror sequence (a new one at every restart)."""
        self.version = -1
        """The mirror's model version."""
        self._mirror: dict[str, torch.Tensor] | None = None
        self._on_grid = True
        self._lag = 0.0
        self._links: OrderedDict[int, tuple[int, bytes]] = OrderedDict()
        """Target version -> (base version, encoded change): the last ``max_versions``."""
        self._link_codecs: dict[int, str] = {}
        """Target version -> the codec spec its change was encoded with."""
        self._whole: tuple[int, int, bytes, dict[str, torch.Tensor], bool] | None = None
        self._counted: set[int] = set()
        """Targets of cached changes already counted in :attr:`broadcast_bytes`."""
        self.initial_digest = ""
        if initial is not None:
            self.epoch, self.version = 0, 0
            self._mirror = {n: initial[n].detach().to(self.device, copy=True) for n in self.specs}
            self._on_grid = all(torch.equal(to_grid(t, grid), t) for t in self._mirror.values())
            self.initial_digest = initial_digest
        self.seeded_start = bool(self.initial_digest)
        """Whether first contacts at version 0 were assumed to hold the initial model."""
        # --- devices ---
        self._held: dict[int, tuple[int, int]] = {}
        self._pending: dict[int, tuple[int, int]] = {}
        self._known: set[int] = set()
        """Devices that had a task: only a first contact is assumed at version 0."""
        # --- counters ---
        self.resyncs = 0
        """Whole models sent to devices whose version the server knew (evicted changes,
        changes that outweigh a whole model, a new epoch)."""
        self.broadcast_bytes = 0
        """Payload bytes if each change were broadcast once: every change counted once,
        when first sent, and every whole model as sent."""
        self.restarts = 0
        """Sequences restarted by the lag guard."""
        self.changes_encoded = 0
        self.payloads: Counter[str] = Counter()
        """Payloads by what they carried: ``seeded`` / ``stay`` (empty), ``changes``,
        ``whole``."""
        self.whole_reasons: Counter[str] = Counter()
        self.links_sent: Counter[int] = Counter()
        """Changes-payloads by their number of changes (the device's lag in versions)."""

    # --- the downlink interface (as DownlinkEncoder's) -----------------------------------
    def prepare(
        self, node_id: int, state: Mapping[str, torch.Tensor], version: int
    ) -> DownlinkPayload:
        """The payload of a task to ``node_id`` starting from ``version`` (the global
        model ``state``): empty, the changes it missed, or the whole model."""
        self._advance(state, version)
        self._pending.pop(node_id, None)
        held = self._held.get(node_id)
        if held is None:
            if self.initial_digest and self.epoch == 0 and node_id not in self._known:
                return self._from(node_id, state, 0, seeded=True)
            reason = "unknown" if node_id in self._known else "first-contact"
            return self._whole_for(node_id, state, reason, resync=False)
        epoch, base = held
        if epoch != self.epoch or base > self.version:
            return self._whole_for(node_id, state, "epoch", resync=True)
        return self._from(node_id, state, base, seeded=False)

    def commit(self, node_id: int) -> None:
        """The device's reply is in: it holds what its last payload decoded to."""
        self._known.add(node_id)
        pending = self._pending.pop(node_id, None)
        if pending is None:
            self._held.pop(node_id, None)  # an untracked whole model (see _whole_for)
        else:
            self._held[node_id] = pending

    def reset(self, node_id: int) -> None:
        """The device's state is unknown (failed or lost task): next payload is whole."""
        self._known.add(node_id)
        self._pending.pop(node_id, None)
        self._held.pop(node_id, None)

    def rebase(self, full_codec: UpdateCodecLike) -> None:
        """The model changed outside the update path (pruned): restart the sequence at
        the next task's model, and encode whole models with ``full_codec`` now."""
        self._full_codec = full_codec
        self._mirror = None
        self._whole = None
        self.initial_digest = ""
        self._links.clear()
        self._link_codecs.clear()
        self._counted.clear()
        self._held.clear()
        self._pending.clear()

    def holds(self, node_id: int) -> dict[str, torch.Tensor] | None:
        """The model the device holds once it applied its last payload, when that is
        the current mirror (``None``: an older version, or unknown)."""
        at = self._pending.get(node_id) or self._held.get(node_id)
        if at is None or at != (self.epoch, self.version) or self._mirror is None:
            return None
        return self._mirror

    @property
    def replicas(self) -> int:
        """Devices whose version the server knows."""
        return len(self._held)

    @property
    def mirror(self) -> dict[str, torch.Tensor] | None:
        """The current mirror (what a device at :attr:`version` holds)."""
        return self._mirror

    def changes_since(self, base: int) -> list[tuple[int, bytes]]:
        """The cached changes from version ``base`` to the mirror's, in order.

        Raises
        ------
        VersionEvicted
            If they are no longer all cached (or ``base`` is no version of the
            sequence).
        """
        links: list[tuple[int, bytes]] = []
        at = self.version
        while at != base:
            link = self._links.get(at)
            if link is None or at < base:
                raise VersionEvicted(
                    f"the changes from version {base} to {self.version} are not cached "
                    f"(the last {self.max_versions} are)"
                )
            previous, frame = link
            links.append((at, frame))
            at = previous
        links.reverse()
        return links

    def describe(self) -> dict[str, Any]:
        """The counters, for ``summary.json``."""
        return {
            "epoch": self.epoch,
            "version": self.version,
            "grid": self.grid,
            "max_versions": self.max_versions,
            "seeded_start": self.seeded_start,
            "changes_encoded": self.changes_encoded,
            "restarts": self.restarts,
            "payloads": dict(sorted(self.payloads.items())),
            "whole_reasons": dict(sorted(self.whole_reasons.items())),
            "changes_per_payload": {str(k): v for k, v in sorted(self.links_sent.items())},
            "cached_bytes": sum(len(f) for _, f in self._links.values())
            + (len(self._whole[2]) if self._whole is not None else 0),
            "bytes_broadcast": self.broadcast_bytes,
        }

    # --- internals ----------------------------------------------------------------------------
    def _from(
        self, node_id: int, state: Mapping[str, torch.Tensor], base: int, *, seeded: bool
    ) -> DownlinkPayload:
        """The payload for a device at ``base``: empty, or the changes since."""
        codecs: tuple[str, ...] = ()
        if base == self.version:
            payload, links, broadcast = b"", [], 0
            detail = "seeded" if seeded else "stay"
        else:
            try:
                links = self.changes_since(base)
            except VersionEvicted:
                return self._whole_for(node_id, state, "evicted", resync=not seeded)
            payload = encode_changes(links, base=base, epoch=self.epoch, grid=self.grid)
            if len(payload) >= len(self._whole_payload()[2]):
                return self._whole_for(node_id, state, "cheaper", resync=not seeded)
            broadcast = sum(len(f) for t, f in links if t not in self._counted)
            self._counted.update(t for t, _ in links)
            detail = "changes"
            self.links_sent[len(links)] += 1
            codecs = tuple(self._link_codecs.get(target, "") for target, _ in links)
        self.payloads[detail] += 1
        self.broadcast_bytes += broadcast
        self._pending[node_id] = (self.epoch, self.version)
        assert self._mirror is not None
        return DownlinkPayload(
            payload,
            "shared",
            self._mirror if self.keep_start else None,
            self._lag,
            detail=detail,
            links=len(links),
            broadcast_bytes=broadcast,
            initial_digest=self.initial_digest if seeded else "",
            codecs=named_codecs(*codecs),
        )

    def _whole_for(
        self, node_id: int, state: Mapping[str, torch.Tensor], reason: str, *, resync: bool
    ) -> DownlinkPayload:
        _, _, payload, decoded, exact = self._whole_payload()
        self.resyncs += int(resync)
        self.whole_reasons[reason] += 1
        self.payloads["whole"] += 1
        self.broadcast_bytes += len(payload)
        if exact:
            self._pending[node_id] = (self.epoch, self.version)
        # else: version 0's mirror is off the grid (the exact seeded model), so the device
        # holds the whole model's rounding of it, which no change applies to: it stays
        # untracked and gets a whole model again next time.
        return DownlinkPayload(
            payload,
            "shared",
            decoded if self.keep_start else None,
            relative_gap(state, decoded),
            detail="whole",
            broadcast_bytes=len(payload),
            codecs=named_codecs(codec_spec(self._full_codec)),
        )

    def _whole_payload(self) -> tuple[int, int, bytes, dict[str, torch.Tensor], bool]:
        """The whole mirror as a payload (encoded once per version), what it decodes to
        and whether that is the mirror exactly."""
        assert self._mirror is not None
        key = (self.epoch, self.version)
        if self._whole is None or self._whole[:2] != key:
            frame = self._full_codec.encode(self._mirror)
            decoded = densify(self._full_codec.decode(frame, self.specs, device=self.device))
            decoded = {n: t.to(self._mirror[n].dtype) for n, t in decoded.items()}
            exact = all(torch.equal(decoded[n], self._mirror[n]) for n in self.specs)
            if self._on_grid and not exact:
                raise RuntimeError(
                    f"the whole-model codec does not carry the {self.grid} mirror exactly"
                )
            payload = encode_whole(frame, target=self.version, epoch=self.epoch, grid=self.grid)
            self._whole = (*key, payload, decoded, exact)
        return self._whole

    def _advance(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Bring the mirror to ``version``: one change, encoded once."""
        if self._mirror is None:
            self._restart(state, version)
            return
        if version == self.version:
            return
        if version < self.version:
            raise ValueError(f"model version {version} is older than the mirror's {self.version}")
        codec = self._delta_codec(version)
        mirror = self._mirror
        # The difference in the model's own dtype: the frame's table then matches the
        # specs the device decodes against.
        diff = {n: (state[n] - mirror[n]).to(state[n].dtype) for n in self.specs}
        frame = codec.encode(diff)
        decoded = densify(codec.decode(frame, self.specs, device=self.device))
        new = advance(mirror, decoded, self.grid)
        lag = relative_gap(state, new)
        if lag > self.max_lag:
            self.restarts += 1
            self._restart(state, version)
            return
        self._links[version] = (self.version, frame)
        self._link_codecs[version] = codec_spec(codec)
        while len(self._links) > self.max_versions:
            evicted, _ = self._links.popitem(last=False)
            self._counted.discard(evicted)
            self._link_codecs.pop(evicted, None)
        self._mirror, self.version, self._lag, self._on_grid = new, version, lag, True
        self.changes_encoded += 1

    def _restart(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """A new sequence, starting at ``state`` on the grid: every device's next
        payload is a whole model."""
        self.epoch += 1
        self.version = version
        self._mirror = {n: to_grid(state[n].detach(), self.grid) for n in self.specs}
        self._on_grid = True
        self._lag = relative_gap(state, self._mirror)
        self.initial_digest = ""
        self._links.clear()
        self._link_codecs.clear()
        self._counted.clear()
        self._whole = None
