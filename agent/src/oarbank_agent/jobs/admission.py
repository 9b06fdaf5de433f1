"""FIFO token admission (pure): which waiting jobs may take their pool tokens now.

Rules:
- A job asks for ``requires.pools`` tokens (``{pool_key: n}``) and may name ``needs_pools``
  (the pool must exist on this node, i.e. have a capacity above zero; no token is taken).
- Jobs are considered in submission order. A job that cannot get all its tokens waits, and
  no later job may take a token of a pool an earlier waiting job is waiting for (no
  overtaking), while jobs on other pools still go ahead.
- Tokens are held until ``release``; capacities come from fingerprints and may change (a
  withdrawn service's pools count 0); a lowered capacity never takes tokens back, it only
  stops new admissions.

- Memory: a job charges ``mem_gb`` (its ``requires.resources.mem_gb``) plus the reserve of
  every ``reserves_host_memory`` service it would bring up that is not charged yet; it is
  admitted only if that fits the node's ``budget_gb`` next to what is charged (admitted jobs,
  services that run or have users). A job waiting for memory blocks later jobs that charge
  memory (memory is one more pool: no overtaking), not jobs that charge none.
- GPU memory: the same with ``gpu_budget_gb`` (the GPUs' total memory, where NVML reads it;
  None: not accounted), the ``reserve.gpu_mem_gb`` of the services a job brings up, and
  ``service_gpu_charges``.
- GPU: a job reserving a pool of a GPU service carries ``gpu`` (``shared``/``exclusive``).
  While GPU work is forbidden (``gpu_allowed`` false) no GPU job is admitted. An ``exclusive``
  GPU job is admitted only when no other GPU job holds tokens, and no GPU job is admitted
  next to an exclusive one. A waiting GPU job blocks later GPU jobs (the GPU is a pool too).
- ``paused``: a readable reason (e.g. memory pressure) while nothing may be admitted.
- ``memory_blocked``: after a pass, the first job held back only by memory (its pool tokens
  are there), what it is short of and the services it reserves: what demand eviction
  (``protection/eviction.py``) would make room for. None when no such job waits.

Pool keys are ``"<module id>/<pool>"``: two modules may both name a pool ``model``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from oarbank_agent.protection.decisions import memory_fits

__all__ = ["Request", "Admission", "MemoryBlock"]

_MEM = "\0memory"  # pseudo-pool names for the no-overtaking rule
_GPU = "\0gpu"


@dataclass(frozen=True)
class Request:
    job_id: str
    pools: dict[str, int] = field(default_factory=dict)  # pool key -> tokens
    needs: tuple[str, ...] = ()  # pool keys that must exist
    mem_gb: float = 0.0  # requires.resources.mem_gb
    services_mem: dict[str, float] = field(default_factory=dict)  # service key -> reserve it
    # brings up (reserves_host_memory services whose pools it reserves)
    services_gpu: dict[str, float] = field(default_factory=dict)  # service key -> its GPU
    # memory reserve (reserve.gpu_mem_gb of the services whose pools it reserves)
    gpu: str | None = None  # "shared" | "exclusive" when it reserves a GPU service's pool

    def pseudo_pools(self) -> set[str]:
        out = set()
        if (self.mem_gb > 0 or any(v > 0 for v in self.services_mem.values())
                or any(v > 0 for v in self.services_gpu.values())):
            out.add(_MEM)
        if self.gpu:
            out.add(_GPU)
        return out


@dataclass(frozen=True)
class MemoryBlock:
    """The first job memory holds back: how much of each resource is short (``mem_gb``:
    the budget), and the services it reserves (never evicted for it)."""

    job_id: str
    short: dict[str, float]
    need: dict[str, float]  # what it asks for, per resource
    reserves: frozenset[str]


class Admission:
    def __init__(self) -> None:
        self.capacity: dict[str, int] = {}
        self.in_use: dict[str, int] = {}
        self._queue: OrderedDict[str, Request] = OrderedDict()
        self._holding: dict[str, Request] = {}
        self.budget_gb: float | None = None  # None: memory is not accounted
        self.service_charges: dict[str, float] = {}  # service key -> reserve charged now
        self.gpu_budget_gb: float | None = None  # None: GPU memory is not accounted
        self.service_gpu_charges: dict[str, float] = {}  # service key -> GPU memory charged
        self.gpu_allowed = True
        self.paused: str | None = None  # why nothing is admitted now (memory pressure)
        self._why: dict[str, str] = {}  # job id -> why it waits (memory / GPU), last pass
        self.memory_blocked: MemoryBlock | None = None  # the last pass's (see above)

    # --- inputs ---------------------------------------------------------------------------

    def set_capacity(self, pool_key: str, n: int) -> None:
        self.capacity[pool_key] = max(0, int(n))

    def enqueue(self, req: Request, *, front: bool = False) -> None:
        """Queue a job; ``front`` for a released job, which keeps its place ahead of
        jobs submitted after it."""
        self._queue[req.job_id] = req
        if front:
            self._queue.move_to_end(req.job_id, last=False)

    def cancel(self, job_id: str) -> bool:
        """Drop a waiting request (never admitted). True if it was waiting."""
        return self._queue.pop(job_id, None) is not None

    def release(self, job_id: str) -> dict[str, int]:
        """Give back the tokens a job holds; returns them."""
        req = self._holding.pop(job_id, None)
        if req is None:
            return {}
        for pool, n in req.pools.items():
            self.in_use[pool] = self.in_use.get(pool, 0) - n
        return dict(req.pools)

    # --- the decision ---------------------------------------------------------------------

    def admit(self) -> list[Request]:
        """Admit every job that may go now, in order; their tokens are taken."""
        admitted: list[Request] = []
        blocked: set[str] = set()
        self._why = {}
        self.memory_blocked = None
        if self.paused is not None:
            self._why = {job_id: self.paused for job_id in self._queue}
            return admitted
        for job_id, req in list(self._queue.items()):
            pools = set(req.pools) | set(req.needs) | req.pseudo_pools()
            if pools & blocked:
                blocked |= pools  # waits behind an earlier job: its pools block later ones too
                continue
            if self._fits(req):
                for pool, n in req.pools.items():
                    self.in_use[pool] = self.in_use.get(pool, 0) + n
                for key, gb in req.services_mem.items():
                    self.service_charges.setdefault(key, gb)  # it will bring them up
                for key, gb in req.services_gpu.items():
                    self.service_gpu_charges.setdefault(key, gb)
                del self._queue[job_id]
                self._holding[job_id] = req
                admitted.append(req)
            else:
                blocked |= pools
        return admitted

    def charged_gb(self) -> float:
        """Memory charged now: admitted jobs plus running (or wanted) reserving services."""
        return (sum(r.mem_gb for r in self._holding.values())
                + sum(self.service_charges.values()))

    def _mem_request(self, req: Request) -> float:
        return req.mem_gb + sum(gb for key, gb in req.services_mem.items()
                                if key not in self.service_charges)

    def _gpu_block(self, req: Request) -> str | None:
        if not req.gpu:
            return None
        if not self.gpu_allowed:
            return "GPU work is not allowed on this node now (host rule)"
        held = [r.gpu for r in self._holding.values() if r.gpu]
        if req.gpu == "exclusive" and held:
            return "waiting for the GPU: an exclusive GPU job needs it to itself"
        if "exclusive" in held:
            return "waiting for the GPU: an exclusive GPU job is running"
        return None

    def _fits(self, req: Request) -> bool:
        gpu = self._gpu_block(req)
        if gpu is not None:
            self._why[req.job_id] = gpu
            return False
        short: dict[str, float] = {}
        needs: dict[str, float] = {}
        why = []
        if self.budget_gb is not None:
            need = self._mem_request(req)
            charged = self.charged_gb()
            if need > 0 and not memory_fits(charged, need, self.budget_gb):
                why.append(f"waiting for memory: needs {need:g} GB; {charged:g} of "
                           f"{self.budget_gb:g} GB budget charged")
                short["mem_gb"], needs["mem_gb"] = charged + need - self.budget_gb, need
        if self.gpu_budget_gb is not None:
            need = sum(gb for key, gb in req.services_gpu.items()
                       if key not in self.service_gpu_charges)
            charged = sum(self.service_gpu_charges.values())
            if need > 0 and not memory_fits(charged, need, self.gpu_budget_gb):
                why.append(f"waiting for GPU memory: needs {need:g} GB; {charged:g} of "
                           f"{self.gpu_budget_gb:g} GB charged")
                short["gpu_mem_gb"] = charged + need - self.gpu_budget_gb
                needs["gpu_mem_gb"] = need
        if short:
            self._why[req.job_id] = "; ".join(why)
            if self.memory_blocked is None and self._tokens_free(req):
                self.memory_blocked = MemoryBlock(
                    req.job_id, {r: round(v, 9) for r, v in short.items()}, needs,
                    frozenset(req.services_mem) | frozenset(req.services_gpu))
            return False
        return self._tokens_free(req)

    def _tokens_free(self, req: Request) -> bool:
        for pool in req.needs:
            if self.capacity.get(pool, 0) <= 0:
                return False
        for pool, n in req.pools.items():
            if self.capacity.get(pool, 0) - self.in_use.get(pool, 0) < n:
                return False
        return True

    def note(self, job_id: str, text: str) -> None:
        """Add to why a job waits (demand eviction says what it is stopping for it)."""
        if job_id in self._why:
            self._why[job_id] = f"{self._why[job_id]}; {text}"

    # --- views ----------------------------------------------------------------------------

    def waiting(self) -> list[str]:
        return list(self._queue)

    def queued_tokens(self) -> dict[str, int]:
        """Pool key -> tokens the waiting jobs ask for (what a claim does not offer)."""
        out: dict[str, int] = {}
        for req in self._queue.values():
            for pool, n in req.pools.items():
                out[pool] = out.get(pool, 0) + n
        return out

    def why_waiting(self, job_id: str) -> str | None:
        """Why a queued job was not admitted by the last pass (memory, GPU, paused), if that
        is why; pool tokens have their own explanation in the service rows."""
        return self._why.get(job_id)

    def holding(self) -> list[Request]:
        return list(self._holding.values())

    def holders(self, pool_key: str) -> int:
        """How many admitted jobs hold at least one token of ``pool_key``."""
        return sum(1 for r in self._holding.values() if r.pools.get(pool_key, 0) > 0)
