"""TLS material for the SuperLink: SANs, the CA chain, file modes, reuse."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509

from fedsync.deploy.tls import TlsFiles, generate_certificates, parse_san


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_server_certificate_names_loopback_and_extra_hosts(tmp_path: Path) -> None:
    files = generate_certificates(tmp_path, hosts=["10.213.0.1", "DNS:superlink.lan"])
    assert files.subject_alt_names() == [
        "IP:127.0.0.1",
        "DNS:localhost",
        "IP:10.213.0.1",
        "DNS:superlink.lan",
    ]
    server, ca = _load(files.server_cert), _load(files.ca_cert)
    server.verify_directly_issued_by(ca)  # raises if the chain is wrong
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)


def test_private_keys_are_owner_only(tmp_path: Path) -> None:
    files = generate_certificates(tmp_path)
    for key in (files.ca_key, files.server_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.ca_cert.stat().st_mode) == 0o644


def test_existing_files_are_reused_or_refused(tmp_path: Path) -> None:
    first = generate_certificates(tmp_path, hosts=["10.0.0.5"])
    before = first.server_cert.read_bytes()
    # Same (or fewer) names: the run folder's files are kept as they are.
    again = generate_certificates(tmp_path, hosts=["10.0.0.5"])
    assert again.server_cert.read_bytes() == before
    with pytest.raises(FileExistsError, match="overwrite"):
        generate_certificates(tmp_path, hosts=["10.0.0.6"])
    replaced = generate_certificates(tmp_path, hosts=["10.0.0.6"], overwrite=True)
    assert "IP:10.0.0.6" in replaced.subject_alt_names()
    assert replaced.server_cert.read_bytes() != before


def test_flags_point_at_the_files(tmp_path: Path) -> None:
    files = TlsFiles.in_folder(tmp_path)
    assert files.superlink_args() == [
        "--ssl-ca-certfile",
        str(tmp_path.resolve() / "ca.crt"),
        "--ssl-certfile",
        str(tmp_path.resolve() / "server.pem"),
        "--ssl-keyfile",
        str(tmp_path.resolve() / "server.key"),
    ]
    assert files.supernode_args() == ["--root-certificates", str(tmp_path.resolve() / "ca.crt")]
    assert not files.exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("192.168.1.10", x509.IPAddress(ipaddress.ip_address("192.168.1.10"))),
        ("IP:10.0.0.1", x509.IPAddress(ipaddress.ip_address("10.0.0.1"))),
        ("ip:fe80::1", x509.IPAddress(ipaddress.ip_address("fe80::1"))),
        ("2001:db8::5", x509.IPAddress(ipaddress.ip_address("2001:db8::5"))),
        ("superlink.lan", x509.DNSName("superlink.lan")),
        ("DNS:edge-hub", x509.DNSName("edge-hub")),
    ],
)
def test_parse_san(text: str, expected: x509.GeneralName) -> None:
    assert parse_san(text) == expected


@pytest.mark.parametrize("text", ["", "IP:not-an-ip", "DNS:", "host:9092", "URI:x"])
def test_parse_san_refuses_what_a_client_cannot_dial(text: str) -> None:
    with pytest.raises(ValueError):
        parse_san(text)


def test_validity_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="days"):
        generate_certificates(tmp_path, days=0)
