"""``fedsync.protocol`` stays light: speaking the protocol loads no torch, numba or config."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "numba", "fedsync.config", "fedsync.strategies")


def test_the_protocol_imports_no_torch_numba_or_config() -> None:
    code = (
        f"import sys, fedsync.protocol; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import fedsync.protocol loaded: {out.stdout.strip()}"


def test_the_config_value_type_is_defined_once() -> None:
    import fedsync.config
    import fedsync.records

    assert fedsync.config.ConfigValue is fedsync.records.ConfigValue
