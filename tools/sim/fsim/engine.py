"""The discrete-event engine: ranks are Python generators that yield actions, as a rank's code
calls MPI and libtorch; the engine advances simulated time.

Actions a rank program yields (tuples):
  ("compute", seconds, what)  run for `seconds` of work at full speed (see processor sharing)
  ("send", dst, Message)      MPI_Isend: returns at once; the message reaches dst after its link
  ("recv", src, key)          blocking receive of the next message from src (MPI's order per pair);
                              key None takes any message, else it must equal message.key (the
                              header check of parallel/message.h: a mismatch is a schedule bug)
  ("recv_any", [srcs])        blocking receive of the first message to arrive from any of srcs
                              (MPI_ANY_SOURCE: rank 0's inbox of the other leaders' messages)
  ("poll", [srcs])            the messages from srcs that have arrived by now, oldest first; never
                              blocks (MPI_Test on the inbox's posted receive)
  ("sleep", seconds)          wait without using the processor (a round trip to another rank)
  ("wait_sends",)             Messenger::wait_all: until every large message it sent has arrived
  ("mark", name, value)       record (time, name, value) in the rank's log; no time passes

Links: each ordered pair (src, dst) is a FIFO: a message departs when it is posted and the link is
free, occupies the link for bytes / bandwidth, and arrives `latency` per MPI message later (a
fluxmpi message is a header plus one MPI message per tensor). Contention between different pairs
(a shared NIC, a switch) is not modelled.

Processor sharing: ranks on one node share `cores` processors (None: every rank has its own device,
as one GPU per rank). While n > cores of them compute, each runs at cores / n of full speed; a
waiting rank uses no processor (fluxmpi's receives sleep while they poll).
"""
import heapq
import math
from collections import deque

EPS = 1e-12
# Open MPI's shared-memory eager limit (btl_vader_eager_limit, 4 KiB): an Isend this small is
# complete once posted; a larger one only when the receiver has it.
EAGER_BYTES = 4096


class Message:
    __slots__ = ("key", "nbytes", "parts", "payload", "arrival")

    def __init__(self, key, nbytes, parts=1, payload=None):
        self.key = key          # (kind, image, step, pass, patch) as MessageTag, or a marker
        self.nbytes = nbytes
        self.parts = parts      # MPI messages it takes (header + tensors)
        self.payload = payload  # what the receiver needs to know (the unit), not transferred data
        self.arrival = None


class Link:
    __slots__ = ("bandwidth", "latency")

    def __init__(self, bandwidth, latency):
        self.bandwidth = float(bandwidth)
        self.latency = float(latency)


class ScheduleError(Exception):
    """A rank received a message it did not expect, or the ranks deadlocked."""


class _Rank:
    __slots__ = ("gen", "node", "state", "rem", "last", "version", "waiting_src", "waiting_key",
                 "busy", "blocked", "block_start", "compute_start", "end", "last_arrival", "log", "blocked_at")

    def __init__(self, gen, node):
        self.gen = gen
        self.node = node
        self.state = "ready"
        self.rem = 0.0
        self.last = 0.0
        self.version = 0
        self.waiting_src = None
        self.waiting_key = None
        self.busy = 0.0
        self.blocked = 0.0
        self.block_start = None
        self.compute_start = None
        self.end = None
        self.last_arrival = 0.0
        self.log = []
        self.blocked_at = {}  # mark name -> seconds blocked before it


class Engine:
    """Runs rank programs. `node_of[r]` is rank r's node, `cores[node]` its processors (None:
    unshared), `link(src, dst)` the Link between two ranks."""

    def __init__(self, node_of, cores, link, capacity=None):
        self.node_of = list(node_of)
        self.cores = cores
        # capacity(n): processors n computing ranks of a node get (default: all `cores`); on a
        # shared machine less, as its scheduler gives the other users' processes their share.
        self.capacity = capacity
        self.link = link
        self.now = 0.0
        self._heap = []
        self._seq = 0
        self._inbox = {}
        self._link_free = {}
        self._active = {}  # node -> set of computing ranks (processor-shared nodes only)
        self.ranks = []
        self._last_received = None

    # --- public ---------------------------------------------------------------------------
    def run(self, programs):
        self.ranks = [_Rank(gen, self.node_of[r]) for r, gen in enumerate(programs)]
        for r in range(len(self.ranks)):
            self._resume(r, None)
        while self._heap:
            t, _, r, version = heapq.heappop(self._heap)
            rank = self.ranks[r]
            if version != rank.version:
                continue
            self._set_time(t)
            self._wake(r)
        stuck = [r for r, k in enumerate(self.ranks) if k.state != "done"]
        if stuck:
            desc = ", ".join("rank %d %s%s" % (r, self.ranks[r].state,
                                                " from %s %s" % (self.ranks[r].waiting_src, self.ranks[r].waiting_key)
                                                if self.ranks[r].state == "recv" else "") for r in stuck)
            raise ScheduleError("deadlock at t=%.6f: %s" % (self.now, desc))
        return self

    def result(self):
        return [{"busy": k.busy, "blocked": k.blocked, "end": k.end, "log": k.log, "blocked_at": k.blocked_at}
                for k in self.ranks]

    # --- internals -----------------------------------------------------------------------------
    def _set_time(self, t):
        if t < self.now - 1e-9:
            raise AssertionError("time went back: %r < %r" % (t, self.now))
        self.now = max(self.now, t)

    def _schedule(self, r, t):
        rank = self.ranks[r]
        rank.version += 1
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, r, rank.version))

    def _shared(self, node):
        return self.cores is not None and self.cores.get(node) is not None

    def _rate(self, node):
        if not self._shared(node):
            return 1.0
        n = len(self._active.get(node, ()))
        if n == 0:
            return 1.0
        cap = self.cores[node] if self.capacity is None else self.capacity(n)
        return min(1.0, cap / n)

    def _rebalance(self, node, change=None, add=True):
        """Charges the work done on `node` since the last change, applies `change`, reschedules."""
        active = self._active.setdefault(node, set())
        rate = self._rate(node)
        for r in active:
            k = self.ranks[r]
            k.rem -= (self.now - k.last) * rate
            k.last = self.now
        if change is not None:
            (active.add if add else active.discard)(change)
        rate = self._rate(node)
        for r in active:
            k = self.ranks[r]
            self._schedule(r, self.now + max(k.rem, 0.0) / rate)

    def _start_compute(self, r, seconds):
        k = self.ranks[r]
        k.state = "compute"
        k.rem = seconds
        k.last = self.now
        k.compute_start = self.now
        if self._shared(k.node):
            self._rebalance(k.node, r, True)
        else:
            self._schedule(r, self.now + seconds)

    def _end_compute(self, r):
        k = self.ranks[r]
        k.busy += self.now - k.compute_start
        k.compute_start = None
        if self._shared(k.node):
            self._rebalance(k.node, r, False)
            k.version += 1  # its own rescheduled wake is stale now

    def _block(self, r, state):
        k = self.ranks[r]
        k.state = state
        if k.block_start is None:
            k.block_start = self.now

    def _unblock(self, r):
        k = self.ranks[r]
        if k.block_start is not None:
            k.blocked += self.now - k.block_start
            k.block_start = None

    def _wake(self, r):
        k = self.ranks[r]
        if k.state == "compute":
            if self._shared(k.node):
                k.rem -= (self.now - k.last) * self._rate(k.node)
                k.last = self.now
                if k.rem > 1e-9:
                    self._schedule(r, self.now + k.rem / self._rate(k.node))
                    return
            self._end_compute(r)
            self._resume(r, None)
        elif k.state == "recv":
            if self._try_recv_now(r):
                self._resume(r, self._last_received)
        elif k.state in ("sleep", "wait_sends"):
            if k.state == "wait_sends" and k.last_arrival > self.now + EPS:
                self._schedule(r, k.last_arrival)
                return
            self._unblock(r)
            self._resume(r, None)

    def _post(self, src, dst, msg):
        link = self.link(src, dst)
        depart = max(self.now, self._link_free.get((src, dst), 0.0))
        wire = msg.nbytes / link.bandwidth if link.bandwidth > 0 and not math.isinf(link.bandwidth) else 0.0
        self._link_free[(src, dst)] = depart + wire
        msg.arrival = depart + wire + link.latency * msg.parts
        q = self._inbox.setdefault((src, dst), deque())
        q.append(msg)
        s = self.ranks[src]
        if msg.nbytes > EAGER_BYTES:  # a small send completes locally, a large one on delivery
            s.last_arrival = max(s.last_arrival, msg.arrival)
        d = self.ranks[dst] if dst < len(self.ranks) else None
        if d is not None and d.state == "recv" and d.waiting_src == src and q[0] is msg:
            self._schedule(dst, msg.arrival)
        elif d is not None and d.state == "recv" and isinstance(d.waiting_src, tuple) and src in d.waiting_src:
            heads = [self._inbox[(s, dst)][0].arrival for s in d.waiting_src if self._inbox.get((s, dst))]
            self._schedule(dst, min(heads))

    def _resume(self, r, value):
        k = self.ranks[r]
        while True:
            try:
                action = k.gen.send(value)
            except StopIteration:
                k.state = "done"
                k.end = self.now
                return
            value = None
            kind = action[0]
            if kind == "compute":
                if action[1] > 0:
                    self._start_compute(r, float(action[1]))
                    return
            elif kind == "send":
                self._post(r, action[1], action[2])
            elif kind == "recv":
                k.waiting_src, k.waiting_key = action[1], action[2]
                if not self._try_recv_now(r):
                    return
                value = self._last_received
            elif kind == "recv_any":
                k.waiting_src, k.waiting_key = tuple(action[1]), None
                if not self._try_recv_now(r):
                    return
                value = self._last_received
            elif kind == "poll":
                value = []
                while True:
                    msg = self._earliest_arrived(action[1], r)
                    if msg is None:
                        break
                    value.append(self._inbox[msg].popleft())
            elif kind == "sleep":
                if action[1] > 0:
                    self._block(r, "sleep")
                    self._schedule(r, self.now + action[1])
                    return
            elif kind == "wait_sends":
                if k.last_arrival > self.now + EPS:
                    self._block(r, "wait_sends")
                    self._schedule(r, k.last_arrival)
                    return
            elif kind == "mark":
                k.log.append((self.now, action[1], action[2]))
                k.blocked_at[action[1]] = k.blocked
            else:
                raise ValueError("unknown action %r" % (action,))

    def _earliest_arrived(self, srcs, r):
        """The inbox key (src, r) whose head message has arrived by now, earliest first; None."""
        best = None
        for src in srcs:
            q = self._inbox.get((src, r))
            if q and q[0].arrival <= self.now + EPS and (best is None or q[0].arrival < self._inbox[best][0].arrival):
                best = (src, r)
        return best

    def _try_recv_now(self, r):
        """A receive posted by a running program: returns True (and the message in
        _last_received) when it completes at once, else blocks the rank."""
        k = self.ranks[r]
        if isinstance(k.waiting_src, tuple):  # recv_any
            key = self._earliest_arrived(k.waiting_src, r)
            if key is not None:
                self._last_received = self._inbox[key].popleft()
                self._unblock(r)
                return True
            self._block(r, "recv")
            heads = [self._inbox[(s, r)][0].arrival for s in k.waiting_src if self._inbox.get((s, r))]
            if heads:
                self._schedule(r, min(heads))
            return False
        q = self._inbox.get((k.waiting_src, r))
        if q and q[0].arrival <= self.now + EPS:
            msg = q.popleft()
            if k.waiting_key is not None and msg.key != k.waiting_key:
                raise ScheduleError("rank %d expected %s from rank %d, got %s" % (r, k.waiting_key, k.waiting_src, msg.key))
            self._last_received = msg
            self._unblock(r)
            return True
        self._block(r, "recv")
        if q:
            self._schedule(r, q[0].arrival)
        return False
