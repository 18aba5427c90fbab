"""What a measurement ran on, and the process's own memory as Linux reports it in ``/proc/self``.

``RssAnon`` is the memory the process owns; safetensors files are memory-mapped, so file-backed pages inflate plain
RSS. :class:`MemoryPoller` samples the peak of both while a ``with`` block (a load) runs.
"""

from __future__ import annotations

import os
import platform
import threading
from typing import Any

import torch

MIB = 1024 * 1024
STATUS_FIELDS = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem")


def _first_value(path: str, prefix: str) -> str | None:
    """The value after ``:`` on the first line of ``path`` that starts with ``prefix`` (case-insensitive)."""
    try:
        with open(path) as handle:
            for line in handle:
                if line.lower().startswith(prefix.lower()):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def hardware_info(threads: int | None = None, device: str | torch.device | None = None) -> dict[str, Any]:
    """The machine and software a measurement ran on: CPU model and count, memory, threads, GPU, library versions.

    Args:
        threads: The torch thread count used (default: ``torch.get_num_threads()``).
        device: The device the models ran on; a CUDA device adds its name and memory.
    """
    import transformers

    from .._version import __version__

    memory = _first_value("/proc/meminfo", "MemTotal")
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = None
    try:
        import safetensors

        safetensors_version = safetensors.__version__
    except ImportError:  # pragma: no cover - a dependency
        safetensors_version = None
    info: dict[str, Any] = {
        "processor": platform.processor() or None,
        "cpu_model": _first_value("/proc/cpuinfo", "model name"),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "mem_total_bytes": int(memory.split()[0]) * 1024 if memory else None,
        "torch_threads": threads if threads is not None else torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors_version,
        "hf_snapvit": __version__,
        "device": str(device) if device is not None else "cpu",
    }
    if device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(torch.device(device))
        info.update(gpu_name=properties.name, gpu_memory_bytes=properties.total_memory, cuda=torch.version.cuda)
    return info


def device_slug(hardware: dict[str, Any]) -> str:
    """The GPU's name, else the device, of a :func:`hardware_info` record as a file-name part, e.g.
    ``nvidia-h200`` or ``cpu``: benchmark results are named for the machine that measured them."""
    return (hardware.get("gpu_name") or hardware["device"]).lower().replace(" ", "-")


def read_status(fields: tuple[str, ...] = STATUS_FIELDS) -> dict[str, int]:
    """Selected ``/proc/self/status`` fields, in bytes (missing fields, or a non-Linux system, give fewer keys)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in fields:
                    out[key] = int(value.split()[0]) * 1024  # reported in kB
    except OSError:
        pass
    return out


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0: write 5 to clear_refs). Returns whether it worked."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def count_mmapped_parameters(model: torch.nn.Module) -> int | None:
    """How many parameters have their storage inside a mapping of a ``.safetensors`` file (zero-copy loads); None
    where ``/proc/self/maps`` cannot be read."""
    ranges = []
    try:
        with open("/proc/self/maps") as handle:
            for line in handle:
                if ".safetensors" in line:
                    start, end = line.split()[0].split("-")
                    ranges.append((int(start, 16), int(end, 16)))
    except OSError:
        return None
    return sum(any(a <= p.untyped_storage().data_ptr() < b for a, b in ranges) for p in model.parameters())


class MemoryPoller(threading.Thread):
    """Samples ``RssAnon`` and ``VmRSS`` every ``interval`` seconds until the ``with`` block ends; keeps the peaks."""

    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak_anon = 0
        self.peak_rss = 0
        self.samples = 0
        self._stop_event = threading.Event()
        self._started_sampling = threading.Event()

    def sample(self) -> None:
        """Read the current memory once and update the peaks."""
        status = read_status(("RssAnon", "VmRSS"))
        self.peak_anon = max(self.peak_anon, status.get("RssAnon", 0))
        self.peak_rss = max(self.peak_rss, status.get("VmRSS", 0))
        self.samples += 1

    def run(self) -> None:
        while True:
            self.sample()
            self._started_sampling.set()
            if self._stop_event.wait(self.interval):
                break

    def __enter__(self) -> "MemoryPoller":
        self.start()
        self._started_sampling.wait(5.0)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop_event.set()
        self.join()
        self.sample()  # the state right after the load counts too
