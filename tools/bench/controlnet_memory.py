#!/usr/bin/python3
"""Peak RSS per rank of a ControlNet job against --dry-run's plan (docs/performance.md, "ControlNet:
memory against the plan"). Standard library only.

  tools/bench/controlnet_memory.py [--build build] [--work /tmp/fluxmpi-controlnet-memory]
                                   [--size 512] [--ranks 2] [--repeat 2] [--cn-double 1 --cn-single 2]

Makes the bench model (make-tiny-model --preset bench: width 768, 4 double + 8 single blocks) and a
random InstantX ControlNet of its width (fluxmpi-bench-controlnet --save-controlnet; 1 double + 2
single blocks by default, a quarter of the transformer's blocks as InstantX's), then runs one image
on --ranks ranks (1 thread each, fp32, 2 steps) without and with `--controlnet`, taking turns
--repeat times. Per rank: the slice weights and peak RSS (VmHWM, from the --log-level debug lines;
the largest over the turns) against the --dry-run plan's peak of that rank. --glibc-tunables T runs
the jobs with GLIBC_TUNABLES=T (e.g. glibc.malloc.mmap_threshold=131072: a fixed threshold, so that
freed weight-sized blocks go back to the system; docs/performance.md says why that matters here).
"""
import argparse, os, re, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from bench import MiB, cpu_flags, rank_memory, to_bytes  # noqa: E402  (tools/bench/bench.py)
import bench  # noqa: E402


def run(cmd):
    return bench.run(cmd)[0]


def mpirun(ranks):
    return ["mpirun", "-np", str(ranks), "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])


def plan_peaks(out):
    """Per rank, the plan table's peak memory and stage."""
    return [(to_bytes(m.group(1), m.group(2)), m.group(3))
            for m in re.finditer(r"^\s*\d+\s.*?([0-9.]+) (B|KiB|MiB|GiB|TiB)\s+(encode|denoise|decode)\b", out, re.M)]


def rank0_denoise(out, planned):
    """Rank 0's denoise stage: the plan's estimate (--dry-run) or the measured stage peak (summary line)."""
    m = re.search(r"rank 0 stages: .*?denoise ([0-9.]+) (\w+)" if planned else
                  r"summary: .*? denoise [0-9.]+ s \(peak ([0-9.]+) (\w+)\)", out)
    return to_bytes(m.group(1), m.group(2)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default="/tmp/fluxmpi-controlnet-memory")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--cn-double", type=int, default=1)
    ap.add_argument("--cn-single", type=int, default=2)
    ap.add_argument("--glibc-tunables", default="", help="GLIBC_TUNABLES for the measured jobs")
    a = ap.parse_args()
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    os.makedirs(a.work, exist_ok=True)
    model = os.path.join(a.work, "model")
    if not os.path.exists(os.path.join(model, "model_index.json")):
        run([os.path.join(a.build, "tools", "make_tiny_model", "make-tiny-model"), "--out", model, "--preset", "bench"])
    net = os.path.join(a.work, "controlnet-%dx%d" % (a.cn_double, a.cn_single))
    if not os.path.exists(os.path.join(net, "config.json")):
        run([os.path.join(a.build, "tools", "bench", "fluxmpi-bench-controlnet"), "--model", model, "--cn-double",
             str(a.cn_double), "--cn-single", str(a.cn_single), "--height", "64", "--width", "64", "--repeat", "1",
             "--save-controlnet", net])
    control = os.path.join(ROOT, "tests", "fixtures", "controlnet", "inputs", "edges_64x64.png")  # resized to --size
    base = [os.path.join(a.build, "fluxmpi"), "--model", model, "--prompt", "a mountain village at dawn", "--height",
            str(a.size), "--width", str(a.size), "--steps", "2", "--max-sequence-length", "128", "--seed", "1",
            "--threads", "1", "--dtype", "fp32", "--no-progress", "--log-level", "debug"]
    configs = [("plain", []), ("ControlNet", ["--controlnet", net, "--control-image", control])]
    load_before = open("/proc/loadavg").read().split()[:3]
    plans, runs, stage_plan, stage_peak = {}, {}, {}, {}
    for name, extra in configs:
        dry = run(mpirun(a.ranks) + base + extra + ["--dry-run"])
        plans[name], stage_plan[name] = plan_peaks(dry), rank0_denoise(dry, True)
    for _ in range(a.repeat):
        for name, extra in configs:
            tunables = ["-x", "GLIBC_TUNABLES=" + a.glibc_tunables] if a.glibc_tunables else []
            out = run(mpirun(a.ranks) + tunables + base + extra + ["-o", os.path.join(a.work, name + ".png")])
            m = rank_memory(out, a.ranks)
            stage_peak[name] = max(stage_peak.get(name) or 0, rank0_denoise(out, False) or 0)
            prev = runs.get(name)
            runs[name] = m if prev is None else [(w, max(p, q)) for (w, p), (_, q) in zip(m, prev)]
    load_after = open("/proc/loadavg").read().split()[:3]
    print("cpu: %s; load average before %s, after %s; %d ranks, 1 thread each, fp32, %dx%d, 2 steps, %d turns%s"
          % (cpu_flags(), " ".join(load_before), " ".join(load_after), a.ranks, a.size, a.size, a.repeat,
             "; GLIBC_TUNABLES=" + a.glibc_tunables if a.glibc_tunables else ""))
    print("| job | rank | slice weights | peak RSS | --dry-run peak (stage) | plan / RSS |")
    print("|---|---|---|---|---|---|")
    for name, _ in configs:
        for r, ((w, p), (e, stage)) in enumerate(zip(runs[name], plans[name])):
            print("| %s | %d | %s | %s | %.1f MiB (%s) | %s |" % (
                name, r, "%.1f MiB" % (w / MiB) if w else "?", "%.1f MiB" % (p / MiB) if p else "?", e / MiB, stage,
                "%.2f" % (e / p) if p else "?"))
    if "ControlNet" in runs and "plain" in runs:
        grow = ["rank %d %+.1f MiB" % (r, (c[1] - p[1]) / MiB) for r, (c, p) in enumerate(zip(runs["ControlNet"], runs["plain"]))
                if c[1] and p[1]]
        plan_grow = ["rank %d %+.1f MiB" % (r, (c[0] - p[0]) / MiB) for r, (c, p) in
                     enumerate(zip(plans["ControlNet"], plans["plain"]))]
        print("what the ControlNet adds: measured %s; planned %s" % (", ".join(grow), ", ".join(plan_grow)))
        print("rank 0's denoise stage (summary line against the plan's 'denoise'): plain %.1f MiB against %.1f MiB, "
              "ControlNet %.1f MiB against %.1f MiB: the ControlNet adds %+.1f MiB measured, %+.1f MiB planned" % (
                  stage_peak["plain"] / MiB, stage_plan["plain"] / MiB, stage_peak["ControlNet"] / MiB,
                  stage_plan["ControlNet"] / MiB, (stage_peak["ControlNet"] - stage_peak["plain"]) / MiB,
                  (stage_plan["ControlNet"] - stage_plan["plain"]) / MiB))


if __name__ == "__main__":
    main()
