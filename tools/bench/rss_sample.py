#!/usr/bin/python3
"""What each fluxmpi process of a command holds over time: anonymous memory and shared-library (file)
pages, sampled from /proc/PID/status (docs/performance.md, "ControlNet: memory against the plan").
Standard library only.

  tools/bench/rss_sample.py [--every 0.01] [--out samples.tsv] -- mpirun -np 2 build/fluxmpi ...

Runs the command (its output goes to this script's standard error), samples every fluxmpi process
that it is or starts every --every seconds, and prints per process its peak VmRSS split into RssAnon
and RssFile, and the largest RssFile seen; --out keeps every sample (seconds since the start, pid,
VmRSS, RssAnon, RssFile, in MiB), where the plateau before the weights load is the runtime. Exits
with the command's status.
"""
import argparse, subprocess, sys, time

FIELDS = ("VmRSS", "RssAnon", "RssFile")


def descendants(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            kids = [int(x) for x in f.read().split()]
    except OSError:
        return []
    return kids + [d for k in kids for d in descendants(k)]


def sample(pid):
    """(VmRSS, RssAnon, RssFile) in MiB of a fluxmpi process, or None."""
    try:
        with open("/proc/%d/status" % pid) as f:
            text = f.read()
    except OSError:
        return None
    if "Name:\tfluxmpi\n" not in text:
        return None
    values = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in FIELDS:
            values[name] = int(rest.split()[0]) / 1024.0
    return tuple(values.get(f, 0.0) for f in FIELDS)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--every", type=float, default=0.01, help="seconds between samples")
    ap.add_argument("--out", help="a TSV file of every sample")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        sys.exit("rss_sample: no command (put it after --)")
    proc = subprocess.Popen(cmd, stdout=sys.stderr)
    start, rows, peak, files = time.time(), [], {}, {}
    while proc.poll() is None:
        for pid in [proc.pid] + descendants(proc.pid):
            s = sample(pid)
            if s is None or s[0] == 0:
                continue
            rows.append((time.time() - start, pid) + s)
            files[pid] = max(files.get(pid, 0.0), s[2])
            if s[0] > peak.get(pid, (0.0,))[0]:
                peak[pid] = s
        time.sleep(a.every)
    if a.out:
        with open(a.out, "w") as f:
            f.write("seconds\tpid\tVmRSS\tRssAnon\tRssFile\n")
            f.writelines("%.3f\t%d\t%.1f\t%.1f\t%.1f\n" % r for r in rows)
    print("| process | peak RSS (anonymous + file) | largest file part |")
    print("|---|---|---|")
    for pid in sorted(peak):
        print("| %d | %.1f MiB (%.1f + %.1f) | %.1f MiB |" % ((pid,) + peak[pid] + (files[pid],)))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
