"""How much of a processor a process tree got on a shared machine (Linux /proc/<pid>/schedstat).

For every thread, schedstat holds the time it ran on a CPU and the time it waited, runnable, on a
run queue. Sampled every 0.2 s, the intervals in which a thread wanted a processor most of the
time (run + wait >= half the interval: it was computing) give share = run / (run + wait) over
them: the speed at which the job's threads computed, 1.0 on a quiet machine, less when other
processes (or more ranks than cores) took the processors. Intervals of a thread that mostly slept
(a rank polling for a message wakes up every 200 us and may wait on the run queue each time) are
left out, so waiting for messages does not lower the share."""
import os
import subprocess
import threading
import time


def _children(pid_table, root):
    kids = {}
    for pid, ppid in pid_table.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _ppids():
    t = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    t[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return t


class TreeShare:
    """Samples the schedstat of every thread of a process tree every `period` seconds."""

    def __init__(self, root, period=0.2):
        self.root, self.period = root, period
        self.last = {}  # (pid, tid) -> (run ns, wait ns, time ns)
        self.run_ns = self.wait_ns = self.all_run_ns = 0
        self.busy_wall_ns = 0  # sampled intervals in which at least one thread computed
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _sample(self):
        now = time.monotonic_ns()
        interval, computing = 0, False
        for pid in _children(_ppids(), self.root):
            try:
                tids = os.listdir("/proc/%d/task" % pid)
            except OSError:
                continue
            for tid in tids:
                try:
                    with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                        run, wait, _ = (int(x) for x in f.read().split())
                except (OSError, ValueError):
                    continue
                prev = self.last.get((pid, tid))
                if prev is not None:
                    dr, dw, dt = run - prev[0], wait - prev[1], now - prev[2]
                    self.all_run_ns += dr
                    if dt > 0 and dr + dw >= dt / 2:
                        self.run_ns += dr
                        self.wait_ns += dw
                        interval, computing = max(interval, dt), True
                else:
                    self.all_run_ns += run
                self.last[(pid, tid)] = (run, wait, now)
        if computing:
            self.busy_wall_ns += interval

    def _run(self):
        while not self.stop.wait(self.period):
            self._sample()

    def finish(self):
        """(share, cores, cpu seconds) of the tree up to its last sample: cores is the processor
        time its computing threads got per second while any of them computed (what a fair
        scheduler gave the job's group: it splits that among however many compute)."""
        self.stop.set()
        self.thread.join()
        total = self.run_ns + self.wait_ns
        share = self.run_ns / total if total > 0 else 1.0
        cores = self.run_ns / self.busy_wall_ns if self.busy_wall_ns > 0 else None
        return share, cores, self.all_run_ns / 1e9


def run_measured(cmd, env=None):
    """Runs cmd; returns (returncode, output, share, cores, cpu seconds)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    s = TreeShare(p.pid)
    out, _ = p.communicate()
    share, cores, cpu = s.finish()
    return p.returncode, out, share, cores, cpu
