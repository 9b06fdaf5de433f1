"""The GPU probes themselves, shared by the agent and ``oarbank_sdk.gpu.detect``: each asks an
API's own runtime, through ctypes, for devices (no vendor tools needed). Standard library only.

- ``cuda``: libcuda ``cuInit`` + ``cuDeviceGetCount`` > 0
- ``rocm``: ``/dev/kfd`` + libamdhip64 ``hipGetDeviceCount`` > 0
- ``vulkan``: libvulkan instance with a physical device that is not a CPU (software) device
- ``opencl``: libOpenCL with a platform that has a GPU device
- ``metal``: macOS with a Metal device (every Apple Silicon Mac; ``system_profiler`` elsewhere)
- ``directml``: Windows with DirectML.dll and Direct3D 12

A probe runs in the calling process: the agent runs each in a child of its own under a
watchdog (``oarbank_agent.host.gpuapis``); a runner calling ``gpu.detect()`` runs them in itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import subprocess
import sys

__all__ = ["CANDIDATES", "PROBES", "probe_api"]

# What each OS can have (contract section 5's table), keyed by backend name, not sys.platform:
# the agent's darwin profile on Linux probes what a Mac would.
CANDIDATES = {
    "darwin": ("metal", "vulkan", "opencl"),
    "windows": ("directml", "cuda", "vulkan", "opencl"),
    "linux": ("cuda", "rocm", "vulkan", "opencl"),
}



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


PROBES = {
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
        present, why = PROBES[api]()
    except (LookupError, OSError, AttributeError, subprocess.SubprocessError) as exc:
        return {"present": False, "why": str(exc) or type(exc).__name__}
    return {"present": present, "why": why}
