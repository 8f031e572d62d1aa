"""The aggregation engine on its own: no Grid, no messages, the real codec.

A task is planned, a "device" decodes its downlink, trains (here: moves towards a
target), encodes its update with the real :class:`~fedsync.codecs.UpdateCodec`, and the
engine receives the bytes. Each test checks one arrow of
``reply -> gate -> weight -> buffer -> step -> version``.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch

from fedsync.codecs import UpdateCodec
from fedsync.compression.sparsifiers import dct
from fedsync.config import RunConfig
from fedsync.engine import AggregationEngine, InFlight, Rejection, Verdict
from fedsync.updates import CompressedTensor, QuantizedValues, TensorSpec
from fedsync.wire import BadMagic, UnexpectedCodec, encode_frame

SHAPES = {"w": (6, 4), "b": (4,)}
SPECS = {name: TensorSpec(name, shape) for name, shape in SHAPES.items()}


def engine_for(**values: Any) -> AggregationEngine:
    settings: dict[str, Any] = {
        "uplink_codec": "none+fp32",
        "downlink_codec": "none+fp32",
        "buffer_size": 2,
        **values,
    }
    state = {name: torch.zeros(shape) for name, shape in SHAPES.items()}
    return AggregationEngine(RunConfig.of(**settings), state)


def device_model(plan: InFlight) -> dict[str, torch.Tensor]:
    """What the device holds after decoding a full downlink."""
    decoded = UpdateCodec().decode(plan.downlink.payload, SPECS)
    return {name: tensor.to_dense() for name, tensor in decoded.items()}


def reply(plan: InFlight, delta: dict[str, torch.Tensor]) -> bytes:
    return UpdateCodec(plan.uplink_spec).encode(delta)


def ones(scale: float) -> dict[str, torch.Tensor]:
    return {name: torch.full(shape, scale) for name, shape in SHAPES.items()}


def test_the_engine_imports_no_flower() -> None:
    code = "import sys, fedsync.engine, fedsync.strategies; print('flwr' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_k_updates_make_one_step() -> None:
    engine = engine_for(strategy="fedbuff", staleness="constant")
    first, second = engine.plan_task(1, 1), engine.plan_task(2, 2)
    assert engine.arrived(first, 1) == engine.arrived(second, 1) == 0
    verdict = engine.receive(first, reply(first, ones(1.0)), 10)
    assert verdict.status == "buffered" and engine.version == 0
    verdict = engine.receive(second, reply(second, ones(3.0)), 10)
    assert verdict.status == "aggregated" and verdict.updates == 2 and engine.version == 1
    assert torch.equal(engine.state["w"], torch.full((6, 4), 2.0))  # the mean of 1 and 3


def test_teasq_weights_by_examples_and_staleness() -> None:
    engine = engine_for(strategy="teasq", staleness="polynomial:1", buffer_size=1)
    old = engine.plan_task(1, 1)
    fresh = engine.plan_task(2, 2)
    engine.arrived(fresh, 1)
    assert engine.receive(fresh, reply(fresh, ones(1.0)), 5).status == "aggregated"
    assert engine.arrived(old, 1) == 1  # one aggregation happened meanwhile
    verdict = engine.receive(old, reply(old, ones(1.0)), 30)
    # K = 1 and weight normalisation: the weight re-balances, it never shrinks the step
    assert verdict.weight_sum == pytest.approx(30 * 0.5)
    assert torch.equal(engine.state["b"], torch.full((4,), 2.0))


def test_staleness_is_computed_once_at_arrival_and_kept_on_the_record() -> None:
    """arrived() writes the staleness on the task's record; receive() reads it from there
    (the weight, the gate, the verdict and the counters), never computing it again."""
    engine = engine_for(strategy="fedasync", staleness="polynomial:1", max_staleness=0)
    old, fresh = engine.plan_task(1, 1), engine.plan_task(2, 2)
    assert isinstance(old, InFlight) and old.staleness is None
    with pytest.raises(ValueError, match="before arrived"):
        engine.receive(old, reply(old, ones(1.0)), 10)
    assert engine.arrived(old, 1) == 0 == old.staleness
    engine.arrived(fresh, 1)
    assert engine.receive(fresh, reply(fresh, ones(1.0)), 10).status == "aggregated"
    # The model moved on after old's arrival: its staleness is still the one it came with.
    verdict = engine.receive(old, reply(old, ones(1.0)), 10)
    assert verdict.status == "aggregated" and verdict.staleness == 0
    assert engine.tally.staleness == {0: 2} and engine.version == 2


def test_the_engine_keeps_nothing_of_a_task_but_its_record() -> None:
    """A task's start model (fedasync-mix) rides on its record; no table of the engine
    grows with the tasks in flight."""
    engine = engine_for(strategy="fedasync-mix", fedasync_alpha=0.5)
    before = set(vars(engine))
    flights = [engine.plan_task(node, node) for node in (1, 2, 3)]
    assert all(f.downlink.start is not None for f in flights)
    grown = [
        name
        for name, value in vars(engine).items()
        if isinstance(value, dict) and any(f.task_id in value for f in flights)
    ]
    assert grown == [] and set(vars(engine)) == before


def nan_frame() -> bytes:
    """A well-formed frame (valid checksum) whose values hold a NaN."""
    tensors = []
    for name, shape in SHAPES.items():
        values = np.ones(SPECS[name].numel, dtype=np.float32)
        values[2] = np.nan
        codes = QuantizedValues("fp32", 32, values.view(np.uint32))
        tensors.append(CompressedTensor(TensorSpec(name, shape), "dense", None, codes))
    return encode_frame("none+fp32", tensors)


@pytest.mark.parametrize(
    ("payload", "kind"),
    [(b"garbage", "decode:"), (nan_frame(), "decode:NonFiniteUpdate")],
)
def test_rejected_replies_leave_the_model_untouched(payload: bytes, kind: str) -> None:
    engine = engine_for(strategy="fedasync")
    plan = engine.plan_task(1, 1)
    engine.arrived(plan, 7)
    before = {name: t.clone() for name, t in engine.state.items()}
    verdict = engine.receive(plan, payload, 10)
    assert verdict.status == "rejected" and verdict.kind.startswith(kind)
    assert engine.version == 0 and engine.rejections[verdict.kind] == 1
    assert all(torch.equal(before[n], engine.state[n]) for n in SHAPES)


@pytest.mark.parametrize("other", ["none+fp32", "dct:8,chunk=4096+fp32"])
def test_a_valid_frame_of_another_codec_is_a_codec_mismatch(
    other: str, built_pipelines: list[str]
) -> None:
    """A well-formed frame the task did not assign: refused on its header (no pipeline
    built for it, no DCT matrix), counted, the model untouched; the run goes on."""
    engine = engine_for(strategy="fedasync", uplink_codec="topk:0.5+uniform:8+ef")
    plan, honest_plan = engine.plan_task(1, 1), engine.plan_task(2, 2)
    assert plan.uplink_spec == "topk:0.5+uniform:8+ef"
    payload = UpdateCodec(other).encode(ones(1.0))
    assert UpdateCodec(plan.uplink_spec).decode(payload, SPECS)  # valid: any codec takes it
    honest = reply(honest_plan, ones(1.0))
    built = built_pipelines
    built.clear()  # from here on: the builds of the decoding below
    matrices = dct.MATRICES.nbytes, len(dct.MATRICES)
    before = {name: t.clone() for name, t in engine.state.items()}
    engine.arrived(plan, len(payload))
    verdict = engine.receive(plan, payload, 10)
    assert verdict.status == "rejected" and verdict.rejection is not None
    assert verdict.rejection.kind == Rejection.CODEC_MISMATCH == "codec-mismatch"
    assert repr(other) in verdict.rejection.detail
    assert repr(plan.uplink_spec) in verdict.rejection.detail
    assert built == [] and (dct.MATRICES.nbytes, len(dct.MATRICES)) == matrices
    assert engine.rejections == {"codec-mismatch": 1}
    assert engine.tally.drops == {"rejected": 1} and engine.tally.aggregated == 0
    assert engine.version == 0
    assert all(torch.equal(before[n], engine.state[n]) for n in SHAPES)
    assert engine.describe()["rejections"] == {"codec-mismatch": 1}
    # the run goes on: an honest reply in the task's codec is aggregated
    engine.arrived(honest_plan, 1)
    assert engine.receive(honest_plan, honest, 10).status == "aggregated"
    assert engine.version == 1 and built == [honest_plan.uplink_spec]  # its decoder only


def test_rejections_are_typed_values() -> None:
    mismatch = UnexpectedCodec("another codec", field="codec", expected="'a'", got="'b'")
    assert Rejection.decode_failed(mismatch) == Rejection(
        "codec-mismatch", f"codec mismatch: {mismatch}"
    )
    magic = BadMagic("not a fedsync frame", field="magic")
    assert Rejection.decode_failed(magic) == Rejection(
        "decode:BadMagic", f"decode failed: BadMagic: {magic}"
    )
    assert Rejection.decode_failed(KeyError("w")).kind == "decode:KeyError"
    rejected = Verdict("rejected", 2, rejection=Rejection(Rejection.NORM, "too large"))
    assert (rejected.kind, rejected.why) == ("norm", "too large")
    assert (Verdict("buffered", 0).kind, Verdict("buffered", 0).why) == ("", "")
    with pytest.raises(ValueError, match="rejection"):
        Verdict("rejected", 0)
    with pytest.raises(ValueError, match="rejection"):
        Verdict("stale", 0, rejection=Rejection(Rejection.MALFORMED, "x"))


def test_malformed_and_refused_replies_are_counted_by_their_kind() -> None:
    engine = engine_for(strategy="teasq", buffer_size=1)
    plans = [engine.plan_task(1, n) for n in (1, 2)]
    for plan in plans:
        engine.arrived(plan, 1)
    malformed = engine.receive(plans[0], b"", 10, malformed="no payload array")
    assert malformed.rejection == Rejection("malformed", "no payload array")
    refused = engine.receive(plans[1], reply(plans[1], ones(1.0)), 0)  # TEASQ needs examples
    assert refused.kind == "malformed" and "num-examples" in refused.why
    assert engine.rejections == {"malformed": 2} and engine.version == 0


def test_the_staleness_gate_drops_and_counts() -> None:
    engine = engine_for(strategy="fedasync", max_staleness=0)
    old, fresh = engine.plan_task(1, 1), engine.plan_task(2, 2)
    engine.arrived(fresh, 1)
    engine.receive(fresh, reply(fresh, ones(1.0)), 1)
    engine.arrived(old, 1)
    assert engine.receive(old, reply(old, ones(1.0)), 1).status == "stale"
    assert engine.tally.drops["stale"] == 1 and engine.version == 1


def test_fedasync_mix_is_the_papers_model_mixing() -> None:
    """x <- (1 - a) x + a x_local with a = alpha s(tau), x_local = x_start + Delta."""
    engine = engine_for(strategy="fedasync-mix", fedasync_alpha=0.5, staleness="polynomial:1")
    old = engine.plan_task(1, 1)
    start_old = device_model(old)
    fresh = engine.plan_task(2, 2)
    engine.arrived(fresh, 1)
    engine.receive(fresh, reply(fresh, ones(2.0)), 1)  # staleness 0: a = 0.5
    assert torch.equal(engine.state["w"], torch.full((6, 4), 1.0))  # 0.5 * 0 + 0.5 * 2
    x = {name: t.clone() for name, t in engine.trained.items()}
    engine.arrived(old, 1)
    engine.receive(old, reply(old, ones(4.0)), 1)  # staleness 1: a = 0.5 * 1/2
    a = 0.25
    for name in SHAPES:
        local = start_old[name] + 4.0
        torch.testing.assert_close(engine.state[name], (1 - a) * x[name] + a * local)
    # the delta form of FedAsync would have added a * 4 = 1.0 instead of pulling back
    assert float(engine.state["w"][0, 0]) == pytest.approx(0.75 * 1.0 + 0.25 * 4.0)


def test_sign_transform_steps_the_sign_of_the_mean() -> None:
    engine = engine_for(
        strategy="fedbuff",
        staleness="constant",
        server_update_transform="sign",
        server_learning_rate=0.01,
    )
    first, second = engine.plan_task(1, 1), engine.plan_task(2, 2)
    engine.arrived(first, 1)
    engine.arrived(second, 1)
    up = ones(1.0)
    up["w"][0, 0], up["b"][1] = -5.0, -1.0  # w[0, 0]: mean -1.5; b[1]: mean 0
    engine.receive(first, reply(first, up), 10)
    assert engine.receive(second, reply(second, ones(1.0)), 10).status == "aggregated"
    expected_w = torch.full((6, 4), 0.01)
    expected_w[0, 0] = -0.01
    torch.testing.assert_close(engine.state["w"], expected_w)
    torch.testing.assert_close(engine.state["b"], torch.tensor([0.01, 0.0, 0.01, 0.01]))
    assert "transform='sign'" in engine.describe()["server_optimizer"]
