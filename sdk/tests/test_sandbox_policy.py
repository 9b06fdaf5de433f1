"""Pure parts of the sandbox: argument parsing, /proc status checks, capability derivation,
and the macOS Seatbelt profile (generated here; it can only run on macOS)."""

from __future__ import annotations

import errno

import pytest

from oarbank_sdk.sandbox import _policy, _seatbelt


def test_launch_args() -> None:
    req = _policy.parse_launch_args(["--net", "none", "--", "prog", "--net", "x"])
    assert req == _policy.LaunchRequest("none", ("prog", "--net", "x"))
    assert _policy.parse_launch_args(["--net=none", "--", "a"]).argv == ("a",)
    assert _policy.parse_launch_args(["--", "a"]).net == "none"
    for bad, words in [
        ([], "missing '--'"),
        (["--net"], "--net needs a value"),
        (["--net", "host", "--", "a"], "unsupported --net 'host'"),
        (["a", "--", "b"], "missing '--' before the command 'a'"),
    ]:
        with pytest.raises(_policy.UsageError, match=words):
            _policy.parse_launch_args(bad)


def test_confinement_problem_reads_proc_status() -> None:
    ok = _policy.parse_proc_status("Name:\tpython3\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n")
    assert _policy.confinement_problem(ok) is None
    assert "NoNewPrivs" in _policy.confinement_problem({"NoNewPrivs": "0", "Seccomp": "2"})
    assert "Seccomp is '1'" in _policy.confinement_problem({"NoNewPrivs": "1", "Seccomp": "1"})
    assert "Seccomp is None" in _policy.confinement_problem({"NoNewPrivs": "1"})


def test_policy_refuses_what_the_issue_lists() -> None:
    for name in ("listen", "socket", "bind", "connect", "accept", "accept4", "io_uring_setup"):
        assert name in _policy.REFUSED_SYSCALLS
    assert "socketpair" not in _policy.REFUSED_SYSCALLS  # endpoints need it
    assert _policy.REFUSAL_ERRNO == errno.EPERM


def test_derive_capabilities_claims_nothing_it_did_not_see() -> None:
    nothing = dict.fromkeys(_policy.CAPABILITY_NAMES, "unavailable")
    assert _policy.derive_capabilities(None, "linux") == nothing
    refused = errno.EPERM
    zero = "0000000000000000"
    probe = {
        "status": {"NoNewPrivs": "1", "Seccomp": "2", "Uid": "0\t0\t0\t0", "CapInh": zero,
                   "CapPrm": zero, "CapEff": zero, "CapBnd": zero, "CapAmb": zero},
        "own_netns": True,
        "landlock_abi": 7,
        "ops": {
            # the walls beyond the network (see _probe._walls)
            "fs_write_granted": "ok", "fs_write_outside": errno.EACCES,
            "fs_read_outside": errno.EACCES, "signal_outside": errno.EPERM,
            **{k: refused for k in ("ptrace", "process_vm_readv", "kcmp", "unshare",
                                    "clone_newns", "bpf", "keyctl", "perf_event_open",
                                    "userfaultfd")},
            "clone3": errno.ENOSYS, "dev_list": errno.EACCES, "dev_basic": "ok",
            **{
                k: refused
                for k in (
                    "socket_inet",
                    "socket_inet6",
                    "socket_unix",
                    "socket_packet",
                    "socket_netlink",
                    "listen_held",
                    "accept_held",
                    "bind_held",
                    "connect_held",
                    "io_uring_setup",
                )
            },
            "socketpair": "ok",
        },
    }
    caps = _policy.derive_capabilities(probe, "linux")
    assert caps.pop("macos_seatbelt") == "unavailable"
    assert set(caps.values()) == {"enforced"}
    # One family getting through is enough to lose socket, loopback and abstract_unix.
    leaky = {**probe, "ops": {**probe["ops"], "socket_netlink": "ok"}, "own_netns": False}
    caps = _policy.derive_capabilities(leaky, "linux")
    for lost in ("seccomp_socket", "loopback", "abstract_unix", "netns"):
        assert caps[lost] == "unavailable", lost
    assert caps["seccomp_listen"] == "enforced"
    # socketpair broken: socket refusal is not the capability we promise either.
    broken = {**probe, "ops": {**probe["ops"], "socketpair": errno.EPERM}}
    assert _policy.derive_capabilities(broken, "linux")["seccomp_socket"] == "unavailable"


@pytest.mark.parametrize(("change", "lost"), [
    ({"ops": {"fs_write_outside": "ok"}}, ["landlock_fs"]),
    ({"ops": {"fs_read_outside": errno.EPERM}}, ["landlock_fs"]),  # not Landlock's answer
    ({"ops": {"fs_write_granted": errno.EACCES}}, ["landlock_fs"]),  # granted must work
    ({"ops": {"signal_outside": "ok"}}, ["landlock_signal", "landlock_abstract_unix"]),
    ({"landlock_abi": 5}, ["landlock_abstract_unix"]),
    ({"status": {"CapEff": "0000000000000001"}}, ["caps_dropped"]),
    ({"status": {"CapBnd": "000001ffffffffff"}}, ["caps_dropped"]),  # uid 0: bounding too
    ({"ops": {"kcmp": errno.EINVAL}}, ["seccomp_ptrace"]),
    ({"ops": {"unshare": "ok"}}, ["seccomp_privileged"]),
    ({"ops": {"clone3": errno.EPERM}}, ["seccomp_privileged"]),  # must be ENOSYS (fallback)
    ({"ops": {"dev_list": "ok"}}, ["devices"]),
    ({"ops": {"dev_basic": errno.EACCES}}, ["devices"]),
])
def test_each_wall_is_lost_when_the_probe_did_not_see_it(change: dict, lost: list[str]) -> None:
    zero = "0000000000000000"
    full = {
        "status": {"NoNewPrivs": "1", "Seccomp": "2", "Uid": "0\t0\t0\t0", "CapInh": zero,
                   "CapPrm": zero, "CapEff": zero, "CapBnd": zero, "CapAmb": zero},
        "own_netns": True, "landlock_abi": 7,
        "ops": {"fs_write_granted": "ok", "fs_write_outside": errno.EACCES,
                "fs_read_outside": errno.EACCES, "signal_outside": errno.EPERM,
                **{k: errno.EPERM for k in ("ptrace", "process_vm_readv", "kcmp", "unshare",
                                            "clone_newns", "bpf", "keyctl", "perf_event_open",
                                            "userfaultfd")},
                "clone3": errno.ENOSYS, "dev_list": errno.EACCES, "dev_basic": "ok"},
    }
    walls = ("landlock_fs", "landlock_signal", "landlock_abstract_unix", "caps_dropped",
             "seccomp_ptrace", "seccomp_privileged", "devices")
    caps = _policy.derive_capabilities(full, "linux")
    assert {w: caps[w] for w in walls} == dict.fromkeys(walls, "enforced")
    probe = {**full, **{k: ({**full[k], **v} if isinstance(v, dict) else v)
                        for k, v in change.items()}}
    caps = _policy.derive_capabilities(probe, "linux")
    assert {w: caps[w] for w in walls if caps[w] != "enforced"} == dict.fromkeys(lost, "unavailable")
    # a non-root child keeps its (unusable) bounding set: not a lost wall
    nonroot = {**full, "status": {**full["status"], "Uid": "1000\t1000\t1000\t1000",
                                  "CapBnd": "000001ffffffffff"}}
    assert _policy.derive_capabilities(nonroot, "linux")["caps_dropped"] == "enforced"


def test_seatbelt_profile_from_the_template() -> None:
    text = _seatbelt.profile(["/Users/x/work", '/tmp/we"ird\\dir'])
    assert text.count("(version 1)") == 1
    assert "(deny default)" in text
    assert '(allow file-write* (subpath "/Users/x/work") (subpath "/tmp/we\\"ird\\\\dir"))' in text
    for denied in ("network-bind", "network-inbound", "network-outbound", "system-socket"):
        assert f"(deny {denied})" in text
    assert "(allow network" not in text
    assert "@WRITABLE@" not in text
    # Nothing writable must not mean "everything writable".
    assert "(allow file-write* (literal" in _seatbelt.profile([])


def test_seatbelt_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="absolute"):
        _seatbelt.profile(["relative/dir"])
    with pytest.raises(ValueError, match="cannot appear"):
        _seatbelt.profile(["/a\nb"])
    with pytest.raises(ValueError, match="exactly once"):
        _seatbelt.profile([], template="(version 1)")


def test_seatbelt_command() -> None:
    argv = _seatbelt.command(["python3", "-c", "pass"], writable=["/w"])
    assert argv[:2] == ["/usr/bin/sandbox-exec", "-p"]
    assert argv[3:] == ["python3", "-c", "pass"]


def test_linux_path_does_not_depend_on_seatbelt() -> None:
    import ast
    from pathlib import Path

    pkg = Path(_policy.__file__).parent
    for name in ("_linux.py", "_policy.py", "_probe.py"):
        tree = ast.parse((pkg / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert "_seatbelt" not in imported, name


def test_wall_options_are_parsed_in_order_and_repeatable() -> None:
    req = _policy.parse_launch_args(["--read", "/a", "--read=/b", "--write", "/w", "--dev",
                                     "/dev/nvidia0", "--signals", "open", "--guard-pid", "42",
                                     "--guard-pid=43", "--", "prog", "--read", "x"])
    assert req.read == ("/a", "/b") and req.write == ("/w",) and req.devices == ("/dev/nvidia0",)
    assert req.signals == "open" and req.guard_pids == (42, 43)
    assert req.argv == ("prog", "--read", "x")  # the child's own options stay its own
    plain = _policy.parse_launch_args(["--", "prog"])
    assert (plain.read, plain.write, plain.devices, plain.signals, plain.guard_pids) == (
        (), (), (), "scoped", ())
