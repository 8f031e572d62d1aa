"""One node task end to end on a device, phase by phase, with every host copy it makes.

Run ``python -m benchmarks.gpu_task_profile --device cuda --out task_profile.json``.
The task is what fedsync's ClientApp does for a compressed train task, with the run
config's defaults (digits, its model, the default uplink codec), on ``--device``:

``data``
    the node's partition (:meth:`fedsync.clients.runtime.ClientRuntime.data`; cached by the
    loader after the warm-up task, as in a warm node);
``model``
    the model built and the task's start weights loaded onto the device;
``train``
    local training as the ClientApp runs it
    (:class:`fedsync.clients.runtime.LocalTraining`), the data's copy to the device included;
``delta``
    ``trained - start`` (:func:`fedsync.clientapp.compressed.uplink_delta`);
``encode``
    the uplink codec with error feedback (:meth:`fedsync.codecs.UpdateCodec.encode`)
    to the frame's bytes.

One task runs first to warm up (kernel compilation, library handles); the next
``--tasks`` run with each phase under its own ``torch.profiler`` session (CPU and CUDA
activities), so every device-to-host and host-to-device copy is attributed to its
phase, together with the aten operator that asked for it. Wall time per phase is
measured with the device synchronized at each phase boundary. On a machine without
CUDA it runs on the CPU (a dry run: no copies to list).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from fedsync.clientapp.compressed import uplink_delta
from fedsync.clients.runtime import ClientRuntime, LocalTraining
from fedsync.codecs import UpdateCodec, tensor_specs
from fedsync.config import RunConfig
from fedsync.recipe import model_for, model_state
from fedsync.reports.provenance import provenance
from fedsync.updates import TensorSpec

PHASES = ("data", "model", "train", "delta", "encode")


def _copies(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Every memcpy of a chrome trace with its direction, bytes and the op behind it."""
    events = trace.get("traceEvents", [])
    ops: dict[Any, str] = {}
    for event in events:
        if event.get("cat") == "cpu_op":
            ext = (event.get("args") or {}).get("External id")
            if ext is not None:
                ops[ext] = str(event.get("name", ""))
    copies = []
    for event in events:
        if event.get("cat") != "gpu_memcpy":
            continue
        args = event.get("args") or {}
        name = str(event.get("name", ""))
        direction = next((d for d in ("DtoH", "HtoD", "DtoD", "HtoH") if d in name), name)
        copies.append(
            {
                "direction": direction,
                "bytes": int(args.get("bytes", 0)),
                "op": ops.get(args.get("External id"), "?"),
                "us": float(event.get("dur", 0.0)),
            }
        )
    return copies


def _profiled(
    fn: Callable[[], Any], device: torch.device, folder: Path, name: str
) -> tuple[Any, float, dict[str, Any]]:
    """Run ``fn`` under the profiler; its result, wall seconds and copy summary."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        result = fn()
        if cuda:
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
    path = folder / f"{name}.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    copies = _copies(trace)
    kernels = sum(1 for e in trace.get("traceEvents", []) if e.get("cat") == "kernel")
    syncs = Counter(
        str(e.get("name"))
        for e in trace.get("traceEvents", [])
        if e.get("cat") == "cuda_runtime" and "Synchronize" in str(e.get("name", ""))
    )
    by_direction: dict[str, dict[str, Any]] = {}
    for copy in copies:
        entry = by_direction.setdefault(copy["direction"], {"count": 0, "bytes": 0, "ops": {}})
        entry["count"] += 1
        entry["bytes"] += copy["bytes"]
        entry["ops"][copy["op"]] = entry["ops"].get(copy["op"], 0) + 1
    return result, seconds, {"kernels": kernels, "copies": by_direction, "syncs": dict(syncs)}


def run_task(
    device: torch.device,
    config: RunConfig,
    codec: UpdateCodec,
    specs: dict[str, TensorSpec],
    folder: Path | None,
    index: int,
    *,
    partition: int = 0,
    partitions: int = 2,
    start_state: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """One task; with ``folder``, each phase profiled (traces written there).

    The node holds ``partition`` of ``partitions`` and starts from ``start_state`` (the
    model its downlink decoded to; default: a fresh model's weights).
    """
    # The node's view of the run, as the ClientApp builds it.
    runtime = ClientRuntime(config.training, config.compression, device, partition, partitions, {})
    phases: dict[str, Any] = {}

    def step(name: str, fn: Callable[[], Any]) -> Any:
        if folder is None:
            return fn()
        result, seconds, summary = _profiled(fn, device, folder, f"task{index}-{name}")
        phases[name] = {"seconds": seconds, **summary}
        return result

    data = step("data", lambda: runtime.data()[0])
    if start_state is None:  # the task's start weights, on the host
        start_state = model_state(runtime.fresh_model())

    def build() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
        model = runtime.fresh_model().to(device)
        model.load_state_dict(start_state, strict=False)  # float tensors only: no buffers
        return model, {k: v.to(device) for k, v in start_state.items()}

    model, start = step("model", build)
    step("train", lambda: LocalTraining.from_task({}, runtime).run(model, data, device))
    delta = step("delta", lambda: uplink_delta(model, start, specs))
    frame = step("encode", lambda: codec.encode(delta))
    return {"frame_bytes": len(frame), "phases": phases}


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tasks", type=int, default=3, help="profiled tasks after the warm-up")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--spec", default="", help="uplink codec (default: the run config's)")
    parser.add_argument("--traces", type=Path, default=None, help="keep the chrome traces here")
    args = parser.parse_args(argv)
    if args.tasks < 1:
        parser.error("--tasks must be at least 1")
    device = torch.device(args.device)
    config = RunConfig.from_run_config({})
    spec = args.spec or config.compression.schedule(decaying=False).spec(0)
    with tempfile.TemporaryDirectory(prefix="task-profile-") as tmp:
        folder = args.traces or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        settings = config.training
        specs = tensor_specs(model_state(model_for(settings)))
        codec = UpdateCodec(spec, seed=settings.seed, specs=specs)
        run_task(device, config, codec, specs, None, 0)  # warm-up
        tasks = [run_task(device, config, codec, specs, folder, i + 1) for i in range(args.tasks)]
    summary: dict[str, Any] = {}
    for name in PHASES:
        seconds = [t["phases"][name]["seconds"] for t in tasks]
        last = tasks[-1]["phases"][name]
        summary[name] = {
            "seconds_median": statistics.median(seconds),
            "kernels": last["kernels"],
            "copies": last["copies"],
            "syncs": last["syncs"],
        }
    result = {
        "benchmark": "gpu_task_profile",
        "provenance": provenance("python -m benchmarks.gpu_task_profile", argv),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dataset": config.training.dataset,
        "model": config.training.model,
        "parameters": sum(s.numel for s in specs.values()),
        "spec": spec,
        "frame_bytes": tasks[-1]["frame_bytes"],
        "phases": summary,
        "tasks": tasks,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name in PHASES:
        row = summary[name]
        d2h = row["copies"].get("DtoH", {"count": 0, "bytes": 0, "ops": {}})
        print(
            f"{name:7s} {1e3 * row['seconds_median']:8.2f} ms  kernels {row['kernels']:5d}  "
            f"DtoH {d2h['count']:3d} ({d2h['bytes']} B) {d2h['ops']}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
