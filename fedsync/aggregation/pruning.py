"""The server's side of a pruned run: the masks, who holds them, and the specs they imply.

At the model version the run config names (``prune-at-version``) the engine cuts the
global model by magnitude (:func:`fedsync.compression.pruning.magnitude_masks`) and
keeps it cut: the pruned entries are zeroed after every server step. Each device gets
the masks once, as a bitmap frame (:mod:`fedsync.wire.mask`) beside its next task's
downlink; the server counts a device as holding them once a reply to such a task is in,
and forgets that when a task of the device fails or is lost (it may have restarted and
lost its state), so the next task carries the masks again. Every codec spec of both
directions is then swapped for its masked form (:func:`~fedsync.compression.pruning.masked_spec`):
values at the kept positions, no positions.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

import torch

from fedsync.compression.pruning import apply_masks, magnitude_masks, mask_digest, masked_spec
from fedsync.updates import TensorSpec
from fedsync.wire.mask import decode_masks, encode_masks

__all__ = ["PrunedModel"]


class PrunedModel:
    """Masks cut from the global model, and their delivery to devices.

    Parameters
    ----------
    state : mutable mapping of str to torch.Tensor
        The global model's floating-point tensors; pruned in place.
    specs : mapping of str to TensorSpec
        Their specs (the mask frame carries their schema digest).
    sparsity : float
        Fraction of each prunable tensor set to zero.
    version : int
        The model version the cut is made at (carried in the mask frame).
    masks : mapping of str to torch.Tensor, optional
        The masks of an earlier cut (a resumed run, :meth:`restore`); default: cut
        ``state`` by magnitude now.

    The masks are kept where the tensors they cut live (applying them after each
    server step copies nothing); the frame and the digest are made once, on the host.
    """

    def __init__(
        self,
        state: MutableMapping[str, torch.Tensor],
        specs: Mapping[str, TensorSpec],
        *,
        sparsity: float,
        version: int,
        masks: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        # The cut as made (by magnitude, or decoded from a checkpoint): host tensors.
        cut = masks if masks is not None else magnitude_masks(state, sparsity)
        self.digest = mask_digest(cut)
        self.version = version
        self.sparsity = sparsity
        self.payload = encode_masks(cut, specs, version)
        """The mask frame every device gets once."""
        self.kept = {name: int(mask.sum()) for name, mask in cut.items()}
        self.masks = {name: mask.to(state[name].device) for name, mask in cut.items()}
        self._holders: set[int] = set()
        self._pending: set[int] = set()
        self.sent = 0
        """Mask frames handed out (first deliveries and resends)."""
        self.apply(state)

    @classmethod
    def restore(
        cls,
        state: MutableMapping[str, torch.Tensor],
        specs: Mapping[str, TensorSpec],
        saved: Mapping[str, object],
        *,
        sparsity: float,
    ) -> PrunedModel:
        """The cut a checkpoint holds (:meth:`checkpoint_state`): the same masks and cut
        version; every device gets the masks again (who held them is not saved).

        Raises
        ------
        PayloadError
            If the saved mask frame does not decode against ``specs``.
        """
        frame = saved.get("frame")
        payload = frame.numpy().tobytes() if isinstance(frame, torch.Tensor) else b""
        cut = decode_masks(payload, specs)
        pruned = cls(state, specs, sparsity=sparsity, version=cut.version, masks=cut.masks)
        sent = saved.get("sent", 0)
        pruned.sent = sent if isinstance(sent, int) else 0
        return pruned

    def checkpoint_state(self) -> dict[str, object]:
        """What :meth:`restore` needs: the mask frame (uint8) and the frames sent so far."""
        frame = torch.frombuffer(bytearray(self.payload), dtype=torch.uint8)
        return {"frame": frame, "sent": self.sent}

    def apply(self, state: MutableMapping[str, torch.Tensor]) -> None:
        """Zero the pruned entries of ``state`` again (after a server step)."""
        apply_masks(state, self.masks)

    def spec(self, spec: str) -> str:
        """``spec`` restricted to the masks (see :func:`masked_spec`)."""
        return masked_spec(spec, self.digest)

    def for_task(self, node_id: int) -> bytes:
        """The mask frame a task to ``node_id`` must carry (``b""``: it holds them)."""
        if node_id in self._holders:
            return b""
        self._pending.add(node_id)
        self.sent += 1
        return self.payload

    def commit(self, node_id: int) -> None:
        """A reply of ``node_id`` is in: it holds the masks if its task carried them."""
        if node_id in self._pending:
            self._pending.discard(node_id)
            self._holders.add(node_id)

    def forget(self, node_id: int) -> None:
        """A task of ``node_id`` failed or was lost: send it the masks again."""
        self._pending.discard(node_id)
        self._holders.discard(node_id)

    def describe(self) -> dict[str, object]:
        """For ``summary.json``: where the cut was made and what it keeps."""
        numel = sum(mask.numel() for mask in self.masks.values())
        return {
            "version": self.version,
            "sparsity": self.sparsity,
            "digest": self.digest,
            "mask_bytes": len(self.payload),
            "masks_sent": self.sent,
            "kept": sum(self.kept.values()),
            "pruned_numel": numel,
        }
