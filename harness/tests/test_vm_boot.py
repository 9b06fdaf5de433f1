"""One real VM node (the suite's only boot: minutes under TCG): Debian bookworm's own kernel
under systemd, the agent run by the project's unit as its user, and the kernel's truth: 6.1
has Landlock ABI 2, so the signal and abstract-socket walls are unavailable, `--sandbox
required` refuses to start naming them, `--sandbox auto` starts, warns naming them, and
`status` says which walls hold. Then a job, `kill -9` of the agent, a restart on the same
state, a SIGTERM stop, and nothing left: no process in the guest, no QEMU, no overlay.

Needs root, QEMU and debootstrap (the first run builds and caches the disks: minutes)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from harness_test_helpers import ECHO, ECHO_ID

from harness.nodes.backends import make_backends
from harness.nodes.backends.base import NodeError
from harness.nodes.backends.vm import VmNode
from harness.nodes.vm.disk import AGENT_UNIT, AGENT_USER

MISSING_ON_6_1 = ("landlock_signal", "landlock_abstract_unix")


def _qemu_of(folder: Path) -> list[str]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "qemu-system" in cmd and str(folder) in cmd:
            out.append(f"{p.pid}: {cmd[:200]}")
    return out


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_bookworm_vm_node_tells_its_kernel_truth_and_leaves_nothing(
        system_package: Callable[[str], None], tmp_path: Path) -> None:
    system_package("qemu-system-x86")
    system_package("debootstrap")
    [backend] = make_backends("vm:bookworm")
    why = backend.unavailable()
    if why:
        pytest.skip(f"vm:bookworm cannot run here: {why}")
    facts = backend.setup(tmp_path / "out")
    assert facts["accel"] in ("kvm", "tcg") and facts["accel_why"]
    try:
        node = backend.make_node("vm-1", tmp_path / "vm-1", [ECHO], {}, None)
        assert isinstance(node, VmNode) and node.machine is not None
        try:
            hello = node.machine.hello
            assert hello["kernel"].startswith("6.1."), hello
            assert hello["landlock_abi"] == 2, hello

            with pytest.raises(NodeError, match="the agent exited"):
                node.start_agent("--sandbox", "required")
            # Its refusal, on its stderr: the unit's journal.
            journal = (node.root / "journal.log").read_text()
            [line] = [ln for ln in journal.splitlines()
                      if "--sandbox required, but this kernel lacks walls" in ln][:1]
            assert all(w in line for w in MISSING_ON_6_1), line
            # systemd would restart it (Restart=on-failure): stop it, forget its failures.
            assert node._systemctl("stop", AGENT_UNIT).rc == 0
            node._systemctl("reset-failed", AGENT_UNIT)  # exit 1 once the unit is unloaded

            node.start_agent()  # --sandbox auto (the default)
            sandbox = node.status()["sandbox"]
            assert sandbox["mode"] == "auto"
            for wall in MISSING_ON_6_1:
                assert sandbox[wall] == "unavailable", sandbox
            for wall in ("landlock_fs", "seccomp_listen", "seccomp_socket", "no_new_privs"):
                assert sandbox[wall] == "enforced", sandbox
            log = node.log_tail(100_000)
            assert "sandbox: this kernel lacks" in log, log[-3000:]
            assert all(f"{w} unavailable (" in log for w in MISSING_ON_6_1), log[-3000:]

            rec = node.submit(ECHO_ID, "echo", {"x": 1}, wait=True, timeout_s=300)
            assert rec["state"] == "succeeded", rec
            agent = [p for p in node.processes() if "oarbank-agent run" in p.cmdline]
            assert [p.pid for p in agent] == [node.main_pid], node.processes()
            user = node._run(["stat", "-c", "%U", f"/proc/{node.main_pid}"]).stdout.strip()
            assert user == AGENT_USER

            node.kill_agent()
            assert not node.agent_alive()
            node.start_agent()  # systemd may have restarted it already (Restart=on-failure)
            assert node.agent_starts == 3
            assert node.job_states()[rec["job_id"]]["state"] == "succeeded"
            assert node.stop_agent() == 0
            assert node.processes() == []
        finally:
            node.cleanup()
        assert backend.leftovers() == []
        assert _qemu_of(tmp_path) == []
        assert not list((tmp_path / "vm-1" / "vm").glob("*.qcow2"))
        assert "vm-1" in (tmp_path / "vm-1" / "journal.log").read_text()
    finally:
        backend.teardown()
