"""Record what a node's uplink encoder was given and wrote, and replay it on another device.

A diagnostic for the claim that a GPU node writes the CPU's bytes: with the environment
variable ``FEDSYNC_FRAME_AUDIT`` set to a folder in a node's environment, every uplink
encode (:func:`fedsync.clientapp.compressed.encode_uplink`) writes one ``.npz`` file there
holding the update as the encoder got it (a host copy), the codec's state before and after
(error-feedback residuals, step), its spec and seed, the devices the update and the kept
state were on, and the frame it wrote. ::

    python -m fedsync.clientapp.frame_audit FOLDER [--json OUT]

re-encodes every record with a fresh codec on this process's CPU, from the recorded state,
and checks that the frame and the state after it are byte-equal to the node's. Exit status
0 when all are, 1 when any differs, 2 when the folder holds no record.

Recording costs a host copy of the update and of the codec state per task: leave the
variable unset in production. Tasks of a pruned run (masks) are not recorded, and a record
that cannot be written is logged and skipped (the task goes on). Stages that multiply
matrices (``powersgd``, ``dct``) match the CPU only to rounding on a GPU
(``docs/gpu.md``): their replays differ by design.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from fedsync.codecs import UpdateCodec, tensor_specs

__all__ = [
    "ENV",
    "ReplayResult",
    "audit_folder",
    "record",
    "replay",
    "replay_folder",
    "safe_name",
]

ENV = "FEDSYNC_FRAME_AUDIT"
"""The environment variable naming the folder records go to (unset: nothing recorded)."""


def audit_folder() -> Path | None:
    """The folder :data:`ENV` names, created if missing.

    Returns
    -------
    pathlib.Path or None
        ``None`` when the variable is unset or empty.

    Raises
    ------
    OSError
        When the folder cannot be created.
    """
    value = os.environ.get(ENV, "")
    if not value:
        return None
    folder = Path(value)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def safe_name(text: str) -> str:
    """``text`` with every character but letters, digits, ``.``, ``_`` and ``-`` made ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text) or "_"


def _host(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {key: np.array(value, copy=True) for key, value in state.items()}


def record(
    folder: Path,
    *,
    name: str,
    spec: str,
    seed: int,
    update: Mapping[str, torch.Tensor],
    before: Mapping[str, np.ndarray],
    after: Mapping[str, np.ndarray],
    frame: bytes,
    state_device: str,
) -> Path:
    """Write one encode's inputs and outputs to ``folder/<name>.npz``.

    Parameters
    ----------
    folder : pathlib.Path
        Where the record goes (written to a ``.part`` file, then renamed).
    name : str
        The record's file name without suffix.
    spec, seed : str, int
        The codec's spec and seed (:class:`~fedsync.codecs.UpdateCodec`).
    update : mapping of str to torch.Tensor
        The update as the encoder got it (copied to the host).
    before, after : mapping of str to numpy.ndarray
        :meth:`UpdateCodec.to_state` output before and after the encode.
    frame : bytes
        What the encode wrote.
    state_device : str
        Where the node kept the codec state between tasks.

    Returns
    -------
    pathlib.Path
        The record's path.

    Raises
    ------
    OSError
        When the file cannot be written.
    """
    names = list(update)
    meta = {
        "spec": spec,
        "seed": int(seed),
        "names": names,
        "update_device": str(next(iter(update.values())).device),
        "state_device": state_device,
        "frame_bytes": len(frame),
    }
    arrays: dict[str, np.ndarray] = {"meta": np.array(json.dumps(meta))}
    for key, tensor in update.items():
        arrays[f"update/{key}"] = tensor.detach().to("cpu", torch.float32).numpy()
    arrays.update({f"before/{k}": v for k, v in _host(before).items()})
    arrays.update({f"after/{k}": v for k, v in _host(after).items()})
    arrays["frame"] = np.frombuffer(frame, dtype=np.uint8)
    path = folder / f"{name}.npz"
    part = folder / f"{name}.part"  # not *.npz: a half-written record is never replayed
    with part.open("wb") as handle:
        np.savez(handle, **arrays)  # type: ignore[arg-type]
    part.replace(path)
    return path


@dataclass(frozen=True)
class ReplayResult:
    """One record re-encoded here: whether the frame and the state after it match.

    Attributes
    ----------
    record : str
        The record's file name.
    spec, update_device, state_device : str
        The codec spec, and where the node's update and codec state were.
    frame_bytes : int
        The node's frame length.
    frame_equal, state_equal : bool
        Byte-equal frame; byte-equal codec state after the encode.
    detail : str
        Where they differ (or why the record could not be replayed).
    """

    record: str
    spec: str
    update_device: str
    state_device: str
    frame_bytes: int
    frame_equal: bool
    state_equal: bool
    detail: str = ""

    @property
    def ok(self) -> bool:
        """Frame and state both byte-equal."""
        return self.frame_equal and self.state_equal


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def replay(path: Path, device: str = "cpu") -> ReplayResult:
    """Re-encode the record at ``path`` on ``device`` and compare it with the node's.

    Parameters
    ----------
    path : pathlib.Path
        A record :func:`record` wrote.
    device : str
        Where to re-encode.

    Returns
    -------
    ReplayResult
        Whether the frame and the codec state after it are byte-equal.
    """
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        groups: dict[str, dict[str, np.ndarray]] = {"update": {}, "before": {}, "after": {}}
        for key in data.files:
            group, _, rest = key.partition("/")
            if group in groups:
                groups[group][rest] = data[key]
        frame = data["frame"].tobytes()
    update = {n: torch.from_numpy(groups["update"][n]).to(device) for n in meta["names"]}
    codec = UpdateCodec(meta["spec"], seed=meta["seed"], specs=tensor_specs(update))
    codec.load_state(groups["before"])
    mine = codec.encode(update)
    after = codec.to_state()
    want = groups["after"]
    differing = sorted(
        k
        for k in set(after) | set(want)
        if k not in after or k not in want or not _same(np.asarray(after[k]), want[k])
    )
    detail = f"state differs at {', '.join(differing)}" if differing else ""
    if mine != frame:
        first = next(
            (i for i, (a, b) in enumerate(zip(mine, frame, strict=False)) if a != b),
            min(len(mine), len(frame)),
        )
        detail = "; ".join(
            filter(None, [f"frame differs from byte {first} ({len(mine)} vs {len(frame)})", detail])
        )
    return ReplayResult(
        record=path.name,
        spec=meta["spec"],
        update_device=meta["update_device"],
        state_device=meta["state_device"],
        frame_bytes=meta["frame_bytes"],
        frame_equal=mine == frame,
        state_equal=not differing,
        detail=detail,
    )


def replay_folder(folder: Path, device: str = "cpu") -> list[ReplayResult]:
    """:func:`replay` every record in ``folder``, in name order; a record that cannot be
    read or re-encoded is a failed result that says why."""
    results = []
    for path in sorted(folder.glob("*.npz")):
        try:
            results.append(replay(path, device))
        except Exception as err:  # one bad record must not hide the others
            results.append(ReplayResult(path.name, "?", "?", "?", 0, False, False, repr(err)))
    return results


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--device", default="cpu", help="where to re-encode (default cpu)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    results = replay_folder(args.folder, args.device)
    for result in results:
        verdict = "ok  " if result.ok else "FAIL"
        print(
            f"{verdict} {result.record} {result.spec} on {result.update_device} "
            f"(state on {result.state_device}), {result.frame_bytes} B {result.detail}"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "replayed_on": args.device,
                    "records": len(results),
                    "equal": sum(r.ok for r in results),
                    "results": [asdict(r) for r in results],
                },
                indent=1,
            )
            + "\n"
        )
    if not results:
        print(f"no records in {args.folder}", file=sys.stderr)
        return 2
    print(f"{sum(r.ok for r in results)} of {len(results)} frames byte-equal on {args.device}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
