#!/usr/bin/env python3
"""The tiled VAE decode spread over the ranks (docs/performance.md, "The decode over ranks"): the
decode stage's time of `fluxmpi --vae-tiling` on 2 ranks against 1, measured in one run with the
configurations taking turns. Standard library only.

  tools/bench/decode_bench.py [--build build] [--work /tmp/fluxmpi-decode-bench] [--repeat 3]
                              [--size 256] [--sample-size 128] [--dtype bf16]

The model: make-tiny-model's tiny transformer (the denoising is short) with FLUX.1's VAE widths
(block_out_channels 128, 256, 512, 512, 32 groups) and a tile of --sample-size pixels, so that a
--size image is decoded in FLUX.1's tile pattern at a smaller scale (256 px in 128-px tiles: 3 x 3
tiles, as FLUX.1 at 2048 px in 1024-px tiles). Each job runs with 1 thread per rank, bf16; the time
is the `decode` of fluxmpi's summary line on rank 0 (loading the decoder included; on 2 ranks the
helper loads its copy at the same time). The PNGs of the two rank counts must be identical.

A third configuration, 2 images on 1 rank (two passes), separates the decoder's loading from the
tiles: per pass = t(2 images) - t(1 image), loading = t(1 image) - per pass (at least 0). From these the
schedule model (tools/sim, fsim/decode.py) predicts the 2-rank decode: loading + its simulated
tiles (each tile's cost proportional to its pixels), printed beside the measurement.
"""
import argparse
import filecmp
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit("decode_bench: command failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stdout))
    return p.stdout


def fluxmpi(a, ranks, args):
    """(decode seconds, processor seconds of the job, output)."""
    cmd = [os.path.join(a.build, "fluxmpi"), "--threads", "1"] + args
    if a.sessions:
        cmd = ["setsid", "--wait"] + cmd
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks), "--bind-to", "none", "--oversubscribe"] + \
              (["--allow-run-as-root"] if os.geteuid() == 0 else []) + cmd
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = run(cmd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = re.search(r" decode ([0-9.]+) s \(peak", out)
    if not m:
        sys.exit("decode_bench: no decode time in the output:\n" + out)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return float(m.group(1)), cpu, out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default="/tmp/fluxmpi-decode-bench")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--size", type=int, default=256, help="image height and width in pixels")
    ap.add_argument("--sample-size", type=int, default=128, help="the VAE tile in pixels (its config sample_size)")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--sessions", action="store_true",
                    help="start every rank in a session of its own (setsid): with the kernel's autogroup scheduling "
                         "the ranks of one session share one session's processor time, so on a machine busy with "
                         "other sessions a job gets about the same processor time however many ranks it has")
    a = ap.parse_args()
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    model = os.path.join(a.work, "model-%d" % a.sample_size)
    if not os.path.exists(os.path.join(model, "model_index.json")):
        shutil.rmtree(model, ignore_errors=True)
        os.makedirs(a.work, exist_ok=True)
        run([os.path.join(a.build, "tools", "make_tiny_model", "make-tiny-model"), "--out", model, "--preset", "tiny",
             "--vae-channels", "128,256,512,512", "--vae-groups", "32", "--vae-sample-size", str(a.sample_size)])
    base = ["--model", model, "--prompt", "a harbour town at dusk", "--height", str(a.size), "--width", str(a.size),
            "--steps", "1", "--seed", "3", "--no-progress", "--dtype", a.dtype,
            "--vae-tiling"]
    flags = sorted(set(re.findall(r"\b(avx512_bf16|avx512f|avx2|fma|amx_bf16)\b", open("/proc/cpuinfo").read())))
    autogroup = open("/proc/sys/kernel/sched_autogroup_enabled").read().strip() == "1" \
        if os.path.exists("/proc/sys/kernel/sched_autogroup_enabled") else False
    print("# tiled decode, %d x %d px in %d-px tiles, %s, 1 thread per rank; CPU: %d cores, %s; autogroup %s; %s"
          % (a.size, a.size, a.sample_size, a.dtype, os.cpu_count(), " ".join(flags), "on" if autogroup else "off",
             "every rank in its own session" if a.sessions else "the ranks in one session"), flush=True)
    configs = [("1 rank", 1, 1), ("2 ranks", 2, 1), ("1 rank, 2 passes", 1, 2)]
    times = {tag: [] for tag, _, _ in configs}
    loads = []
    for i in range(a.repeat):
        for tag, ranks, images in configs:
            out_png = os.path.join(a.work, "r%d-%d-{i}.png" % (ranks, images))
            args = base + ["--num-images", str(images), "--microbatch", "1", "-o", out_png]
            t, cpu, _ = fluxmpi(a, ranks, args)
            loads.append(os.getloadavg()[0])
            print("  round %d, %s: decode %.2f s; processor time of the whole job %.2f s; load average %.2f"
                  % (i + 1, tag, t, cpu, loads[-1]), flush=True)
            times[tag].append(t)
    p1, p2 = (os.path.join(a.work, "r%d-1-00000.png" % r) for r in (1, 2))
    if not filecmp.cmp(p1, p2, shallow=False):
        sys.exit("decode_bench: the 2-rank PNG differs from the 1-rank PNG: %s %s" % (p1, p2))
    best = {tag: min(ts) for tag, ts in times.items()}
    med = {tag: statistics.median(ts) for tag, ts in times.items()}
    b1, b2, m1, m2 = best["1 rank"], best["2 ranks"], med["1 rank"], med["2 ranks"]
    print("| ranks | decode (best) | decode (median) | speed-up (best) | speed-up (median) |")
    print("|---|---|---|---|---|")
    print("| 1 | %.2f s | %.2f s | 1.00x | 1.00x |" % (b1, m1))
    print("| 2 | %.2f s | %.2f s | %.2fx | %.2fx |" % (b2, m2, b1 / b2, m1 / m2))
    print("PNGs of 1 and 2 ranks identical; load average during the runs %.2f-%.2f" % (min(loads), max(loads)))
    print("all times: " + "; ".join("%s %s" % (tag, "/".join("%.2f" % t for t in ts)) for tag, ts in times.items()))
    predict(a, best)


def predict(a, best):
    """The schedule model's 2-rank decode from the 1-rank measurements (best times)."""
    per_pass = best["1 rank, 2 passes"] - best["1 rank"]
    # Loading the decoder is a small part; noise can make the difference slightly negative.
    load = max(0.0, best["1 rank"] - per_pass)
    if per_pass <= 0:
        print("model: the 1-rank times do not separate loading from the tiles (%.2f s, %.2f s): no prediction"
              % (best["1 rank"], best["1 rank, 2 passes"]))
        return
    sim = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sim")
    sys.path.insert(0, sim)
    from fsim.decode import DecodePlan  # noqa: E402
    latent, tile = 2 * (a.size // 16), a.sample_size // 8
    plan = DecodePlan(latent, latent, tiled=True, tile=tile, scale=8)
    pixels = sum(plan.tile_pixels(k) for k in range(len(plan.grid)))
    with open(os.path.join(sim, "profiles", "local-cpu.json")) as f:
        profile = json.load(f)
    profile["costs"]["decode_tile"] = {"c0": 0.0, "c1": per_pass / pixels}
    path = os.path.join(a.work, "decode-profile.json")
    with open(path, "w") as f:
        json.dump(profile, f)
    r = json.loads(run([sys.executable, os.path.join(sim, "fluxsim.py"), "--profile", path, "--ranks", "2", "--images",
                        "1", "--steps", "1", "--height", str(a.size), "--width", str(a.size), "--max-sequence-length",
                        "32", "--vae-tiling", "--vae-tile", str(tile), "--json"]))
    predicted = load + r["decode_s"]
    print("model (tools/sim): loading %.2f s + %d tiles %.2f s a pass on 1 rank; 2 ranks predicted %.2f s (%s), "
          "measured %.2f s (%+.1f %%)" % (load, len(plan.grid), per_pass, predicted, r["vae"], best["2 ranks"],
                                           100.0 * (best["2 ranks"] - predicted) / predicted))

if __name__ == "__main__":
    main()
