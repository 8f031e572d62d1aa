"""Threshold quality on real gradients: kept count over requested, SIDCo next to DGC.

Run ``python -m benchmarks.sidco_quality`` (writes
``benchmarks/results/sidco-quality.json``; ``--quick`` for fewer steps, print only).

Two CNNs train on Fashion-MNIST (the real files, found as every fedsync run finds
them) with SGD, batch 64: the project's LeNet-5 (``cnn``, 62k parameters) and a wider
CNN (32 and 64 channels, a 3136 x 256 dense layer: 0.83M parameters) so that the
sampled moments meet tensors of a size where sampling matters. Every few steps the
gradient of each tensor the sparsifiers fit (4096 entries or more) and of the whole
model flattened is handed to each sparsifier, one sparsifier object per method kept
across steps (so SIDCo's stage adaptation runs as in training). For each method and
density the table reports the kept count over ``k``: mean, standard deviation, min,
max, and how many calls ended in the exact top-k fallback (a kept count of exactly
``k`` from a threshold method). Methods: ``dgc`` (sampled threshold), ``sidco`` with
its stage 1 moments from the same 1 % cache-line sample (the default), and ``sidco``
with the full fixed-order pass (``sample=1``), each with the exponential family (the
default) and ``gpd``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsync.compression import PipelineConfig, build_pipeline
from fedsync.compression.base import Sparsifier, target_count
from fedsync.data import DatasetSplits, load_dataset
from fedsync.models.registry import build_model
from fedsync.reports.progress_bar import track

RESULTS = Path(__file__).parent / "results" / "sidco-quality.json"
METHODS = {
    "dgc": "dgc:{d}",
    "sidco": "sidco:{d}",
    "sidco(full pass)": "sidco:{d},sample=1.0",
    "sidco-gpd": "sidco:{d},dist=gpd",
    "sidco-gpd(full pass)": "sidco:{d},dist=gpd,sample=1.0",
}
DENSITIES = (0.01, 0.001)
MIN_FITTED = 1 << 12


class WideCNN(nn.Module):
    """conv3x3(32) -> pool -> conv3x3(64) -> pool -> 256 -> classes (0.83M parameters)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 256),
            nn.ReLU(),
            nn.Linear(256, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def gradients(
    model: nn.Module, splits: DatasetSplits, steps: int, every: int, seed: int
) -> list[dict[str, torch.Tensor]]:
    """Per-tensor gradients (and the whole model's, flattened) every ``every`` steps."""
    x = torch.from_numpy(np.array(splits.train.x, dtype=np.float32))
    y = torch.from_numpy(np.array(splits.train.y, dtype=np.int64))
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    out = []
    for step in range(steps):
        idx = torch.randint(0, x.shape[0], (64,), generator=g)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        if step % every == 0:
            grads = {
                name: p.grad.detach().reshape(-1).clone()
                for name, p in model.named_parameters()
                if p.grad is not None and p.numel() >= MIN_FITTED
            }
            grads["(whole model)"] = torch.cat(
                [p.grad.detach().reshape(-1) for p in model.parameters() if p.grad is not None]
            )
            out.append(grads)
        opt.step()
    return out


def quality(samples: list[dict[str, torch.Tensor]]) -> list[dict[str, Any]]:
    """Kept count over k per tensor, density and method."""
    rows = []
    for density in DENSITIES:
        sparsifiers: dict[str, Sparsifier] = {
            name: build_pipeline(PipelineConfig.from_spec(spec.format(d=density))).sparsifier
            for name, spec in METHODS.items()
        }
        for tensor in samples[0]:
            n = samples[0][tensor].numel()
            k = target_count(n, density)
            for name, sp in sparsifiers.items():
                ratios, exact = [], 0
                for step, grads in enumerate(samples):
                    kept = sp.select(tensor, grads[tensor], step).values.numel()
                    ratios.append(kept / k)
                    exact += kept == k
                rows.append(
                    {
                        "tensor": tensor,
                        "numel": n,
                        "density": density,
                        "k": k,
                        "method": name,
                        "calls": len(ratios),
                        "kept_over_k_mean": statistics.fmean(ratios),
                        "kept_over_k_std": statistics.pstdev(ratios),
                        "kept_over_k_min": min(ratios),
                        "kept_over_k_max": max(ratios),
                        "exact_k_calls": exact,
                    }
                )
    return rows


def print_rows(model: str, rows: list[dict[str, Any]]) -> None:
    print(f"== {model} ==")
    print(
        f"{'tensor':<22} {'numel':>8} {'dens':>6} {'method':<22} {'mean':>6} {'std':>6} "
        f"{'min':>6} {'max':>6} {'=k':>4}"
    )
    for r in rows:
        print(
            f"{r['tensor']:<22} {r['numel']:>8} {r['density']:>6} {r['method']:<22} "
            f"{r['kept_over_k_mean']:>6.3f} {r['kept_over_k_std']:>6.3f} "
            f"{r['kept_over_k_min']:>6.3f} {r['kept_over_k_max']:>6.3f} "
            f"{r['exact_k_calls']:>4}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, print only")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--data-dir", default=None, help="folder holding fashion-mnist/")
    args = parser.parse_args(argv)
    steps, every = (60, 20) if args.quick else (300, 15)
    torch.manual_seed(0)
    splits = load_dataset("fashion-mnist", args.data_dir)
    models: dict[str, nn.Module] = {
        "cnn (LeNet-5)": build_model("cnn", splits.num_classes, splits.input_shape, seed=0),
        "wide-cnn": WideCNN(splits.num_classes),
    }
    report: dict[str, Any] = {
        "benchmark": "sidco_quality",
        "dataset": "fashion-mnist",
        "steps": steps,
        "every": every,
        "methods": METHODS,
        "models": {},
    }
    for name, model in track(models.items(), "models"):
        samples = gradients(model, splits, steps, every, seed=1)
        rows = quality(samples)
        report["models"][name] = rows
        print_rows(name, rows)
        print(file=sys.stderr)
    out = args.out if args.out is not None else (None if args.quick else RESULTS)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
