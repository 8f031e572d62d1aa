"""Zen-style sparsity analysis of a model's real updates (``python -m fedsync.analysis``).

Which way of synchronising sparse updates is cheapest depends on measured properties of
those updates. This package trains the run's model on the run's data for a few tasks
per client (:mod:`~fedsync.analysis.collect`), measures the supports the chosen codec
really sends (:mod:`~fedsync.analysis.metrics`: density, the union ``K`` updates fill
in the server buffer, overlap across clients, Zen's partition imbalance), prices every
index coding on them with the wire format's own encoders
(:mod:`~fedsync.analysis.coding`), and recommends a server buffer kind and a coding
(:mod:`~fedsync.analysis.report`). :mod:`~fedsync.analysis.cli` is the command
(also ``fedsync analyze``).
"""

from fedsync.analysis.coding import index_costs
from fedsync.analysis.collect import Collection, UpdateRecord, collect_updates
from fedsync.analysis.metrics import (
    density,
    entropy_bits_per_nnz,
    keep_counts,
    overlap_shares,
    pairwise_jaccard,
    partition_imbalance,
    union_growth,
)
from fedsync.analysis.report import analyse, plot_analysis

__all__ = [
    "Collection",
    "UpdateRecord",
    "analyse",
    "collect_updates",
    "density",
    "entropy_bits_per_nnz",
    "index_costs",
    "keep_counts",
    "overlap_shares",
    "pairwise_jaccard",
    "partition_imbalance",
    "plot_analysis",
    "union_growth",
]
