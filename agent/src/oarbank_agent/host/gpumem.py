"""GPU memory, as NVIDIA's driver reports it (NVML, through the maintained binding
``nvidia-ml-py``, an optional dependency: ``pip install 'oarbank-agent[gpu]'``).

``Reader.read()`` answers each GPU's memory used and total, and which process holds how much
(where the driver says: compute and graphics processes; a process the driver hides, as in a
container, is not counted). What cannot be read is unknown, with the reason, never zero: no
binding, no driver, no GPU. A failed start of NVML is tried again after ``RETRY_S``.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GpuMemory", "Reader", "RETRY_S"]

RETRY_S = 60.0


@dataclass(frozen=True)
class GpuMemory:
    gpus: list[dict[str, Any]] = field(default_factory=list)  # {index, name, used, total bytes}
    by_pid: dict[int, int] = field(default_factory=dict)  # pid -> GPU bytes it holds
    error: str | None = None  # why nothing is known (then ``gpus`` is empty)

    @property
    def used_bytes(self) -> int | None:
        return sum(g["used_bytes"] for g in self.gpus) if self.gpus else None

    @property
    def total_bytes(self) -> int | None:
        return sum(g["total_bytes"] for g in self.gpus) if self.gpus else None

    def held_by(self, pids: set[int]) -> int | None:
        """GPU bytes these processes hold (None when GPU memory is unknown here)."""
        if self.error is not None:
            return None
        return sum(n for pid, n in self.by_pid.items() if pid in pids)


class Reader:
    """Reads NVML; ``module`` is the binding (tests may give another; default: pynvml)."""

    def __init__(self, module: Any = None) -> None:
        self._nvml = module
        self._started = False
        self._failed_at: float | None = None
        self._error: str | None = None

    def _start(self) -> str | None:
        if self._started:
            return None
        if self._failed_at is not None and time.monotonic() - self._failed_at < RETRY_S:
            return self._error
        try:
            if self._nvml is None:
                self._nvml = importlib.import_module("pynvml")
            self._nvml.nvmlInit()
        except ImportError:
            self._error = ("GPU memory unknown: nvidia-ml-py is not installed "
                           "(pip install 'oarbank-agent[gpu]')")
        except Exception as exc:  # pynvml.NVMLError and its many subclasses
            self._error = f"GPU memory unknown: NVML: {exc}"
        else:
            self._started, self._error = True, None
            return None
        self._failed_at = time.monotonic()
        return self._error

    def read(self) -> GpuMemory:
        error = self._start()
        if error is not None:
            return GpuMemory(error=error)
        nv = self._nvml
        try:
            gpus: list[dict[str, Any]] = []
            by_pid: dict[int, int] = {}
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                name = nv.nvmlDeviceGetName(h)
                gpus.append({"index": i, "name": name.decode() if isinstance(name, bytes)
                             else str(name), "used_bytes": int(mem.used),
                             "total_bytes": int(mem.total)})
                for get in (nv.nvmlDeviceGetComputeRunningProcesses,
                            nv.nvmlDeviceGetGraphicsRunningProcesses):
                    for p in get(h):
                        used = p.usedGpuMemory
                        if isinstance(used, int) and used >= 0:  # None/N/A: not said
                            by_pid[int(p.pid)] = by_pid.get(int(p.pid), 0) + used
        except Exception as exc:  # a GPU gone or a driver error: unknown this time
            return GpuMemory(error=f"GPU memory unknown: NVML: {exc}")
        if not gpus:
            return GpuMemory(error="GPU memory unknown: NVML sees no GPU")
        return GpuMemory(gpus, by_pid)
