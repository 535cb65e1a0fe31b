#!/usr/bin/env python3
"""Runs real fluxmpi jobs on this machine and compares their denoising time with the simulator's.

  python3 tools/sim/validate.py --build BUILD [--profile P.json] [--rounds 2] [--calibrate]

The jobs (the benchmark model, fp32, 1 thread a rank, `mpirun --oversubscribe --bind-to none`):
  exact    4 images x 4 steps, 256 x 256, 128 text tokens, on 1, 2 and 4 ranks
  patches  1 image x 6 steps, 512 x 512, 128 text tokens, --patches 4 --warmup-steps 1, 1/2/4 ranks
take turns for --rounds rounds (each keeps its best denoising time, the `summary:` line's
`denoise`). /proc/loadavg is recorded before every run, and while it runs the job's threads are
sampled (fsim/hostload.py, /proc/<pid>/schedstat): the share of a core a computing thread got,
and the cores the job got while it computed (1 and 2 on a quiet machine for 1 and 2+ ranks).
Two predictions, both with the plan each rank printed (`loaded blocks ...`) and the profile's
costs: on a quiet machine (processor sharing over os.cpu_count() cores: 4 ranks on 2 cores
here), and with the cores the job measurably got, split among whichever ranks compute (as Linux
splits a session's fair share among its runnable threads); the error is the second's. The cores
are a measured capacity, not a fitted time: a rank waiting for a message sleeps, so the
pipeline's bubbles stay the model's to predict.
  stages 2 8 images x 4 steps, 256 x 256, 128 text tokens, --stages 2 on 4 ranks (2 pipelines)
For the `--stages` row the measured time is fluxmpi's "made N images in X s" (from the first
denoising step to the last image written, decodes included: the pipelines end at different times)
and the prediction the simulator's span of the same (its total without the encode).
Target: within 15 %.
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from fsim.hostload import run_measured  # noqa: E402
from fsim.model import Profile  # noqa: E402
from fsim.simulate import Config, simulate  # noqa: E402

CASES = [
    # name, ranks, options of both the job and the simulation
    ("exact", 1, dict(images=4, steps=4, height=256, width=256, text_tokens=128)),
    ("exact", 2, dict(images=4, steps=4, height=256, width=256, text_tokens=128)),
    ("exact", 4, dict(images=4, steps=4, height=256, width=256, text_tokens=128)),
    ("patches 4", 1, dict(images=1, steps=6, height=512, width=512, text_tokens=128, patches=4, warmup=1)),
    ("patches 4", 2, dict(images=1, steps=6, height=512, width=512, text_tokens=128, patches=4, warmup=1)),
    ("patches 4", 4, dict(images=1, steps=6, height=512, width=512, text_tokens=128, patches=4, warmup=1)),
    ("stages 2", 4, dict(images=8, steps=4, height=256, width=256, text_tokens=128, stages=2)),
]


def find(build, name):
    for root, _, files in os.walk(build):
        if name in files and os.access(os.path.join(root, name), os.X_OK):
            return os.path.join(root, name)
    sys.exit("validate: no %s under %s" % (name, build))


def job_command(exe, model, ranks, o):
    cmd = [exe, "--model", model, "--prompt", "a lighthouse at dusk", "--num-images", str(o["images"]),
           "--steps", str(o["steps"]), "--height", str(o["height"]), "--width", str(o["width"]),
           "--max-sequence-length", str(o["text_tokens"]), "--threads", "1", "--dtype", "fp32", "--seed", "1",
           "--no-progress", "--log-level", "debug", "-o", "/tmp/fluxsim-validate/img-{i}.png"]
    if o.get("patches", 1) > 1:
        cmd += ["--patches", str(o["patches"]), "--warmup-steps", str(o["warmup"])]
    if o.get("stages"):
        cmd += ["--stages", str(o["stages"])]
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks), "--bind-to", "none", "--oversubscribe"] + cmd
    return cmd


def partition_of(out, ranks, num_double):
    """`--partition` text from each rank's `loaded blocks double 0-3, single 0-1` line."""
    spans = {}
    for m in re.finditer(r"rank (\d+)/\d+\]: loaded blocks ([^:]+):", out):
        lo, hi = None, None
        for kind, a, b in re.findall(r"(double|single) (\d+)(?:-(\d+))?", m.group(2)):
            off = 0 if kind == "double" else num_double
            first, last = int(a) + off, int(b or a) + off
            lo = first if lo is None else min(lo, first)
            hi = last if hi is None else max(hi, last)
        spans[int(m.group(1))] = (lo, hi)
    if ranks == 1 and not spans:
        return None
    return ",".join("%d:%d-%d" % (r, spans[r][0], spans[r][1]) for r in range(ranks))


def measure(cmd, ranks, num_double, stages=None):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    load = open("/proc/loadavg").read().split()[0]
    rc, stdout, share, cores, cpu = run_measured(cmd, env)
    if rc != 0:
        sys.exit("validate: job failed (%d): %s\n%s" % (rc, " ".join(cmd), stdout[-3000:]))
    m = re.search(r"made \d+ images? in ([0-9.]+) s" if stages else r"denoise ([0-9.]+) s \(peak", stdout)
    if not m:
        sys.exit("validate: no denoise time in:\n" + stdout[-3000:])
    blocked = {int(b.group(1)): float(b.group(2)) / 100 for b in
               re.finditer(r"rank (\d+)/\d+\]: denoised in [0-9.]+ s, [0-9.]+ s \(([0-9.]+) %\) blocked", stdout)}
    return {"denoise_s": float(m.group(1)), "load": float(load), "share": share, "cores": cores, "cpu_s": cpu, "blocked": blocked,
            "partition": partition_of(stdout, stages or ranks, num_double)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True)
    ap.add_argument("--profile", default=os.path.join(HERE, "profiles", "local-cpu.json"))
    ap.add_argument("--work", default="/tmp/fluxsim-cal", help="where calibrate.py made the bench model")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--calibrate", action="store_true", help="run calibrate.py first (also when no profile)")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--only", help="run only the cases of this name (e.g. 'stages 2')")
    a = ap.parse_args()
    os.makedirs("/tmp/fluxsim-validate", exist_ok=True)
    model = os.path.join(a.work, "bench-model")
    if a.calibrate or not os.path.exists(a.profile) or not os.path.isdir(model):
        subprocess.run([sys.executable, os.path.join(HERE, "calibrate.py"), "--build", a.build, "--work", a.work,
                        "--out", a.profile], check=True)
    profile = Profile.load(a.profile)
    exe = find(a.build, "fluxmpi")
    nd = profile.shape.num_double

    cases = [c for c in CASES if a.only is None or c[0] == a.only]
    if not cases:
        sys.exit("validate: no case named %r (%s)" % (a.only, ", ".join(sorted({c[0] for c in CASES}))))
    runs = {i: [] for i in range(len(cases))}
    for rnd in range(a.rounds):
        for i, (name, ranks, o) in enumerate(cases):
            r = measure(job_command(exe, model, ranks, o), ranks, nd, o.get("stages"))
            runs[i].append(r)
            print("round %d: %-9s %d rank(s): denoise %.2f s (load %.2f)" % (rnd + 1, name, ranks, r["denoise_s"],
                                                                           r["load"]), flush=True)
    rows = []
    for i, (name, ranks, o) in enumerate(cases):
        best = min(runs[i], key=lambda r: r["denoise_s"])
        quiet = simulate(profile, Config(ranks=ranks, partition=best["partition"], **o))
        # The cores the job's group got while it computed, split among its computing ranks
        # (Linux shares the processors fairly between sessions: fsim/hostload.py).
        cores = {n: best["cores"] for n in range(1, ranks + 1)}
        shared = simulate(profile, Config(ranks=ranks, partition=best["partition"], capacity=cores, **o))
        if o.get("stages"):  # the pipelines' span, decodes included, against "made N images in X s"
            quiet["denoise_s"] = quiet["total_s"] - quiet["encode_s"]
            shared["denoise_s"] = shared["total_s"] - shared["encode_s"]
        err = (shared["denoise_s"] - best["denoise_s"]) / best["denoise_s"]
        rows.append({"case": name, "ranks": ranks, "measured_s": best["denoise_s"],
                     "all_measured_s": [r["denoise_s"] for r in runs[i]], "loads": [r["load"] for r in runs[i]],
                     "shares": [r["share"] for r in runs[i]], "cores": [r["cores"] for r in runs[i]],
                     "predicted_quiet_s": quiet["denoise_s"], "predicted_s": shared["denoise_s"], "error": err,
                     "partition": best["partition"],
                     "measured_blocked": [best["blocked"].get(k) for k in range(ranks)] if ranks > 1 else [],
                     "predicted_blocked": shared["blocked_share"] if ranks > 1 else []})
    print()
    print("| case | ranks | measured denoise: best (all runs) | load avg at each run | share of a core per "
          "computing thread / cores the job got, each run | predicted, quiet machine | predicted with the "
          "best run's cores | error | blocked, measured / predicted |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        blocked = " ".join("%.0f/%.0f%%" % (100 * m, 100 * p) for m, p in zip(r["measured_blocked"],
                                                                             r["predicted_blocked"]) if m is not None)
        print("| %s | %d | %.2f s (%s) | %s | %s | %.2f s | %.2f s | %+.1f %% | %s |" % (
            r["case"], r["ranks"], r["measured_s"], ", ".join("%.2f" % x for x in r["all_measured_s"]),
            ", ".join("%.2f" % x for x in r["loads"]),
            ", ".join("%.2f / %.2f" % (a, b) for a, b in zip(r["shares"], r["cores"])),
            r["predicted_quiet_s"], r["predicted_s"], 100 * r["error"], blocked or "-"))
    worst = max(abs(r["error"]) for r in rows)
    print("\nlargest error %.1f %% (target 15 %%)" % (100 * worst))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
