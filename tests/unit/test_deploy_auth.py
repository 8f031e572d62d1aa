"""SuperNode keys: OpenSSH ECDSA P-384 pairs, and registration through the flwr CLI."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fedsync.deploy.auth import (
    AlreadyRegistered,
    NodeKey,
    RegistrationError,
    generate_node_key,
    register_node,
)


def test_key_pair_is_openssh_ecdsa_p384(tmp_path: Path) -> None:
    key = generate_node_key(tmp_path / "node-0", comment="node-0")
    private = serialization.load_ssh_private_key(key.private_key.read_bytes(), password=None)
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert private.curve.name == "secp384r1"
    line = key.public_key.read_text().strip()
    kind, body, comment = line.split(" ")
    assert (kind, comment) == ("ecdsa-sha2-nistp384", "node-0")
    public = serialization.load_ssh_public_key(f"{kind} {body}".encode())
    assert public == private.public_key()
    assert stat.S_IMODE(key.private_key.stat().st_mode) == 0o600
    assert key.supernode_args() == ["--auth-supernode-private-key", str(key.private_key)]


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen not installed")
def test_ssh_keygen_reads_the_private_key(tmp_path: Path) -> None:
    key = generate_node_key(tmp_path / "k")
    derived = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(key.private_key)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[:2]
    assert derived == key.public_key.read_text().split()[:2]


def test_existing_pair_is_kept_unless_overwritten(tmp_path: Path) -> None:
    first = generate_node_key(tmp_path / "k")
    text = first.public_key.read_text()
    assert generate_node_key(tmp_path / "k").public_key.read_text() == text
    assert generate_node_key(tmp_path / "k", overwrite=True).public_key.read_text() != text


def _fake_flwr(tmp_path: Path, stdout: str, code: int = 0) -> str:
    script = tmp_path / "flwr"
    script.write_text(
        f"#!{sys.executable}\nimport sys\nprint({stdout!r})\n"
        f"open({str(tmp_path / 'argv')!r}, 'w').write(' '.join(sys.argv[1:]))\n"
        f"sys.exit({code})\n"
    )
    script.chmod(0o755)
    return str(script)


def test_register_returns_the_node_id(tmp_path: Path) -> None:
    key = generate_node_key(tmp_path / "k")
    flwr = _fake_flwr(tmp_path, '{"success": true, "node-id": 42}')
    assert register_node(key, flwr=flwr, connection="c", env={}, name="n0") == 42
    argv = (tmp_path / "argv").read_text().split()
    assert argv[:4] == ["supernode", "register", str(key.public_key), "c"]
    assert argv[-2:] == ["--name", "n0"]


@pytest.mark.parametrize(
    ("stdout", "code"),
    [('{"success": false, "error-message": "exists"}', 0), ("not json", 1), ("{}", 0)],
)
def test_refused_registration_raises(tmp_path: Path, stdout: str, code: int) -> None:
    key = NodeKey.at(tmp_path / "k")
    with pytest.raises(RegistrationError, match="registering"):
        register_node(key, flwr=_fake_flwr(tmp_path, stdout, code), connection="c", env={})


def test_a_key_registered_twice_is_named_so(tmp_path: Path) -> None:
    answer = '{"success": false, "error-message": "[code: 23] Public key already in use."}'
    with pytest.raises(AlreadyRegistered):
        register_node(
            NodeKey.at(tmp_path / "k"), flwr=_fake_flwr(tmp_path, answer), connection="c", env={}
        )
