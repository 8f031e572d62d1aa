"""AB-Training against dense and PowerSGD at the same rank: bytes per update, and the
cost of training in factored form.

Run ``python -m benchmarks.ab_training`` (writes ``benchmarks/results/ab_training.json``).

For fedsync's LeNet-5 CNN (Fashion-MNIST) and its char-LSTM (Tiny Shakespeare), at
ranks 2, 4 and 8, every row is the length of a real frame encoded by
:class:`fedsync.codecs.UpdateCodec` with the model's (or the side's) specs, from a
seeded random update: for these specs (dense, ``uniform:8``, PowerSGD) a frame's length
follows from the shapes alone, so any update of the model gives the same lengths.

* ``dense fp32`` / ``dense uniform:8``: the whole update;
* ``powersgd:<r>+uniform:8+ef``: factors ``P``, ``Q`` of every matrix worth it, the rest
  fp16 (PowerSGD's fallback);
* AB-Training side ``A`` / ``B`` with ``none+uniform:8``: the trained factor's delta of
  every matrix worth it (the same rule as PowerSGD's), the rest 8-bit;
* the frozen-factor frame an AB-Training task carries down (``none+fp16``, the default
  ``downlink-codec``), per side.

The training cost: one local epoch of the CNN (1,600 seeded random images, batch 32,
SGD with momentum, one thread) as a plain model and wrapped for side ``A`` and side
``B`` (:class:`fedsync.clientapp.ab_training.FactoredModel`), interleaved ``--repeats`` times;
median, min and max wall seconds, and the ratio of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsync.clientapp.ab_training import FactoredModel
from fedsync.codecs import UpdateCodec, tensor_specs
from fedsync.data.types import ArrayDataset
from fedsync.factored import SIDES, Side, factor_shapes, frozen_specs, split, uplink_specs
from fedsync.models import build_model
from fedsync.models.training import train
from fedsync.recipe import model_state
from fedsync.updates import TensorSpec

OUT = Path(__file__).resolve().parent / "results" / "ab_training.json"
MODELS: dict[str, tuple[str, int, tuple[int, ...]]] = {
    "cnn (LeNet-5, Fashion-MNIST)": ("cnn", 10, (1, 28, 28)),
    "char-lstm-small (Tiny Shakespeare, cross-site)": ("char-lstm-small", 64, (80,)),
}
RANKS = (2, 4, 8)


def frame_length(spec: str, specs: dict[str, TensorSpec], seed: int = 0) -> int:
    """The length of a real frame of ``spec`` over a seeded random update of ``specs``."""
    g = torch.Generator().manual_seed(seed)
    update = {name: 0.01 * torch.randn(s.shape, generator=g) for name, s in specs.items()}
    return len(UpdateCodec(spec, specs=specs).encode(update))


def rows_for(model: str, classes: int, shape: tuple[int, ...]) -> dict[str, Any]:
    """Every row of one model."""
    torch.manual_seed(0)
    state = build_model(model, classes, shape).state_dict()
    specs = tensor_specs({k: v.float() for k, v in state.items() if v.is_floating_point()})
    dense = frame_length("none+fp32", specs)
    result: dict[str, Any] = {
        "parameters": sum(s.numel for s in specs.values()),
        "dense_fp32": dense,
        "dense_uniform8": frame_length("none+uniform:8", specs),
        "ranks": {},
    }
    for rank in RANKS:
        shapes = factor_shapes(specs, rank, 2.0)
        row: dict[str, Any] = {
            "factored": sorted(shapes),
            "powersgd_uniform8": frame_length(f"powersgd:{rank}+uniform:8+ef", specs),
        }
        for side in SIDES:
            row[f"ab_{side}_uniform8"] = frame_length(
                "none+uniform:8", uplink_specs(specs, shapes, side)
            )
            row[f"ab_{side}_fp32"] = frame_length("none+fp32", uplink_specs(specs, shapes, side))
            row[f"ab_{side}_frozen_fp16"] = frame_length("none+fp16", frozen_specs(shapes, side))
        mean_ab = (row["ab_A_uniform8"] + row["ab_B_uniform8"]) / 2
        row["ab_mean_uniform8"] = mean_ab
        row["ab_vs_powersgd"] = round(mean_ab / row["powersgd_uniform8"], 4)
        row["ab_vs_dense_fp32"] = round(mean_ab / dense, 4)
        result["ranks"][str(rank)] = row
    return result


def training_seconds(repeats: int, rank: int = 4) -> dict[str, Any]:
    """Wall seconds of one local epoch of the CNN, plain and in factored form."""
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    images = rng.standard_normal((1600, 1, 28, 28)).astype(np.float32)
    data = ArrayDataset(images, rng.integers(0, 10, 1600))
    times: dict[str, list[float]] = {"plain": [], "A": [], "B": []}
    for _ in range(repeats):
        for mode in times:
            torch.manual_seed(0)
            model = build_model("cnn", 10, (1, 28, 28))
            trainee: torch.nn.Module = model
            if mode != "plain":
                side: Side = "A" if mode == "A" else "B"
                shapes = factor_shapes(tensor_specs(model_state(model)), rank, 2.0)
                state = model.state_dict()
                frozen = {
                    name: split(state[name], shape)[1 if side == "A" else 0]
                    for name, shape in shapes.items()
                }
                trainee = FactoredModel(model, shapes, frozen, side)
            started = time.perf_counter()
            train(trainee, data, epochs=1, batch_size=32, lr=0.1, momentum=0.9)
            times[mode].append(time.perf_counter() - started)
    plain = statistics.median(times["plain"])
    return {
        "rank": rank,
        "repeats": repeats,
        "seconds": {
            mode: {
                "median": round(statistics.median(v), 4),
                "min": round(min(v), 4),
                "max": round(max(v), 4),
            }
            for mode, v in times.items()
        },
        "ratio_A": round(statistics.median(times["A"]) / plain, 3),
        "ratio_B": round(statistics.median(times["B"]) / plain, 3),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "command": "python -m benchmarks.ab_training",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "models": {label: rows_for(*spec) for label, spec in MODELS.items()},
        "training_epoch_cnn": training_seconds(args.repeats),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for label, model in report["models"].items():
        print(f"{label}: {model['parameters']:,} parameters, dense fp32 {model['dense_fp32']:,} B")
        for rank, row in model["ranks"].items():
            print(
                f"  rank {rank}: powersgd {row['powersgd_uniform8']:,} B; "
                f"AB A {row['ab_A_uniform8']:,} / B {row['ab_B_uniform8']:,} B "
                f"(mean {row['ab_vs_powersgd']:.2f}x powersgd, "
                f"{row['ab_vs_dense_fp32']:.4f}x dense); frozen down A-task "
                f"{row['ab_A_frozen_fp16']:,} / B-task {row['ab_B_frozen_fp16']:,} B"
            )
    print("one CNN epoch (s):", report["training_epoch_cnn"])


if __name__ == "__main__":
    main()
