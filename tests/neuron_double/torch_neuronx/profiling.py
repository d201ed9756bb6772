"""Test double of torch_neuronx.profiling: ProfileMode, NeuronConfig, NeuronProfiler.

Where device time shows up is chosen by ``NEURON_DOUBLE_DEVICE_TIME`` (see README.md):
``trace`` (device events in trace.json), ``key_averages`` (device rows in ``prof.events()``
and ``key_averages()``, only with ``correlate_device_time=True``), or unset (none).
"""

from __future__ import annotations

import enum
import json
import os
import time
from pathlib import Path

from torch._C._profiler import _ExperimentalConfig


class ProfileMode(enum.Enum):
    DEVICE = "device"
    RUNTIME = "runtime"
    CPU_UTIL = "cpu_util"
    HOST_MEMORY = "host_memory"


_OPTIONS = {
    "modes",
    "capture_enabled_for_nc",
    "profile_output_dir",
    "max_events_per_nc",
    "neff_cache_dir",
    "precache_node_info",
    "correlate_device_time",
}


def _rejected() -> set[str]:
    """Options an older SDK lacks, to test the fallback (``NEURON_DOUBLE_REJECT=a,b``)."""
    return {name for name in os.environ.get("NEURON_DOUBLE_REJECT", "").split(",") if name}


def _device_time_mode() -> str:
    if os.environ.get("NEURON_DOUBLE_DEVICE_EVENTS") == "1":
        return "trace"
    return os.environ.get("NEURON_DOUBLE_DEVICE_TIME", "")


def _us_per_op() -> float:
    return float(os.environ.get("NEURON_DOUBLE_US_PER_OP", "100"))


class NeuronConfig(_ExperimentalConfig):
    """Keyword arguments as documented; unknown ones are rejected, like a real signature."""

    def __init__(self, **kwargs: object) -> None:
        unknown = set(kwargs) - (_OPTIONS - _rejected())
        if unknown:
            raise TypeError(f"NeuronConfig() got unexpected keyword arguments {sorted(unknown)}")
        super().__init__()
        self.options = kwargs
        self.modes = list(kwargs.get("modes", [ProfileMode.DEVICE, ProfileMode.RUNTIME]))
        self.profile_output_dir = str(kwargs.get("profile_output_dir", "./output"))


def _launchers(ops: list[tuple[object, str, object, float, float]]) -> list[int]:
    """Indexes of the operators that launch device work: all but same-name dispatch wrappers
    (an operator with a nested operator of its own name launches nothing itself; torch also
    folds such pairs into one event). ``ops``: ``(thread, name, _, start, end)``."""
    wrappers = set()
    for i, (thread, name, _, start, end) in enumerate(ops):
        for j, (t2, n2, _, s2, e2) in enumerate(ops):
            inside = j != i and t2 == thread and n2 == name and start <= s2 and e2 <= end
            if inside and ((s2, e2) != (start, end) or j > i):
                wrappers.add(i)
                break
    return [i for i in range(len(ops)) if i not in wrappers]


def _ledger(entries: list[dict]) -> None:
    """Append what the double put on the device to $NEURON_DOUBLE_LEDGER (JSON lines)."""
    path = os.environ.get("NEURON_DOUBLE_LEDGER")
    if path:
        with open(path, "a") as handle:
            for entry in entries:
                handle.write(json.dumps(entry) + "\n")


def _marked(ranges: list[tuple[float, float]], t: float) -> bool:
    return any(start <= t <= end for start, end in ranges)


def _add_device_events(trace: dict, us_per_op: float) -> None:
    """Give every launching CPU op a runtime call and a device event linked by correlation."""
    events = trace["traceEvents"]
    cpu = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    cpu.sort(key=lambda e: float(e["ts"]))
    ranges = [
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("neuron_mlflow: ")
    ]
    ops = [
        ((e["pid"], e["tid"]), e["name"], e, ts, ts + float(e.get("dur", 0)))
        for e in cpu
        for ts in (float(e["ts"]),)
    ]
    extra, ledger = [], []
    correlation = 10_000
    device_ts = None
    for i in _launchers(ops):
        event = ops[i][2]
        correlation += 1
        start = float(event["ts"])
        # as Kineto writes a runtime call and its device event: the launching operator's
        # External id on both, the correlation id linking them (a row of its own in torch's
        # table, so its time leaves the operator's self CPU time)
        owner = event.get("args", {}).get("External id")
        link = {"correlation": correlation} | ({} if owner is None else {"External id": owner})
        extra.append(
            {
                "ph": "X",
                "cat": "privateuse1_runtime",
                "name": "nrtExecute",
                "pid": event["pid"],
                "tid": event["tid"],
                "ts": start + 0.001,
                "dur": 0.001,
                "args": link,
            }
        )
        device_ts = start if device_ts is None else max(device_ts, start)
        extra.append(
            {
                "ph": "X",
                "cat": "privateuse1_driver",
                "name": f"neuron_kernel_{event['name']}",
                "pid": 100,
                "tid": 7,
                "ts": device_ts,
                "dur": us_per_op,
                "args": {**link, "device": 0},
            }
        )
        device_ts += us_per_op
        ledger.append({"op": event["name"], "us": us_per_op, "marked": _marked(ranges, start)})
    events.extend(extra)
    _ledger(ledger)


class NeuronProfiler:
    """``export_trace`` writes trace.json and placeholder mode files in the documented tree."""

    def __init__(self, config: NeuronConfig) -> None:
        self.config = config

    def export_trace(self, prof: object) -> None:
        root = Path(self.config.profile_output_dir)
        stamp = time.strftime("%Y%m%d_%H%M%S") + f"_{time.time_ns() % 1000:03d}"
        folder = root / f"i-0double000000000_pid_{os.getpid()}" / stamp
        folder.mkdir(parents=True, exist_ok=True)
        name = "trace.json"
        if os.environ.get("NEURON_DOUBLE_TRACE_NAME") == "rank":
            name = f"neuron_framework_trace_rank_{os.environ.get('RANK', '0')}.json"
        trace_path = folder / name
        prof.export_chrome_trace(str(trace_path))
        if _device_time_mode() == "trace":
            trace = json.loads(trace_path.read_text())
            _add_device_events(trace, _us_per_op())
            trace_path.write_text(json.dumps(trace))
        names = {m.name if hasattr(m, "name") else str(m) for m in self.config.modes}
        if "RUNTIME" in names:
            (folder / "ntrace.pb").write_bytes(b"runtime")
            (folder / "trace_info.pb").write_bytes(b"info")
        if "CPU_UTIL" in names:
            (folder / "cpu_util.pb").write_bytes(b"cpu")
        if "HOST_MEMORY" in names:
            (folder / "host_mem.pb").write_bytes(b"mem")
        if "DEVICE" in names:
            (folder / "neff_0123abcd_vnc_0.neff").write_bytes(b"neff")
            for core in (0, 1):
                (folder / f"profile_nc_{core}_session_0.ntff").write_bytes(b"ntff")


def _device_function_events(events: list, us_per_op: float) -> list:
    """What ``correlate_device_time=True`` gives ``key_averages()`` here: for every launching
    CPU operator, a PrivateUse1 device event of the same name, linked to it
    (``linked_correlation_id``, and a kernel record on the operator, as torch links CUDA
    kernels). Device events run back to back from their operator's start on one queue."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    cpu = [
        e
        for e in events
        if e.device_type == DeviceType.CPU
        and not e.is_user_annotation
        and not getattr(e, "is_python_function", False)
        and not e.is_async
    ]
    cpu.sort(key=lambda e: e.time_range.start)
    ranges = [
        (float(e.time_range.start), float(e.time_range.end))
        for e in events
        if e.name.startswith("neuron_mlflow: ")
    ]
    ops = [(e.thread, e.name, e, float(e.time_range.start), float(e.time_range.end)) for e in cpu]
    next_id = max((e.id for e in events), default=0) + 1
    device_free = float("-inf")
    added, ledger = [], []
    for i in _launchers(ops):
        op = ops[i][2]
        start = max(device_free, float(op.time_range.start))
        device_free = start + us_per_op
        device = FunctionEvent(
            id=next_id,
            name=op.name,
            thread=0,
            start_us=start,
            end_us=device_free,
            use_device="neuron",
            device_type=DeviceType.PrivateUse1,
            device_index=0,
            trace_name=op.name,
            input_shapes=[],
            stack=[],
            linked_correlation_id=op.id,
        )
        next_id += 1
        op.append_kernel(op.name, 0, us_per_op)
        added.append(device)
        marked = _marked(ranges, float(op.time_range.start))
        ledger.append({"op": op.name, "us": us_per_op, "marked": marked})
    _ledger(ledger)
    return added


def _install_key_averages_device_time() -> None:
    """Wrap torch's parse of the profiler's results, as the SDK's correlation would feed it."""
    from torch.autograd import profiler as autograd_profiler

    original = autograd_profiler.profile._parse_kineto_results
    if getattr(original, "_neuron_double", False):
        return

    def parse(self: object, result: object, *args: object, **kwargs: object) -> list:
        events = original(self, result, *args, **kwargs)
        config = getattr(self, "experimental_config", None)
        if (
            isinstance(config, NeuronConfig)
            and config.options.get("correlate_device_time") is True
            and _device_time_mode() == "key_averages"
        ):
            events = list(events) + _device_function_events(list(events), _us_per_op())
        return events

    parse._neuron_double = True  # type: ignore[attr-defined]
    autograd_profiler.profile._parse_kineto_results = parse


_install_key_averages_device_time()
