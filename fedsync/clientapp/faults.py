"""Fault injection for testing deployments: a node that sends corrupt or hostile updates.

**For testing deployments only.** Never set ``fault`` on a production node: it makes the
node send updates the server must reject. With node config ``fault`` unset (the
default) nothing here runs.

``flower-supernode --node-config "... fault='nan,norm' fault-rate=0.5"`` makes the
ClientApp corrupt a share ``fault-rate`` (default 1) of its compressed uplinks, cycling
through the listed kinds task by task:

==========  ============================================================================
kind        what the server receives
==========  ============================================================================
truncate    the first half of the frame (a truncated upload)
bitflip     the frame with one bit flipped (transmission error: the checksum must fail)
garbage     random bytes of the frame's length
nan         a well-formed frame (valid checksum) whose values decode to NaN
inf         the same with +Inf
shape       a well-formed frame for a model whose first tensor has one more row
norm        a well-formed, finite update 10^5 times the honest one (a poisoning attempt)
codec       a well-formed frame of the honest update in another codec than the task
            assigned (``none+fp32``; ``none+fp16`` when that is the task's)
==========  ============================================================================

The honest update is encoded first, so the node's error-feedback state moves on as if
it had been sent; only the bytes on the wire are replaced. Dense (FedAvg) replies are
never corrupted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import torch

from fedsync.codecs import UpdateCodec, tensor_specs
from fedsync.compression import parse_spec
from fedsync.compression.pruning import mask_digest, masked_spec
from fedsync.config import SettingsError
from fedsync.updates import CompressedTensor, TensorSpec
from fedsync.wire import decode_frame, encode_frame

__all__ = ["FAULT", "FAULT_KINDS", "FAULT_RATE", "FaultInjector"]

FAULT: Final = "fault"
"""Node config key: comma-separated fault kinds (unset or empty: an honest node)."""
FAULT_RATE: Final = "fault-rate"
"""Node config key: share of tasks whose uplink is corrupted, in [0, 1] (default 1)."""
FAULT_KINDS: Final = ("truncate", "bitflip", "garbage", "nan", "inf", "shape", "norm", "codec")

NORM_FACTOR: Final = 1e5
"""How much larger than the honest update a ``norm`` fault's update is."""

OTHER_CODECS: Final = ("none+fp32", "none+fp16")
"""What a ``codec`` fault encodes with: the first that is not the task's spec."""

# Bit patterns of NaN / +Inf for the float schemes, whose codes are raw bits.
_SPECIAL_BITS: Final = {
    "fp32": {"nan": 0x7FC00000, "inf": 0x7F800000},
    "fp16": {"nan": 0x7E00, "inf": 0x7C00},
    "bf16": {"nan": 0x7FC0, "inf": 0x7F80},
}


@dataclass(frozen=True)
class FaultInjector:
    """Corrupts uplink frames as node config ``fault`` / ``fault-rate`` say.

    Parameters
    ----------
    kinds : tuple of str
        Fault kinds (see :data:`FAULT_KINDS`), used in turn.
    rate : float
        Share of tasks corrupted, in [0, 1].
    """

    kinds: tuple[str, ...]
    rate: float = 1.0

    def __post_init__(self) -> None:
        if not self.kinds:
            raise SettingsError("node config 'fault' names no fault kind")
        unknown = [kind for kind in self.kinds if kind not in FAULT_KINDS]
        if unknown:
            raise SettingsError(
                f"node config 'fault' has unknown kinds {unknown}; valid: {', '.join(FAULT_KINDS)}"
            )
        if not 0.0 <= self.rate <= 1.0:
            raise SettingsError(f"node config 'fault-rate' must be in [0, 1], got {self.rate}")

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any]) -> FaultInjector | None:
        """The injector node config asks for, or ``None`` for an honest node."""
        spec = str(node_config.get(FAULT, "") or "").strip()
        if not spec:
            return None
        kinds = tuple(kind.strip() for kind in spec.split(",") if kind.strip())
        try:
            rate = float(node_config.get(FAULT_RATE, 1.0))
        except (TypeError, ValueError) as err:
            raise SettingsError(f"node config 'fault-rate' must be a number: {err}") from err
        return cls(kinds, rate)

    def pick(self, task_index: int, seed: int) -> str:
        """The fault for this node's ``task_index``-th task, or ``""`` for none."""
        if self.rate < 1.0 and np.random.default_rng([seed, task_index]).random() >= self.rate:
            return ""
        return self.kinds[task_index % len(self.kinds)]

    def corrupt(
        self,
        kind: str,
        payload: bytes,
        delta: Mapping[str, torch.Tensor],
        spec: str,
        seed: int,
        masks: Mapping[str, torch.Tensor] | None = None,
    ) -> bytes:
        """The bytes a node with fault ``kind`` sends instead of the honest ``payload``.

        Parameters
        ----------
        kind : str
            One of :data:`FAULT_KINDS`.
        payload : bytes
            The honest frame.
        delta : mapping of str to torch.Tensor
            The honest update (``shape`` and ``norm`` re-encode a changed copy,
            ``codec`` the update itself).
        spec : str
            The task's codec spec.
        seed : int
            Seeds the random choices (bit position, garbage bytes).
        masks : mapping of str to torch.Tensor, optional
            The pruning masks a masked spec (``mask:digest=...``) names, after a cut.
        """
        rng = np.random.default_rng(seed)
        if kind == "truncate":
            return payload[: len(payload) // 2]
        if kind == "bitflip":
            flipped = bytearray(payload)
            position = int(rng.integers(8, len(flipped)))  # past the magic: a subtle error
            flipped[position] ^= 1 << int(rng.integers(0, 8))
            return bytes(flipped)
        if kind == "garbage":
            return rng.integers(0, 256, size=len(payload), dtype=np.uint8).tobytes()
        if kind in ("nan", "inf"):
            return _non_finite(payload, kind, tensor_specs(delta))
        if kind == "shape":
            wrong = dict(delta)
            name, tensor = next(iter(wrong.items()))
            extra = torch.zeros((1, *tensor.shape[1:]) if tensor.dim() else (1,))
            wrong[name] = torch.cat([tensor.reshape(tensor.shape or (1,)), extra])
            if masks is not None and name in masks:
                # After a pruning cut: masks grown to the wrong shape (another digest).
                masks = dict(masks)
                grown = masks[name].reshape(masks[name].shape or (1,))
                masks[name] = torch.cat([grown, torch.ones_like(extra, dtype=grown.dtype)])
                spec = masked_spec(spec, mask_digest(masks))
            return UpdateCodec(spec, seed=seed, masks=masks).encode(wrong)
        if kind == "norm":
            # A fresh codec: the node's own residual must not hold the poisoned mass.
            return UpdateCodec(spec, seed=seed, masks=masks).encode(
                {name: tensor * NORM_FACTOR for name, tensor in delta.items()}
            )
        if kind == "codec":
            assigned = parse_spec(spec).to_spec()
            other = next(codec for codec in OTHER_CODECS if codec != assigned)
            # Both ends know the model, as for the honest frame: its digest, not a table.
            return UpdateCodec(other, seed=seed, specs=tensor_specs(delta)).encode(delta)
        raise SettingsError(f"unknown fault kind {kind!r}")


def _non_finite(payload: bytes, kind: str, specs: Mapping[str, TensorSpec]) -> bytes:
    """Re-frame ``payload`` with one value NaN/Inf; the checksum is valid again."""
    codec, tensors = decode_frame(payload, expected=specs)
    target = next((t for t in tensors if len(t.values) > 0), None)
    if target is None:
        raise ValueError("the honest update sent no values to corrupt")
    _poison(target, kind)
    return encode_frame(codec, tensors, schema="digest")


def _poison(tensor: CompressedTensor, kind: str) -> None:
    values = tensor.values
    special = float("nan") if kind == "nan" else float("inf")
    if values.params:
        # Quantizers with side information (scale, min, norm): one bad float spoils all.
        name = sorted(values.params)[0]
        params = np.array(values.params[name], dtype=np.float32, copy=True)
        params.reshape(-1)[0] = special
        values.params[name] = params
        return
    bits = _SPECIAL_BITS.get(values.scheme)
    if bits is None:
        raise ValueError(f"cannot place {kind} in a {values.scheme!r} code without params")
    codes = np.array(values.codes, copy=True)
    codes[0] = bits[kind]
    values.codes = codes
