"""Server optimizers against steps computed by hand, and their checkpoint state."""

from __future__ import annotations

import math

import pytest
import torch

from fedsync.aggregation import (
    ServerAdam,
    ServerMomentum,
    ServerSGD,
    build_server_optimizer,
)


def params() -> dict[str, torch.Tensor]:
    return {"w": torch.tensor([1.0, -2.0]), "b": torch.tensor([0.5])}


D1 = {"w": torch.tensor([0.2, 0.4]), "b": torch.tensor([-1.0])}
D2 = {"w": torch.tensor([-0.1, 0.0]), "b": torch.tensor([2.0])}


def test_sgd() -> None:
    x = params()
    ServerSGD(learning_rate=0.5).step(x, D1)
    torch.testing.assert_close(x["w"], torch.tensor([1.1, -1.8]))
    torch.testing.assert_close(x["b"], torch.tensor([0.0]))


def test_momentum_two_steps() -> None:
    x = params()
    opt = ServerMomentum(learning_rate=0.5, momentum=0.9)
    opt.step(x, D1)  # v = d1; x += 0.5 d1
    opt.step(x, D2)  # v = 0.9 d1 + d2 = w: [0.08, 0.36], b: [1.1]; x += 0.5 v
    torch.testing.assert_close(x["w"], torch.tensor([1.0 + 0.1 + 0.04, -2.0 + 0.2 + 0.18]))
    torch.testing.assert_close(x["b"], torch.tensor([0.5 - 0.5 + 0.55]))


def test_nesterov_two_steps() -> None:
    x = params()
    opt = ServerMomentum(learning_rate=1.0, momentum=0.5, nesterov=True)
    opt.step(x, D1)  # v = d1; step = d1 + 0.5 d1 = 1.5 d1
    opt.step(x, D2)  # v = 0.5 d1 + d2; step = d2 + 0.5 v
    v = {k: 0.5 * D1[k] + D2[k] for k in D1}
    for k in x:
        torch.testing.assert_close(x[k], params()[k] + 1.5 * D1[k] + D2[k] + 0.5 * v[k])


def test_adam_two_steps() -> None:
    x = params()
    opt = ServerAdam(learning_rate=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
    opt.step(x, D1)
    opt.step(x, D2)
    expected = params()
    for k in expected:
        m = v = torch.zeros_like(expected[k])
        for d in (D1[k], D2[k]):
            m = 0.9 * m + 0.1 * d
            v = 0.99 * v + 0.01 * d * d
            expected[k] = expected[k] + 0.1 * m / (v.sqrt() + 1e-3)
        torch.testing.assert_close(x[k], expected[k])
    # by hand for one coordinate: b after step 1: m = -0.1, v = 0.01 -> 0.5 + 0.1 * -0.1 / 0.101
    x1 = params()
    ServerAdam(learning_rate=0.1).step(x1, D1)
    assert float(x1["b"]) == pytest.approx(0.5 - 0.01 / 0.101, rel=1e-6)


def test_adam_bias_correction() -> None:
    x = params()
    ServerAdam(learning_rate=0.1, bias_correction=True).step(x, D1)
    # t = 1: m = 0.1 d, v = 0.01 d^2, eta scaled by sqrt(0.01) / 0.1 = 1
    scale = math.sqrt(1 - 0.99) / (1 - 0.9)
    expected = 0.5 + 0.1 * scale * (-0.1) / (math.sqrt(0.01) + 1e-3)
    assert float(x["b"]) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam"])
def test_state_dict_resumes_the_same_trajectory(name: str) -> None:
    straight = params()
    opt = build_server_optimizer(name, learning_rate=0.3)
    for d in (D1, D2, D1):
        opt.step(straight, d)

    resumed = params()
    first = build_server_optimizer(name, learning_rate=0.3)
    first.step(resumed, D1)
    state = first.state_dict()
    second = build_server_optimizer(name, learning_rate=0.3)
    second.load_state_dict(state)
    second.step(resumed, D2)
    second.step(resumed, D1)
    for k in straight:
        torch.testing.assert_close(resumed[k], straight[k])
    assert second.steps == 3
    # the state is a copy: stepping on does not change a saved checkpoint
    saved = {slot: {k: t.clone() for k, t in d.items()} for slot, d in state["buffers"].items()}
    for slot, tensors in state["buffers"].items():
        for k, t in tensors.items():
            torch.testing.assert_close(t, saved[slot][k])


def test_load_refuses_another_kind() -> None:
    state = ServerAdam().state_dict()
    with pytest.raises(ValueError, match="'adam' optimizer state, this is 'momentum'"):
        ServerMomentum().load_state_dict(state)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ServerSGD(learning_rate=0.0), "learning rate"),
        (lambda: ServerSGD(learning_rate=float("inf")), "learning rate"),
        (lambda: ServerMomentum(momentum=1.0), "momentum"),
        (lambda: ServerAdam(beta2=-0.1), "beta2"),
        (lambda: ServerAdam(tau=0.0), "tau"),
        (lambda: build_server_optimizer("lamb"), "unknown server optimizer"),
    ],
)
def test_constructor_validation(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_step_checks_names_and_shapes() -> None:
    opt = ServerSGD()
    with pytest.raises(ValueError, match="do not match"):
        opt.step(params(), {"w": D1["w"]})
    with pytest.raises(ValueError, match="shape"):
        opt.step(params(), {"w": torch.zeros(3), "b": torch.zeros(1)})
    x = params()
    opt.step(x, {"w": torch.zeros(2), "b": torch.zeros(1)})
    torch.testing.assert_close(x["w"], params()["w"])


def test_aliases() -> None:
    assert isinstance(build_server_optimizer("fedavgm"), ServerMomentum)
    assert isinstance(build_server_optimizer("FedAdam"), ServerAdam)
    assert isinstance(build_server_optimizer("plain"), ServerSGD)


# --- the update transform (DeMo's sign-of-update) ---------------------------------------------
D3 = {"w": torch.tensor([0.2, 0.0]), "b": torch.tensor([-1e-6])}


def test_sign_transform_moves_every_moved_coordinate_by_the_learning_rate() -> None:
    x = params()
    ServerSGD(learning_rate=0.01, transform="sign").step(x, D3)
    # sign(0.2) = 1, sign(0) = 0 (no device moved it: it stays), sign(-1e-6) = -1
    torch.testing.assert_close(x["w"], torch.tensor([1.01, -2.0]))
    torch.testing.assert_close(x["b"], torch.tensor([0.49]))


def test_sign_transform_comes_before_the_momentum() -> None:
    x = params()
    opt = build_server_optimizer("momentum", learning_rate=0.5, momentum=0.9, transform="sign")
    opt.step(x, D1)  # v = sign(d1) = w: [1, 1], b: [-1]
    opt.step(x, D2)  # v = 0.9 v + sign(d2) = w: [0.9 - 1, 0.9 + 0], b: [-0.9 + 1]
    torch.testing.assert_close(x["w"], torch.tensor([1.0 + 0.5 - 0.05, -2.0 + 0.5 + 0.45]))
    torch.testing.assert_close(x["b"], torch.tensor([0.5 - 0.5 + 0.05]))


def test_none_transform_is_the_plain_step() -> None:
    plain, explicit = params(), params()
    ServerAdam(learning_rate=0.1).step(plain, D1)
    ServerAdam(learning_rate=0.1, transform=" None ").step(explicit, D1)
    for k in plain:
        assert torch.equal(plain[k], explicit[k])
    assert "transform='none'" in repr(build_server_optimizer("adam"))


def test_unknown_transform_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown server update transform 'median'; known: none"):
        build_server_optimizer("sgd", transform="median")


def test_nesterov_reports_its_transform_and_does_not_resume_plain_momentum_state() -> None:
    nesterov = build_server_optimizer("nesterov", learning_rate=0.7, transform="sign")
    assert "nesterov=True" in repr(nesterov) and "transform='sign'" in repr(nesterov)
    plain = build_server_optimizer("momentum", learning_rate=0.7)
    plain.step({"w": torch.zeros(3)}, {"w": torch.ones(3)})
    with pytest.raises(ValueError, match="'momentum' optimizer state, this is 'nesterov'"):
        nesterov.load_state_dict(plain.state_dict())
    build_server_optimizer("momentum").load_state_dict(plain.state_dict())  # same kind: fine
