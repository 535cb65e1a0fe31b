#!/usr/bin/python3
"""Peak memory of loading a single-file transformer against the diffusers folder of the same
weights (docs/performance.md, "Loading single files"). Standard library and h5py.

  tools/bench/single_file_memory.py [--build build] [--work /tmp/fluxmpi-sf-bench] [--repeat 2]

Makes a random FLUX-shaped pipeline large enough for the weights to dominate the process
(make-tiny-model: 64 heads x 16 = width 1024, 8 double + 16 single blocks, bf16 on disk: about
1.1 GB of transformer), writes its transformer as one original-layout file
(tools/bench/to_original_layout.py), and runs one 1-step 64x64 image from each in turns, in bf16
on one rank with one thread. Reports the peak RSS of the load stage from fluxmpi's summary line
and the process's peak RSS (VmHWM sampled every 2 ms), and checks that both runs give bit-identical latents.
"""
import argparse, os, re, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
UNITS = {"B": 1, "KiB": 1024.0, "MiB": 1024.0 ** 2, "GiB": 1024.0 ** 3}


def run(cmd):
    return run_measured(cmd)[0]


def run_measured(cmd):
    """Output and the child's peak RSS in bytes: the largest VmHWM / VmRSS of /proc/<pid>/status,
    read every 2 ms. (fluxmpi resets VmHWM between stages, which also lowers wait4's ru_maxrss, and
    its summary line rounds to 0.1 GiB.)"""
    import tempfile, threading, time
    log = tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    peak = [0]

    def sample():
        while p.poll() is None:
            try:
                for line in open("/proc/%d/status" % p.pid):
                    if line.startswith(("VmHWM:", "VmRSS:")):
                        peak[0] = max(peak[0], int(line.split()[1]) * 1024)
            except OSError:
                pass
            time.sleep(0.002)

    t = threading.Thread(target=sample)
    t.start()
    p.wait()
    t.join()
    log.seek(0)
    out = log.read()
    if p.returncode != 0:
        sys.exit("bench: command failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), out))
    return out, float(peak[0])


def peaks(output):
    """{stage: peak bytes} from the summary line 'encode 0.14 s (peak 194.6 MiB) load ...'."""
    out = {}
    for stage, number, unit in re.findall(r"(\w+) [0-9.]+ s \(peak ([0-9.]+) (\w+)\)", output):
        out[stage] = float(number) * UNITS[unit]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default="/tmp/fluxmpi-sf-bench")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    model = os.path.join(a.work, "model")
    single = os.path.join(a.work, "flux1-bench.safetensors")
    if not os.path.exists(os.path.join(model, "model_index.json")):
        run([os.path.join(a.build, "tools/make_tiny_model/make-tiny-model"), "--out", model, "--heads", "64",
             "--head-dim", "16", "--double", "8", "--single", "16", "--dtype", "bf16", "--shards", "3"])
    if not os.path.exists(single):
        run([sys.executable, os.path.join(HERE, "to_original_layout.py"), os.path.join(model, "transformer"), single])
    common = ["--prompt", "a photo of a cat", "--steps", "1", "--height", "64", "--width", "64", "--seed", "1",
              "--dtype", "bf16", "--threads", "1", "--no-progress"]
    configs = {
        "diffusers folder": ["--model", model],
        "single file": ["--model", single, "--vae", os.path.join(model, "vae"), "--text-encoder",
                        os.path.join(model, "text_encoder"), "--text-encoder-2", os.path.join(model, "text_encoder_2"),
                        "--model-config", model],
    }
    best = {}
    for r in range(a.repeat):
        for name, args in configs.items():
            h5 = os.path.join(a.work, "%s-%d.h5" % (name.replace(" ", "-"), r))
            if os.path.exists(h5):
                os.remove(h5)
            out, maxrss = run_measured([os.path.join(a.build, "fluxmpi")] + args + common +
                                       ["--checkpoint", h5, "-o", os.path.join(a.work, "img.png")])
            p = peaks(out)
            b = best.setdefault(name, {"load": float("inf"), "run": float("inf"), "h5": h5})
            b["load"] = min(b["load"], p["load"])
            b["run"] = min(b["run"], maxrss)
    import h5py
    rows = [h5py.File(best[n]["h5"], "r")["images/00000/latents/steps"][()] for n in configs]
    identical = (rows[0] == rows[1]).all()
    size = os.path.getsize(single)
    print("transformer: %.1f MiB of bf16 weights (%s)" % (size / UNITS["MiB"], single))
    print("| weights from | peak RSS of the load stage (summary line, rounded) | peak RSS of the process (VmHWM sampled) |")
    print("|---|---|---|")
    for name in configs:
        print("| %s | %.1f MiB | %.1f MiB |" % (name, best[name]["load"] / UNITS["MiB"], best[name]["run"] / UNITS["MiB"]))
    ratio = best["single file"]["run"] / best["diffusers folder"]["run"]
    print("single file / folder, process peak: %.4f; latents bit-identical: %s" % (ratio, identical))
    if not identical:
        sys.exit("bench: the two runs' latents differ")


if __name__ == "__main__":
    main()
