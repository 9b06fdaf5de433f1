"""The README's two commands on a fresh machine: `python -m harness.tools.fresh_machine`.

A clean `git clone` of this checkout's HEAD goes into a new container of the harness's bare
Debian image (debootstrap minbase: python3, python3-venv, libseccomp2; no Chromium, Docker,
debootstrap, PostgreSQL, git or compiler) and runs, in a venv (Debian's own python3 refuses
`pip install` outside one, PEP 668), exactly what the README says:

    python3 -m pip install nox && nox -s demo
    python3 -m pip install nox && nox -s tests

The clone is in root's home, which only root can read. Both must pass; the tests that need
a missing system package are skipped and counted (the
run's last lines are printed). The container has no network (`--network none`): pip reads
a wheelhouse downloaded on the host beforehand (from the index this machine's pip is set up
for), through PIP_NO_INDEX/PIP_FIND_LINKS. It runs as root with the capabilities a root
shell on a fresh VM has that the tests use (see ROOT_CAPS). Exit 0 when both pass.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.nodes.cache import cache_dir
from harness.nodes.engine import EngineUnavailable, start_engine
from harness.nodes.image import REPO, ensure_base_image

__all__ = ["README_COMMANDS", "wheelhouse", "main"]

README_COMMANDS = ("python3 -m pip install nox && nox -s demo",
                   "python3 -m pip install nox && nox -s tests")
# A root shell's powers the tests use (namespaces, cgroups, ptrace checks), without Docker's
# own seccomp profile. Not `privileged`: that asks for every capability, and a machine whose
# own bounding set lacks one (CAP_SYS_RESOURCE on some hosts) cannot start such a container.
ROOT_CAPS = ["SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE"]
CHECKOUT = "/root/oarbank"  # where the clone is in the container
# What `nox -s tests` and `nox -s demo` install, and what builds our editable packages.
WANTED = ("nox", "setuptools>=61", "wheel")
# The wheels the module-environment tests fetch from the index (agent/tests/test_module_envs.py,
# sdk/tests/test_module_requirements.py): offline in the container, the wheelhouse is the index.
TEST_WHEELS = ("six==1.16.0", "six==1.17.0", "numpy")


def _log(msg: str) -> None:
    print(f"[fresh] {msg}", file=sys.stderr, flush=True)


def _noxfile_list(name: str) -> list[str]:
    """A list the noxfile spells out (``TEST_DEPS``, ``PACKAGES``): read, not imported (nox
    need not be installed)."""
    import ast

    tree = ast.parse((REPO / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return [str(v) for v in ast.literal_eval(node.value)]
    raise RuntimeError(f"noxfile.py has no {name} list")


def _our_packages() -> list[str]:
    """Our packages as the noxfile installs them, extras included (``sdk[web]``), as paths."""
    return [str(REPO / p) for p in _noxfile_list("PACKAGES") if p != "-e"]


def wheelhouse() -> Path:
    """Every distribution the two commands install, downloaded once for this machine's Python
    (the image's python3 is the same minor version: checked by the caller)."""
    reqs = [*WANTED, *_noxfile_list("TEST_DEPS")]
    key = hashlib.sha256("\n".join([*reqs, *TEST_WHEELS, *_noxfile_list("PACKAGES"), *(
        (REPO / d / "pyproject.toml").read_text() for d in ("sdk", "agent", "ui-pages"))]
    ).encode()).hexdigest()[:12]
    out = cache_dir() / "wheels" / f"fresh-{key}"
    if (out / ".done").is_file():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    _log(f"downloading the wheelhouse into {out}")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(out), *reqs,
                    *_our_packages()], check=True)
    for spec in TEST_WHEELS:  # one at a time: two versions of one name never resolve together
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:",
                        "--no-deps", "-d", str(out), spec], check=True)
    for p in out.glob("oarbank*"):  # ours are built from the clone, never from here
        p.unlink() if p.is_file() else shutil.rmtree(p)
    (out / ".done").write_text("ok")
    return out


def _clone(dest: Path) -> str:
    subprocess.run(["git", "clone", "-q", str(REPO), str(dest)], check=True)
    return subprocess.run(["git", "-C", str(dest), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.tools.fresh_machine", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--release", default="bookworm")
    ap.add_argument("--timeout-s", type=float, default=1800)
    args = ap.parse_args(argv)
    try:
        engine = start_engine()
    except EngineUnavailable as exc:
        print(f"fresh-machine check cannot run here: {exc}", file=sys.stderr)
        return 1
    t0 = time.monotonic()
    try:
        tag, python, _ = ensure_base_image(engine.client, args.release)
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        if python != here:
            print(f"the {args.release} image has Python {python}, this machine {here}: the "
                  f"wheelhouse would not fit", file=sys.stderr)
            return 1
        wheels = wheelhouse()
        with tempfile.TemporaryDirectory(prefix="oarbank-fresh-") as tmp:
            src = Path(tmp) / "oarbank"
            head = _clone(src)
            _log(f"clean clone of {head} in a {args.release} container ({tag})")
            # The clone sits in root's home, which only root may read (as on Debian): the
            # tests must not assume that another user can read the checkout.
            script = f"set -e; chmod 700 /root; python3 -m venv /opt/py; . /opt/py/bin/activate; " \
                f"cd {CHECKOUT}; " + "; ".join(f"echo '$ {c}'; {c}" for c in README_COMMANDS)
            ctr = engine.client.containers.run(
                tag, ["/bin/sh", "-c", script], detach=True, network_mode="none",
                cap_add=ROOT_CAPS, security_opt=["seccomp=unconfined", "apparmor=unconfined"],
                # A machine's loopback has ::1; Docker turns IPv6 off in a network-less one.
                sysctls={"net.ipv6.conf.all.disable_ipv6": "0",
                         "net.ipv6.conf.lo.disable_ipv6": "0"},
                working_dir=CHECKOUT,
                volumes={str(src): {"bind": CHECKOUT, "mode": "rw"},
                         str(wheels): {"bind": "/wheels", "mode": "ro"}},
                environment={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/wheels",
                             "PIP_CONFIG_FILE": "/dev/null", "LANG": "C.UTF-8",
                             "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
            try:
                for chunk in ctr.logs(stream=True, follow=True):
                    sys.stdout.write(chunk.decode(errors="replace"))
                    sys.stdout.flush()
                rc = ctr.wait(timeout=args.timeout_s)["StatusCode"]
            finally:
                ctr.remove(force=True)
                # The tests ran as root in the container: hand the clone back for cleanup.
                subprocess.run(["chmod", "-R", "u+rwX", str(src)], check=False)
        took = time.monotonic() - t0
        verdict = "both passed" if rc == 0 else f"failed (exit {rc})"
        print(f"fresh machine ({args.release}, only Python): README's two commands {verdict} "
              f"in {took:.0f} s")
        return 0 if rc == 0 else 1
    finally:
        engine.close()


if __name__ == "__main__":
    sys.exit(main())
