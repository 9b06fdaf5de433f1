"""oom-limit: a stage's requires.resources become its attempt cgroup's memory.max and cpu.max;
an attempt over its memory is ended by the kernel's OOM killer and fails as the job fault
`oom` naming the limit (not retried), while one within it succeeds.

Needs a node whose kernel offers the memory and cpu controllers to the agent's cgroup v2 tree
(`vm:bookworm`: systemd, full cgroup v2), so it runs only when named. Where the agent reports
either limit unavailable, the cell fails saying why (its `status.resource_limits`), never
passes on what it could not show."""

from __future__ import annotations

from harness.e2e.scenario import Ctx, scenario

MOD = "dev.oarbank.e2e.memlimited"
MEM_GB = 0.125  # harness/e2e/modules/memlimited: requires.resources.mem_gb of `hog`
CPU_MAX = "50000 100000"  # ... and cpu = 0.5


@scenario("oom-limit", "a job over its requires.resources.mem_gb is killed by the OOM killer "
          "at its attempt's memory.max and fails `oom` naming the limit; one within succeeds",
          opt_in="needs a kernel that offers the memory and cpu controllers to the agent's "
          "cgroup v2 tree (vm:bookworm does; .ci/run runs it there)")
def oom_limit(ctx: Ctx) -> None:
    node = ctx.node("oom-a", ["memlimited"])
    limits = node.status().get("resource_limits") or {}
    ctx.note(f"resource limits: {limits}")
    for name in ("memory.max", "cpu.max"):
        state = (limits.get(name) or {}).get("state")
        ctx.check(state == "enforced", f"the agent does not enforce {name} on this node: "
                  f"{limits.get(name)} (the kernel must offer the controller to its cgroup "
                  "v2 tree)")

    within = node.submit(MOD, "hog", {"alloc_mb": 32}, wait=True, timeout_s=120)
    ctx.check(within.get("state") == "succeeded", f"a job within its memory: {within}")
    seen = ((within.get("result") or {}).get("payload") or {}).get("limits") or {}
    want_mem = str(int(MEM_GB * 2**30))
    ctx.note(f"the runner read its own cgroup: {seen}")
    for name, want in (("memory.max", want_mem), ("cpu.max", CPU_MAX)):
        got = seen.get(name, "")
        ctx.check(got == want or got.startswith("unreadable"),
                  f"the attempt's {name} is {got!r}, expected {want!r}")

    over = node.submit(MOD, "hog", {"alloc_mb": 1024}, wait=True, timeout_s=120)
    if over.get("job_id"):
        ctx.expect_final(over["job_id"], "failed")  # the one job meant to fail
    reason = str(over.get("reason") or "")
    ctx.check(over.get("state") == "failed", f"a job over its memory should fail: {over}")
    ctx.check(reason.startswith("oom: the OOM killer ended"),
              f"its reason should be the oom fault: {reason!r}")
    ctx.check(f"requires.resources.mem_gb = {MEM_GB:g} (memory.max = {want_mem} bytes)"
              in reason, f"its reason should name the limit: {reason!r}")
    ctx.check(over.get("attempts") == 1, f"a job fault is not retried: attempts "
              f"{over.get('attempts')}")
    ctx.note(f"over its limit: {over.get('state')} after {over.get('attempts')} attempt: "
             f"{reason}")
