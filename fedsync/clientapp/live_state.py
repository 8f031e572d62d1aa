"""The uplink codec's sender memory kept on the node's device between tasks.

A node that trains on a GPU and runs in a process that outlives its tasks (the warm
executor) would otherwise rebuild the error-feedback residual from
``context.state`` on every task: host arrays uploaded to the device again, after the
previous task copied them down to save them. Here the live :class:`CodecState` (its
residuals, velocities and PowerSGD factors still on the device) stays in the process
between tasks, and the next task takes it back instead of the saved copy.

The saved copy (``context.state``, and the disk with ``state-dir``) is still written
after every encode, exactly as before: it is what a restarted process resumes from.
The live state is only taken when it is provably the one that copy was made from:
each save writes a fresh token next to the record and files the live state under it;
a task takes the live state out (so a task that fails half-way leaves none behind)
and only when the record's token is the one it was filed under. Any other case --
a new process, another run, a state rewritten by someone else, a failed save -- falls
back to the saved copy.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from collections.abc import Hashable

import torch
from flwr.app import ConfigRecord, Context

from fedsync.codecs import CodecState, UpdateCodec
from fedsync.records import get_str

__all__ = ["LIVE_TOKEN", "LiveStates", "keeps_live_state"]

LIVE_TOKEN = "fedsync-codec-live"
"""``context.state`` config record: the token of the saved codec state's live twin."""

MAX_LIVE = 8
"""Live states a process keeps (least recently saved dropped first)."""


def keeps_live_state(device: torch.device) -> bool:
    """Whether a node on ``device`` keeps its codec memory live between tasks: on an
    accelerator, where reloading it means copying it back; on the CPU the saved host
    arrays are already where the codec runs."""
    return device.type != "cpu"


class LiveStates:
    """Live codec states by key (run, node, partition, job), at most ``limit``."""

    def __init__(self, limit: int = MAX_LIVE) -> None:
        self._limit = limit
        self._states: OrderedDict[Hashable, tuple[str, CodecState]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._states)

    def take(self, key: Hashable, context: Context, codec: UpdateCodec) -> bool:
        """Give ``codec`` the live state filed under ``key`` if ``context.state``'s saved
        codec state was made from it; return whether it did. The entry is removed
        either way: :meth:`keep` files it again after the next successful save."""
        with self._lock:
            entry = self._states.pop(key, None)
        record = context.state.config_records.get(LIVE_TOKEN)
        if entry is None or record is None or get_str(record, "token", "") != entry[0]:
            return False
        codec.state.load(entry[1])
        return True

    def keep(self, key: Hashable, context: Context, codec: UpdateCodec) -> None:
        """File ``codec``'s state under ``key`` after its saved copy was written."""
        token = secrets.token_hex(16)
        context.state.config_records[LIVE_TOKEN] = ConfigRecord({"token": token})
        live = CodecState()
        live.load(codec.state)
        with self._lock:
            self._states[key] = (token, live)
            self._states.move_to_end(key)
            while len(self._states) > self._limit:
                self._states.popitem(last=False)

    def forget(self, context: Context) -> None:
        """Drop the token: the saved state is no longer the live one's copy."""
        context.state.config_records.pop(LIVE_TOKEN, None)


LIVE = LiveStates()
"""The process's live states."""
