"""Frames of every registered stage from fixed inputs, and their SHA-256 digests.

``tests/unit/data/frame_golden.json`` holds the digests the codec wrote before the
sender kept its update on the device up to the frame; ``test_device_resident`` checks
that every spec still writes exactly those bytes, on every kernel backend. Run this
module to rewrite the file (only when a format change is intended)::

    python -m tests.unit.frame_golden
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from fedsync.codecs import UpdateCodec

GOLDEN = Path(__file__).with_name("data") / "frame_golden.json"
MATMUL = Path(__file__).with_name("data") / "frame_golden_matmul.json"
"""The other exact digests of the specs whose values come out of a matrix product
(``dct``, ``powersgd``): torch's CPU matrix products round differently on another CPU
family (these were written on an AMD EPYC, where the digests of :data:`GOLDEN` never
come out; each is the same on every run of its machine). A spec's frames must match one
list exactly."""


def accepted(spec: str) -> list[list[str]]:
    """Every exact digest list ``spec``'s frames may have (:data:`GOLDEN`, :data:`MATMUL`)."""
    others = json.loads(MATMUL.read_text()) if MATMUL.is_file() else {}
    return [json.loads(GOLDEN.read_text())[spec], *others.get(spec, [])]


GOLDEN_SPECS = [
    # every sparsifier
    "topk:0.01+uniform:8",
    "dgc:0.01,sample=0.05+uniform:4",
    "sidco:0.01,dist=gpd+fp32",
    "randomk:0.02+uniform:8",
    "mask:0.1,seed=3+uniform:2",
    "none+uniform:8",
    "dct:4,chunk=64+fp32",
    "powersgd:2+fp32",
    "chunktopk:64,block=32+fp32",
    # every quantizer
    "topk:0.05+fp16",
    "topk:0.05+bf16",
    "topk:0.05+uniform:3,chunk=100",
    "topk:0.05+qsgd:16",
    "topk:0.05+ternary",
    "topk:0.05+sign",
    "topk:0.05+binmean:2",
    "none+fp32",
    # every feedback stage, over several steps
    "topk:0.01+uniform:8+ef",
    "dgc:0.01+uniform:8+ef:momentum=0.9",
    "randomk:0.05+qsgd:4+ef",
    "powersgd:2+fp16+ef",
    "dct:4,chunk=64+uniform:8+demo",
    "chunktopk:128+binmean:2+demo:0.95",
    # the rotation, dense and (with feedback) over the kept values
    "none+rht+uniform:4",
    "topk:0.05+rht:64+uniform:3,chunk=64+ef",
]
STEPS = 3


def golden_update(step: int) -> dict[str, torch.Tensor]:
    """A small model update: a matrix, a vector, a zero tensor, a scalar, an empty one."""
    g = torch.Generator().manual_seed(1000 + step)
    w = torch.randn(120, 250, generator=g) * torch.rand(120, 1, generator=g)
    w[0, :40] = 0.0
    return {
        "w": w,
        "b": torch.randn(97, generator=g),
        "z": torch.zeros(5),
        "s": torch.randn((), generator=g),
        "e": torch.zeros(0),
    }


def golden_frames(spec: str) -> list[bytes]:
    """``STEPS`` frames of ``spec`` (seed 7) over the golden updates."""
    codec = UpdateCodec(spec, seed=7)
    return [codec.encode(golden_update(step)) for step in range(STEPS)]


def digest(frames: list[bytes]) -> list[str]:
    """SHA-256 of each frame, hex."""
    return [hashlib.sha256(frame).hexdigest() for frame in frames]


def main() -> None:
    table = {spec: digest(golden_frames(spec)) for spec in GOLDEN_SPECS}
    GOLDEN.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(table)} specs to {GOLDEN}")


if __name__ == "__main__":
    main()
