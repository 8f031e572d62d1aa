"""The K-update buffer: exactly K, weighted scatter-add, only updates validated once."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.aggregation import (
    BufferFull,
    BufferNotReady,
    InvalidUpdate,
    UpdateBuffer,
    ValidUpdate,
    validate_update,
)
from fedsync.aggregation.buffer import Normalization
from fedsync.updates import LowRankTensor, SparseTensor, TensorSpec

SPECS = {"w": TensorSpec("w", (4, 3)), "b": TensorSpec("b", (5,))}


def sparse(name: str, positions: list[int], values: list[float]) -> SparseTensor:
    return SparseTensor(
        SPECS[name],
        torch.tensor(positions, dtype=torch.int64),
        torch.tensor(values, dtype=torch.float32),
    )


def random_update(gen: torch.Generator) -> dict[str, SparseTensor]:
    update = {}
    for name, spec in SPECS.items():
        keep = int(torch.randint(0, spec.numel + 1, (1,), generator=gen))
        positions = torch.randperm(spec.numel, generator=gen)[:keep].sort().values
        update[name] = SparseTensor(spec, positions, torch.randn(keep, generator=gen))
    return update


def valid(update: Mapping, specs: Mapping[str, TensorSpec] = SPECS) -> ValidUpdate:
    """``update`` through the one check that lets it into a buffer."""
    return validate_update(update, specs)


def dense_of(update: dict[str, SparseTensor]) -> dict[str, torch.Tensor]:
    return {name: t.to_dense() for name, t in update.items()}


def test_weighted_mean_by_count_and_by_weight() -> None:
    u1 = {"w": sparse("w", [0, 5], [1.0, 2.0]), "b": sparse("b", [4], [3.0])}
    u2 = {"w": sparse("w", [5, 11], [4.0, -1.0]), "b": sparse("b", [], [])}
    cases: tuple[tuple[Normalization, float], ...] = (("count", 2.0), ("weight", 1.5))
    for normalization, divisor in cases:
        buffer = UpdateBuffer(SPECS, capacity=2, normalization=normalization)
        buffer.add(valid(u1), 0.5)
        buffer.add(valid(u2), 1.0)
        result = buffer.take()
        expected_w = torch.zeros(12)
        expected_w[0], expected_w[5], expected_w[11] = 0.5, 0.5 * 2 + 4.0, -1.0
        torch.testing.assert_close(result.update["w"], (expected_w / divisor).reshape(4, 3))
        torch.testing.assert_close(result.update["b"], torch.tensor([0, 0, 0, 0, 1.5]) / divisor)
        assert result.count == 2 and result.weight_sum == pytest.approx(1.5)


def test_refuses_the_k_plus_first_update() -> None:
    gen = torch.Generator().manual_seed(0)
    buffer = UpdateBuffer(SPECS, capacity=3)
    for expected in (1, 2, 3):
        assert buffer.add(valid(random_update(gen)), 1.0) == expected
    assert buffer.is_full
    with pytest.raises(BufferFull):
        buffer.add(valid(random_update(gen)), 1.0)
    assert len(buffer) == 3  # the refused update left no trace
    buffer.take()
    assert len(buffer) == 0 and not buffer.is_full


def test_take_before_k_raises() -> None:
    buffer = UpdateBuffer(SPECS, capacity=2)
    with pytest.raises(BufferNotReady):
        buffer.take()
    buffer.add(valid(random_update(torch.Generator().manual_seed(1))), 1.0)
    with pytest.raises(BufferNotReady, match="1 of K=2"):
        buffer.take()


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(1, 5),
    arrivals=st.integers(0, 23),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_exactly_k_per_aggregation_in_any_arrival_order(
    k: int, arrivals: int, seed: int, data: st.DataObject
) -> None:
    """Drive the buffer as the loop does (add, take when full) over a random order of
    arrivals: every aggregation holds exactly K updates, never K+1, and equals the
    dense weighted mean of exactly those K."""
    gen = torch.Generator().manual_seed(seed)
    updates = [random_update(gen) for _ in range(arrivals)]
    weights = [float(w) for w in torch.rand(arrivals, generator=gen) + 0.1]
    order = data.draw(st.permutations(range(arrivals)))
    buffer = UpdateBuffer(SPECS, capacity=k, normalization="count")
    window: list[int] = []
    aggregations = 0
    for index in order:
        buffer.add(valid(updates[index]), weights[index])
        window.append(index)
        assert len(buffer) <= k
        if buffer.is_full:
            result = buffer.take()
            assert result.count == k == len(window)
            for name in SPECS:
                expected = sum(weights[i] * dense_of(updates[i])[name] for i in window) / k
                torch.testing.assert_close(result.update[name], expected, atol=1e-5, rtol=1e-5)
            window.clear()
            aggregations += 1
    assert aggregations == arrivals // k
    assert len(buffer) == arrivals % k


def test_sum_does_not_depend_on_order() -> None:
    gen = torch.Generator().manual_seed(3)
    updates = [random_update(gen) for _ in range(4)]
    results = []
    for order in ([0, 1, 2, 3], [3, 1, 0, 2]):
        buffer = UpdateBuffer(SPECS, capacity=4, normalization="weight")
        for i in order:
            buffer.add(valid(updates[i]), 1.0 + i)
        results.append(buffer.take().update)
    for name in SPECS:
        torch.testing.assert_close(results[0][name], results[1][name])


def test_add_never_densifies_an_update(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: SparseTensor) -> torch.Tensor:
        raise AssertionError("the buffer densified an update")

    monkeypatch.setattr(SparseTensor, "to_dense", refuse)
    buffer = UpdateBuffer(SPECS, capacity=1)
    buffer.add(valid({"w": sparse("w", [1], [1.0]), "b": sparse("b", [0], [2.0])}), 1.0)
    assert buffer.take().update["b"][0] == 2.0


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ({"w": sparse("w", [0], [1.0])}, "lacks model tensors"),
        (
            {"w": sparse("w", [0], [1.0]), "b": sparse("b", [0], [1.0]), "x": sparse("b", [], [])},
            "does not",
        ),
        ({"w": sparse("w", [12], [1.0]), "b": sparse("b", [], [])}, "outside"),
        ({"w": sparse("w", [3, 3], [1.0, 1.0]), "b": sparse("b", [], [])}, "strictly increasing"),
        ({"w": sparse("w", [1, 0], [1.0, 1.0]), "b": sparse("b", [], [])}, "strictly increasing"),
        ({"w": sparse("w", [0], [float("nan")]), "b": sparse("b", [], [])}, "NaN or Inf"),
        ({"w": sparse("w", [0], [float("inf")]), "b": sparse("b", [], [])}, "NaN or Inf"),
        ({"w": sparse("w", [0, 1], [1.0]), "b": sparse("b", [], [])}, "indices but"),
        (
            {
                "w": SparseTensor(TensorSpec("w", (3, 4)), torch.tensor([0]), torch.tensor([1.0])),
                "b": sparse("b", [], []),
            },
            "shape",
        ),
        (
            {
                "w": SparseTensor(
                    SPECS["w"], torch.tensor([0]), torch.tensor([1.0], dtype=torch.float64)
                ),
                "b": sparse("b", [], []),
            },
            "float32",
        ),
    ],
)
def test_invalid_updates_never_reach_the_buffer(update: dict, message: str) -> None:
    buffer = UpdateBuffer(SPECS, capacity=2)
    good = valid({"w": sparse("w", [2], [1.0]), "b": sparse("b", [1], [1.0])})
    buffer.add(good, 1.0)
    with pytest.raises(InvalidUpdate, match=message):
        validate_update(update, SPECS)
    with pytest.raises(TypeError, match="ValidUpdate"):
        buffer.add(update, 1.0)  # type: ignore[arg-type]  # never checked: refused
    assert len(buffer) == 1
    buffer.add(good, 1.0)
    result = buffer.take()
    assert float(result.update["w"].sum()) == pytest.approx(1.0)


def test_a_valid_update_is_checked_once_and_read_only() -> None:
    update = {"w": sparse("w", [2], [1.0]), "b": sparse("b", [], [])}
    checked = validate_update(update, SPECS)
    update["w"] = sparse("w", [0], [float("nan")])  # the caller's mapping, not the update's
    assert torch.equal(checked.tensors["w"].indices, torch.tensor([2]))
    with pytest.raises(TypeError):
        checked.tensors["w"] = update["w"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        checked.tensors = {}  # type: ignore[misc]
    dense = valid({"w": torch.ones(4, 3), "b": sparse("b", [0], [1.0])})
    assert isinstance(dense.tensors["w"], torch.Tensor)
    for bad, message in (
        ({"w": torch.ones(3, 4), "b": sparse("b", [], [])}, "shape"),
        ({"w": torch.ones(4, 3, dtype=torch.int64), "b": sparse("b", [], [])}, "floating"),
        ({"w": torch.full((4, 3), float("inf")), "b": sparse("b", [], [])}, "NaN or Inf"),
        ({"w": torch.ones(4, 3)}, "lacks model tensors"),
    ):
        with pytest.raises(InvalidUpdate, match=message):
            valid(bad)


def test_the_buffer_trusts_a_valid_update_without_checking_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What became a ValidUpdate is added as it is: the buffer runs no check of its own
    (a NaN vouched for by building a ValidUpdate directly goes straight in)."""
    import fedsync.aggregation.validation as validation

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the buffer checked an update again")

    vouched = ValidUpdate({"w": sparse("w", [0], [float("nan")]), "b": sparse("b", [], [])}, SPECS)
    monkeypatch.setattr(validation, "_validate_tensor", refuse)
    monkeypatch.setattr(validation, "_validate_dense", refuse)
    buffer = UpdateBuffer(SPECS, capacity=1)
    buffer.add(vouched, 1.0)
    assert torch.isnan(buffer.take().update["w"][0, 0])


def test_bad_weights_and_arguments() -> None:
    buffer = UpdateBuffer(SPECS, capacity=1)
    update = valid({"w": sparse("w", [], []), "b": sparse("b", [], [])})
    for weight in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="weight"):
            buffer.add(update, weight)
    with pytest.raises(ValueError, match="capacity"):
        UpdateBuffer(SPECS, capacity=0)
    with pytest.raises(ValueError, match="normalization"):
        UpdateBuffer(SPECS, capacity=1, normalization="mean")  # type: ignore[arg-type]


def test_zero_weights_move_nowhere() -> None:
    buffer = UpdateBuffer(SPECS, capacity=1, normalization="weight")
    buffer.add(valid({"w": sparse("w", [0], [5.0]), "b": sparse("b", [], [])}), 0.0)
    assert float(buffer.take().update["w"].abs().sum()) == 0.0


def test_low_rank_updates_are_kept_as_factors_and_added_once() -> None:
    """K PowerSGD-style updates: the buffer holds factors, never one product per update,
    and takes the same weighted mean as their dense sum."""
    spec = TensorSpec("w", (12, 3, 2))
    gen = torch.Generator().manual_seed(4)
    updates = [
        LowRankTensor(spec, torch.randn(12, 2, generator=gen), torch.randn(6, 2, generator=gen))
        for _ in range(3)
    ]
    weights = [0.5, 1.0, 2.0]
    buffer = UpdateBuffer({"w": spec}, capacity=3, normalization="weight")
    for update, weight in zip(updates, weights, strict=True):
        buffer.add(valid({"w": update}, {"w": spec}), weight)
        assert update._values is None  # the product was never formed for one update
    mean = buffer.take().update["w"]
    dense = sum(w * u.to_dense() for w, u in zip(weights, updates, strict=True)) / sum(weights)
    torch.testing.assert_close(mean, dense)
    bad = LowRankTensor(spec, torch.full((12, 1), float("nan")), torch.ones(6, 1))
    with pytest.raises(InvalidUpdate, match="factor P"):
        validate_update({"w": bad}, {"w": spec})


def mixed_update(gen: torch.Generator, specs: dict[str, TensorSpec], dense: set[str]) -> dict:
    """Sparse tensors of random density (some empty, some full), dense ones for ``dense``."""
    update: dict[str, SparseTensor | torch.Tensor] = {}
    for name, spec in specs.items():
        if name in dense:
            update[name] = torch.randn(spec.shape, generator=gen)
            continue
        keep = int(torch.randint(0, spec.numel + 1, (1,), generator=gen))
        keep = keep if torch.rand(1, generator=gen) < 0.5 else keep // 50
        positions = torch.randperm(spec.numel, generator=gen)[:keep].sort().values
        update[name] = SparseTensor(spec, positions, torch.randn(keep, generator=gen))
    return update


@settings(max_examples=30, deadline=None)
@given(
    k=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    dense_above=st.sampled_from([0.0, 0.01, 0.05, 0.3, 1.0]),
    normalization=st.sampled_from(["count", "weight"]),
    with_dense=st.booleans(),
)
def test_sparse_dense_and_auto_accumulators_give_the_same_bits(
    k: int, seed: int, dense_above: float, normalization: Normalization, with_dense: bool
) -> None:
    """Whatever kind holds each tensor, and wherever auto switches, every aggregate is
    bit-identical (-0.0 included) over several aggregations of one buffer."""
    specs = {
        "big": TensorSpec("big", (40, 50)),
        "mid": TensorSpec("mid", (300,)),
        "b": TensorSpec("b", (7,)),
    }
    gen = torch.Generator().manual_seed(seed)
    updates = [mixed_update(gen, specs, {"b"} if with_dense else set()) for _ in range(2 * k)]
    weights = [float(w) for w in torch.rand(2 * k, generator=gen)]
    weights[0] = 0.0
    outputs = {}
    for kind in ("dense", "sparse", "auto"):
        buffer = UpdateBuffer(
            specs,
            capacity=k,
            normalization=normalization,
            accumulator=kind,
            dense_above=dense_above,
        )
        takes = []
        for update, weight in zip(updates, weights, strict=True):
            buffer.add(valid(update, specs), weight)
            if buffer.is_full:
                takes.append(buffer.take().update)
        outputs[kind] = takes
    for kind in ("sparse", "auto"):
        for got, want in zip(outputs[kind], outputs["dense"], strict=True):
            for name in specs:
                assert torch.equal(got[name].view(torch.int32), want[name].view(torch.int32))


def test_auto_turns_a_tensor_dense_once_its_union_passes_the_threshold() -> None:
    spec = TensorSpec("w", (1000,))
    buffer = UpdateBuffer({"w": spec}, capacity=3, dense_above=0.05)

    def update(positions: list[int]) -> ValidUpdate:
        idx = torch.tensor(positions, dtype=torch.int64)
        return valid({"w": SparseTensor(spec, idx, torch.ones(len(positions)))}, {"w": spec})

    buffer.add(update(list(range(0, 30))), 1.0)
    assert buffer.union_density("w") == pytest.approx(0.03)
    buffer.add(update(list(range(10, 40))), 1.0)  # 60 positions cached, union 40: still sparse
    assert buffer.union_density("w") == pytest.approx(0.04)
    buffer.add(update(list(range(40, 51))), 1.0)  # union 51 > 50: dense
    assert buffer.union_density("w") == 1.0
    result = buffer.take()
    assert buffer.last_kinds == {"w": "dense"}
    assert float(result.update["w"].sum()) == pytest.approx((30 + 30 + 11) / 3)
    # The next aggregation starts sparse again and stays so below the threshold.
    for _ in range(3):
        buffer.add(update([1, 2]), 1.0)
    buffer.take()
    assert buffer.last_kinds == {"w": "sparse"}


def test_low_rank_and_dense_updates_make_their_tensor_dense() -> None:
    spec = TensorSpec("w", (12, 6))
    gen = torch.Generator().manual_seed(5)
    buffer = UpdateBuffer({"w": spec}, capacity=2, accumulator="sparse")
    specs = {"w": spec}
    buffer.add(valid({"w": SparseTensor(spec, torch.tensor([3]), torch.tensor([1.0]))}, specs), 1.0)
    factors = LowRankTensor(spec, torch.randn(12, 1, generator=gen), torch.ones(6, 1))
    buffer.add(valid({"w": factors}, specs), 1.0)
    buffer.take()
    assert buffer.last_kinds == {"w": "dense"}
    buffer.add(valid({"w": torch.ones(12, 6)}, specs), 1.0)
    assert buffer.union_density("w") == 1.0


def test_bad_accumulator_arguments() -> None:
    with pytest.raises(ValueError, match="accumulator"):
        UpdateBuffer(SPECS, capacity=1, accumulator="coo")  # type: ignore[arg-type]
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="dense_above"):
            UpdateBuffer(SPECS, capacity=1, dense_above=bad)


def test_an_update_validated_against_other_tensors_is_refused() -> None:
    """A ValidUpdate vouches for the tensors it was checked against, not for any model:
    the buffer refuses one checked against other specs (say, AB-Training's factors)."""
    other = {name: dataclasses.replace(spec, dtype="float16") for name, spec in SPECS.items()}
    update = validate_update({"w": sparse("w", [0], [1.0]), "b": sparse("b", [], [])}, other)
    buffer = UpdateBuffer(SPECS, capacity=1)
    with pytest.raises(ValueError, match="other tensors"):
        buffer.add(update, 1.0)
    assert len(buffer) == 0
