"""gpu-shared-start: a shared GPU service runs only where its GPU API is. On a node with the
API, jobs share one service process (one load, several users at once); on a node without it,
a job is refused GPU_API_MISSING and the row says `gpu api missing`."""

from __future__ import annotations

from typing import Any

from harness.e2e.scenario import Ctx, scenario
from harness.e2e.scenarios.common import loads, row, service_pids, submit_all_watching, wait_portal

GPU = "dev.oarbank.e2e.gpumodel"
MISSING = "GPU_API_MISSING: needs cuda, vulkan; this node provides opencl"


@scenario("gpu-shared-start", "jobs share one GPU service process where the API exists; "
          "refused GPU_API_MISSING where it does not", needs_portal=True)
def gpu_shared_start(ctx: Ctx) -> None:
    settings = {GPU: {"load_s": 0.3, "slots": 4}}
    with_api = ctx.node("gpu-yes", ["gpumodel"], settings=settings, flags=("--gpu-apis", "cuda"))
    without = ctx.node("gpu-no", ["gpumodel"], settings=settings,
                       flags=("--gpu-apis", "opencl"))

    # Node with the API: three jobs at once, each holding the service 2 s; watch the row.
    most_users = 0

    def look() -> None:
        nonlocal most_users
        r: dict[str, Any] | None = with_api.service_row(GPU, "model")
        if r:
            most_users = max(most_users, int(r.get("users") or 0))

    recs = submit_all_watching(with_api, GPU, "generate",
                               [{"prompts": [f"g{i}"], "hold_s": 2} for i in range(3)],
                               look, 0.2)
    ctx.check(all(r["state"] == "succeeded" for r in recs),
              f"GPU jobs: {[(r['state'], r.get('reason')) for r in recs]}")
    pids = sorted({p for r in recs for p in service_pids(r)})
    ctx.check(len(pids) == 1, f"the GPU jobs saw service pids {pids}: want one shared process")
    ctx.check(len(loads(with_api)) == 1, f"model.loads on gpu-yes: {loads(with_api)}")
    ctx.check(most_users >= 2, f"at most {most_users} user(s) at once: the service is not shared")
    r = row(with_api, GPU, "model")
    ctx.check(not r["gpu_api_missing"], f"gpu-yes row says the API is missing: {r}")
    ctx.note(f"gpu-yes (cuda): 3 jobs on one service pid {pids[0]}, one load, "
             f"up to {most_users} users at once")

    # Node without it: refused at once, nothing queued, the row says why.
    refused = without.submit_raw("--module", GPU, "--stage", "generate",
                                 "--payload", '{"prompts": ["x"]}')
    ctx.check(refused.rc != 0 and MISSING in refused.stderr + refused.stdout,
              f"submit on gpu-no should be refused with {MISSING!r}: {refused}")
    ctx.note(f"gpu-no (opencl): submit exit {refused.rc}: {refused.stderr.strip()[:200]}")
    ctx.check(without.status().get("jobs") == [], "gpu-no queued a job it cannot run")
    r = row(without, GPU, "model")
    ctx.check(r["gpu_api_missing"] and not r["running"], f"gpu-no row: {r}")
    ctx.check(not loads(without), f"the service ran on gpu-no: {loads(without)}")
    ctx.note(f"gpu-no row: gpu_api_missing={r['gpu_api_missing']} running={r['running']}")
    pr = wait_portal(ctx, GPU, without, "model", "stopped, gpu api missing",
                     lambda r: r.get("state") == "stopped"
                     and r.get("stopped_reason") == "gpu api missing")
    ctx.note(f"portal row of gpu-no: state={pr['state']} stopped_reason={pr['stopped_reason']}")
