"""The sparsity analysis's measures on hand-made supports with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsync.aggregation.buffer import DENSE_ABOVE
from fedsync.analysis import (
    Collection,
    UpdateRecord,
    analyse,
    density,
    entropy_bits_per_nnz,
    index_costs,
    keep_counts,
    overlap_shares,
    pairwise_jaccard,
    partition_imbalance,
    union_growth,
)
from fedsync.analysis.report import OVERALL
from fedsync.updates import TensorSpec


def s(*positions: int) -> np.ndarray:
    return np.array(positions, dtype=np.int64)


def test_density_and_union_growth() -> None:
    assert density(s(0, 3, 7), 10) == pytest.approx(0.3)
    assert density(s(), 10) == 0.0
    assert union_growth([s(0, 1), s(1, 2), s(5), s(0, 2)], 10) == pytest.approx(
        [0.2, 0.3, 0.4, 0.4]
    )


def test_pairwise_jaccard() -> None:
    got = pairwise_jaccard([s(0, 1), s(1, 2), s(5)], 10)
    assert got == pytest.approx([1 / 3, 0.0, 0.0])
    assert pairwise_jaccard([s(), s()], 4) == [1.0]
    assert pairwise_jaccard([s(2, 3)], 4) == []


def test_keep_counts_and_overlap_shares() -> None:
    supports = [s(0, 1), s(0, 1), s(0, 2), s(0, 3), s(4)]
    assert keep_counts(supports, 6).tolist() == [4, 2, 1, 1, 1, 0]
    shares = overlap_shares(supports, 6)
    # union {0..4}: kept by >= 2 -> {0, 1}; by >= ceil(5/2) = 3 -> {0}; by all 5 -> none
    assert shares == pytest.approx(
        {"union_density": 5 / 6, "kept_by_2": 0.4, "kept_by_half": 0.2, "kept_by_all": 0.0}
    )
    same = overlap_shares([s(1, 2), s(1, 2)], 4)
    assert same["kept_by_all"] == 1.0 and same["kept_by_half"] == 1.0
    assert overlap_shares([s(), s()], 4)["kept_by_2"] == 0.0
    with pytest.raises(ValueError, match="at least one"):
        overlap_shares([], 4)


def test_partition_imbalance() -> None:
    clustered = s(*range(10))
    assert partition_imbalance(clustered, 100, 2) == pytest.approx(2.0)  # loads 10, 0
    assert partition_imbalance(clustered, 100, 10) == pytest.approx(10.0)  # all in one
    assert partition_imbalance(s(*range(0, 100, 10)), 100, 10) == pytest.approx(1.0)
    # numel 10, P = 4: ranges [0,2) [2,5) [5,7) [7,10); loads 2, 3, 0, 0; mean 5/4
    assert partition_imbalance(s(0, 1, 2, 3, 4), 10, 4) == pytest.approx(3 / 1.25)
    assert partition_imbalance(s(), 10, 4) == 1.0
    assert partition_imbalance(s(3), 10, 1) == 1.0
    for parts in (0, 11):
        with pytest.raises(ValueError, match="parts"):
            partition_imbalance(s(1), 10, parts)


def test_entropy_bits_per_nnz() -> None:
    assert entropy_bits_per_nnz(32, 64) == pytest.approx(2.0)  # H(1/2) / (1/2)
    h = -(0.25 * math.log2(0.25) + 0.75 * math.log2(0.75))
    assert entropy_bits_per_nnz(1, 4) == pytest.approx(h / 0.25)
    assert entropy_bits_per_nnz(0, 10) == 0.0 and entropy_bits_per_nnz(10, 10) == 0.0
    with pytest.raises(ValueError, match="nnz"):
        entropy_bits_per_nnz(11, 10)


@pytest.mark.parametrize(
    "bad",
    [s(3, 2), s(1, 1), s(-1, 2), s(0, 10), np.array([0.5]), np.zeros((2, 2), dtype=np.int64)],
)
def test_bad_supports_are_refused(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="support"):
        density(bad, 10)
    with pytest.raises(ValueError, match="support"):
        index_costs(bad, 10)


def ef_bits(count: int, numel: int) -> int:
    """Elias-Fano's closed form (low parts, then the high bit array) at its best ``L``,
    plus the parameter byte."""
    best = min(
        math.ceil(count * low / 8) + math.ceil((count + ((numel - 1) >> low)) / 8)
        for low in range(0, (numel - 1).bit_length() + 1)
    )
    return 8 * (best + 1)


def test_index_costs_on_known_supports() -> None:
    even = s(*range(0, 64, 2))
    costs = index_costs(even, 64, value_bits=8)
    assert costs["bitmap"] == 64  # 8 bytes, no table fields
    assert costs["coo_int32"] == 32 * 32
    assert costs["dense"] == 8 * 32  # the 32 zeros, 8 bits each
    assert costs["entropy"] == pytest.approx(64.0)  # 32 * H(1/2) / (1/2)
    assert costs["elias_fano"] == ef_bits(32, 64)
    assert "rice" in costs and "context" in costs
    sparse = s(5, 900, 40_000)
    costs = index_costs(sparse, 100_000, value_bits=4)
    assert costs["bitmap"] == 100_000
    assert costs["elias_fano"] == ef_bits(3, 100_000)
    assert costs["rice"] < costs["bitmap"] and costs["coo_int32"] == 96
    assert costs["dense"] == 4 * (100_000 - 3)
    full = index_costs(s(*range(16)), 16)
    assert full["dense"] == 0.0 and full["entropy"] == 0.0 and "context" not in full


def test_context_coding_wins_on_a_clustered_support() -> None:
    """Whole rows kept: the context coder, real section length, beats H(rho)/rho."""
    support = np.concatenate([np.arange(r * 100, r * 100 + 100) for r in range(0, 100, 10)])
    costs = index_costs(support, 10_000, shape=(100, 100))
    assert costs["context"] < costs["entropy"] < costs["bitmap"]


def record(client: int, round_index: int, supports: dict[str, np.ndarray]) -> UpdateRecord:
    return UpdateRecord(
        client=client,
        round=round_index,
        spec="topk:0.1+uniform:8",
        payload_bytes=100,
        supports=supports,
        value_bits=dict.fromkeys(supports, 8),
        sent_coding=dict.fromkeys(supports, "rice"),
        sent_index_bytes=dict.fromkeys(supports, 3),
        train_loss=0.0,
    )


def test_analyse_on_hand_made_updates() -> None:
    """Two tensors, two clients, two rounds, K = 2: every number from known supports."""
    specs = {"a": TensorSpec("a", (10, 10)), "b": TensorSpec("b", (4,))}
    updates = [
        record(0, 0, {"a": s(0, 1), "b": s(0)}),
        record(1, 0, {"a": s(1, 2), "b": s(0)}),
        record(0, 1, {"a": s(50, 60), "b": s(3)}),
        record(1, 1, {"a": s(70, 80), "b": s(2)}),
    ]
    collection = Collection(specs, clients=2, rounds=2, buffer_size=2, updates=updates)
    collection.accuracy = [0.5, 0.6]
    report = analyse(collection, partitions=(2, 4))
    a, b, model = (report["layers"][n] for n in ("a", "b", OVERALL))
    assert a["density"] == pytest.approx({"mean": 0.02, "min": 0.02, "max": 0.02})
    # round 0 union {0,1,2} = 0.03, round 1 {50,60,70,80} = 0.04
    assert a["union_growth"]["mean"] == pytest.approx([0.02, 0.035])
    assert a["union_at_k"] == pytest.approx(0.035)
    assert a["overlap"]["jaccard"] == pytest.approx({"mean": 1 / 6, "min": 0.0, "max": 1 / 3})
    assert a["overlap"]["kept_by_all"] == pytest.approx((1 / 3 + 0) / 2)
    assert b["overlap"]["kept_by_all"] == pytest.approx((1 + 0) / 2)
    # P = 2 on "a": {0,1}, {1,2} in the first half (2.0), {50,60}, {70,80} in the second
    assert a["imbalance"]["2"]["update"]["mean"] == pytest.approx(2.0)
    assert a["imbalance"]["2"]["union_of_2"]["max"] == pytest.approx(2.0)
    # the model's flat space: "b" follows "a" at offset 100
    assert model["numel"] == 104
    assert model["union_at_k"] == pytest.approx((4 / 104 + 6 / 104) / 2)
    assert a["buffer"] == ("dense" if DENSE_ABOVE < 0.035 else "sparse")
    assert b["buffer"] == "dense"  # a union of 1/4 to 1/2 of the tensor
    # the model's coding costs are the layers' sums
    for coding in ("bitmap", "coo_int32", "dense", "entropy", "best_per_tensor", "sent"):
        total = a["index_bytes_per_update"][coding] + b["index_bytes_per_update"][coding]
        assert model["index_bytes_per_update"][coding] == pytest.approx(total)
    assert model["index_bits_per_nnz"]["coo_int32"] == 32.0
    assert model["index_bytes_per_update"]["bitmap"] == 13 + 1  # ceil(100/8) + ceil(4/8)
    bits = model["index_bits_per_nnz"]
    assert bits[model["best_coding"]] == min(
        bits[c] for c in ("bitmap", "elias_fano", "rice", "context", "coo_int32", "dense")
    )
    rec = report["recommendation"]
    assert rec["buffer"] == model["buffer"] and rec["coding"] == model["best_coding"]
    assert report["sent"]["index_bytes_per_update"] == 6
    assert model["index_bytes_per_update"]["sent"] == 6
    assert model["index_bits_per_nnz"]["sent"] == pytest.approx(8 * 6 * 4 / 12)
