"""Spec strings, typed configs and the registry."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.compression import (
    REGISTRY,
    DenseConfig,
    DGCConfig,
    ErrorFeedbackConfig,
    Fp16Config,
    MaskConfig,
    PipelineConfig,
    QSGDConfig,
    QuantizerConfig,
    RandomKConfig,
    SIDCoConfig,
    SignConfig,
    SparsifierConfig,
    SpecError,
    TernaryConfig,
    TopKConfig,
    UniformConfig,
    parse_spec,
)
from fedsync.compression.config import STAGE_ORDER

EXAMPLES = [
    ("topk:0.01+uniform:8+ef", "topk:0.01+uniform:8+ef"),
    ("dgc:0.001,sample=0.01+qsgd:16+ef:momentum=0.9", "dgc:0.001+qsgd:16+ef:momentum=0.9"),
    ("sidco:0.01,dist=gpd+sign+ef", "sidco:0.01,dist=gpd+sign+ef"),
    ("none+fp16", "none+fp16"),
    ("mask:0.1,seed=3+uniform:4", "mask:0.1,seed=3+uniform:4"),
    ("fp16", "none+fp16"),
    ("none", "none+fp32"),
    ("topk:0.1+none", "topk:0.1+fp32"),
    (" TopK : 0.1 , + Uniform:4, chunk=64 ", None),  # malformed: empty argument
    ("uniform:4,chunk=64", "none+uniform:4,chunk=64"),
    ("randomk:density=0.5+ternary", "randomk:0.5+ternary"),
    ("ef:momentum=0.5,masking=off", "none+fp32+ef:momentum=0.5,masking=false"),
    ("sidco:0.02,dist=gamma-gpd,stages=2", "sidco:0.02,dist=gamma-gpd,stages=2+fp32"),
]


@pytest.mark.parametrize(("spec", "canonical"), EXAMPLES)
def test_examples_parse_to_canonical_form(spec: str, canonical: str | None) -> None:
    if canonical is None:
        with pytest.raises(SpecError):
            parse_spec(spec)
        return
    config = parse_spec(spec)
    assert config.to_spec() == canonical
    assert parse_spec(canonical) == config
    assert parse_spec(canonical).to_spec() == canonical


def test_typed_config_builds_the_same_pipeline() -> None:
    typed = PipelineConfig(DGCConfig(0.001), QSGDConfig(16), ErrorFeedbackConfig(momentum=0.9))
    assert typed == parse_spec("dgc:0.001+qsgd:16+ef:momentum=0.9")
    assert PipelineConfig() == parse_spec("none")
    assert PipelineConfig(TopKConfig(1)).to_spec() == "topk:1.0+fp32"


densities = st.floats(1e-6, 1.0, allow_nan=False).filter(lambda d: d > 0)
sparsifiers = st.one_of(
    st.builds(DenseConfig),
    st.builds(TopKConfig, densities),
    st.builds(RandomKConfig, densities),
    st.builds(
        DGCConfig,
        densities,
        sample=densities,
        lower=st.floats(0.01, 1.0),
        upper=st.floats(1.0, 10.0),
        iters=st.integers(0, 10),
    ),
    st.builds(
        SIDCoConfig,
        densities,
        dist=st.sampled_from(["exp", "gpd", "gamma-gpd"]),
        stages=st.just(1),
        max_stages=st.integers(1, 8),
        tol=st.floats(0.01, 0.99),
    ),
    st.builds(MaskConfig, densities, seed=st.integers(-(2**40), 2**40)),
)
quantizers = st.one_of(
    st.sampled_from([parse_spec(q).quantizer for q in ("fp32", "fp16", "bf16", "sign", "ternary")]),
    st.builds(UniformConfig, st.integers(1, 8), chunk=st.integers(1, 1 << 20)),
    st.builds(QSGDConfig, st.integers(1, 32767), chunk=st.integers(1, 1 << 20)),
)
feedback = st.one_of(
    st.none(),
    st.builds(ErrorFeedbackConfig, st.floats(0.0, 0.999), masking=st.booleans()),
)


@settings(max_examples=150, deadline=None)
@given(sparsifiers, quantizers, feedback)
def test_config_spec_config_round_trip(
    sparsifier: SparsifierConfig, quantizer: QuantizerConfig, fb: ErrorFeedbackConfig | None
) -> None:
    config = PipelineConfig(sparsifier, quantizer, fb)
    spec = config.to_spec()
    again = parse_spec(spec)
    assert again == config
    assert again.to_spec() == spec


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "valid stages"),
        ("   ", "valid stages"),
        ("foo:1", "unknown stage 'foo'"),
        ("topk:2", "density must be in (0, 1]"),
        ("topk:0", "density must be in (0, 1]"),
        ("topk:nan", "density must be float"),
        ("topk:0.1,dens=3", "unknown key 'dens'; valid keys: density"),
        ("topk:0.1,density=0.2", "density given twice"),
        ("uniform:9", "bits must be in [1, 8]"),
        ("uniform:4.5", "bits must be int"),
        ("uniform:4,chunk=0", "chunk must be an int >= 1"),
        ("qsgd:0", "levels must be in [1, 32767]"),
        ("uniform:8+topk:0.1", "out of order"),
        ("topk:0.1+topk:0.2", "out of order"),
        ("topk:0.1+ef+uniform:8", "out of order"),
        ("topk:0.1+", "empty stage"),
        ("topk:0.1,", "empty argument"),
        ("ef:0.9", "no bare argument"),
        ("ef:momentum=1", "momentum must be in [0, 1)"),
        ("ef:masking=maybe", "masking must be bool"),
        ("sign:1", "no bare argument"),
        ("sidco:0.1,dist=normal", "dist must be one of exp, gpd, gamma-gpd"),
        ("sidco:0.1,stages=5", "stages must be an int in [1, max_stages=4]"),
        ("dgc:0.1,lower=1.5", "lower must be in (0, 1]"),
        ("mask:digest=abc", "digest must be 16 lowercase hex digits"),
        ("mask:0.1,digest=0123456789abcdef", "not both"),
        ("topk:0.1,0.2", "only its first argument bare"),
        ("topk:0.1+uniform:8;x", "malformed"),
        ("3topk", "malformed stage name"),
    ],
)
def test_malformed_specs_say_what_is_valid(spec: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert message in str(info.value)


def test_unknown_stage_lists_every_registered_name() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec("bogus+uniform:8")
    text = str(info.value)
    # Every name the registry holds, kind by kind (so a new stage is listed too).
    for kind in STAGE_ORDER:
        names = REGISTRY.names(kind)
        assert names
        assert f"{kind}: {', '.join(names)}" in text
    assert {"topk", "randomk", "dgc", "sidco", "mask", "none"} <= set(REGISTRY.names("sparsifier"))
    assert {"fp32", "fp16", "bf16", "uniform", "qsgd", "sign", "ternary"} <= set(
        REGISTRY.names("quantizer")
    )


def test_registry_is_keyed_by_kind_and_name() -> None:
    assert REGISTRY.lookup("none", "sparsifier") is DenseConfig
    assert REGISTRY.lookup("none", "quantizer") is REGISTRY.lookup("fp32", "quantizer")
    assert REGISTRY.find("topk", "quantizer") is None
    with pytest.raises(SpecError, match="valid: bf16, binmean, fp16"):
        REGISTRY.lookup("int8", "quantizer")
    with pytest.raises(ValueError, match="already registered"):
        REGISTRY.add(type("Clash", (TopKConfig,), {"name": "randomk"}))


def test_with_density_and_bits_override_per_task() -> None:
    base = parse_spec("dgc:0.001,sample=0.05+uniform:8+ef")
    assert base.with_density(0.01).to_spec() == "dgc:0.01,sample=0.05+uniform:8+ef"
    assert base.with_bits(3).to_spec() == "dgc:0.001,sample=0.05+uniform:3+ef"
    assert parse_spec("topk:0.1+qsgd:16").with_bits(4).to_spec() == "topk:0.1+qsgd:7"
    assert parse_spec("mask:0.1,seed=3").with_density(0.2).to_spec() == "mask:0.2,seed=3+fp32"
    with pytest.raises(SpecError, match="no density"):
        parse_spec("none+fp16").with_density(0.1)
    with pytest.raises(SpecError, match="code width is fixed"):
        parse_spec("topk:0.1+fp16").with_bits(8)
    with pytest.raises(SpecError, match="bits must be in"):
        base.with_bits(9)
    with pytest.raises(SpecError, match="density must be in"):
        base.with_density(0.0)


def test_configs_are_frozen_and_validate_on_construction() -> None:
    config = TopKConfig(0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.density = 0.1  # type: ignore[misc]
    with pytest.raises(SpecError):
        UniformConfig(bits=0)
    with pytest.raises(SpecError):
        PipelineConfig(sparsifier=Fp16Config())  # type: ignore[arg-type]
    assert SignConfig().to_spec() == "sign"
    assert TernaryConfig().to_spec() == "ternary"


def _runtime_imports(module: str) -> tuple[set[str], list[str]]:
    """The ``fedsync.compression`` modules ``module`` imports at run time (top level,
    outside ``if TYPE_CHECKING:``), and any import statement inside a function."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    with open(spec.origin, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    top: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            top.add(node.module)
            top.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            top.update(a.name for a in node.names)
    nested = [
        ast.unparse(inner)
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        for inner in ast.walk(fn)
        if isinstance(inner, ast.Import | ast.ImportFrom)
    ]
    return {m for m in top if m.startswith("fedsync.compression")}, nested


def test_config_registry_spec_import_one_way() -> None:
    # config <- registry <- spec, each at module level: no cycle, and no import
    # tucked into a function to dodge one.
    base = "fedsync.compression"
    config, config_nested = _runtime_imports(f"{base}.config")
    registry, registry_nested = _runtime_imports(f"{base}.registry")
    spec, spec_nested = _runtime_imports(f"{base}.spec")
    assert config_nested == registry_nested == spec_nested == []
    assert not config & {f"{base}.registry", f"{base}.spec"}, config
    assert f"{base}.config" in registry and f"{base}.spec" not in registry
    assert {f"{base}.config", f"{base}.registry"} <= spec
