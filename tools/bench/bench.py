#!/usr/bin/env python3
"""The benchmarks of docs/performance.md, measured in one run so that their ratios are fair on a
noisy machine. Standard library only.

  tools/bench/bench.py [--build build] [--work /tmp/fluxmpi-bench] [--repeat 3]

Makes the benchmark model (make-tiny-model --preset bench) and measures, with 1 thread per rank:
  1. throughput of 4 images: 2 ranks against 1 rank (target >= 1.8x);
  2. time of one image: 2 ranks against 1 rank (target <= 1.05x: the pipeline's own overhead);
  3. per-rank peak RSS against the weight bytes of its slice (target <= 1.15x + 400 MB), and the
     --dry-run estimate against the measured peak (target within 20 %);
  4. the transformer forward's FLOP rate against the matmul peak (fluxmpi-bench-matmul).
Times are the denoising stage as fluxmpi reports it (start-up, encoding and decoding excluded);
the configurations take turns --repeat times and each keeps its best time.

  tools/bench/bench.py --patches [--size 512 --steps 28 --repeat 1] [--runs exact1,m4w1]  # 25 min quiet

measures patch pipelining instead (docs/performance.md): one image, 2 ranks x 1 thread with
--patches M --warmup-steps W for M = 2, 4, 8 and W = 1, 2, 4 against 1 rank x 1 thread exact (and
2 ranks exact), then one image with true CFG; the speed-up of each against the 1-rank exact run,
and its drift from it (fluxmpi-bench-drift: the final latents' relative difference and the decoded
image's PSNR). --runs keeps only the named runs (tags as in the table: exact1, exact2, m<M>w<W>,
cfg-exact1, cfg-m4w1; exact1, the reference, always runs), e.g. --runs exact1,m4w1 --repeat 2 for the
headline number alone (about 5 min); --runs also takes m3w1 and np4-m4w1, np4-m6w1, np4-m8w1 (4 ranks x 1
thread, oversubscribed on fewer than 4 cores).

  tools/bench/bench.py --stages [--images 8 --repeat 3] [--sessions]   # about 6 min on a quiet machine

measures several pipelines in one job instead (docs/performance.md): images an hour of one rank x 1
thread, of two 1-rank pipelines (-np 2 --stages 1, 1 thread each; target >= 1.9x) and of one
2-rank pipeline (-np 2, the GPipe schedule), taking turns, each with a checkpoint; the rate is
fluxmpi's "made N images in X s" line (from the first denoising step to the last image written:
start-up, loading and encoding excluded; the whole run's wall time is printed beside it). Then
checks that the three runs' PNGs are identical.

With the kernel's autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled) the processes of
one session share one session's processor time: on a machine busy with other sessions a 2-rank job
then gets about the cores of a 1-rank job, and no schedule can beat 1x. --sessions starts every
rank in a session of its own (setsid), as separate logins or a batch system's job steps would be;
on a quiet machine both ways give the same numbers. The table's "cores it got" column (processor
seconds / wall seconds of the whole run) shows which case a run was in.
"""
import argparse, os, re, resource, shutil, subprocess, sys, time

MiB = 1024.0 * 1024.0
UNITS = {"B": 1, "KiB": 1024.0, "MiB": MiB, "GiB": MiB * 1024, "TiB": MiB * 1024 * 1024}


def to_bytes(number, unit):
    return float(number) * UNITS[unit]


def run(cmd, env=None):
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode != 0:
        sys.exit("bench: command failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stdout))
    return p.stdout, time.time() - t0


def fluxmpi(build, ranks, args, rate=False, sessions=False):
    exe = os.path.join(build, "fluxmpi")
    cmd = [exe, "--threads", "1"] + args
    if sessions:
        cmd = ["setsid", "--wait"] + cmd
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks), "--bind-to", "none", "--oversubscribe"] + \
              (["--allow-run-as-root"] if os.geteuid() == 0 else []) + cmd
    out, wall = run(cmd)
    if rate:
        m = re.search(r"made (\d+) images? in ([0-9.]+) s on \d+ pipelines?", out)
        if not m:
            sys.exit("bench: no 'made N images' line in the output:\n" + out)
        return float(m.group(2)), wall, out
    m = re.search(r"denoise ([0-9.]+) s \(peak", out)
    if not m:
        sys.exit("bench: no denoise time in the output:\n" + out)
    return float(m.group(1)), wall, out


def rank_memory(out, ranks):
    """Per rank: (slice weight bytes, peak RSS bytes) from the --log-level debug lines."""
    weights, peaks = {}, {}
    for m in re.finditer(r"fluxmpi\[rank (\d+)/\d+\]: loaded blocks .*?: \d+ tensors, ([0-9.]+) (\w+)", out):
        weights[int(m.group(1))] = to_bytes(m.group(2), m.group(3))
    for m in re.finditer(r"fluxmpi\[rank (\d+)/\d+\]: .*peak RSS(?: of rank \d+)? ([0-9.]+) (\w+)", out):
        peaks[int(m.group(1))] = to_bytes(m.group(2), m.group(3))
    return [(weights.get(r), peaks.get(r)) for r in range(ranks)]


def dry_run_peaks(build, ranks, args):
    exe = os.path.join(build, "fluxmpi")
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else []) + \
          [exe, "--dry-run"] + args
    out, _ = run(cmd)
    return out


def drift(build, run_h5, exact_h5, run_png, exact_png):
    out, _ = run([os.path.join(build, "tools", "bench", "fluxmpi-bench-drift"), run_h5, exact_h5, run_png, exact_png])
    m = re.search(r"latents relative ([0-9.e+-]+|inf|nan), max \|diff\| ([0-9.e+-]+|inf|nan); image PSNR ([0-9.]+|inf) dB", out)
    if not m:
        sys.exit("bench: no drift in the output:\n" + out)
    return float(m.group(1)), float(m.group(3))


def patches_bench(a, model):
    """One image: 2 ranks with --patches M --warmup-steps W against 1 rank exact."""
    size, steps = a.size, a.steps
    base = ["--model", model, "--prompt", "a mountain village at dawn", "--height", str(size), "--width", str(size),
            "--steps", str(steps), "--max-sequence-length", "128", "--seed", "1", "--no-progress", "--log-level", "debug", "--dtype", "fp32"]
    cfg = ["--true-cfg", "2", "--negative-prompt", "blurry, low quality"]
    # (tag, ranks, options): the exact 1-rank reference runs again in the middle of the patched
    # runs (each keeps its best time), so that a slow spell of the machine hits them alike.
    patched = [("m%dw%d" % (m, w), 2, ["--patches", str(m), "--warmup-steps", str(w)]) for w in (1, 2, 4) for m in (2, 4, 8)]
    # Only with --runs: M = 3 on 2 ranks, and 4 ranks x 1 thread (np4-m<M>w1; oversubscribed on a
    # machine of fewer than 4 cores, where the ratio cannot pass the cores it has).
    extra_runs = [("m3w1", 2, ["--patches", "3", "--warmup-steps", "1"])] + \
                 [("np4-m%dw1" % m, 4, ["--patches", str(m), "--warmup-steps", "1"]) for m in (4, 6, 8)]
    configs = [("exact1", 1, []), ("exact2", 2, [])] + patched[:3] + [("exact1", 1, [])] + patched[3:]
    configs += [("cfg-exact1", 1, cfg), ("cfg-m4w1", 2, cfg + ["--patches", "4", "--warmup-steps", "1"])]
    if a.runs:
        keep = set(a.runs.split(",")) | {"exact1"}
        configs += [c for c in extra_runs if c[0] in keep]
        patched += [c for c in extra_runs if c[0] in keep]
        unknown = keep - {tag for tag, _, _ in configs}
        if unknown:
            sys.exit("bench: --runs: no run named %s" % ", ".join(sorted(unknown)))
        configs = [c for c in configs if c[0] in keep]
        patched = [c for c in patched if c[0] in keep]
        if "cfg-m4w1" in keep:
            keep.add("cfg-exact1")
            configs = [c for c in configs if c[0] != "cfg-exact1"] + [("cfg-exact1", 1, cfg)]
            configs.sort(key=lambda c: c[0] == "cfg-m4w1")
    best = {}
    for _ in range(a.repeat):
        for tag, ranks, extra in configs:
            h5 = os.path.join(a.work, tag + ".h5")
            if os.path.exists(h5):
                os.remove(h5)
            t, _, out = fluxmpi(a.build, ranks, base + extra + ["--checkpoint", h5, "-o", os.path.join(a.work, tag + ".png")])
            blocked = ["%s%%" % m.group(1) for m in re.finditer(r"denoised in [0-9.]+ s, [0-9.]+ s \(([0-9.]+) %\) blocked", out)]
            print("  %s (%d rank%s): %.2f s%s; load average %.1f" % (tag, ranks, "" if ranks == 1 else "s", t,
                  ", blocked on messages " + "/".join(blocked) if blocked else "", os.getloadavg()[0]), flush=True)
            best.setdefault(tag, []).append(t)
    times = {tag: min(ts) for tag, ts in best.items()}
    flags = sorted(set(re.findall(r"\b(avx512_bf16|avx512f|avx2|fma|amx_bf16)\b", open("/proc/cpuinfo").read())))
    print()
    print("# patch pipelining: %s, %d x %d, %d steps, 1 image, fp32, 1 thread per rank, best of %d; CPU flags: %s"
          % (model, size, size, steps, a.repeat, " ".join(flags)))
    print("| run | ranks | denoising time | speed-up vs 1 rank exact | final latents rel. diff | image PSNR vs exact |")
    print("|---|---|---|---|---|---|")
    w = lambda tag: (os.path.join(a.work, tag + ".h5"), os.path.join(a.work, tag + ".png"))
    for tag, ranks, _ in [("exact1", 1, None), ("exact2", 2, None)] + [(t, r, None) for t, r, _ in patched]:
        if tag not in times:
            continue
        rel, psnr = drift(a.build, w(tag)[0], w("exact1")[0], w(tag)[1], w("exact1")[1])
        print("| %s | %d | %.2f s | %.3fx | %.3g | %s |" % (tag, ranks, times[tag], times["exact1"] / times[tag], rel,
                                                        "identical" if psnr == float("inf") else "%.2f dB" % psnr))
    for tag, ranks in (("cfg-exact1", 1), ("cfg-m4w1", 2)):
        if tag not in times or "cfg-exact1" not in times:
            continue
        rel, psnr = drift(a.build, w(tag)[0], w("cfg-exact1")[0], w(tag)[1], w("cfg-exact1")[1])
        print("| %s (true CFG) | %d | %.2f s | %.3fx | %.3g | %s |" % (tag, ranks, times[tag], times["cfg-exact1"] / times[tag],
                                                                   rel, "identical" if psnr == float("inf") else "%.2f dB" % psnr))
    print("(all times: %s)" % ", ".join("%s %s" % (t, "/".join("%.1f" % x for x in ts)) for t, ts in best.items()))


def cpu_flags():
    return " ".join(sorted(set(re.findall(r"\b(avx512_bf16|avx512f|avx2|fma|amx_bf16)\b", open("/proc/cpuinfo").read()))))


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def autogroup():
    path = "/proc/sys/kernel/sched_autogroup_enabled"
    return os.path.exists(path) and open(path).read().strip() == "1"


def stages_bench(a, model):
    """Images an hour: 1 rank against two 1-rank pipelines and one 2-rank pipeline, taking turns.
    Each run's processor time (all its processes, the whole run) says how many cores it got (CPU
    seconds / wall seconds) and whether the pipelines cost any extra work (the same CPU seconds as
    one rank: no overhead; the ratio is then bounded by the cores the machine had free)."""
    n = a.images
    base = ["--model", model, "--prompt", "a mountain village at dawn", "--height", str(a.size), "--width", str(a.size),
            "--steps", str(a.steps), "--max-sequence-length", "128", "--seed", "1", "--no-progress", "--log-level", "debug",
            "--dtype", "fp32", "--num-images", str(n)]
    configs = [("one rank", 1, []), ("2 pipelines x 1 rank", 2, ["--stages", "1"]), ("1 pipeline x 2 ranks", 2, [])]
    print("# --stages benchmark: %d x %d, %d steps, %d images, fp32, 1 thread per rank; CPU: %d cores, %s; autogroup %s; %s"
          % (a.size, a.size, a.steps, n, os.cpu_count(), cpu_flags(), "on" if autogroup() else "off",
             "every rank in its own session" if a.sessions else "the ranks in one session"), flush=True)
    best, walls, loads, cpu = {}, {}, [], {}
    for rep in range(a.repeat):
        for k, (tag, ranks, extra) in enumerate(configs):
            stem = os.path.join(a.work, "stages-%d" % k)
            if os.path.exists(stem + ".h5"):
                os.remove(stem + ".h5")
            loads.append(os.getloadavg()[0])
            c0 = children_cpu()
            t, wall, out = fluxmpi(a.build, ranks, base + extra + ["--checkpoint", stem + ".h5", "-o", stem + "-{i}.png"],
                                   rate=True, sessions=a.sessions)
            c = children_cpu() - c0
            taken = re.findall(r"fluxmpi\[rank (\d+)/\d+\]: .*?(\d+) work group\(s\) taken", out)
            print("  round %d, %s: %d images in %.2f s = %.0f images/hour (wall %.1f s, CPU %.1f s: %.2f cores)%s; "
                  "load average %.2f" % (rep + 1, tag, n, t, 3600.0 * n / t, wall, c, c / wall,
                                         "; groups taken " + ", ".join("rank %s: %s" % x for x in taken) if taken else "",
                                         loads[-1]), flush=True)
            best.setdefault(tag, []).append(t)
            walls.setdefault(tag, []).append(wall)
            cpu.setdefault(tag, []).append((c, c / wall))
    loads.append(os.getloadavg()[0])
    times = {tag: min(ts) for tag, ts in best.items()}
    wall = {tag: min(ts) for tag, ts in walls.items()}
    one, one_wall = times["one rank"], wall["one rank"]
    print()
    print("best of %d; load average (1 min) at the starts and the end: %s" % (a.repeat, "/".join("%.2f" % x for x in loads)))
    print("| run | ranks | time for %d images | images/hour | vs one rank | target | whole run's wall time (vs one rank) "
          "| CPU s of the whole run (min) | cores it got (max) |" % n)
    print("|---|---|---|---|---|---|---|---|---|")
    for tag, ranks, _ in configs:
        target = ">= 1.9x" if tag.startswith("2 pipelines") else ""
        print("| %s | %d | %.2f s | %.0f | %.2fx | %s | %.1f s (%.2fx) | %.1f s | %.2f |" % (
            tag, ranks, times[tag], 3600.0 * n / times[tag], one / times[tag], target, wall[tag], one_wall / wall[tag],
            min(x[0] for x in cpu[tag]), max(x[1] for x in cpu[tag])))
    print("(all times: %s)" % "; ".join("%s %s" % (t, "/".join("%.2f" % x for x in ts)) for t, ts in best.items()))
    same = all(open(os.path.join(a.work, "stages-0-%05d.png" % i), "rb").read() ==
               open(os.path.join(a.work, "stages-%d-%05d.png" % (c, i)), "rb").read() for c in (1, 2) for i in range(n))
    print("PNGs of the three runs identical: %s" % ("yes" if same else "NO"))
    if not same:
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default="/tmp/fluxmpi-bench")
    ap.add_argument("--repeat", type=int, default=None, help="3; 1 with --patches")
    ap.add_argument("--size", type=int, default=None, help="image height and width (256; 512 with --patches)")
    ap.add_argument("--steps", type=int, default=None, help="denoising steps (4; 28 with --patches)")
    ap.add_argument("--patches", action="store_true", help="the patch-pipelining benchmark instead")
    ap.add_argument("--runs", default="", help="with --patches: only these runs (comma-separated tags; exact1 always)")
    ap.add_argument("--stages", action="store_true", help="the several-pipelines benchmark instead (--stages 1 on 2 ranks)")
    ap.add_argument("--images", type=int, default=8, help="images of the --stages benchmark")
    ap.add_argument("--sessions", action="store_true",
                    help="--stages: start every rank in a session of its own (setsid), for the kernel's autogroup scheduling")
    a = ap.parse_args()
    if a.repeat is None:
        a.repeat = 1 if a.patches else 3
    if a.size is None:
        a.size = 512 if a.patches else 256
    if a.steps is None:
        a.steps = 28 if a.patches else 4
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    model = os.path.join(a.work, "model")
    if not os.path.exists(os.path.join(model, "model_index.json")):
        shutil.rmtree(model, ignore_errors=True)
        os.makedirs(a.work, exist_ok=True)
        run([os.path.join(a.build, "tools", "make_tiny_model", "make-tiny-model"), "--out", model, "--preset", "bench"])
    if a.patches:
        patches_bench(a, model)
        return
    if a.stages:
        stages_bench(a, model)
        return
    base = ["--model", model, "--prompt", "a mountain village at dawn", "--height", str(a.size), "--width", str(a.size),
            "--steps", str(a.steps), "--max-sequence-length", "128", "--seed", "1", "--no-progress", "--log-level", "debug", "--dtype", "fp32",
            "-o", os.path.join(a.work, "bench-{i}.png")]

    # The configurations take turns, repeat after repeat, so that a slow spell of the machine
    # hits them alike; each keeps its best time.
    configs = [(1, []), (2, []), (1, ["--num-images", "4"]), (2, ["--num-images", "4"])]
    results = [None] * len(configs)
    for _ in range(a.repeat):
        for i, (ranks, extra) in enumerate(configs):
            r = fluxmpi(a.build, ranks, base + extra)
            if results[i] is None or r[0] < results[i][0]:
                results[i] = r

    print("# fluxmpi benchmark: %s, %d x %d, %d steps, 1 thread per rank, best of %d" % (model, a.size, a.size, a.steps, a.repeat))
    (one_1, _, _), (one_2, _, out_2), (four_1, _, _), (four_2, _, out_4) = results
    print("| measurement | 1 rank | 2 ranks | ratio | target |")
    print("|---|---|---|---|---|")
    print("| 4 images, denoising time | %.2f s | %.2f s | %.2fx throughput | >= 1.8x |" % (four_1, four_2, four_1 / four_2))
    print("| 1 image, denoising time | %.2f s | %.2f s | %.3fx time | <= 1.05x |" % (one_1, one_2, one_2 / one_1))
    print()
    print("Where the time of the 4-image 2-rank run goes (per rank: computing, blocked on messages):")
    for m in re.finditer(r"fluxmpi\[rank (\d+)/\d+\]: denoised in ([0-9.]+) s, ([0-9.]+) s \(([0-9.]+) %\) blocked", out_4):
        total, blocked = float(m.group(2)), float(m.group(3))
        print("  rank %s: %.2f s computing, %.2f s (%s %%) blocked" % (m.group(1), total - blocked, blocked, m.group(4)))
    print("  one rank alone: %.2f s for all the blocks; half of it: %.2f s" % (four_1, four_1 / 2))
    print()
    dry = dry_run_peaks(a.build, 2, base[:-2] + ["--num-images", "1"])
    est = [to_bytes(m.group(1), m.group(2))
           for m in re.finditer(r"^\s*\d+\s.*?([0-9.]+) (B|KiB|MiB|GiB|TiB)\s+(?:encode|denoise|decode)\b", dry, re.M)]
    print("| rank | slice weights | peak RSS | RSS / (1.15 x weights + 400 MB) | dry-run estimate | estimate / RSS |")
    print("|---|---|---|---|---|---|")
    for r, (w, p) in enumerate(rank_memory(out_2, 2)):
        bound = 1.15 * w + 400e6 if w else None
        e = est[r] if r < len(est) else None
        print("| %d | %s | %s | %s | %s | %s |" % (r, "%.1f MiB" % (w / MiB) if w else "?", "%.1f MiB" % (p / MiB) if p else "?",
              "%.2f" % (p / bound) if p and bound else "?", "%.1f MiB" % (e / MiB) if e else "?",
              "%.2f" % (e / p) if e and p else "?"))
    print()
    print("--dry-run table of the 2-rank run:")
    print(dry)
    for dtype in ("fp32", "bf16"):
        out, _ = run([os.path.join(a.build, "tools", "bench", "fluxmpi-bench-matmul"), "--model", model, "--height", str(a.size),
                      "--width", str(a.size), "--msl", "128", "--dtype", dtype, "--threads", "1",
                      "--repeat", "5" if dtype == "fp32" else "1"])  # a bf16 forward takes about a minute here
        print(out.strip())


if __name__ == "__main__":
    main()
