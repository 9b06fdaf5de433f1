"""gpu-real: on a node with a real CUDA GPU, the agent finds the API itself (no --gpu-apis), jobs
share one sandboxed service process that holds its model in GPU memory, and the idle stop gives
that memory back; the sandbox opens the GPU's device nodes only to a child that declared them.

Needs an NVIDIA GPU and its driver on the machine running the harness (the `local` backend: the
wall check runs the launcher here), so it runs only when named. On a machine without one the
cell fails saying what the agent's own detection found."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from typing import Any

from harness.e2e.scenario import Ctx, scenario
from harness.e2e.scenarios.common import loads, row, service_pids, submit_all_watching, wait_row

CUDA = "dev.oarbank.e2e.cudamodel"
IDLE_S = 4.0  # harness/e2e/modules/cudamodel: idle_timeout_s
MODEL_GB = 2.0


def gpu_processes() -> dict[int, int] | None:
    """pid -> MiB of GPU memory, as nvidia-smi lists compute processes; None without it."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    out = subprocess.run([smi, "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         timeout=30, check=False).stdout
    found = {}
    for line in out.splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit():
            found[int(pid)] = int(mib.strip()) if mib.strip().isdigit() else -1
    return found


# cuInit and a device count through the driver, as the agent's probe does, but importing nothing
# of the project: a sandboxed child reads only the system and the Python installation.
CUDA_PROBE = ("import ctypes, json; c = ctypes.CDLL('libcuda.so.1'); rc = c.cuInit(0); "
              "n = ctypes.c_int(0); rc = rc or c.cuDeviceGetCount(ctypes.byref(n)); "
              "print(json.dumps({'cuInit': rc, 'devices': n.value}))")


def sandboxed_cuda_probe(gpu: bool) -> tuple[bool, str]:
    """(whether a sandboxed child found a CUDA device, what it said)."""
    from oarbank_sdk import sandbox

    argv = sandbox.wrap([sys.executable, "-I", "-c", CUDA_PROBE], gpu=gpu)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return False, f"exit {done.returncode}: {done.stderr.strip()[-300:]}"
    try:
        answer = json.loads(lines[-1])
    except ValueError:
        return False, f"not JSON: {lines[-1]!r}"
    return answer.get("cuInit") == 0 and answer.get("devices", 0) > 0, lines[-1]


@scenario("gpu-real", "on a real CUDA GPU: detected by the agent, jobs share one sandboxed "
          "service holding GPU memory, the idle stop frees it, only declared children open "
          "the GPU", opt_in="needs an NVIDIA GPU with its driver on this machine (local "
          "backend)")
def gpu_real(ctx: Ctx) -> None:
    node = ctx.node("gpu-real", ["cudamodel"],
                    settings={CUDA: {"load_s": 0.2, "slots": 4, "model_gb": MODEL_GB}})
    gpu = node.status().get("gpu") or {}
    ctx.note(f"the agent's GPU detection: {gpu}")
    ctx.check("cuda" in (gpu.get("apis") or []) and gpu.get("source") == "detected",
              f"the agent did not detect CUDA on this machine: {gpu}")
    sandbox = node.status().get("sandbox")
    ctx.note(f"the sandbox's walls on this kernel: {sandbox}")

    # Three jobs at once, each holding the service 2 s, while nvidia-smi is read.
    seen_on_gpu: set[int] = set()
    recs = submit_all_watching(node, CUDA, "generate",
                               [{"prompts": [f"g{i}"], "hold_s": 2} for i in range(3)],
                               lambda: seen_on_gpu.update(gpu_processes() or {}), 0.3,
                               timeout_s=60)
    ctx.check(all(r["state"] == "succeeded" for r in recs),
              f"GPU jobs: {[(r['state'], r.get('reason')) for r in recs]}")
    pids = sorted({p for r in recs for p in service_pids(r)})
    ctx.check(len(pids) == 1, f"the jobs saw service pids {pids}: want one shared process")
    ctx.check(len(loads(node)) == 1, f"model.loads: {loads(node)}: want one load")
    texts = [t for r in recs for t in ((r.get("result") or {}).get("payload") or {}).get("texts", [])]
    ctx.check(texts and all("[on NVIDIA" in t for t in texts),
              f"each answer should name the GPU it was computed on: {texts}")
    ctx.note(f"3 jobs on service pid {pids[0]}, one load; answers: {texts[:1]}")
    during = gpu_processes()
    if during is None:
        ctx.note("nvidia-smi not found: which processes hold GPU memory is not checked")
    else:
        ctx.check(seen_on_gpu == set(pids), f"processes holding GPU memory during the jobs: "
                  f"{sorted(seen_on_gpu)}; want only the service daemon {pids}")
        ctx.note(f"nvidia-smi during the jobs: only pid(s) {sorted(seen_on_gpu)}; "
                 f"after: {during}")

    # The idle stop ends the daemon and with it its context: the GPU memory is given back.
    wait_row(ctx, node, CUDA, "model", "stopped with no users",
             lambda r: not r["running"] and r["users"] == 0, IDLE_S + 40)
    if during is not None:
        ctx.wait_for("no process holding GPU memory after the idle stop",
                     lambda: "none" if not gpu_processes() else None, 20)
        ctx.note("after the idle stop nvidia-smi lists no process holding GPU memory")
    r: dict[str, Any] = row(node, CUDA, "model")
    ctx.check(not r["gpu_api_missing"], f"the row says the GPU API is missing: {r}")

    # The wall: the GPU's device nodes are opened only for a child that declared them.
    (opened, with_gpu), (leaked, without) = sandboxed_cuda_probe(True), sandboxed_cuda_probe(False)
    ctx.note(f"sandboxed CUDA probe with the GPU declared: {with_gpu}; without: {without}")
    ctx.check(opened, f"a sandboxed child that declared the GPU could not use it: {with_gpu}")
    ctx.check(not leaked, f"a sandboxed child that did not declare the GPU used it: {without}")
