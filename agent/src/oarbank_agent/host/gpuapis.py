"""Which GPU APIs this host provides (contract section 5), probed so a bad driver cannot hang us.

Each API is probed in its own child process (`python -m oarbank_agent.host.gpuapis --probe API`)
under a watchdog: a driver that hangs in its init, or crashes the process, costs one probe and
reads as absent, never a stuck agent. The probes ask the real runtime for devices through ctypes
(no vendor tools needed):

- ``cuda``: libcuda ``cuInit`` + ``cuDeviceGetCount`` > 0
- ``rocm``: ``/dev/kfd`` + libamdhip64 ``hipGetDeviceCount`` > 0
- ``vulkan``: libvulkan instance with a physical device that is not a CPU (software) device
- ``opencl``: libOpenCL with a platform that has a GPU device
- ``metal``: macOS with a Metal device (every Apple Silicon Mac; ``system_profiler`` elsewhere)
- ``directml``: Windows with DirectML.dll and Direct3D 12

``--gpu-apis LIST`` on ``oarbank-agent run`` replaces detection (operators, tests).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field

from oarbank_sdk.gpu import GPU_APIS  # the contract's names, shared with the manifest checker

__all__ = ["GPU_APIS", "Detection", "detect", "from_override", "probe_api"]

PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Detection:
    """What the host provides, and how each API was found out (shown in ``status``)."""

    apis: tuple[str, ...]
    source: str  # "detected" or "override"
    probes: dict[str, str] = field(default_factory=dict)  # api -> "present" / "absent: why"

    def as_dict(self) -> dict:
        return {"apis": list(self.apis), "source": self.source, "probes": dict(self.probes)}


def from_override(value: str) -> Detection:
    """``--gpu-apis cuda,vulkan`` (or ``none`` / empty) -> a Detection. Raises ValueError."""
    names = [] if value.strip().lower() in ("", "none") else [v.strip() for v in value.split(",")]
    unknown = [n for n in names if n not in GPU_APIS]
    if unknown:
        raise ValueError(f"unknown GPU API {', '.join(unknown)} (known: {', '.join(GPU_APIS)})")
    return Detection(tuple(dict.fromkeys(names)), "override", {n: "override" for n in names})


# What each backend's system can have (contract section 5's table), keyed by the backend's
# name, not sys.platform: the darwin profile on Linux probes what a Mac would.
_CANDIDATES = {
    "darwin": ("metal", "vulkan", "opencl"),
    "windows": ("directml", "cuda", "vulkan", "opencl"),
    "linux": ("cuda", "rocm", "vulkan", "opencl"),
}


def detect(timeout_s: float = PROBE_TIMEOUT_S) -> Detection:
    """Probe every API this OS can have, each in a child with a watchdog, all at once."""
    from oarbank_agent import platform as backends  # here: the probe child imports this module

    sessions = backends.current().sessions
    children: dict[str, subprocess.Popen] = {}
    probes: dict[str, str] = {}
    for api in _CANDIDATES.get(backends.name(), _CANDIDATES["linux"]):
        try:
            children[api] = sessions.start(
                [sys.executable, "-I", "-m", "oarbank_agent.host.gpuapis", "--probe", api],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            probes[api] = f"absent: probe could not start ({exc})"
    deadline = time.monotonic() + timeout_s
    for api, child in children.items():
        try:
            out, _ = child.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            sessions.kill_session(child.pid)
            child.communicate()
            probes[api] = f"absent: probe did not answer within {timeout_s:g} s (driver hangs?)"
            continue
        probes[api] = _read_probe_output(out, child.returncode)
    apis = tuple(a for a in GPU_APIS if probes.get(a) == "present")
    return Detection(apis, "detected", probes)


def _read_probe_output(out: bytes, returncode: int) -> str:
    lines = out.decode("utf-8", "replace").strip().splitlines()
    if returncode != 0 or not lines:
        return f"absent: probe exited {returncode}"
    try:
        answer = json.loads(lines[-1])
    except ValueError:
        return "absent: probe printed no answer"
    return "present" if answer.get("present") is True else f"absent: {answer.get('why', '?')}"


# --- the probes themselves (run in the child) ---------------------------------------------------


def _load(*names: str) -> ctypes.CDLL:
    errors = []
    for name in names:
        if not _fits_platform(name):
            continue
        path = ctypes.util.find_library(name) if "." not in name else name
        if not path:
            errors.append(f"{name} not found")
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as exc:
            errors.append(str(exc))
    raise LookupError("; ".join(errors))


def _fits_platform(name: str) -> bool:
    """Skip library file names of other operating systems (``x.dll`` on Linux, ...)."""
    if name.endswith(".dll"):
        return sys.platform == "win32"
    if name.endswith(".dylib"):
        return sys.platform == "darwin"
    if ".so" in name:
        return sys.platform.startswith("linux")
    return True


def _probe_cuda() -> tuple[bool, str]:
    lib = _load("libcuda.so.1", "cuda", "nvcuda.dll")
    rc = lib.cuInit(0)
    if rc != 0:
        return False, f"cuInit failed ({rc})"
    count = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0 or count.value < 1:
        return False, f"no CUDA device (rc {rc}, count {count.value})"
    return True, f"{count.value} device(s)"


def _probe_rocm() -> tuple[bool, str]:
    if not os.path.exists("/dev/kfd"):
        return False, "/dev/kfd missing"
    lib = _load("libamdhip64.so", "amdhip64")
    count = ctypes.c_int(0)
    rc = lib.hipGetDeviceCount(ctypes.byref(count))
    if rc != 0 or count.value < 1:
        return False, f"no ROCm device (rc {rc}, count {count.value})"
    return True, f"{count.value} device(s)"


class _VkInstanceCreateInfo(ctypes.Structure):
    _fields_ = [
        ("sType", ctypes.c_int),
        ("pNext", ctypes.c_void_p),
        ("flags", ctypes.c_uint32),
        ("pApplicationInfo", ctypes.c_void_p),
        ("enabledLayerCount", ctypes.c_uint32),
        ("ppEnabledLayerNames", ctypes.c_void_p),
        ("enabledExtensionCount", ctypes.c_uint32),
        ("ppEnabledExtensionNames", ctypes.c_void_p),
    ]


_VK_PHYSICAL_DEVICE_TYPE_CPU = 4


def _probe_vulkan() -> tuple[bool, str]:
    lib = _load("libvulkan.so.1", "vulkan", "vulkan-1.dll", "libvulkan.1.dylib")
    info = _VkInstanceCreateInfo(sType=1)  # VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO
    instance = ctypes.c_void_p()
    rc = lib.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance))
    if rc != 0:
        return False, f"vkCreateInstance failed ({rc})"
    try:
        count = ctypes.c_uint32(0)
        lib.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        devices = (ctypes.c_void_p * max(count.value, 1))()
        lib.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), devices)
        hardware = 0
        for i in range(count.value):
            props = (ctypes.c_uint32 * 256)()  # VkPhysicalDeviceProperties fits in 1 KiB
            lib.vkGetPhysicalDeviceProperties(ctypes.c_void_p(devices[i]), props)
            if props[4] != _VK_PHYSICAL_DEVICE_TYPE_CPU:  # deviceType is the 5th uint32
                hardware += 1
    finally:
        lib.vkDestroyInstance(instance, None)
    if hardware < 1:
        return False, f"no hardware Vulkan device ({count.value} software)"
    return True, f"{hardware} device(s)"


def _probe_opencl() -> tuple[bool, str]:
    lib = _load("libOpenCL.so.1", "OpenCL", "OpenCL.dll")
    n = ctypes.c_uint32(0)
    if lib.clGetPlatformIDs(0, None, ctypes.byref(n)) != 0 or n.value < 1:
        return False, "no OpenCL platform"
    platforms = (ctypes.c_void_p * n.value)()
    lib.clGetPlatformIDs(n.value, platforms, None)
    gpus = 0
    for p in platforms:
        count = ctypes.c_uint32(0)
        gpu_type = ctypes.c_uint64(1 << 2)  # CL_DEVICE_TYPE_GPU
        if lib.clGetDeviceIDs(ctypes.c_void_p(p), gpu_type, 0, None, ctypes.byref(count)) == 0:
            gpus += count.value
    if gpus < 1:
        return False, "no OpenCL GPU device"
    return True, f"{gpus} device(s)"


def _probe_metal() -> tuple[bool, str]:
    if sys.platform != "darwin":
        return False, "not macOS"
    if platform.machine() == "arm64":
        return True, "Apple Silicon"
    out = subprocess.run(
        ["system_profiler", "SPDisplaysDataType"], capture_output=True, text=True, timeout=8
    ).stdout
    return ("Metal" in out), "from system_profiler"


def _probe_directml() -> tuple[bool, str]:
    if sys.platform != "win32":
        return False, "not Windows"
    system32 = os.path.join(os.environ.get("SYSTEMROOT", r"C:\Windows"), "System32")
    if not os.path.exists(os.path.join(system32, "DirectML.dll")):
        return False, "DirectML.dll missing"
    ctypes.WinDLL("d3d12")
    return True, "DirectML and Direct3D 12"


_PROBES = {
    "cuda": _probe_cuda,
    "rocm": _probe_rocm,
    "vulkan": _probe_vulkan,
    "opencl": _probe_opencl,
    "metal": _probe_metal,
    "directml": _probe_directml,
}


def probe_api(api: str) -> dict:
    """Run one probe in this process. Returns ``{"present": bool, "why": text}``."""
    try:
        present, why = _PROBES[api]()
    except (LookupError, OSError, AttributeError, subprocess.SubprocessError) as exc:
        return {"present": False, "why": str(exc) or type(exc).__name__}
    return {"present": present, "why": why}


def _main(argv: list[str]) -> int:
    from oarbank_agent import platform as backends

    if backends.name() == "darwin":
        backends.current()  # the darwin profile's tripwire, in the probe child too
    if len(argv) == 2 and argv[0] == "--probe" and argv[1] in _PROBES:
        print(json.dumps(probe_api(argv[1])), flush=True)
        return 0
    if not argv:
        print(json.dumps(detect().as_dict(), indent=2))
        return 0
    print(f"usage: python -m oarbank_agent.host.gpuapis [--probe {'|'.join(_PROBES)}]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
