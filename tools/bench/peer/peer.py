#!/usr/bin/env python3
"""fluxmpi against its peer, diffusers' FluxPipeline, on the same weights, in one table.
Standard library only; see docs/performance.md ("Against diffusers") for a run and its reading.

  tools/bench/peer/peer.py --diffusers DIR [--diffusers DIR2] [--build build] [--build-d13 build-debian13]
                           [--peer-python "scripts/debian13.sh python3"] [--work DIR] [--threads 2] [--quick]
                           [--only forward|job|demo|startup] [--dtype fp32|bf16] [--forward-model d512|d3072]

--diffusers: folders that hold the `diffusers` and `huggingface_hub` packages (their source trees'
src/ folders, or an install), put on the peer Python's path; nothing of theirs is in this repository.
--peer-python: the command that runs the peer's Python (any Python with torch >= 2; the default is
Debian 13's python3 with python3-torch 2.6, through scripts/debian13.sh); every path given to it
must be visible there (scripts/debian13.sh binds the folder that holds this clone).
--build: the fluxmpi build of this machine; --build-d13: a second build run through
scripts/debian13.sh (libtorch 2.6), measured as a third column when the folder exists.

Makes (or reuses, in --work) three random-weight pipelines with make-tiny-model:
  d512   width 512 (8 heads x 64), 2 double + 4 single blocks, tiny text encoders,
         FLUX.1's VAE size (block_out_channels 128,256,512,512, 32 groups);
  d3072  width 3072 (24 heads x 128, FLUX.1's), 2 double + 4 single blocks (bf16 on disk);
  demo   the demo's model (make-tiny-model --preset tiny).
and measures, the implementations taking turns process after process (diffusers, fluxmpi, fluxmpi
on libtorch 2.6; the order reversed every other round), each process with --threads threads:
  1. one transformer forward (256 text tokens; the best of R after a warm-up; fluxmpi-bench-matmul
     and FluxTransformer2DModel.forward on random inputs) of d512 and d3072 at 256², 512², 1024²,
     fp32 and bf16;
  2. the whole job: FluxPipeline.__call__ (its time, weights already loaded) against the fluxmpi
     command (its `total`, from start-up to the written PNG: validation, loading, encoding, 4 steps,
     decoding), d512 at 512² and 1024², fp32 and bf16, seed 1, guidance 3.5; diffusers gets the prompt
     embeddings of the same tiny text encoders from a fluxmpi checkpoint (transformers is not
     packaged for Debian 13; see diffusers_side.py); the PSNR between the two PNGs shows that both
     did the same work;
  3. the demo model's whole job at 1024², 28 steps (the default a user sees);
  4. start-up (--only startup; not in the default plan): from the launch to the first denoising step
     of a 1-step 256² fluxmpi job (mpirun -np 1 and -np 2; the libtorch 2.6 build, run through
     scripts/debian13.sh, from its process's start), against diffusers from its process's start to a
     loaded pipeline (transformer, VAE, scheduler: its text encoders cannot be loaded here), for the
     demo model and d3072; and each fluxmpi rank's peak RSS while loading against its slice of the
     weights plus the largest transformer shard.
--quick: forwards at 256² and 512² (d3072 at 256² only), jobs at 512² only, the demo at 4 steps;
--smoke: tiny sizes, to check the setup (its numbers mean nothing).
Prints one Markdown table (ratio = fluxmpi time / diffusers time; < 1: fluxmpi is faster) with the
CPU flags, both libtorch versions and the load average before and after.
"""
import argparse, json, os, re, shlex, shutil, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
PROMPT = "a lighthouse on a cliff at dawn"
TEXT_TOKENS = 256
SEED, GUIDANCE = 1, 3.5

MODELS = {
    "d512": ["--preset", "tiny", "--heads", "8", "--head-dim", "64", "--double", "2", "--single", "4",
             "--vae-channels", "128,256,512,512", "--vae-groups", "32", "--seed", "1"],
    "d3072": ["--preset", "tiny", "--heads", "24", "--head-dim", "128", "--double", "2", "--single", "4",
              "--dtype", "bf16", "--seed", "1"],
    "demo": ["--preset", "tiny"],
}


# Sizes of each part: forward sizes per model, job sizes, (demo size, demo steps).
PLANS = {
    "full": {"forward": {"d512": [256, 512, 1024], "d3072": [256, 512, 1024]}, "job": [512, 1024], "demo": (1024, 28)},
    "quick": {"forward": {"d512": [256, 512], "d3072": [256]}, "job": [512], "demo": (1024, 4)},
    "smoke": {"forward": {"d512": [256], "d3072": []}, "job": [128], "demo": (128, 2)},
}


def fail(message):
    sys.exit("peer: " + message)


def run(cmd, what):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        fail("%s failed (exit %d): %s\n%s" % (what, p.returncode, " ".join(map(shlex.quote, cmd)), p.stdout[-4000:]))
    return p.stdout


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        text = f.read()
    model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    flags = set(re.search(r"^flags\s*:\s*(.*)$", text, re.M).group(1).split())
    shown = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")
             if f in flags]
    return "%s, %d vCPUs; %s" % (model.group(1) if model else "?", os.cpu_count(), " ".join(shown))


class Side:
    """One implementation: how to run its forward and its job, and what its label is."""

    def __init__(self, name, prefix, build=None):
        self.name, self.prefix, self.build = name, prefix, build


def make_models(args, work, names):
    exe = os.path.join(args.build, "tools", "make_tiny_model", "make-tiny-model")
    paths = {}
    for name in names:
        flags = MODELS[name]
        out = os.path.join(work, name)
        stamp = os.path.join(out, ".peer-stamp")
        want = " ".join(flags)
        if not (os.path.exists(stamp) and open(stamp).read() == want):
            shutil.rmtree(out, ignore_errors=True)
            run([exe, "--out", out] + flags, "make-tiny-model " + name)
            with open(stamp, "w") as f:
                f.write(want)
        paths[name] = out
    return paths


def peer_cmd(args, *rest):
    cmd = shlex.split(args.peer_python) + [os.path.join(HERE, "diffusers_side.py")]
    for d in args.diffusers:
        cmd += ["--path", os.path.abspath(d)]
    return cmd + list(rest)


def peer_result(out, what):
    for line in out.splitlines():
        if line.startswith("peer-result "):
            return json.loads(line[len("peer-result "):])
    fail("no result from %s:\n%s" % (what, out[-4000:]))


def fluxmpi_exe(side, tool):
    return side.prefix + [os.path.join(side.build, tool)]


def forward_time(args, side, model, size, dtype, repeat):
    """Best forward seconds of one process of `side`."""
    if side.name == "diffusers":
        out = run(peer_cmd(args, "forward", "--model", model, "--height", str(size), "--width", str(size),
                           "--msl", str(TEXT_TOKENS), "--dtype", dtype, "--threads", str(args.threads),
                           "--repeat", str(repeat)), "diffusers forward")
        r = peer_result(out, "diffusers forward")
        side.version = "torch %s, diffusers %s" % (r["torch"], r["diffusers"])
        return r["best_s"]
    out = run(fluxmpi_exe(side, "tools/bench/fluxmpi-bench-matmul") +
              ["--model", model, "--height", str(size), "--width", str(size), "--msl", str(TEXT_TOKENS),
               "--dtype", dtype, "--threads", str(args.threads), "--repeat", str(repeat)], side.name + " forward")
    m = re.search(r"transformer forward: ([0-9.]+) ms", out)
    if not m:
        fail("no forward time from %s:\n%s" % (side.name, out))
    return float(m.group(1)) / 1e3


def job_embeds(args, side, model, dtype, work):
    """A fluxmpi checkpoint of the prompt's embeddings in `dtype` (a 64² 1-step run, not timed)."""
    ckpt = os.path.join(work, "embeds-%s-%s.h5" % (os.path.basename(model), dtype))
    if not os.path.exists(ckpt):
        tmp = ckpt + ".partial.h5"
        if os.path.exists(tmp):
            os.remove(tmp)
        run(fluxmpi_exe(side, "fluxmpi") + ["--model", model, "--prompt", PROMPT, "--height", "64", "--width", "64",
                                            "--steps", "1", "--seed", str(SEED), "--dtype", dtype, "--threads",
                                            str(args.threads), "--max-sequence-length", str(TEXT_TOKENS),
                                            "--output", os.path.join(work, "embeds.png"), "--checkpoint", tmp],
            "fluxmpi (prompt embeddings)")
        os.rename(tmp, ckpt)
    return ckpt


def job_time(args, side, model, size, steps, dtype, embeds, png):
    """(seconds, detail) of one whole job of `side`, writing `png`."""
    if side.name == "diffusers":
        out = run(peer_cmd(args, "job", "--model", model, "--embeds", embeds, "--height", str(size), "--width",
                           str(size), "--steps", str(steps), "--seed", str(SEED), "--guidance", str(GUIDANCE),
                           "--dtype", dtype, "--threads", str(args.threads), "--output", png), "diffusers job")
        r = peer_result(out, "diffusers job")
        return r["call_s"], "load %.1f s" % r["load_s"]
    out = run(fluxmpi_exe(side, "fluxmpi") + ["--model", model, "--prompt", PROMPT, "--height", str(size), "--width",
                                              str(size), "--steps", str(steps), "--seed", str(SEED), "--guidance",
                                              str(GUIDANCE), "--dtype", dtype, "--threads", str(args.threads),
                                              "--max-sequence-length", str(TEXT_TOKENS), "--output", png],
              side.name + " job")
    m = re.search(r"summary:(.*); total ([0-9.]+) s", out)
    if not m:
        fail("no summary line from %s:\n%s" % (side.name, out[-4000:]))
    stages = re.findall(r" (\w[\w ]*?) ([0-9.]+) s \(peak", m.group(1))
    return float(m.group(2)), ", ".join("%s %s" % (n, s) for n, s in stages)


def startup_diffusers(args, model, dtype):
    r = peer_result(run(peer_cmd(args, "load", "--model", model, "--dtype", dtype, "--threads", str(args.threads)),
                        "diffusers load"), "diffusers load")
    return r["ready_s"], "import %.2f s, from_pretrained %.2f s, peak RSS %.0f MiB" % (
        r["import_s"], r["load_s"], r["peak_rss_bytes"] / 2 ** 20)


def startup_fluxmpi(args, side, model, dtype, ranks, png):
    """(seconds to the first denoising step, detail, [(rank, slice bytes, peak RSS while loading)])."""
    cmd = fluxmpi_exe(side, "fluxmpi") + [
        "--model", model, "--prompt", PROMPT, "--height", "256", "--width", "256", "--steps", "1", "--seed", str(SEED),
        "--dtype", dtype, "--threads", str(max(1, args.threads // ranks)), "--max-sequence-length", str(TEXT_TOKENS),
        "--log-level", "debug", "--no-progress", "--output", png]
    if ranks > 1:
        mpirun = ["mpirun", "-np", str(ranks), "--bind-to", "none", "--oversubscribe"] + \
                 (["--allow-run-as-root"] if os.geteuid() == 0 else [])
        cmd = side.prefix + mpirun + cmd[len(side.prefix):]
    launched = time.time()
    out = run(cmd, side.name + " start-up")
    m = re.search(r"first denoising step: [0-9.]+ s after the run began, ([0-9.]+) s after the process started "
                  r"\(at ([0-9.]+) s since the epoch\)", out)
    if not m:
        fail("no first-step line from %s:\n%s" % (side.name, out[-4000:]))
    # The native build: from the launch of mpirun (or of fluxmpi alone); through scripts/debian13.sh,
    # from the process's start (the wrapper's own set-up is not fluxmpi's).
    seconds = float(m.group(2)) + float(m.group(1)) - launched if not side.prefix else float(m.group(1))
    stages = re.search(r"summary: (.*?) denoise", out)
    before = re.search(r"summary: validate [0-9.]+ s \(peak ([0-9.]+) (\w+)\)", out)
    base = to_bytes(before.group(1), before.group(2)) if before else 0.0
    ranks_mem = []
    for r in re.finditer(r"fluxmpi\[rank (\d+)/\d+\]: loaded blocks .*?: \d+ tensors, ([0-9.]+) (\w+) in .*?"
                         r"peak RSS so far ([0-9.]+) (\w+)", out):
        ranks_mem.append((int(r.group(1)), to_bytes(r.group(2), r.group(3)), to_bytes(r.group(4), r.group(5)), base))
    return seconds, stages.group(1) if stages else "", sorted(ranks_mem)


def to_bytes(number, unit):
    return float(number) * {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "TiB": 2 ** 40}[unit]


def largest_shard(model):
    folder = os.path.join(model, "transformer")
    return max(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors"))


def psnr(args, a, b):
    r = peer_result(run(peer_cmd(args, "psnr", a, b), "psnr"), "psnr")
    return r["psnr_db"]


def interleaved(sides, rounds, measure):
    """Best of `rounds` per side, the sides taking turns (order reversed every other round)."""
    best = {s.name: (float("inf"), "") for s in sides}
    for i in range(rounds):
        for s in (sides if i % 2 == 0 else sides[::-1]):
            t, detail = measure(s)
            if t < best[s.name][0]:
                best[s.name] = (t, detail)
    return best


def row_text(label, sides, best, extra=""):
    ref = best["diffusers"][0]
    cells = []
    for s in sides:
        t = best[s.name][0]
        cells.append("%.2f s" % t if s.name == "diffusers" else "%.2f s | **%.2f**" % (t, t / ref))
    return "| %s | %s |%s" % (label, " | ".join(cells), extra)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--diffusers", action="append", required=True,
                    help="folder holding diffusers (and huggingface_hub); repeat for each")
    ap.add_argument("--peer-python", default=os.path.join(REPO, "scripts", "debian13.sh") + " python3")
    ap.add_argument("--build", default="build")
    ap.add_argument("--build-d13", default="build-debian13")
    ap.add_argument("--work", default=None, help="models and images (default BUILD/peer-bench)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="turns of each measurement (best kept)")
    ap.add_argument("--quick", action="store_true", help="the short plan (see above)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: checks the setup in a few minutes, no numbers")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), action="append",
                    help="only these dtypes (repeatable; default both), to re-measure some rows")
    ap.add_argument("--forward-model", choices=("d512", "d3072"), action="append",
                    help="only these models' forwards (repeatable; default both)")
    ap.add_argument("--only", choices=("forward", "job", "demo", "startup"), action="append",
                    help="run only these parts (repeatable)")
    args = ap.parse_args()
    os.chdir(REPO)
    args.build = os.path.abspath(args.build)
    work = os.path.abspath(args.work or os.path.join(args.build, "peer-bench"))
    os.makedirs(work, exist_ok=True)
    parts = args.only or ["forward", "job", "demo"]
    dtypes = args.dtype or ["fp32", "bf16"]
    forward_models = args.forward_model or ["d512", "d3072"]
    plan = PLANS["smoke" if args.smoke else "quick" if args.quick else "full"]
    for exe in ("fluxmpi", "tools/make_tiny_model/make-tiny-model", "tools/bench/fluxmpi-bench-matmul"):
        if not os.path.exists(os.path.join(args.build, exe)):
            fail("%s is missing: build the targets fluxmpi, make-tiny-model and fluxmpi-bench-matmul" % os.path.join(args.build, exe))

    sides = [Side("diffusers", None), Side("fluxmpi", [], args.build)]
    if os.path.exists(os.path.join(args.build_d13, "fluxmpi")):
        sides.append(Side("fluxmpi-2.6", [os.path.join(REPO, "scripts", "debian13.sh")], os.path.abspath(args.build_d13)))
    else:
        print("peer: no %s/fluxmpi: the libtorch 2.6 column is left out" % args.build_d13, flush=True)

    start = time.time()
    load_before = loadavg()
    wanted = set()
    if "forward" in parts:
        wanted |= {n for n in forward_models if plan["forward"][n]}
    if "job" in parts:
        wanted.add("d512")
    if "demo" in parts:
        wanted.add("demo")
    if "startup" in parts:
        wanted |= {"demo", "d3072"}
    models = make_models(args, work, sorted(wanted))
    lines = []

    def emit(line):
        lines.append(line)
        print(line, flush=True)

    header = "| measurement | diffusers | fluxmpi | ratio |" + "".join(" fluxmpi (2.6) | ratio |" for s in sides[2:])
    emit(header)
    emit("|" + "---|" * (header.count("|") - 1))

    if "forward" in parts:
        for name in forward_models:
            for size in plan["forward"][name]:
                for dtype in dtypes:
                    repeat = 3 if name == "d512" else 1
                    best = interleaved(sides, args.rounds, lambda s: (forward_time(args, s, models[name], size, dtype,
                                                                                   repeat), ""))
                    emit(row_text("forward, width %s, %d², %s" % (name[1:], size, dtype), sides, best))

    def jobs(name, sizes, steps):
        for size in sizes:
            for dtype in dtypes:
                embeds = job_embeds(args, sides[1], models[name], dtype, work)
                pngs = {s.name: os.path.join(work, "%s-%d-%s-%s.png" % (name, size, dtype, s.name)) for s in sides}
                best = interleaved(sides, args.rounds, lambda s: job_time(args, s, models[name], size, steps, dtype,
                                                                         embeds, pngs[s.name]))
                db = [psnr(args, pngs[s.name], pngs["diffusers"]) for s in sides[1:]]
                label = "job %s, %d², %d steps, %s" % ("width 512 + FLUX.1 VAE" if name == "d512" else "demo model",
                                                      size, steps, dtype)
                emit(row_text(label, sides, best, " PSNR vs diffusers: %s" % ", ".join("%.1f dB" % d for d in db)))
                for s in sides[1:]:
                    print("    %s stages: %s" % (s.name, best[s.name][1]), flush=True)

    if "job" in parts:
        jobs("d512", plan["job"], 4)
    if "demo" in parts:
        jobs("demo", [plan["demo"][0]], plan["demo"][1])
    if "startup" in parts:
        startup(args, sides, models, dtypes, work, emit)

    print()
    print("CPU: %s" % cpu_flags())
    for s in sides:
        if getattr(s, "version", None):
            print("%s: %s" % (s.name, s.version))
    print("libtorch of the fluxmpi builds: %s" % ", ".join("%s %s" % (s.name, libtorch_version(s)) for s in sides[1:]))
    print("threads %d per process; load average before %s, after %s; %.0f s" % (args.threads, load_before, loadavg(),
                                                                                 time.time() - start))
    print("command: %s" % " ".join(map(shlex.quote, sys.argv)))


def startup(args, sides, models, dtypes, work, emit):
    """Launch to the first denoising step against diffusers' launch to a loaded pipeline (see above)."""
    for name in ("demo", "d3072"):
        shard = largest_shard(models[name])
        for dtype in dtypes:
            runs = [("diffusers", sides[0], 1)] + [("%s, %d rank%s" % (s.name, n, "" if n == 1 else "s"), s, n)
                                                  for s in sides[1:] for n in ((1, 2) if not s.prefix else (1,))]
            best = {label: (float("inf"), "", []) for label, _, _ in runs}
            for i in range(args.rounds):
                for label, side, n in (runs if i % 2 == 0 else runs[::-1]):
                    if side.name == "diffusers":
                        t, detail = startup_diffusers(args, models[name], dtype)
                        mem = []
                    else:
                        png = os.path.join(work, "startup-%s-%s.png" % (name, dtype))
                        t, detail, mem = startup_fluxmpi(args, side, models[name], dtype, n, png)
                    if t < best[label][0]:
                        best[label] = (t, detail, mem)
            ref = best["diffusers"][0]
            for label, _, _ in runs[1:]:
                t, detail, mem = best[label]
                emit("| start-up, %s model, %s, %s | %.2f s | %.2f s | **%.2f** | %s |" % (
                    "demo" if name == "demo" else "width-3072", dtype, label, ref, t, t / ref, detail))
                # The process before loading (rank 0's peak while validating: libtorch, MPI, the
                # tokenizers) is not weights; every rank is charged rank 0's.
                for rank, slice_bytes, peak, base in mem:
                    emit("|   rank %d while loading: peak RSS %.0f MiB = %.0f MiB before loading + %.0f MiB; slice %.0f MiB, "
                         "largest shard %.0f MiB | | | %s | |" % (
                             rank, peak / 2 ** 20, base / 2 ** 20, (peak - base) / 2 ** 20, slice_bytes / 2 ** 20,
                             shard / 2 ** 20, "within" if peak - base <= slice_bytes + shard else "above"))
            print("    diffusers: %s" % best["diffusers"][1], flush=True)


def libtorch_version(side):
    cache = os.path.join(side.build, "CMakeCache.txt")
    try:
        text = open(cache).read()
        m = re.search(r"^Torch_DIR:PATH=(.*)$", text, re.M)
        torch_dir = m.group(1) if m else ""
    except OSError:
        return "?"
    root = "/var/cache/fluxmpi/debian13-root" if side.prefix else ""
    version_file = os.path.join(root + torch_dir, "TorchConfigVersion.cmake")
    try:
        m = re.search(r'PACKAGE_VERSION "([^"]+)"', open(version_file).read())
        return m.group(1) if m else "?"
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
