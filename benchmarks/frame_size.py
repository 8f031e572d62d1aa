"""Frame bits per kept value on real model updates, against the entropy bound.

Run ``python -m benchmarks.frame_size`` (writes ``benchmarks/results/frame_size.json``
and ``frame_size.md``; ``--quick`` prints only, with fewer training steps).

The updates are real: fedsync's CNN trained on Fashion-MNIST and its char-LSTM on
Tiny Shakespeare (data from ``--data-dir``, default ``../shared/data``) for a few local
SGD steps from a seeded start; the update is ``trained - start``. Each update is
compressed with ``topk:<density>+uniform:<bits>`` at densities 0.1 %, 1 % and 10 %
and 8 / 4 bits, through :class:`fedsync.codecs.UpdateCodec` given the model's specs
(so the frame carries the schema digest, not the tensor table), and the real frame's
length is compared with the bound

    value bits + H(rho) / rho        per kept value, rho = kept / numel,

the cost of the codes plus the entropy of a random support of that density. The
frame's bytes are broken down (:func:`fedsync.wire.inspect_frame`) into codes,
positions, quantizer params (the per-chunk min and scale floats) and the rest
(header, codec string, digest, format table, per-tensor entries, checksum). The
same update with the tensor table in the frame is reported alongside.

A second table gives the index bits per kept position each coding would spend
(forced for every tensor, as :func:`fedsync.wire.index_bits_for` sizes it), the
smallest of them per tensor (``chosen_bits``; the frame itself may skip the context
coder where its cheap test says no, see the frame table's index column), and
``H(rho) / rho``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsync.codecs import UpdateCodec, tensor_specs
from fedsync.data.registry import load_dataset
from fedsync.models import build_model, train
from fedsync.reports.progress_bar import track
from fedsync.updates import host_array
from fedsync.wire import decode_frame, index_bits_for, inspect_frame

RESULTS = Path(__file__).resolve().parent / "results"
DENSITIES = (0.001, 0.01, 0.1)
BITS = (8, 4)
TARGET = 1.15
MODELS = {"cnn": "fashion-mnist", "char-lstm": "shakespeare"}


def entropy_bits(rho: float) -> float:
    """``H(rho) / rho``: bits per kept position of a random support of density rho."""
    if rho <= 0.0 or rho >= 1.0:
        return 0.0
    h = -rho * math.log2(rho) - (1 - rho) * math.log2(1 - rho)
    return h / rho


def real_update(
    model_name: str, data_dir: str, steps: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    """``trained - start`` of ``steps`` local SGD steps on the model's dataset."""
    data = load_dataset(MODELS[model_name], data_dir)
    torch.manual_seed(seed)
    model = build_model(model_name, data.num_classes, data.input_shape, seed=seed)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(data.train.y), size=min(len(data.train.y), 32 * steps), replace=False)
    subset = type(data.train)(data.train.x[pick], data.train.y[pick])
    train(model, subset, epochs=1, batch_size=32, lr=0.05, max_steps=steps, seed=seed)
    return {
        k: (v.detach() - start[k]).to(torch.float32)
        for k, v in model.state_dict().items()
        if v.is_floating_point()
    }


def frame_row(update: dict[str, torch.Tensor], density: float, bits: int) -> dict[str, Any]:
    """Sizes of one update's frame (digest and table), broken down, and the bound."""
    specs = tensor_specs(update)
    spec = f"topk:{density}+uniform:{bits}"
    payload = UpdateCodec(spec, specs=specs).encode(update)
    table_payload = UpdateCodec(spec).encode(update)
    _, layouts = inspect_frame(payload, expected=specs)
    _, tensors = decode_frame(payload, expected=specs)
    numel = sum(s.numel for s in specs.values())
    kept = sum(layout.count for layout in layouts)
    rho = kept / numel
    codes = sum(layout.codes_nbytes for layout in layouts)
    index = sum(layout.index_nbytes for layout in layouts)
    params = sum(layout.params_nbytes for layout in layouts)
    bound = bits + entropy_bits(rho)
    per_value = 8 * len(payload) / kept
    return {
        "spec": spec,
        "numel": numel,
        "tensors": len(layouts),
        "kept": kept,
        "rho": rho,
        "frame_bytes": len(payload),
        "table_frame_bytes": len(table_payload),
        "bits_per_value": per_value,
        "table_bits_per_value": 8 * len(table_payload) / kept,
        "bound_bits_per_value": bound,
        "ratio_to_bound": per_value / bound,
        "meets_target": per_value <= TARGET * bound,
        "breakdown_bits_per_value": {
            "codes": 8 * codes / kept,
            "index": 8 * index / kept,
            "params": 8 * params / kept,
            "rest": 8 * (len(payload) - codes - index - params) / kept,
        },
        "codings": sorted({layout.coding for layout in layouts}),
        "decoded_values": sum(len(t.values) for t in tensors),
    }


def index_row(update: dict[str, torch.Tensor], density: float) -> dict[str, Any]:
    """Index bits per kept position for each coding forced on every tensor."""
    codec = UpdateCodec(f"topk:{density}+fp32")
    _, tensors = decode_frame(codec.encode(update))
    totals: dict[str, int] = {}
    chosen = 0
    kept = numel = 0
    for tensor in tensors:
        assert tensor.indices is not None
        n = tensor.spec.numel
        bits = index_bits_for(host_array(tensor.indices), n, shape=tensor.spec.shape)
        for coding, value in bits.items():
            if coding != "dense":
                totals[coding] = totals.get(coding, 0) + value
        chosen += min(bits.values())
        kept += len(tensor.indices)
        numel += n
    row: dict[str, Any] = {"density": density, "kept": kept, "rho": kept / numel}
    row.update({f"{coding}_bits": totals[coding] / kept for coding in sorted(totals)})
    row["chosen_bits"] = chosen / kept
    row["entropy_bits"] = entropy_bits(kept / numel)
    row["chosen_over_entropy"] = row["chosen_bits"] / row["entropy_bits"]
    return row


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Frame size on real updates",
        "",
        f"Command: `{results['command']}`. Bound: value bits + H(rho)/rho per kept value; "
        f"target: frame <= {TARGET} x bound.",
        "",
        "| model | spec | kept | frame B | bits/value | bound | ratio | codes | index "
        "| params | rest | table-frame bits/value |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model, rows in results["frames"].items():
        for r in rows:
            b = r["breakdown_bits_per_value"]
            lines.append(
                f"| {model} | `{r['spec']}` | {r['kept']} | {r['frame_bytes']} | "
                f"{r['bits_per_value']:.2f} | {r['bound_bits_per_value']:.2f} | "
                f"{r['ratio_to_bound']:.3f}{'' if r['meets_target'] else ' (over)'} | "
                f"{b['codes']:.2f} | {b['index']:.2f} | {b['params']:.2f} | {b['rest']:.2f} | "
                f"{r['table_bits_per_value']:.2f} |"
            )
    lines += ["", "# Index bits per kept position on real updates", ""]
    codings = sorted(
        {k for rows in results["index"].values() for r in rows for k in r if k.endswith("_bits")}
        - {"chosen_bits", "entropy_bits"}
    )
    lines.append(
        "| model | density | kept | "
        + " | ".join(c.removesuffix("_bits") for c in codings)
        + " | best per tensor | H(rho)/rho | best / H |"
    )
    lines.append("|---|---:|---:|" + "---:|" * (len(codings) + 3))
    for model, rows in results["index"].items():
        for r in rows:
            cells = " | ".join(f"{r[c]:.2f}" for c in codings)
            lines.append(
                f"| {model} | {r['density']} | {r['kept']} | {cells} | {r['chosen_bits']:.2f} | "
                f"{r['entropy_bits']:.2f} | {r['chosen_over_entropy']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--steps", type=int, default=20, help="local SGD steps per model")
    parser.add_argument("--quick", action="store_true", help="5 steps, print only")
    args = parser.parse_args()
    steps = 5 if args.quick else args.steps
    torch.set_num_threads(1)
    results: dict[str, Any] = {
        "command": "python -m benchmarks.frame_size" + (" --quick" if args.quick else ""),
        "steps": steps,
        "machine": {"python": platform.python_version(), "torch": torch.__version__},
        "frames": {},
        "index": {},
    }
    for model in track(MODELS, "models"):
        start = time.perf_counter()
        update = real_update(model, args.data_dir, steps)
        results["frames"][model] = [frame_row(update, d, b) for d in DENSITIES for b in BITS]
        results["index"][model] = [index_row(update, d) for d in DENSITIES]
        print(f"{model}: {time.perf_counter() - start:.1f} s")
    text = markdown(results)
    print(text)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "frame_size.json").write_text(json.dumps(results, indent=2) + "\n")
        (RESULTS / "frame_size.md").write_text(text)


if __name__ == "__main__":
    main()
