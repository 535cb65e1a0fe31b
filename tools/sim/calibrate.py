#!/usr/bin/env python3
"""Derives a simulator profile from costs measured on this machine.

  python3 tools/sim/calibrate.py --build BUILD [--model DIR] [--out PROFILE.json] [--threads 1]
                                 [--dtype fp32] [--repeat 5] [--rounds 2]

1. Blocks: fluxmpi-bench-matmul times whole transformer forwards of the model's own config with
   1 and 3 double blocks (no single blocks) and 1 and 3 single blocks (no double blocks), at
   several token counts n (image tokens of the size + text tokens of --msl), each time scaled by
   the share of a processor the bench process got (fsim/hostload.py). The difference of 3
   and 1 blocks over 2 is one block's time; what is left of the 1-block forward is the embedders
   and the final layer. Each block type's times are fitted by least squares to
   c0 + c1 n + c2 n^2, which the simulator applies as c0 + c1 q + c2 q kv to a unit of q query
   tokens attending to kv keys (c2: attention, c1: the linear layers, c0: per-call overhead).
   The embedders + final layer are fitted to e0 + e_img n_img + e_txt n_txt and split half and
   half between the two (their FLOPs per image token are equal: in_channels x D each way).
   The same processes also time one pipelined step of PATCHES patches (`--patches`: each patch's
   rows through every block with the key/value caches, the modulation once per step), and the
   3-minus-1 differences of those steps, P calls of a block whose queries add up to n and
   each read all n keys, are fitted to P c0 + c1 n + c2 n^2: the `*_block_patch` costs the
   simulator charges a patch unit (c0 per call; a patch is cheaper than the whole-sequence fit
   says, since its GEMMs stay as efficient and the modulation is not recomputed).
2. Encode, decode and checkpoint costs: one-rank fluxmpi jobs (2 images, 4 steps, 64 x 64
   pixels) with and without --checkpoint, from the `summary:` line: encode per distinct prompt,
   decode per image (both include loading their models, as a job does), and the checkpoint's
   cost per image and step (rows kept every step; with --checkpoint-every 1000, the step mode
   writes alone).
3. Links: memory copy bandwidth of this machine (64 MiB copies: what Open MPI's shared
   memory transport does) and, as latency per MPI message, the mean poll delay of
   Messenger::recv_into (pauses doubling up to 200 us: ~100 us) over the ~3 MPI messages of one
   fluxmpi message.
4. Host: os.cpu_count() processors shared by the ranks.

Makes the benchmark model (make-tiny-model --preset bench) when --model is absent.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from fsim.hostload import run_measured  # noqa: E402
# (height = width, max sequence length): 96, 192, 384, 704 and 1152 joint tokens.
POINTS = [(128, 32), (128, 128), (256, 128), (384, 128), (512, 128)]
# Patches of the pipelined steps timed beside the forwards (validate.py's patch rows use 4).
PATCHES = 4


def run(cmd, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode != 0:
        sys.exit("calibrate: command failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stdout[-3000:]))
    return p.stdout


def find(build, name):
    for root, _, files in os.walk(build):
        if name in files and os.access(os.path.join(root, name), os.X_OK):
            return os.path.join(root, name)
    sys.exit("calibrate: no %s under %s" % (name, build))


def forward_ms(bench, config, double, single, size, msl, a):
    """The best forward's and the best pipelined step's seconds, times the share of a processor
    the bench process got (on a shared machine its wall time is stretched by 1 / share;
    fsim/hostload.py)."""
    cmd = [bench, "--config", config, "--double", str(double), "--single", str(single), "--height", str(size),
           "--width", str(size), "--msl", str(msl), "--threads", str(a.threads), "--dtype", a.dtype,
           "--repeat", str(a.repeat), "--patches", str(PATCHES)]
    rc, out, share, _, _ = run_measured(cmd)
    m = re.search(r"transformer forward: ([0-9.]+) ms", out)
    p = re.search(r"patched step \(%d patches\): ([0-9.]+) ms" % PATCHES, out)
    if rc != 0 or not m or not p:
        sys.exit("calibrate: no forward time from %s:\n%s" % (" ".join(cmd), out[-3000:]))
    return float(m.group(1)) / 1000.0 * share, float(p.group(1)) / 1000.0 * share


def least_squares(rows, ys):
    """Solves the normal equations of a small linear least-squares problem (Gauss-Jordan)."""
    k = len(rows[0])
    m = [[sum(r[i] * r[j] for r in rows) for j in range(k)] + [sum(r[i] * y for r, y in zip(rows, ys))]
         for i in range(k)]
    for c in range(k):
        p = max(range(c, k), key=lambda i: abs(m[i][c]))
        m[c], m[p] = m[p], m[c]
        for i in range(k):
            if i != c:
                f = m[i][c] / m[c][c]
                m[i] = [a - f * b for a, b in zip(m[i], m[c])]
    return [m[i][k] / m[i][i] for i in range(k)]


def quadratic_fit(ns, ts, calls=1):
    """c0 + c1 n + c2 n^2 per call, from times of `calls` calls that together cover n tokens."""
    # Scaled columns keep the normal equations well conditioned (n is up to ~1e3).
    c = least_squares([[1.0, n / 1e3, (n / 1e3) ** 2] for n in ns], ts)
    return {"c0": c[0] / calls, "c1": c[1] / 1e3, "c2": c[2] / 1e6}


def measure_blocks(bench, config, a, log):
    # Rounds over every (point, layout) in turn, each keeping its best: a slow spell of a shared
    # machine then spoils one round of a measurement, not all of it.
    best, best_p = {}, {}
    for _ in range(a.rounds):
        for size, msl in POINTS:
            for d, s in ((1, 0), (3, 0), (0, 1), (0, 3)):
                t, tp = forward_ms(bench, config, d, s, size, msl, a)
                k = (size, msl, d, s)
                best[k] = min(best.get(k, t), t)
                best_p[k] = min(best_p.get(k, tp), tp)
    rows = []
    for size, msl in POINTS:
        img = (size // 16) ** 2
        t = {(d, s): best[(size, msl, d, s)] for d, s in ((1, 0), (3, 0), (0, 1), (0, 3))}
        tp = {(d, s): best_p[(size, msl, d, s)] for d, s in ((1, 0), (3, 0), (0, 1), (0, 3))}
        cd = (t[(3, 0)] - t[(1, 0)]) / 2
        cs = (t[(0, 3)] - t[(0, 1)]) / 2
        rest = ((t[(1, 0)] - cd) + (t[(0, 1)] - cs)) / 2
        pd = (tp[(3, 0)] - tp[(1, 0)]) / 2
        ps = (tp[(0, 3)] - tp[(0, 1)]) / 2
        rows.append({"size": size, "msl": msl, "image_tokens": img, "tokens": img + msl, "double_s": cd,
                     "single_s": cs, "embed_final_s": rest, "forwards_s": {"%dd%ds" % k: v for k, v in t.items()},
                     "patched_double_s": pd, "patched_single_s": ps,
                     "patched_steps_s": {"%dd%ds" % k: v for k, v in tp.items()}})
        log("  %4d tokens: double %.2f ms, single %.2f ms, embedders + final %.2f ms; in a step of %d patches: "
            "double %.2f ms, single %.2f ms" % (img + msl, 1e3 * cd, 1e3 * cs, 1e3 * rest, PATCHES, 1e3 * pd,
                                                 1e3 * ps))
    return rows


def measure_job_costs(fluxmpi, model, a, log, work):
    """Encode, decode, checkpoint from 1-rank jobs."""
    base = [fluxmpi, "--model", model, "--prompt", "a harbour", "--num-images", "2", "--steps", "4", "--height", "64",
            "--width", "64", "--max-sequence-length", "32", "--threads", str(a.threads), "--dtype", a.dtype,
            "--seed", "1", "--no-progress", "-o", os.path.join(work, "cal-{i}.png")]

    def job(extra):
        out = run(base + extra)
        stage = {m.group(1): float(m.group(2)) for m in re.finditer(r" (\w+) ([0-9.]+) s \(peak", out)}
        return stage

    results = {"plain": [], "ckpt": [], "ckpt_last": []}
    for k in range(3):
        results["plain"].append(job([]))
        for name, extra in (("ckpt", []), ("ckpt_last", ["--checkpoint-every", "1000"])):
            h5 = os.path.join(work, "cal-%d-%s.h5" % (k, name))
            if os.path.exists(h5):
                os.remove(h5)
            results[name].append(job(["--checkpoint", h5] + extra))
            os.remove(h5)
    best = {k: {s: min(r[s] for r in v) for s in v[0]} for k, v in results.items()}
    steps = 2 * 4
    row = max(0.0, (best["ckpt"]["denoise"] - best["ckpt_last"]["denoise"]) / steps)
    step = max(0.0, (best["ckpt_last"]["denoise"] - best["plain"]["denoise"]) / steps)
    log("  encode %.3f s / prompt, decode %.3f s / image, checkpoint %.2f ms / image-step + %.2f ms / row" % (
        best["plain"]["encode"], best["plain"]["decode"] / 2, 1e3 * step, 1e3 * row))
    return {"encode_prompt_s": best["plain"]["encode"], "decode_image_s": best["plain"]["decode"] / 2,
            "checkpoint_step_s": step, "checkpoint_row_s": row, "jobs": results}


def copy_bandwidth():
    a = bytearray(b"\x01") * (64 << 20)  # 64 MiB; slice assignment is one memmove
    b = bytearray(len(a))
    best = float("inf")
    for _ in range(10):
        t0 = time.perf_counter()
        b[:] = a
        best = min(best, time.perf_counter() - t0)
    return len(a) / best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True)
    ap.add_argument("--model", help="pipeline folder (default: make the bench model under --work)")
    ap.add_argument("--work", default="/tmp/fluxsim-cal")
    ap.add_argument("--out", default=os.path.join(HERE, "profiles", "local-cpu.json"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--repeat", type=int, default=5, help="forwards per bench process (its best counts)")
    ap.add_argument("--rounds", type=int, default=2, help="bench processes per measurement, in turns")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)

    def log(s):
        print(s, flush=True)

    model = a.model or os.path.join(a.work, "bench-model")
    if not os.path.isdir(model):
        run([find(a.build, "make-tiny-model"), "--out", model, "--preset", "bench"])
    config = os.path.join(model, "transformer", "config.json")
    with open(config) as f:
        cfg = json.load(f)
    bench = find(a.build, "fluxmpi-bench-matmul")
    fluxmpi = find(a.build, "fluxmpi")
    load = open("/proc/loadavg").read().split()[:3]
    log("calibrating on %s (load %s): blocks" % (model, " ".join(load)))
    rows = measure_blocks(bench, config, a, log)
    ns = [r["tokens"] for r in rows]
    double = quadratic_fit(ns, [r["double_s"] for r in rows])
    single = quadratic_fit(ns, [r["single_s"] for r in rows])
    double_patch = quadratic_fit(ns, [r["patched_double_s"] for r in rows], calls=PATCHES)
    single_patch = quadratic_fit(ns, [r["patched_single_s"] for r in rows], calls=PATCHES)
    e = least_squares([[1.0, r["image_tokens"] / 1e3, r["msl"] / 1e3] for r in rows],
                      [r["embed_final_s"] for r in rows])
    e = [max(0.0, e[0]), max(0.0, e[1] / 1e3), max(0.0, e[2] / 1e3)]
    log("job costs")
    jc = measure_job_costs(fluxmpi, model, a, log, a.work)
    bw = copy_bandwidth()
    log("memory copy %.1f GB/s" % (bw / 1e9))

    dtype_bytes = {"fp32": 4, "bf16": 2, "fp16": 2}[a.dtype]
    profile = {
        "name": "local-cpu (%s, %s, %d thread(s) a rank)" % (os.path.basename(model.rstrip("/")), a.dtype, a.threads),
        "source": "tools/sim/calibrate.py, %s UTC, load average %s" % (time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                                                                       " ".join(load)),
        "model": cfg,
        "dtype_bytes": dtype_bytes,
        "costs": {
            "double_block": double,
            "single_block": single,
            "double_block_patch": dict(double_patch, patches=PATCHES),
            "single_block_patch": dict(single_patch, patches=PATCHES),
            "embedder": {"c0": e[0] / 2, "c_img": e[1] / 2, "c_txt": e[2]},
            "final_layer": {"c0": e[0] / 2, "c1": e[1] / 2},
            "decode": {"c0": jc["decode_image_s"], "c1": 0.0},
            "encode_prompt_s": jc["encode_prompt_s"],
            "checkpoint": {"step_s": jc["checkpoint_step_s"], "row_s": jc["checkpoint_row_s"]},
        },
        "host": {"cores_per_node": os.cpu_count()},
        "links": {"intra": {"bandwidth": bw, "latency": 100e-6 / 3}},
        "measured": {"blocks": rows, "jobs": jc["jobs"], "copy_bandwidth": bw,
                     "cpu_flags": sorted(set(re.findall(r"\b(avx2|avx512f|avx512_bf16|amx_bf16)\b",
                                                        open("/proc/cpuinfo").read())))},
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(profile, f, indent=1)
    log("wrote %s" % a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
