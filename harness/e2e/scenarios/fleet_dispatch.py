"""fleet-dispatch: jobs submitted to the portal only, pulled by three nodes (`run --claim`),
placed where their model is warm (contract section 10). Two modules, the chaos run's ledger
module under two ids (its service appends `start <job>` and `done <job>` to its ledger: the
service counts what was done, not the agent), each node running both.

First one job of each module: each is started cold on some node (nothing is warm anywhere).
Then 20 more, mixed: each goes to the node where its model is loaded (a backlog this short is
never worth a second load: its work on the warm copy is shorter than a load), so each model
has loaded exactly once in the whole fleet. Every
job succeeded once: the portal says succeeded with one grant, and the ledger of the node it
names holds exactly one `done` of the node's job for it; the fleet's ledgers hold no other
`done`.

The scenario starts its own portal (the run's serves harness/e2e/modules, and these two ids
are made here), on the same transport as the run's, so it is the same on every backend.
"""

from __future__ import annotations

import random
import subprocess
from typing import Any

from harness.e2e.portal import Portal, portal_command
from harness.e2e.scenario import Ctx, scenario
from harness.modelcopy import ledger_as
from harness.nodes.backends.base import Node

MODS = ("dev.oarbank.e2e.fleet-a", "dev.oarbank.e2e.fleet-b")
NODES = ("fleet-1", "fleet-2", "fleet-3")
# longer than the short backlog takes on the warm copy (10 jobs x ~0.5 s / 4 tokens; the cold
# nodes read this load from the warm one's claims: a slow backend's jobs must stay under 2.4 s)
LOAD_S = 6.0
WORK_S = 0.3
MORE = 20  # jobs after the first two
WAIT_S = 120.0


def _submitter(portal: Portal) -> str:
    cmd = portal_command()
    assert cmd is not None
    r = subprocess.run([*cmd, "token", "issue", "--submitter", "e2e", "--db",
                        str(portal.folder / "portal.db")], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"oarbank-portal token issue --submitter: {r.stderr.strip()}")
    return r.stdout.strip().splitlines()[-1]


def _submit(ctx: Ctx, token: str, mods: list[str]) -> list[str]:
    r = ctx.portal.session.post(f"{ctx.portal.base}/v1/jobs", timeout=30,
                                headers={"Authorization": f"Bearer {token}"},
                                json={"jobs": [{"module": m, "stage": "work",
                                                "payload": {"work_s": WORK_S}} for m in mods]})
    ctx.check(r.status_code == 201, f"submit answered {r.status_code}: {r.text[:500]}")
    return [j["job_id"] for j in r.json()["jobs"]]


def _jobs(ctx: Ctx, token: str, ids: list[str]) -> list[dict[str, Any]]:
    def done() -> list[dict[str, Any]] | None:
        out = []
        for i in ids:
            r = ctx.portal.session.get(f"{ctx.portal.base}/v1/jobs/{i}", timeout=30,
                                       headers={"Authorization": f"Bearer {token}"})
            if r.status_code != 200:
                return None
            out.append(r.json())
        return out if all(j["state"] in ("succeeded", "failed", "cancelled")
                          for j in out) else None

    return ctx.wait_for(f"{len(ids)} portal job(s) to end", done, WAIT_S, 0.5)


def _lines(node: Node, module: str, name: str) -> list[str]:
    out: list[str] = []
    for f in node.find_files(name):
        if f.parent.parent.name == module:
            out += [ln for ln in f.read_text(errors="replace").splitlines() if ln.strip()]
    return out


@scenario("fleet-dispatch", "3 nodes claim from the portal (`run --claim`), 2 modules, jobs "
          "submitted to the portal only: every job succeeds once (the service's ledger counts "
          "each job's work done once, on the node the portal names), each model loads once in "
          "the fleet, and the jobs after the first go where their model is ready")
def fleet_dispatch(ctx: Ctx) -> None:
    src = [ledger_as(ctx.folder / "src" / m.rsplit(".", 1)[1], m) for m in MODS]
    ctx.portal = Portal(ctx.place("portal"), src, tcp=ctx.backend.portal_over_tcp)
    ctx.note(f"portal serving {', '.join(MODS)} at {ctx.portal.url}")
    token = _submitter(ctx.portal)
    settings = {m: {"load_s": LOAD_S} for m in MODS}
    nodes = [ctx.node(n, list(src), settings=settings,
                      flags=("--claim", "--claim-wait-s", "2")) for n in NODES]

    first = _jobs(ctx, token, _submit(ctx, token, list(MODS)))
    ctx.check(all(j["state"] == "succeeded" for j in first),
              f"the first jobs: {[(j['module'], j['state'], j['node_id']) for j in first]}")
    ctx.check([j["placement"] for j in first] == ["cold", "cold"],
              f"the first job of each module starts its model: {first}")
    ctx.note("first job of each module: " + ", ".join(
        f"{j['module'].rsplit('.', 1)[1]} on {j['node_id']} ({j['placement']})" for j in first))
    warm = {j["module"]: j["node_id"] for j in first}

    order = [MODS[i % 2] for i in range(MORE)]
    random.Random(50).shuffle(order)
    more = _jobs(ctx, token, _submit(ctx, token, order))
    jobs = first + more
    bad = [(j["job_id"], j["state"], j["grants"]) for j in jobs
           if j["state"] != "succeeded" or j["grants"] != 1]
    ctx.check(not bad, f"jobs not succeeded with one grant: {bad}")
    placed = {(j["module"].rsplit(".", 1)[1], j["node_id"], j["placement"]) for j in more}
    ctx.note(f"{MORE} more, mixed: (module, node, placement) {sorted(placed)}")
    # Where each ran is the check; its placement label is the node's view as its last claim
    # said it, which may be a claim sent before its model was up (contract 10.4): `cold` on
    # the warm node is a claim that raced the load, not a second load (the loads say so below).
    ctx.check(all(j["node_id"] == warm[j["module"]] for j in more),
              f"a later job went elsewhere than its model's warm node {warm}: {sorted(placed)}")

    by_node = {n.node_id: n for n in nodes}
    done_lines = {n.node_id: {m: [ln.split(" ", 1)[1] for ln in _lines(n, m, "model.ledger")
                                  if ln.startswith("done ")] for m in MODS} for n in nodes}
    for j in jobs:
        local = str((j.get("record") or {}).get("job_id"))
        seen = done_lines[j["node_id"]][j["module"]].count(local)
        ctx.check(seen == 1, f"portal job {j['job_id']} ran as {local} on {j['node_id']}: its "
                             f"service's ledger has {seen} `done` of it (want 1)")
    total = sum(len(v) for d in done_lines.values() for v in d.values())
    ctx.check(total == len(jobs), f"the fleet's ledgers hold {total} `done` lines for "
                                  f"{len(jobs)} jobs")
    ctx.note(f"ledgers: each of the {len(jobs)} jobs done once, on the node the portal names "
             f"({total} `done` lines in all)")
    loads = {m: {n.node_id: len(_lines(n, m, "model.loads")) for n in nodes} for m in MODS}
    ctx.note(f"model loads per module and node: {loads}")
    for m in MODS:
        ctx.check(sum(loads[m].values()) == 1 and loads[m][warm[m]] == 1,
                  f"{m} loaded {loads[m]}: want once, on {warm[m]}")
    ctx.check(set(by_node) == set(NODES), f"nodes {sorted(by_node)}")
