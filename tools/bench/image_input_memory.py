#!/usr/bin/python3
"""Rank 0's peak memory with an input image at 1024x1024 (docs/performance.md, "Image inputs").
Standard library and Pillow.

  tools/bench/image_input_memory.py [--build build] [--work /tmp/fluxmpi-image-bench] [--size 1024]

Makes a pipeline whose VAE is FLUX.1's real size (make-tiny-model --vae-channels 128,256,512,512
--vae-groups 32: the 84M-parameter AutoencoderKL, random weights) with a tiny transformer and
text encoders, writes a SIZE x SIZE PNG, and runs one 1-step image on one rank, one thread, fp32:
text-to-image, img2img and inpaint, in turns. Reports each stage's peak RSS from fluxmpi's
summary line (the stages are measured apart: fluxmpi resets the peak between them), the
"encode images" stage against --dry-run's estimate of it, and the whole run's peak.
"""
import argparse, os, re, subprocess, sys

UNITS = {"B": 1, "KiB": 1024.0, "MiB": 1024.0 ** 2, "GiB": 1024.0 ** 3}


def mib(text):
    value, unit = text.split()
    return float(value) * UNITS[unit] / 1024 ** 2


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stdout[-3000:]))
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default="/tmp/fluxmpi-image-bench")
    ap.add_argument("--size", type=int, default=1024)
    a = ap.parse_args()
    fluxmpi = os.path.join(a.build, "fluxmpi")
    make = os.path.join(a.build, "tools", "make_tiny_model", "make-tiny-model")
    os.makedirs(a.work, exist_ok=True)
    model = os.path.join(a.work, "model")
    if not os.path.exists(os.path.join(model, "model_index.json")):
        run([make, "--out", model, "--vae-channels", "128,256,512,512", "--vae-groups", "32"])
    from PIL import Image
    n = a.size
    photo = os.path.join(a.work, "photo.png")
    Image.frombytes("RGB", (n, n), bytes((x * 7 + y * 13 + c * 50) % 256 for y in range(n) for x in range(n)
                                         for c in range(3))).save(photo)
    mask = os.path.join(a.work, "mask.png")
    Image.frombytes("L", (n, n), bytes(255 if (x - n // 2) ** 2 + (y - n // 2) ** 2 < (n // 4) ** 2 else 0
                                       for y in range(n) for x in range(n))).save(mask)
    base = [fluxmpi, "--model", model, "--prompt", "a photo", "--steps", "1", "--height", str(n), "--width", str(n),
            "--seed", "1", "--threads", "1", "--dtype", "fp32", "--no-progress"]
    modes = [("text2img", []), ("img2img", ["--image", photo, "--strength", "1"]),
             ("inpaint", ["--image", photo, "--mask", mask, "--strength", "1"])]
    estimate = re.search(r"VAE encoder stage .*? = ([\d.]+ \w+)", run(base + modes[1][1] + ["--dry-run"]))
    print("cpu: %s" % " ".join(sorted({f for f in open("/proc/cpuinfo").read().split()
                                         if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")})))
    print("| mode | " + " | ".join(["validate", "encode", "encode images", "load", "denoise", "decode"]) + " | run peak |")
    print("|---|" + "---|" * 7)
    for name, extra in modes:
        out = run(base + extra + ["-o", os.path.join(a.work, name + ".png")])
        line = [l for l in out.splitlines() if "summary:" in l][-1]
        stages = dict((s, mib(p)) for s, p in re.findall(r" ([a-z ]+?) [\d.]+ s \(peak ([\d.]+ \w+)\)", line))
        peak = mib(re.search(r"peak RSS of rank 0 ([\d.]+ \w+)", line).group(1))
        cells = ["%.0f MiB" % stages[s] if s in stages else "-" for s in
                 ["validate", "encode", "encode images", "load", "denoise", "decode"]]
        print("| %s | %s | %.0f MiB |" % (name, " | ".join(cells), peak))
    if estimate:
        print("--dry-run's estimate of the encode-images stage: %s (plus the process's own base)" % estimate.group(1))


if __name__ == "__main__":
    main()
