"""Per-message phase timing of the ClientApp (node config ``timing-log``).

Node config ``timing-log=/path.jsonl`` appends one line per message to that file: where
the ClientApp process's time went (process start, the ClientApp's imports, the data
partition, training, the rest of the handler), for :mod:`benchmarks.deploy_overhead`.
``device`` and ``device-class`` (free text, e.g. ``jetson-orin``) are written into those
lines. Without ``timing-log`` the mod only passes the message on.

:mod:`fedsync.clients.app` imports this module before anything that imports torch, so the
first message a process handles after loading the ClientApp reports that load as
``imports_s`` and its handler window starts where the load did; later messages in the same
process (the warm executor) report none. This module therefore imports no torch at module
level (:mod:`fedsync.protocol` is torch-free).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from flwr.app import Context, Message, MessageType

from fedsync import protocol

__all__ = ["TIMING_LOG", "Handler", "Mod", "phase_timing"]

_IMPORTED_AT: Final = time.time()
TIMING_LOG: Final = "timing-log"
"""Node config key: a JSONL file that gets one line of phase times per message."""

Handler = Callable[[Message, Context], Message]
Mod = Callable[[Message, Context, Handler], Message]


def phase_timing() -> Mod:
    """A Flower mod that writes one ``timing-log`` line per message (see the module docs).

    Create it where the ClientApp module has finished its imports: the time between this
    module's import and this call is the ClientApp's load, which the first message reports.
    """
    loaded_at = time.time()
    pending_load: list[float] = [_IMPORTED_AT]  # emptied by the first timed message

    def timing_mod(msg: Message, context: Context, call_next: Handler) -> Message:
        path = context.node_config.get(TIMING_LOG)
        if not path:
            return call_next(msg, context)
        # Imported here, not above: it imports torch (see the module docs).
        from fedsync.clients.runtime import ClientRuntime

        handler_start = time.time()
        imports_s = 0.0
        if pending_load:
            handler_start = pending_load.pop()
            imports_s = loaded_at - handler_start
        data_s = 0.0
        if msg.metadata.message_type != MessageType.QUERY:
            started = time.perf_counter()
            ClientRuntime.from_context(context).data()  # cached: the handler's call is free
            data_s = time.perf_counter() - started
        started = time.perf_counter()
        reply = call_next(msg, context)
        handler_s = time.perf_counter() - started
        compute_s = 0.0
        if reply.has_content():
            for record in reply.content.metric_records.values():
                value = record.get(protocol.COMPUTE_SECONDS)
                if isinstance(value, int | float):
                    compute_s = float(value)
        line: dict[str, Any] = {
            "pid": os.getpid(),
            "run_id": context.run_id,
            "node_id": context.node_id,
            "message_type": msg.metadata.message_type,
            "device": str(context.node_config.get(protocol.DEVICE, "")),
            "device_class": str(context.node_config.get(protocol.DEVICE_CLASS, "")),
            "process_start": process_start_time(),
            "module_loaded": loaded_at,
            "handler_start": handler_start,
            "handler_end": time.time(),
            "compute_s": compute_s,
            "imports_s": imports_s,
            "data_s": data_s,
            "handler_s": handler_s,
        }
        with Path(str(path)).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
        return reply

    return timing_mod


def process_start_time() -> float:
    """Unix time this process started (Linux ``/proc``; 0.0 elsewhere)."""
    try:
        stat_fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(stat_fields[19])  # field 22 (starttime), after pid and comm
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0
    return boot + ticks / os.sysconf("SC_CLK_TCK")
