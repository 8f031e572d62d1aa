"""Compressed train tasks: decode the downlink, train, encode the update with error feedback."""

from __future__ import annotations

from flwr.app import Context, Message

from clients.runtime import ClientRuntime


def train_compressed(msg: Message, context: Context, runtime: ClientRuntime) -> Message:
    """Handle a compressed train task (filled in with the codec)."""
    raise RuntimeError("compressed tasks need fedsync.codec")
