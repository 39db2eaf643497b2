"""Replicas as Ray actors serving one work queue, with Ray's actor restarts for faults.

A `ReplicaPool` starts N actors of one class (one per GPU, or `threads_per_replica` CPUs
each), hands out work items from a single queue as replicas free up (each replica takes
up to `per_replica` items at once), and yields every item's outcome in completion order.

Faults: an actor is created with `max_restarts=1`, so Ray rebuilds a dead replica once by
re-running its constructor. A replica's death is charged to none of the items it had in
flight (one of them may have killed it, the others are innocent): they go back on the
queue as suspects, and a suspect runs alone on its replica until it finishes. An item
fails on a replica when it raises there, or when its replica dies (or hangs) while it ran
alone; an item that has failed on two different replicas (or twice, when no other replica
is left) comes back as an error, and is retried on another replica before that. A
restarting replica gets no new work until a `ready()` call on it returns; a replica whose
restart failed too is dropped, and if none is left the remaining items fail.

Hangs (with `hang_timeout_s`): every replica with work in flight is pinged (`ready()`)
each heartbeat; one that leaves a ping unanswered for `hang_timeout_s` is hung (alive,
not answering): it is killed, its items are handled as at a death, and a new actor
replaces it. Every `ray.wait` then has a timeout, so a hung replica cannot stall the run.
The actor must answer a ping while it works (an async actor, as a search replica is).

`ray_cluster` joins `--ray-address` or starts a small local cluster for the run (no
dashboard, a small object store: the results are a few KB each), reachable on 127.0.0.1
only: nothing of a one-machine run listens on the machine's network address.
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import ray
import ray._private.ray_constants as ray_constants
from ray.exceptions import ActorUnavailableError, RayError, RayTaskError

from tts_runtime.config import ConfigError
from tts_runtime.runs.scale_config import ScaleOut

ATTEMPTS = 2  # an item fails for good after failing twice (on two replicas where there are two)
_LOCAL_OBJECT_STORE = 100 << 20
_READY_TIMEOUT_S = 1800.0  # first model load dequantizes GGUF files: minutes on a slow CPU
_REPING_S = 0.5
_LOOPBACK = "127.0.0.1"


@contextmanager
def ray_cluster(scale: ScaleOut) -> Iterator[None]:
    """Connect to Ray for the run; a cluster this process is already connected to (a test's,
    a notebook's) is used and left running."""
    if ray.is_initialized():
        yield
        return
    try:
        if scale.address:
            # A cluster on the loopback address (a test's, another run's) is joined there too.
            loopback = scale.address.split(":")[0] in (_LOOPBACK, "localhost")
            with _single_node() if loopback else nullcontext():
                ray.init(address=scale.address, include_dashboard=False, configure_logging=False)
        else:
            with _single_node():
                ray.init(num_cpus=scale.replicas * scale.threads_per_replica,
                         num_gpus=scale.replicas * scale.gpus_per_replica or None,
                         include_dashboard=False, object_store_memory=_LOCAL_OBJECT_STORE, configure_logging=False,
                         _node_ip_address=_LOOPBACK)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"cannot start or join the Ray cluster{' at ' + scale.address if scale.address else ''}: "
                          f"{exc}") from None
    try:
        yield
    finally:
        ray.shutdown()


@contextmanager
def _single_node() -> Iterator[None]:
    """Let a cluster started (or joined) now live on 127.0.0.1. `_node_ip_address="127.0.0.1"`
    alone is not enough, nor is joining "127.0.0.1:port": Ray turns a loopback address into
    the machine's IP (services.resolve_ip_for_localhost) unless multi-node clusters are off,
    the switch `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` sets when Ray is imported
    (ray_constants.ENABLE_RAY_CLUSTER, read on every address lookup). It is off only while
    ray.init runs; the GCS, raylet and workers then keep the loopback address."""
    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def _check_room(scale: ScaleOut) -> None:
    """Fail now, not after an endless wait for placement, when the cluster is too small."""
    total = ray.cluster_resources()
    for resource, each in (("CPU", scale.threads_per_replica), ("GPU", scale.gpus_per_replica)):
        need = each * scale.replicas
        if need and total.get(resource, 0) < need:
            raise ConfigError(f"the Ray cluster has {total.get(resource, 0):g} {resource}s; {scale.replicas} "
                              f"replicas need {need} (lower --replicas or --threads-per-replica)")


@dataclass(frozen=True)
class ReplicaInfo:
    """Where a replica runs, returned by its `ready()`."""

    pid: int
    host: str

    @classmethod
    def here(cls) -> ReplicaInfo:
        return cls(os.getpid(), socket.gethostname())


@dataclass
class WorkItem:
    key: str
    args: tuple
    errors: list[str] = field(default_factory=list)
    failed_on: list[int] = field(default_factory=list)  # replica indexes, one per failure
    suspect: bool = False  # was in flight when a replica died or hung: runs alone


@dataclass
class Outcome:
    key: str
    value: Any = None
    error: str | None = None  # the last error of an item that failed ATTEMPTS times


@dataclass
class Replica:
    index: int
    handle: Any
    info: ReplicaInfo | None = None
    state: str = "starting"  # starting -> ready -> (restarting | replacing -> ready) -> dead
    in_flight: dict[Any, WorkItem] = field(default_factory=dict)  # ObjectRef -> item
    done: int = 0
    heartbeat: Any = None  # the unanswered ping's ObjectRef
    heartbeat_sent: float = 0.0
    last_answer: float = 0.0

    @property
    def runs_suspect(self) -> bool:
        return any(item.suspect for item in self.in_flight.values())


class ReplicaPool:
    def __init__(self, actor_class: type, args: tuple, scale: ScaleOut, *, per_replica: int = 1,
                 hang_timeout_s: float | None = None) -> None:
        """`hang_timeout_s`: heartbeats on (see the module's doc); None: off, for actors that
        answer no call while they work (a sync actor running one long call)."""
        _check_room(scale)
        self._remote = ray.remote(actor_class).options(
            num_cpus=scale.threads_per_replica, num_gpus=scale.gpus_per_replica, max_restarts=1,
            max_task_retries=0, scheduling_strategy="SPREAD")
        self._args = args
        self.scale = scale
        self.per_replica = per_replica
        self.hang_timeout_s = hang_timeout_s
        self._heartbeat_s = None if hang_timeout_s is None else min(5.0, hang_timeout_s / 4)
        self.replicas = [Replica(i, self._remote.remote(*args)) for i in range(scale.replicas)]
        self.retries = 0  # items put back on the queue after a failure
        self.restarts = 0  # replica deaths Ray restarted
        self.replaced = 0  # hung replicas killed and replaced by a new actor
        self.lost = 0  # replicas gone for good
        self._pings: dict[Any, Replica] = {r.handle.ready.remote(): r for r in self.replicas}
        self._heartbeats: dict[Any, Replica] = {}

    def wait_ready(self) -> None:
        """Block until every replica has built its state (models loaded); a constructor error
        is raised here, once, instead of as a failure of every item."""
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while self._pings:
            ready, _ = ray.wait(list(self._pings), num_returns=1, timeout=max(deadline - time.monotonic(), 0))
            if not ready:
                raise ConfigError(f"{len(self._pings)} replica(s) not up within {_READY_TIMEOUT_S:.0f} s")
            replica = self._pings.pop(ready[0])
            try:
                replica.info = ray.get(ready[0])
                replica.state = "ready"
            except ActorUnavailableError:  # it died while loading and Ray is restarting it
                self._ping_later(replica)
            except RayError as exc:
                raise ConfigError(f"a replica could not start: {_cause(exc)}") from None

    def run(self, method: str, items: Iterable[WorkItem]) -> Iterator[Outcome]:
        """Serve `items` from one queue; yield each outcome as it completes."""
        queue = deque(items)
        while queue or self._busy():
            yield from self._dispatch(method, queue)
            waiting = [ref for r in self.replicas for ref in r.in_flight] + list(self._pings)
            if not waiting:  # every replica is dead: nothing will run what is left
                while queue:
                    item = queue.popleft()
                    yield Outcome(item.key, error="no replica left: " + "; ".join(item.errors))
                return
            ready, _ = ray.wait(waiting + list(self._heartbeats), num_returns=1, timeout=self._heartbeat_s)
            if ready and ready[0] in self._heartbeats:
                self._answered(ready[0])
            elif ready and ready[0] in self._pings:
                self._revived(ready[0])
            elif ready:
                outcome = self._collect(ready[0], queue)
                if outcome is not None:
                    yield outcome
            if self.hang_timeout_s is not None:
                self._check_heartbeats(queue)

    def call_all(self, method: str, *args: Any) -> list[Any]:
        """`method` on every live replica (e.g. its counters at the end of a run)."""
        live = [r for r in self.replicas if r.state == "ready"]
        return ray.get([getattr(r.handle, method).remote(*args) for r in live])

    def call_one(self, method: str, *args: Any) -> Any:
        replica = next(r for r in self.replicas if r.state == "ready")
        return ray.get(getattr(replica.handle, method).remote(*args))

    def shutdown(self) -> None:
        for replica in self.replicas:
            ray.kill(replica.handle, no_restart=True)

    def stats(self) -> dict[str, Any]:
        return {**self.scale.to_dict(), "retries": self.retries, "replica_restarts": self.restarts,
                "replicas_replaced": self.replaced, "replicas_lost": self.lost,
                "per_replica": [{"index": r.index, "pid": r.info.pid if r.info else None,
                                 "host": r.info.host if r.info else None, "done": r.done, "state": r.state}
                                for r in self.replicas]}

    # -- internals -----------------------------------------------------------------
    def _busy(self) -> bool:
        return any(r.in_flight for r in self.replicas) or bool(self._pings)

    def _dispatch(self, method: str, queue: deque[WorkItem]) -> Iterator[Outcome]:
        """Hand out what fits, in queue order; yields the items no live replica may run."""
        kept: list[WorkItem] = []
        for item in queue:
            if self._hopeless(item):
                yield Outcome(item.key, error=self._final_error(item))
                continue
            replica = self._replica_for(item)
            if replica is None:
                kept.append(item)
                continue
            replica.in_flight[getattr(replica.handle, method).remote(*item.args)] = item
        queue.clear()
        queue.extend(kept)

    def _replica_for(self, item: WorkItem) -> Replica | None:
        """The least-loaded free replica that may run `item`: one it has not failed on while
        such a replica is alive; alone, for a suspect."""
        alive = [r for r in self.replicas if r.state != "dead"]
        untried = {r.index for r in alive} - set(item.failed_on)
        free = [r for r in alive if r.state == "ready" and len(r.in_flight) < self.per_replica
                and not r.runs_suspect and (not item.suspect or not r.in_flight)
                and (not untried or r.index in untried)]
        return min(free, key=lambda r: len(r.in_flight)) if free else None

    def _hopeless(self, item: WorkItem) -> bool:
        if len(set(item.failed_on)) >= 2:
            return True
        untried = {r.index for r in self.replicas if r.state != "dead"} - set(item.failed_on)
        return len(item.failed_on) >= ATTEMPTS and not untried

    def _final_error(self, item: WorkItem) -> str:
        replicas = " and ".join(str(i) for i in sorted(set(item.failed_on)))
        return f"failed on replica{'s' if len(set(item.failed_on)) > 1 else ''} {replicas}: {item.errors[-1]}"

    def _collect(self, ref: Any, queue: deque[WorkItem]) -> Outcome | None:
        replica = next(r for r in self.replicas if ref in r.in_flight)
        item = replica.in_flight.pop(ref)
        try:
            value = ray.get(ref)
        except RayTaskError as exc:  # the search raised: the replica is fine
            return self._failed(item, replica, _cause(exc), queue)
        except RayError as exc:  # the actor died (crash, kill, Ray's out-of-memory killer, lost node)
            self._lose_work(replica, [item, *replica.in_flight.values()], f"replica {replica.index} died: "
                            f"{_cause(exc)}", queue)
            replica.in_flight.clear()  # their calls fail too: no need to wait for them
            self._died(replica)
            return None
        replica.done += 1
        return Outcome(item.key, value)

    def _failed(self, item: WorkItem, replica: Replica, error: str, queue: deque[WorkItem]) -> Outcome | None:
        item.errors.append(error)
        item.failed_on.append(replica.index)
        if self._hopeless(item):
            return Outcome(item.key, error=self._final_error(item))
        self.retries += 1
        queue.appendleft(item)  # first in line for the next free replica
        return None

    def _lose_work(self, replica: Replica, items: list[WorkItem], error: str, queue: deque[WorkItem]) -> None:
        """A replica died or hung with `items` in flight. Only a suspect that ran alone is
        charged (it failed there); the others go back first in line, as suspects."""
        for item in reversed(items):
            if item.suspect and len(items) == 1:
                item.errors.append(error)
                item.failed_on.append(replica.index)
            else:
                item.suspect = True
                item.errors.append(error + " (not charged: other problems were in flight there)")
            self.retries += 1
            queue.appendleft(item)

    def _died(self, replica: Replica) -> None:
        """The first failed call of a dead replica: stop giving it work until Ray's restart
        answers a ping (calls to a restarting actor wait for it)."""
        self._forget_heartbeat(replica)
        if replica.state == "ready":
            replica.state = "restarting"
            self.restarts += 1
            self._pings[replica.handle.ready.remote()] = replica

    # -- heartbeats ----------------------------------------------------------------
    def _check_heartbeats(self, queue: deque[WorkItem]) -> None:
        now = time.monotonic()
        for replica in self.replicas:
            if replica.state != "ready" or not replica.in_flight:
                continue
            if replica.heartbeat is None:
                if now - replica.last_answer >= self._heartbeat_s:
                    replica.heartbeat, replica.heartbeat_sent = replica.handle.ready.remote(), now
                    self._heartbeats[replica.heartbeat] = replica
            elif now - replica.heartbeat_sent > self.hang_timeout_s:
                self._replace_hung(replica, queue)

    def _answered(self, ref: Any) -> None:
        replica = self._heartbeats.pop(ref)
        replica.heartbeat = None
        replica.last_answer = time.monotonic()  # a failed ping is a death: the work's calls say so

    def _forget_heartbeat(self, replica: Replica) -> None:
        if replica.heartbeat is not None:
            self._heartbeats.pop(replica.heartbeat, None)
            replica.heartbeat = None

    def _replace_hung(self, replica: Replica, queue: deque[WorkItem]) -> None:
        self._forget_heartbeat(replica)
        ray.kill(replica.handle, no_restart=True)
        self._lose_work(replica, list(replica.in_flight.values()),
                        f"replica {replica.index} hung (no heartbeat answered in {self.hang_timeout_s:g} s)", queue)
        replica.in_flight.clear()
        replica.handle = self._remote.remote(*self._args)
        replica.state = "replacing"
        self.replaced += 1
        self._pings[replica.handle.ready.remote()] = replica

    def _ping_later(self, replica: Replica) -> None:
        time.sleep(_REPING_S)  # a restarting actor may refuse calls at once: do not spin on it
        self._pings[replica.handle.ready.remote()] = replica

    def _revived(self, ref: Any) -> None:
        replica = self._pings.pop(ref)
        try:
            replica.info = ray.get(ref)
            replica.state = "ready"
            replica.last_answer = time.monotonic()
        except ActorUnavailableError:  # Ray has not restarted it yet: ask again
            self._ping_later(replica)
        except RayError:
            if replica.state == "restarting":
                self.restarts -= 1
            replica.state = "dead"
            self.lost += 1


def _cause(exc: Exception) -> str:
    """One line saying why: the remote exception's own message, not Ray's wrapping."""
    cause = getattr(exc, "cause", None)
    text = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
    return " ".join(text.split())[:500]
