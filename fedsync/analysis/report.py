"""Turn a :class:`~fedsync.analysis.collect.Collection` into the analysis: numbers per
layer and for the whole model, a recommendation, and plots.

"Overall" numbers treat the model as one flat index space (the tensors one after
another, in the model's order), the view of a server that partitions or buffers the
whole update. Statistics over rounds are means (with min and max where the spread
matters); each round's ``n`` updates all start from the same global model, as the
``K`` updates of one aggregation do.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from statistics import mean
from typing import Any

import numpy as np

from fedsync.aggregation.buffer import DENSE_ABOVE
from fedsync.analysis.coding import SPARSE_CODINGS, index_costs
from fedsync.analysis.collect import Collection
from fedsync.analysis.metrics import (
    overlap_shares,
    pairwise_jaccard,
    partition_imbalance,
    union_growth,
)

__all__ = ["OVERALL", "PARTITIONS", "analyse", "plot_analysis", "table"]

OVERALL = "(model)"
"""The key of the whole-model numbers among the layers'."""
PARTITIONS = (2, 4, 8, 16)
"""Default partition counts for Zen's imbalance."""
COST_KEYS = (*SPARSE_CODINGS, "dense", "entropy", "best_per_tensor", "sent")
"""The index costs reported: each coding, the bound, the smallest wire coding of each
tensor's support (none for a fully kept tensor: it travels dense), and ``sent``, what
the positions took in the real frames (the frame encoder tries the context coder only
where a quick test finds the support clustered, so it may send more than
``best_per_tensor``, never less)."""


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {"mean": float(mean(values)), "min": float(min(values)), "max": float(max(values))}


def _flat(collection: Collection, supports: dict[str, np.ndarray]) -> np.ndarray:
    """One update's supports as positions in the model's flat index space."""
    parts, offset = [], 0
    for name, spec in collection.specs.items():
        parts.append(supports[name] + offset)
        offset += spec.numel
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _layer(
    supports_by_round: list[list[np.ndarray]],
    numel: int,
    *,
    k: int,
    partitions: Sequence[int],
    costs: list[dict[str, float]],
) -> dict[str, Any]:
    """The numbers of one layer (or of the flat model) from its supports by round."""
    every = [s for supports in supports_by_round for s in supports]
    nnz = [int(s.size) for s in every]
    growth = [union_growth(supports, numel) for supports in supports_by_round]
    n = min(len(g) for g in growth)
    union: dict[str, Any] = {
        "k": list(range(1, n + 1)),
        "mean": [mean(g[i] for g in growth) for i in range(n)],
        "min": [min(g[i] for g in growth) for i in range(n)],
        "max": [max(g[i] for g in growth) for i in range(n)],
    }
    jaccard = [j for supports in supports_by_round for j in pairwise_jaccard(supports, numel)]
    shares = [overlap_shares(supports, numel) for supports in supports_by_round]
    overlap: dict[str, Any] = {
        "jaccard": _stats(jaccard) if jaccard else None,
        **{
            key: mean(s[key] for s in shares)
            for key in ("kept_by_2", "kept_by_half", "kept_by_all")
        },
    }
    imbalance: dict[str, Any] = {}
    for parts in partitions:
        if parts > numel:
            continue
        per_update = [partition_imbalance(s, numel, parts) for s in every]
        unions = [
            partition_imbalance(np.unique(np.concatenate(supports[:k])), numel, parts)
            for supports in supports_by_round
        ]
        imbalance[str(parts)] = {"update": _stats(per_update), f"union_of_{k}": _stats(unions)}
    total_nnz = sum(nnz)
    totals = {name: sum(c[name] for c in costs) for name in COST_KEYS}
    per_nnz = {name: (bits / total_nnz if total_nnz else None) for name, bits in totals.items()}
    candidates = [*SPARSE_CODINGS, "dense"]
    best = min(candidates, key=lambda name: totals[name])
    union_at_k = union["mean"][min(k, n) - 1]
    return {
        "numel": numel,
        "updates": len(every),
        "density": _stats([x / numel for x in nnz]),
        "union_growth": union,
        "union_at_k": union_at_k,
        "overlap": overlap,
        "imbalance": imbalance,
        "index_bits_per_nnz": per_nnz,
        "index_bytes_per_update": {name: bits / 8 / len(every) for name, bits in totals.items()},
        "best_coding": best,
        "buffer": "dense" if union_at_k > DENSE_ABOVE else "sparse",
    }


def analyse(collection: Collection, *, partitions: Sequence[int] = PARTITIONS) -> dict[str, Any]:
    """Every number of the analysis, JSON-ready (see the module docstring).

    Returns
    -------
    dict
        ``layers`` (by tensor name, and :data:`OVERALL`), ``sent`` (what the real
        frames cost), ``accuracy`` by round and ``recommendation``.
    """
    k = min(collection.buffer_size, collection.clients)
    rounds = range(collection.rounds)
    by_round = [collection.round_updates(r) for r in rounds]
    layers: dict[str, Any] = {}
    per_update_costs: dict[int, dict[str, float]] = {}
    for name, spec in collection.specs.items():
        costs = []
        for index, update in enumerate(collection.updates):
            cost = index_costs(
                update.supports[name],
                spec.numel,
                shape=spec.shape,
                value_bits=update.value_bits[name],
            )
            if "context" not in cost:
                # Empty or full support: no context section; the encoder codes it
                # with the best of the others.
                cost["context"] = min(cost[c] for c in ("bitmap", "elias_fano", "rice"))
            cost["sent"] = 8.0 * update.sent_index_bytes[name]
            cost["best_per_tensor"] = (
                0.0  # every position kept: the frame sends the tensor dense, no index
                if update.supports[name].size == spec.numel
                else min(cost[c] for c in ("bitmap", "elias_fano", "rice", "context"))
            )
            costs.append(cost)
            into = per_update_costs.setdefault(index, dict.fromkeys(COST_KEYS, 0.0))
            for coding in COST_KEYS:
                into[coding] += cost[coding]
        layers[name] = {
            "shape": list(spec.shape),
            **_layer(
                [[u.supports[name] for u in updates] for updates in by_round],
                spec.numel,
                k=k,
                partitions=partitions,
                costs=costs,
            ),
        }
    overall_costs = [per_update_costs[i] for i in range(len(collection.updates))]
    numel = sum(spec.numel for spec in collection.specs.values())
    layers[OVERALL] = {
        "shape": [numel],
        **_layer(
            [[_flat(collection, u.supports) for u in updates] for updates in by_round],
            numel,
            k=k,
            partitions=partitions,
            costs=overall_costs,
        ),
    }
    # The flat space's own coding numbers would code the model as one tensor; the
    # frame codes tensor by tensor, so the model's costs are the layers' sums.
    sent_index = sum(sum(u.sent_index_bytes.values()) for u in collection.updates)
    sent = {
        "payload_bytes_per_update": mean(u.payload_bytes for u in collection.updates),
        "index_bytes_per_update": sent_index / len(collection.updates),
        "dense_float32_bytes": 4 * numel,
        "codings_chosen": _count(c for u in collection.updates for c in u.sent_coding.values()),
    }
    return {
        "k": k,
        "dense_above": DENSE_ABOVE,
        "partitions": list(partitions),
        "accuracy": collection.accuracy,
        "seconds": collection.seconds,
        "sent": sent,
        "layers": layers,
        "recommendation": recommend(layers, k),
    }


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return dict(sorted(out.items()))


def recommend(layers: dict[str, Any], k: int) -> dict[str, Any]:
    """Server buffer kind and index coding, with the numbers behind them."""
    model = layers[OVERALL]
    per_nnz = model["index_bits_per_nnz"]
    dense_layers = sorted(n for n, v in layers.items() if n != OVERALL and v["buffer"] == "dense")
    sparse_layers = sorted(n for n, v in layers.items() if n != OVERALL and v["buffer"] == "sparse")
    best = model["best_coding"]
    entropy = per_nnz["entropy"]
    lines = [
        f"union density of K={k} updates: {model['union_at_k']:.4f} of the model "
        f"(one update keeps {model['density']['mean']:.4f}); the buffer's threshold is "
        f"{DENSE_ABOVE}: {'dense' if model['buffer'] == 'dense' else 'sparse'} accumulator "
        f"for the model as a whole; per tensor, auto holds {len(dense_layers)} dense and "
        f"{len(sparse_layers)} sparse.",
        f"cheapest single index coding over the model: {best} at "
        f"{per_nnz[best]:.2f} bits per kept position (entropy bound H(rho)/rho "
        f"{entropy:.2f}, int32 COO 32, bitmap {per_nnz['bitmap']:.2f}); the best coding per "
        f"tensor reaches {per_nnz['best_per_tensor']:.2f}, the real frames spent "
        f"{per_nnz['sent']:.2f}.",
    ]
    return {
        "buffer": model["buffer"],
        "buffer_union_density": model["union_at_k"],
        "dense_tensors": dense_layers,
        "sparse_tensors": sparse_layers,
        "coding": best,
        "coding_bits_per_nnz": per_nnz[best],
        "best_per_tensor_bits_per_nnz": per_nnz["best_per_tensor"],
        "sent_bits_per_nnz": per_nnz["sent"],
        "entropy_bits_per_nnz": entropy,
        "coo_int32_over_best": 32.0 / per_nnz[best] if per_nnz[best] else None,
        "summary": lines,
    }


def table(report: dict[str, Any]) -> list[str]:
    """The per-layer numbers as fixed-width text lines (what the command prints)."""
    k = report["k"]
    parts = str(max(report["partitions"]))
    lines = [
        f"{'tensor':<20} {'numel':>8} {'density':>8} {f'union@{k}':>8} {'jaccard':>8} "
        f"{f'imb@{parts}':>7} {'best':>10} {'bits/nz':>8} {'H/rho':>6} {'buffer':>7}"
    ]
    for name, layer in report["layers"].items():
        bits = layer["index_bits_per_nnz"]
        jaccard = layer["overlap"]["jaccard"]
        imbalance = layer["imbalance"].get(parts)
        lines.append(
            f"{name[:20]:<20} {layer['numel']:>8} {layer['density']['mean']:>8.4f} "
            f"{layer['union_at_k']:>8.4f} "
            f"{(jaccard['mean'] if jaccard else float('nan')):>8.3f} "
            f"{(imbalance['update']['mean'] if imbalance else float('nan')):>7.2f} "
            f"{layer['best_coding']:>10} {bits[layer['best_coding']] or 0.0:>8.2f} "
            f"{bits['entropy'] or 0.0:>6.2f} {layer['buffer']:>7}"
        )
    return lines


def plot_analysis(report: dict[str, Any], folder: Path) -> list[Path]:
    """``union_growth.png``, ``index_coding.png``, ``imbalance.png`` and
    ``overlap.png`` in ``folder``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    layers = report["layers"]
    names = list(layers)
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in names:
        growth = layers[name]["union_growth"]
        style = {"color": "black", "lw": 2.2} if name == OVERALL else {"lw": 1.0}
        ax.plot(growth["k"], growth["mean"], marker="o", ms=3, label=name, **style)
    ax.axhline(report["dense_above"], color="red", ls="--", lw=0.8, label="buffer DENSE_ABOVE")
    ax.axvline(report["k"], color="grey", ls=":", lw=0.8, label=f"K = {report['k']}")
    ax.set_yscale("log")
    ax.set_xlabel("updates summed (K)")
    ax.set_ylabel("union density")
    ax.set_title("what the server buffer holds")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    paths.append(_save(fig, folder / "union_growth.png", plt))

    codings = [*SPARSE_CODINGS, "dense", "entropy"]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / len(codings)
    for i, coding in enumerate(codings):
        values = [layers[n]["index_bits_per_nnz"].get(coding) or np.nan for n in names]
        ax.bar(np.arange(len(names)) + i * width, values, width, label=coding)
    ax.set_xticks(
        np.arange(len(names)) + 0.4 - width / 2, names, rotation=30, ha="right", fontsize=7
    )
    ax.set_yscale("log")
    ax.set_ylabel("index bits per kept position")
    ax.set_title("position coding cost on the real supports")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    paths.append(_save(fig, folder / "index_coding.png", plt))

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in names:
        parts = sorted(layers[name]["imbalance"], key=int)
        style = {"color": "black", "lw": 2.2} if name == OVERALL else {"lw": 1.0}
        ax.plot(
            [int(p) for p in parts],
            [layers[name]["imbalance"][p]["update"]["mean"] for p in parts],
            marker="o",
            ms=3,
            label=name,
            **style,
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("equal index partitions (P)")
    ax.set_ylabel("max partition load / mean")
    ax.set_title("Zen's imbalance of one update's non-zeros")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    paths.append(_save(fig, folder / "imbalance.png", plt))

    fig, ax = plt.subplots(figsize=(7, 4.2))
    keys = ("kept_by_2", "kept_by_half", "kept_by_all")
    width = 0.8 / (len(keys) + 1)
    for i, key in enumerate(keys):
        ax.bar(
            np.arange(len(names)) + i * width,
            [layers[n]["overlap"][key] for n in names],
            width,
            label=f"share of union {key}",
        )
    ax.bar(
        np.arange(len(names)) + len(keys) * width,
        [(layers[n]["overlap"]["jaccard"] or {"mean": np.nan})["mean"] for n in names],
        width,
        label="mean pairwise Jaccard",
    )
    ax.set_xticks(
        np.arange(len(names)) + 0.4 - width / 2, names, rotation=30, ha="right", fontsize=7
    )
    ax.set_ylim(0, 1)
    ax.set_title("overlap of the clients' kept positions (per round)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(_save(fig, folder / "overlap.png", plt))
    return paths


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
