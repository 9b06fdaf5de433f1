"""A runner that reports how it was started: what `--process-factory on` and `off` must give
alike (tests/test_factory.py). Payload: exit (a code), kill (a signal to itself), sleep_s,
first_attempt_sleep_s (only the job's first attempt sleeps)."""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time


def status_fields() -> dict[str, str]:
    keep = ("NoNewPrivs", "Seccomp", "Seccomp_filters", "CapInh", "CapPrm", "CapEff", "CapBnd",
            "CapAmb", "SigBlk", "SigIgn", "Umask")
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in keep:
                out[k] = v.strip()
    return out


def fds() -> dict[str, str]:
    out = {}
    for name in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor
        kind = target.split(":", 1)[0] if target.startswith(("socket:", "pipe:")) else target
        flags = ""
        with open(f"/proc/self/fdinfo/{name}") as f:
            for line in f:
                if line.startswith("flags:"):
                    flags = line.split()[1]
        out[name] = f"{kind} flags={flags}"
    return out


def landlock() -> str:
    try:
        os.close(os.open("/", os.O_RDONLY | os.O_DIRECTORY))
        return "/ readable"
    except PermissionError:
        return "/ refused"


def outermost_file() -> str:
    f = sys._getframe()
    while f.f_back is not None:
        f = f.f_back
    return f.f_code.co_filename


def report() -> dict:
    # Signals and SIG_DFL/SIG_IGN by number: they are IntEnums, whose str() is the number
    # from 3.11 and the name ("Signals.SIGHUP", "Handlers.SIG_DFL") on 3.10.
    def disp(s: int) -> str:
        h = signal.getsignal(s)
        if isinstance(h, int):
            return str(int(h))
        return getattr(h, "__name__", None) or str(h)

    def cmdline(path: str) -> list[str]:
        with open(path, "rb") as f:
            return [x.decode() for x in f.read().split(b"\0") if x]

    return {
        "argv": sys.argv, "orig_argv": sys.orig_argv, "executable": sys.executable,
        "env": dict(os.environ), "proc_environ": sorted(cmdline("/proc/self/environ")),
        "cmdline": cmdline("/proc/self/cmdline"), "cwd": os.getcwd(), "path": sys.path,
        "flags": list(sys.flags), "file": __file__, "name": __name__,
        "stdio": [(s.encoding, s.errors, s.line_buffering, s.name) for s in
                  (sys.stdin, sys.stdout, sys.stderr)],
        "fds": fds(),
        "rlimits": {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource)
                    if n.startswith("RLIMIT_")},
        "signals": {str(int(s)): disp(s) for s in signal.valid_signals()
                    if s not in (signal.SIGKILL, signal.SIGSTOP)},
        "status": status_fields(), "landlock": landlock(),
        "session": [os.getsid(0) == os.getpid(), os.getpgid(0) == os.getpid()],
        "cgroup_own": open("/proc/self/cgroup").read().strip().rsplit("/", 1)[-1].startswith("g"),
        "netns_own": os.readlink("/proc/self/ns/net") != os.readlink(f"/proc/{os.getppid()}/ns/net")
        if os.access(f"/proc/{os.getppid()}/ns/net", os.R_OK) else "unreadable",
        "dumpable": open(f"/proc/{os.getpid()}/stat").read() != "",
        "main": sys.modules["__main__"].__dict__.get("__file__"),
        # not compared: whether the factory's child ran it in place (under runpy's frames)
        "in_factory": outermost_file() != __file__,
    }


def main() -> int:
    args = sys.argv[1:]
    spec_path, workdir, out = (args[args.index(k) + 1] for k in ("--spec", "--workdir", "--out"))
    with open(spec_path) as f:
        payload = json.load(f)["payload"]
    time.sleep(float(payload.get("sleep_s", 0)))
    if os.environ.get("OARBANK_ATTEMPT_ID", "").endswith(".1"):
        time.sleep(float(payload.get("first_attempt_sleep_s", 0)))
    rep = report()
    with open(os.path.join(workdir, "probe.json"), "w") as f:
        json.dump(rep, f)
    if payload.get("kill"):
        os.kill(os.getpid(), int(payload["kill"]))
    if payload.get("exit") is not None:
        return int(payload["exit"])
    with open(out, "w") as f:
        json.dump({"envelope": 1, "payload": {"ok": True}}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
