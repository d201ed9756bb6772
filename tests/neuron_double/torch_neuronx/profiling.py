"""Test double of torch_neuronx.profiling: ProfileMode, NeuronConfig, NeuronProfiler."""

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


class NeuronConfig(_ExperimentalConfig):
    """Keyword arguments as documented; unknown ones are rejected, like a real signature."""

    def __init__(self, **kwargs: object) -> None:
        unknown = set(kwargs) - _OPTIONS
        if unknown:
            raise TypeError(f"NeuronConfig() got unexpected keyword arguments {sorted(unknown)}")
        super().__init__()
        self.options = kwargs
        self.modes = list(kwargs.get("modes", [ProfileMode.DEVICE, ProfileMode.RUNTIME]))
        self.profile_output_dir = str(kwargs.get("profile_output_dir", "./output"))


def _add_device_events(trace: dict, us_per_op: float) -> None:
    """Give every CPU op a runtime call and a device event linked by correlation id."""
    extra = []
    correlation = 10_000
    device_ts = None
    for event in trace["traceEvents"]:
        if event.get("ph") != "X" or event.get("cat") != "cpu_op":
            continue
        correlation += 1
        start = float(event["ts"])
        extra.append(
            {
                "ph": "X",
                "cat": "privateuse1_runtime",
                "name": "nrtExecute",
                "pid": event["pid"],
                "tid": event["tid"],
                "ts": start + 0.001,
                "dur": max(float(event.get("dur", 0)) / 2, 0.001),
                "args": {
                    "correlation": correlation,
                    "External id": event.get("args", {}).get("External id"),
                },
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
                "args": {"correlation": correlation, "device": 0},
            }
        )
        device_ts += us_per_op
    trace["traceEvents"].extend(extra)


class NeuronProfiler:
    """``export_trace`` writes trace.json and placeholder mode files in the documented tree."""

    def __init__(self, config: NeuronConfig) -> None:
        self.config = config

    def export_trace(self, prof: object) -> None:
        root = Path(self.config.profile_output_dir)
        stamp = time.strftime("%Y%m%d_%H%M%S") + f"_{time.time_ns() % 1000:03d}"
        folder = root / f"i-0double000000000_pid_{os.getpid()}" / stamp
        folder.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(folder / "trace.json"))
        if os.environ.get("NEURON_DOUBLE_DEVICE_EVENTS") == "1":
            trace = json.loads((folder / "trace.json").read_text())
            _add_device_events(trace, float(os.environ.get("NEURON_DOUBLE_US_PER_OP", "100")))
            (folder / "trace.json").write_text(json.dumps(trace))
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
