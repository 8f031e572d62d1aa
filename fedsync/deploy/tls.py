"""TLS material for a SuperLink: a private CA and a server certificate signed by it.

Flower 1.39's SuperLink serves the Fleet API (gRPC, SuperNodes connect), the Control
API (HTTP, the ``flwr`` CLI connects) and the Runtime API (HTTP, the ServerApp process
connects) with one certificate: ``--ssl-ca-certfile ca.crt --ssl-certfile server.pem
--ssl-keyfile server.key``. Clients verify it against the CA (``flower-supernode
--root-certificates ca.crt``, ``root-certificates = "/abs/ca.crt"`` in the CLI's
``config.toml``), so the server certificate must name, as subject alternative names,
every address clients dial: ``IP:127.0.0.1`` and ``DNS:localhost`` always, plus the
SuperLink host's IP addresses and DNS names on real machines.

Keys are ECDSA P-384 and written ``0600``. ``ca.key`` is kept so more server
certificates can be signed later; on real machines keep it off the SuperLink host.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["DEFAULT_SANS", "TlsFiles", "generate_certificates", "parse_san"]

DEFAULT_SANS: tuple[str, ...] = ("127.0.0.1", "localhost")
"""Names every server certificate carries: the loopback tooling dials these."""

GeneralName = x509.IPAddress | x509.DNSName


@dataclass(frozen=True)
class TlsFiles:
    """Where a run's CA and server certificate live, and the flags that use them.

    Attributes
    ----------
    ca_cert : pathlib.Path
        The CA certificate (PEM): what clients trust.
    ca_key : pathlib.Path
        The CA's private key (PEM, ``0600``): only needed to sign more certificates.
    server_cert, server_key : pathlib.Path
        The SuperLink's certificate chain and private key (PEM).
    """

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path

    @classmethod
    def in_folder(cls, folder: Path) -> TlsFiles:
        """The file names :func:`generate_certificates` writes into ``folder``."""
        folder = folder.resolve()
        return cls(
            ca_cert=folder / "ca.crt",
            ca_key=folder / "ca.key",
            server_cert=folder / "server.pem",
            server_key=folder / "server.key",
        )

    def exists(self) -> bool:
        """Whether every file is there (a run folder may be reused)."""
        return all(path.is_file() for path in self._paths())

    def superlink_args(self) -> list[str]:
        """``flower-superlink`` flags that turn TLS on for all its APIs."""
        return [
            "--ssl-ca-certfile",
            str(self.ca_cert),
            "--ssl-certfile",
            str(self.server_cert),
            "--ssl-keyfile",
            str(self.server_key),
        ]

    def supernode_args(self) -> list[str]:
        """``flower-supernode`` flags that make it verify the SuperLink against the CA."""
        return ["--root-certificates", str(self.ca_cert)]

    def subject_alt_names(self) -> list[str]:
        """The SANs of the server certificate, as ``IP:...`` / ``DNS:...`` strings."""
        cert = x509.load_pem_x509_certificate(self.server_cert.read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return [
            f"IP:{name.value}" if isinstance(name, x509.IPAddress) else f"DNS:{name.value}"
            for name in names
            if isinstance(name, x509.IPAddress | x509.DNSName)
        ]

    def _paths(self) -> tuple[Path, ...]:
        return (self.ca_cert, self.ca_key, self.server_cert, self.server_key)


def parse_san(text: str) -> GeneralName:
    """One subject alternative name: ``"10.0.0.5"``, ``"IP:10.0.0.5"``, ``"DNS:link.lan"``.

    A bare value that parses as an IPv4/IPv6 address is an IP SAN, anything else a DNS
    SAN (gRPC matches an IP literal only against IP SANs).

    Raises
    ------
    ValueError
        On an empty name, an ``IP:`` prefix with no valid address, or an unknown prefix.
    """
    value = text.strip()
    kind, sep, rest = value.partition(":")
    if sep and kind.upper() == "IP":
        try:
            return x509.IPAddress(ipaddress.ip_address(rest))
        except ValueError:
            raise ValueError(f"{text!r}: {rest!r} is not an IP address") from None
    if sep and kind.upper() == "DNS":
        if not rest or ":" in rest:
            raise ValueError(f"{text!r}: {rest!r} is not a DNS name")
        return x509.DNSName(rest)
    if not value:
        raise ValueError("empty subject alternative name")
    try:
        return x509.IPAddress(ipaddress.ip_address(value))
    except ValueError:
        pass
    if sep:
        # "host:port" or an unknown prefix would silently become a bogus DNS name.
        raise ValueError(f"{text!r} is neither an IP address nor a DNS name (use IP:/DNS:)")
    return x509.DNSName(value)


def generate_certificates(
    out: Path,
    *,
    hosts: Iterable[str] = (),
    days: int = 365,
    overwrite: bool = False,
) -> TlsFiles:
    """Write a CA and a SuperLink server certificate into ``out``.

    Parameters
    ----------
    out : pathlib.Path
        The folder (created) that receives ``ca.crt``, ``ca.key``, ``fedsync.server.pem`` and
        ``fedsync.server.key``.
    hosts : iterable of str
        Extra subject alternative names for real hosts (IP addresses and DNS names,
        optionally prefixed ``IP:`` / ``DNS:``), on top of :data:`DEFAULT_SANS`.
    days : int
        Validity of both certificates, ``>= 1``.
    overwrite : bool
        Replace existing files; without it an existing complete set is kept as is
        when it already names every requested host (a run folder may be reused) and
        otherwise refused.

    Returns
    -------
    TlsFiles

    Raises
    ------
    ValueError
        On a bad SAN or ``days < 1``.
    FileExistsError
        When files exist that lack a requested SAN and ``overwrite`` is False.
    """
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    sans = _unique([parse_san(name) for name in (*DEFAULT_SANS, *hosts)])
    files = TlsFiles.in_folder(out)
    if not overwrite and any(path.exists() for path in files._paths()):
        if files.exists() and set(_san_strings(sans)) <= set(files.subject_alt_names()):
            return files
        raise FileExistsError(
            f"TLS files already in {out} (without every requested SAN); pass overwrite=True"
        )
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    # Backdate a little: a node whose clock is a few minutes behind must not see a
    # certificate that is "not yet valid".
    not_before, not_after = now - dt.timedelta(minutes=10), now + dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedsync deployment CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA384())
    )

    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedsync superlink")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA384())
    )

    _write(files.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(files.ca_key, _pem_private(ca_key), private=True)
    _write(files.server_cert, server_cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(files.server_key, _pem_private(server_key), private=True)
    return files


def _pem_private(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, private: bool) -> None:
    # Private keys are created 0600 from the start, never readable for a moment.
    mode = 0o600 if private else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    os.chmod(path, mode)


def _unique(names: Sequence[GeneralName]) -> list[GeneralName]:
    seen: list[GeneralName] = []
    for name in names:
        if name not in seen:
            seen.append(name)
    return seen


def _san_strings(names: Iterable[GeneralName]) -> list[str]:
    return [
        f"IP:{name.value}" if isinstance(name, x509.IPAddress) else f"DNS:{name.value}"
        for name in names
    ]
