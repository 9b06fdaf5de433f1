"""The example's `model` service with its model in GPU memory (harness `gpu-real` scenario).

Runs ``examples/modelserver/model_service.py`` (copied beside this file by harness-base.txt)
with one change: loading the model also opens the first CUDA device through the driver API
(libcuda via ctypes: no framework needed), allocates ``model_gb`` of device memory, fills it on
the device and reads a sample back. The daemon keeps that memory until it exits, so
``nvidia-smi`` lists exactly the service's daemon while it is warm, and nothing once it
stopped. Each answer's text names the device. Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the bundle out
import model_service as ms  # noqa: E402 - the example's service, after the path is set

FILL = 0x5A
_held: list[object] = []  # the context and allocation: alive as long as the daemon


def _check(rc: int, call: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{call} failed: CUresult {rc}")


def load_on_gpu(gb: float) -> str:
    """Open device 0, allocate `gb` GiB there, fill it on the device, check a sample; its name."""
    cuda = ctypes.CDLL("libcuda.so.1")
    _check(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int(0)
    _check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    name = ctypes.create_string_buffer(256)
    _check(cuda.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
    ctx = ctypes.c_void_p()
    _check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    _check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    size = max(1 << 20, int(gb * (1 << 30)))
    ptr = ctypes.c_uint64(0)
    _check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)), "cuMemAlloc")
    _check(cuda.cuMemsetD8_v2(ptr, ctypes.c_ubyte(FILL), ctypes.c_size_t(size)), "cuMemsetD8")
    sample = (ctypes.c_ubyte * 4096)()
    _check(cuda.cuMemcpyDtoH_v2(sample, ctypes.c_uint64(ptr.value + size - 4096),
                                ctypes.c_size_t(4096)), "cuMemcpyDtoH")
    if any(b != FILL for b in sample):
        raise RuntimeError("device memory read back differs from what the device wrote")
    _held.extend([cuda, ctx, ptr])
    return name.value.decode("utf-8", "replace")


_example_load = ms.load_model
_example_complete = ms.complete
DEVICE = {"name": "not loaded"}


def load_model(d: Path, load_s: float) -> None:
    DEVICE["name"] = load_on_gpu(float(ms.settings()["model_gb"]))
    _example_load(d, load_s)


def complete(prompt: str) -> str:
    return f"{_example_complete(prompt)} [on {DEVICE['name']}]"


ms.load_model = load_model
ms.complete = complete
ms.__file__ = os.path.abspath(__file__)  # `start` runs this file, not the example's, as the daemon

if __name__ == "__main__":
    sys.exit(ms.main(sys.argv[1:]))
