"""A runner that uses the runner protocol's control document through oarbank_sdk.control, as
upstream's cooperative runners do (tests/test_job_control.py). Its manifest declares
``cancellable``, ``cooperative_pause`` and ``checkpoint``.

Payload: ``chunks`` (units of work, one safe point before each), ``chunk_s`` (each unit's
time), ``every`` (a checkpoint every so many units; 0: only when a stop asks for one),
``deaf_below_attempt`` (attempts numbered below it never reach a safe point: they ignore
every stop and pause), ``forge_control`` (a path: right after it starts, the runner replaces
its control.json with a link to that file, holding a document of its own that says stop).

Each unit done is a line of ``<W>/work.jsonl`` ({t, chunk, attempt}); a resumed attempt starts
after the checkpoint's last unit. The result's payload: units done here, where it resumed,
and ``paused_s`` as ``Control`` counted it.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

from oarbank_sdk.control import Checkpoints, Control, Stopped, replace_text


def main() -> int:
    ap = argparse.ArgumentParser()
    verbs = ap.add_subparsers(dest="verb", required=True)
    run = verbs.add_parser("run")
    run.add_argument("--spec", required=True)
    run.add_argument("--workdir", required=True)
    run.add_argument("--out", required=True)
    run.add_argument("--events")
    doctor = verbs.add_parser("doctor")
    doctor.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.verb == "doctor":
        print(json.dumps({"runner_protocol": {"supported": [1]}, "health": "healthy",
                          "capabilities": ["cancellable", "cooperative_pause", "checkpoint"]}))
        return 0
    workdir = Path(args.workdir)
    spec = json.loads(Path(args.spec).read_text(encoding="utf-8"))
    p = spec["payload"]
    attempt = int(os.environ["OARBANK_ATTEMPT_ID"].rpartition(".")[2])
    deaf = attempt < p.get("deaf_below_attempt", 0)
    ctl = Control(workdir)
    ckpt = Checkpoints(workdir, args.events, spec)
    if p.get("forge_control"):
        victim = Path(p["forge_control"])
        forged = workdir / "control.json.forged"
        forged.symlink_to(victim)
        os.replace(forged, workdir / "control.json")
    start = 0
    if ckpt.resume():
        start = json.loads((ckpt.resume_dir() / "state.json").read_text())["next"]

    def checkpoint(upto: int) -> None:
        with ckpt.write({"next": upto}) as d:
            (d / "state.json").write_text(json.dumps({"next": upto}))

    ctl.phase("work")
    i = start
    log = open(workdir / "work.jsonl", "a", encoding="utf-8")  # noqa: SIM115 - the process's
    try:
        while i < p["chunks"]:
            if not deaf:
                held = ctl.paused_s
                ctl.safe_point()
                if ctl.paused_s > held:
                    log.write(json.dumps({"t": time.time(), "held_s": ctl.paused_s - held})
                              + "\n")
            time.sleep(p.get("chunk_s", 0.1))
            i += 1
            log.write(json.dumps({"t": time.time(), "chunk": i - 1, "attempt": attempt}) + "\n")
            log.flush()
            if p.get("every") and i % p["every"] == 0 and i < p["chunks"]:
                checkpoint(i)
    except Stopped:
        if ctl.checkpoint_requested and i > start:
            checkpoint(i)
        log.write(json.dumps({"t": time.time(), "stopped_at": i}) + "\n")
        log.close()
        return ctl.acknowledge_stop()
    log.close()
    replace_text(args.out, json.dumps({"envelope": 1, "payload": {
        "done_here": i - start, "resumed_at": start, "paused_s": round(ctl.paused_s, 3)}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
