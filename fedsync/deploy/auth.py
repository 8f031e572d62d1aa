"""SuperNode authentication keys: OpenSSH-format ECDSA keys, registered before a node starts.

With ``flower-superlink --enable-supernode-auth`` (which needs TLS) a SuperNode must
sign its requests with a key whose public half was registered on the SuperLink
(``flwr supernode register key.pub <connection>``); an unknown key is refused with
``[code: 2004] Failed to activate SuperNode``. The node id is fixed at registration,
so a node that restarts with the same key comes back as the same node.

:func:`generate_node_key` writes the same files as ``ssh-keygen -t ecdsa -b 384 -N ""
-f key`` (OpenSSH private key, ``0600``; ``key.pub`` one line ``ecdsa-sha2-nistp384
...``), with Python's ``cryptography``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

__all__ = [
    "AlreadyRegistered",
    "NodeKey",
    "RegistrationError",
    "generate_node_key",
    "register_node",
]


class RegistrationError(RuntimeError):
    """``flwr supernode register`` refused a key or could not reach the SuperLink."""


class AlreadyRegistered(RegistrationError):
    """The SuperLink already holds this public key (``[code: 23] Public key already in
    use``): a run folder and its SuperLink database were reused."""


@dataclass(frozen=True)
class NodeKey:
    """A SuperNode's key pair on disk.

    Attributes
    ----------
    private_key : pathlib.Path
        OpenSSH private key (``0600``), given to ``--auth-supernode-private-key``.
    public_key : pathlib.Path
        ``<private_key>.pub``, what the SuperLink registers.
    """

    private_key: Path
    public_key: Path

    @classmethod
    def at(cls, private_key: Path) -> NodeKey:
        """The key pair whose private half is ``private_key`` (public: ``+ .pub``)."""
        private_key = private_key.resolve()
        return cls(private_key, private_key.with_name(private_key.name + ".pub"))

    def exists(self) -> bool:
        """Whether both halves are on disk."""
        return self.private_key.is_file() and self.public_key.is_file()

    def supernode_args(self) -> list[str]:
        """The ``flower-supernode`` flag that makes it authenticate with this key."""
        return ["--auth-supernode-private-key", str(self.private_key)]


def generate_node_key(private_key: Path, *, comment: str = "", overwrite: bool = False) -> NodeKey:
    """Write an ECDSA P-384 key pair in OpenSSH format (as ``ssh-keygen -t ecdsa -b 384``).

    Parameters
    ----------
    private_key : pathlib.Path
        Where the private key goes; the public key is written next to it as ``.pub``.
    comment : str
        Appended to the public key line (``ssh-keygen -C``), e.g. the node's name.
    overwrite : bool
        Replace an existing pair; without it an existing pair is returned unchanged
        (a node keeps its identity when its run folder is reused).

    Returns
    -------
    NodeKey
    """
    key = NodeKey.at(private_key)
    if key.exists() and not overwrite:
        return key
    key.private_key.parent.mkdir(parents=True, exist_ok=True)
    secret = ec.generate_private_key(ec.SECP384R1())
    private_bytes = secret.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public_line = secret.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    if comment:
        public_line += b" " + comment.encode()
    fd = os.open(key.private_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(private_bytes)
    os.chmod(key.private_key, 0o600)
    key.public_key.write_bytes(public_line + b"\n")
    return key


def register_node(
    key: NodeKey,
    *,
    flwr: str,
    connection: str,
    env: Mapping[str, str],
    name: str = "",
    timeout: float = 60.0,
) -> int:
    """Register a node's public key with the SuperLink; return the node id it gets.

    Parameters
    ----------
    key : NodeKey
        The node's key pair.
    flwr : str
        The ``flwr`` executable.
    connection : str
        The SuperLink connection name in ``$FLWR_HOME/config.toml`` (TLS, since auth
        needs it).
    env : mapping
        Environment with ``FLWR_HOME``.
    name : str
        Optional node name stored with the registration.
    timeout : float
        Seconds for the command.

    Raises
    ------
    RegistrationError
        When the command fails or its answer has no node id.
    """
    command: Sequence[str] = [
        flwr,
        "supernode",
        "register",
        str(key.public_key),
        connection,
        "--format",
        "json",
    ]
    if name:
        command = [*command, "--name", name]
    result = subprocess.run(
        list(command),
        capture_output=True,
        text=True,
        env=dict(env),
        timeout=timeout,
        check=False,
    )
    try:
        answer = json.loads(result.stdout)
    except json.JSONDecodeError:
        answer = {}
    node_id = answer.get("node-id") if isinstance(answer, dict) else None
    if result.returncode != 0 or not answer.get("success", False) or node_id is None:
        kind = AlreadyRegistered if "already in use" in result.stdout else RegistrationError
        raise kind(
            f"registering {key.public_key} failed (exit {result.returncode}): "
            f"{result.stdout.strip()} {result.stderr.strip()}".strip()
        )
    return int(node_id)
