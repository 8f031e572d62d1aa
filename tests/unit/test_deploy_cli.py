"""``fedsync-deploy``: the run command line, ``certs`` and ``node-key``."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fedsync.deploy.cli import build_parser, main, parse_config, parse_rates


def test_parse_config_literals() -> None:
    assert parse_config("a=1 b=0.5 c=true d='x' e=cuda:0") == {
        "a": 1,
        "b": 0.5,
        "c": True,
        "d": "x",
        "e": "cuda:0",
    }
    with pytest.raises(argparse.ArgumentTypeError):
        parse_config("novalue")


def test_parse_rates() -> None:
    assert parse_rates("1,5,20") == [1.0, 5.0, 20.0]
    for bad in ("", "1,x", "0", "-2,3"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_rates(bad)


def test_run_is_secure_unless_asked() -> None:
    args = build_parser().parse_args(["--nodes", "2"])
    assert (args.insecure, args.no_node_auth, args.link_mbit, args.san) == (False, False, None, [])
    args = build_parser().parse_args(["--insecure", "--link-mbit", "1,5", "--san", "h.lan"])
    assert args.insecure and args.link_mbit == [1.0, 5.0] and args.san == ["h.lan"]


def test_rates_must_match_the_nodes() -> None:
    with pytest.raises(SystemExit, match="1 or 3 rates"):
        main(["--nodes", "3", "--link-mbit", "1,5"])


def test_certs_command_writes_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", "--out", str(tmp_path), "--san", "192.168.1.10"]) == 0
    out = capsys.readouterr().out
    assert "IP:127.0.0.1, DNS:localhost, IP:192.168.1.10" in out
    assert "--ssl-certfile" in out and "--root-certificates" in out
    assert {p.name for p in tmp_path.iterdir()} == {"ca.crt", "ca.key", "server.pem", "server.key"}
    with pytest.raises(SystemExit, match="overwrite"):
        main(["certs", "--out", str(tmp_path), "--san", "10.1.1.1"])


def test_node_key_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["node-key", "--out", str(tmp_path / "node-0"), "--comment", "n0"]) == 0
    assert (tmp_path / "node-0").read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert (tmp_path / "node-0.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
    assert "flwr supernode register node-0.pub" in capsys.readouterr().out
