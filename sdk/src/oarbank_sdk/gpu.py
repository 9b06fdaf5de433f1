"""The GPU APIs a manifest may name and a node may provide (contract section 5), spelled once.

The manifest checker and the agent's GPU probe both read them. The probe runs in a child of its
own for each API, so this module holds the names and imports nothing.
"""

__all__ = ["GPU_APIS"]

GPU_APIS = ("metal", "cuda", "rocm", "vulkan", "opencl", "directml")
