"""The floor of a connect's hand-over in Python on this design: what figure 3's targets are
held against when they are missed (issue 29: "where a target cannot be reached in Python on
this design, show the profile that proves it").

Three processes and nothing else: a job that sends the contract's ``connect`` and ``received``
lines on its connector and takes its end; an "agent" on asyncio's loop that only does a
hand-over's work (``socketpair``, the ``connection`` and ``ok`` lines each with SCM_RIGHTS,
its two copies kept until their receipts); a blocking "service" that answers ``accepted`` and
closes its end. No parsing beyond finding the op, no decisions, no logging, no rate limit, no
ownership: the three loop turns, the syscalls and the interpreter's own cost per connect.

``python -m harness.bench.handover_floor COUNT`` prints one JSON object: the job's latency per
connect (seconds) and each side's CPU per connect (microseconds, user + system), both over the
connects after the first ``WARMUP`` (each process's own start is left out).
"""

from __future__ import annotations

import array
import asyncio
import json
import os
import resource
import socket
import sys
import time
import traceback
from typing import Any

__all__ = ["measure"]

_SCM = (socket.SOL_SOCKET, socket.SCM_RIGHTS)
WARMUP = 50


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _recv_fd(s: socket.socket) -> tuple[bytes, int | None]:
    msg, anc, _flags, _addr = s.recvmsg(4096, socket.CMSG_SPACE(4))
    fds = array.array("i")
    for _lvl, _typ, data in anc:
        fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return msg, (fds[0] if fds else None)


def _conn_of(line: bytes) -> int:
    return int(line.split(b'"conn":')[1].split(b",")[0].strip().rstrip(b"}"))


def _job(s: socket.socket, count: int) -> dict[str, Any]:
    latencies: list[float] = []
    c0 = _cpu()
    for i in range(WARMUP + count):
        if i == WARMUP:
            latencies.clear()
            c0 = _cpu()
        t0 = time.perf_counter()
        s.sendall(b'{"op":"connect","pid":%d}\n' % os.getpid())
        msg, fd = _recv_fd(s)
        s.sendall(b'{"op":"received","conn":%d}\n' % _conn_of(msg))
        latencies.append(time.perf_counter() - t0)
        if fd is not None:
            os.close(fd)
    return {"latencies_s": latencies, "job_cpu_us": 1e6 * (_cpu() - c0) / count}


def _service(s: socket.socket, out: int) -> None:
    c0, n = _cpu(), -WARMUP
    while True:
        msg, fd = _recv_fd(s)
        if not msg:
            break
        if n == 0:
            c0 = _cpu()
        s.sendall(b'{"op":"accepted","conn":%d}\n' % _conn_of(msg))
        if fd is not None:
            os.close(fd)
        n += 1
    os.write(out, json.dumps({"service_cpu_us": 1e6 * (_cpu() - c0) / max(n, 1)}).encode())


def _agent(connector: socket.socket, channel: socket.socket, out: int) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        held: dict[tuple[int, int], socket.socket] = {}
        done = loop.create_future()
        n, c0 = -WARMUP, _cpu()
        seq = 0  # conn numbers
        connector.setblocking(False)
        channel.setblocking(False)

        job_gone = False

        def end_when_drained() -> None:
            # Ends only once every receipt is in: closing the channel with the service's last
            # ``accepted`` lines unread would reset it (a unix stream socket's rule), not end it.
            if job_gone and not held and not done.done():
                done.set_result(None)

        def release(side: int, line: bytes) -> None:
            s = held.pop((side, _conn_of(line)), None)
            if s is not None:
                s.close()
            end_when_drained()

        def on_connector() -> None:
            nonlocal n, c0, seq, job_gone
            data = connector.recv(65536)
            if not data:
                job_gone = True
                loop.remove_reader(connector.fileno())
                end_when_drained()
                return
            for line in data.split(b"\n"):
                if line.startswith(b'{"op":"connect"'):
                    if n == 0:
                        c0 = _cpu()
                    ours, theirs = socket.socketpair()
                    channel.sendmsg([b'{"op":"connection","conn":%d,"attempt":1}\n' % seq],
                                    [(*_SCM, array.array("i", [ours.fileno()]))])
                    connector.sendmsg([b'{"ok":true,"conn":%d}\n' % seq],
                                      [(*_SCM, array.array("i", [theirs.fileno()]))])
                    held[(0, seq)], held[(1, seq)] = ours, theirs
                    n, seq = n + 1, seq + 1
                elif line.startswith(b'{"op":"received"'):
                    release(1, line)

        def on_channel() -> None:
            for line in channel.recv(65536).split(b"\n"):
                if line.startswith(b'{"op":"accepted"'):
                    release(0, line)

        loop.add_reader(connector.fileno(), on_connector)
        loop.add_reader(channel.fileno(), on_channel)
        await done
        os.write(out, json.dumps({"agent_cpu_us": 1e6 * (_cpu() - c0) / max(n, 1)}).encode())

    asyncio.run(main())


def measure(count: int) -> dict[str, Any]:
    """Run the three processes for ``count`` connects (call from a single-threaded process:
    the two others are forked)."""
    job_end, agent_connector = socket.socketpair()
    agent_channel, service_end = socket.socketpair()
    reports: list[int] = []
    pids = []
    for role in ("service", "agent"):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its role, then out (a failure said, never a silent gap)
            os.close(r)
            status = 1
            try:
                if role == "service":
                    for x in (job_end, agent_connector, agent_channel):
                        x.close()
                    _service(service_end, w)
                else:
                    job_end.close()
                    service_end.close()
                    _agent(agent_connector, agent_channel, w)
                status = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(status)
        os.close(w)
        reports.append(r)
        pids.append(pid)
    for x in (agent_connector, agent_channel, service_end):
        x.close()
    result = _job(job_end, count)
    job_end.close()  # the agent ends at EOF, and with it the channel: the service ends
    for r in reports:
        with os.fdopen(r, "rb") as f:
            result.update(json.loads(f.read() or b"{}"))
    for pid, role in zip(pids, ("service", "agent"), strict=True):
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise RuntimeError(f"the {role} process failed (wait status {status}): see its "
                               "traceback above")
    return result


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)))
