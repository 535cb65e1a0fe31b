#!/usr/bin/env python3
"""FLUX.2 multi-reference editing, the cost of a denoising step: fluxmpi with reference images
against fluxmpi text-to-image, and against diffusers' Flux2KleinPipeline(image=[...]) on torch 2.6
(Debian 13), on the same random-weight model. See docs/performance.md ("Multi-reference editing").

  tools/bench/multiref_bench.py --build build --diffusers /work/peer/diffusers-0.40.0/src \\
      --diffusers /work/peer/huggingface_hub-1.28.0/src --diffusers /work/peer/accelerate-1.14.0/src \\
      [--work DIR] [--threads 2] [--size 512] [--rounds 3]

The model (made once in --work, with diffusers in the Debian 13 root): a FLUX.2 [klein] folder whose
transformer has width 512 (8 heads x 64), 2 double + 4 single blocks (random weights), with the text
encoder, tokenizer, VAE and scheduler of the shared tiny-flux2-klein fixture; a reference image of
--size x --size pixels. Each round runs, in turn (the order reversed every other round), one process
each, --threads threads, fp32, --size² output, 256 text tokens:
  fluxmpi   text-to-image, and with 1 and 2 references (each --size², so L_ref = L, 2 L);
  diffusers the same three calls (prompt embeddings from a fluxmpi checkpoint: transformers is not
            packaged for Debian 13, tools/bench/peer/diffusers_side.py).
A step's cost: fluxmpi's `denoise` seconds (its summary line) of a 6-step run minus a 2-step run,
over 4; diffusers' from callback_on_step_end timestamps, steps 2..6 (the first step warms up).
Both exclude loading, the text encoder, the VAE encode of the references and the decode.
Prints one Markdown table with the CPU flags and the load average before and after.
"""
import argparse, json, os, re, shlex, shutil, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SHARED = os.path.normpath(os.path.join(REPO, "..", "shared", "fixtures"))
PROMPT = "a lighthouse on a cliff at dawn"
TEXT_TOKENS = 256
STEPS = (2, 6)


# --- The Debian 13 side (diffusers on torch 2.6) ------------------------------------------------

def peer_make_model(args):
    import torch
    sys.path.insert(0, os.path.join(REPO, "tools", "bench", "peer"))
    from diffusers_side import import_diffusers
    import_diffusers([])
    from diffusers import Flux2Transformer2DModel
    from PIL import Image
    import numpy as np
    out = args.out
    base = os.path.join(SHARED, "flux2", "tiny-flux2-klein")
    for part in ("vae", "text_encoder", "tokenizer", "scheduler"):
        shutil.copytree(os.path.join(base, part), os.path.join(out, part), dirs_exist_ok=True)
    shutil.copy(os.path.join(base, "model_index.json"), out)
    torch.manual_seed(1)
    tr = Flux2Transformer2DModel(patch_size=1, in_channels=128, out_channels=None, num_layers=2, num_single_layers=4,
                                 attention_head_dim=64, num_attention_heads=8, joint_attention_dim=96,
                                 timestep_guidance_channels=256, mlp_ratio=3.0, axes_dims_rope=(16, 16, 16, 16),
                                 rope_theta=2000, eps=1e-6, guidance_embeds=False)
    tr.save_pretrained(os.path.join(out, "transformer"), safe_serialization=True)
    y, x = np.mgrid[0:args.size, 0:args.size].astype(np.float64)
    rgb = np.stack([x / args.size, y / args.size, 0.5 + 0.5 * np.sin((x + y) / 17)], -1) * 255
    Image.fromarray(rgb.astype(np.uint8), "RGB").save(args.image)


def peer_run(args):
    import h5py, torch
    sys.path.insert(0, os.path.join(REPO, "tools", "bench", "peer"))
    from diffusers_side import import_diffusers
    import_diffusers([])
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Transformer2DModel
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline
    from diffusers.utils import load_image
    torch.set_num_threads(args.threads)
    m = args.model
    pipe = Flux2KleinPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(m, "scheduler")),
        vae=AutoencoderKLFlux2.from_pretrained(os.path.join(m, "vae")).eval(), text_encoder=None, tokenizer=None,
        transformer=Flux2Transformer2DModel.from_pretrained(os.path.join(m, "transformer")).eval(), is_distilled=True)
    with h5py.File(args.embeds, "r") as f:
        pe = torch.from_numpy(f["images/00000/text/prompt_embeds"][()]).unsqueeze(0)
    images = [load_image(args.image)] * args.references if args.references else None
    stamps = []

    def on_step(p, i, t, kw):
        stamps.append(time.perf_counter())
        return {}

    with torch.inference_mode():
        pipe(image=images, prompt_embeds=pe, height=args.size, width=args.size, num_inference_steps=STEPS[1],
             guidance_scale=1.0, generator=torch.Generator("cpu").manual_seed(1), output_type="latent",
             callback_on_step_end=on_step)
    per_step = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    print("peer-result " + json.dumps({"per_step_s": per_step, "torch": torch.__version__, "threads": torch.get_num_threads()}),
          flush=True)


# --- The host side (fluxmpi) -----------------------------------------------------------------

def sh(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(shlex.quote(c) for c in cmd)}\n{r.stdout[-4000:]}")
    return r.stdout


def peer_cmd(args, *more):
    env = ["env", "PYTHONPATH=" + ":".join(args.diffusers), "OMP_NUM_THREADS=" + str(args.threads)]
    return [os.path.join(REPO, "scripts", "debian13.sh")] + env + ["python3", os.path.abspath(__file__)] + list(more)


def fluxmpi_denoise(args, model, references, steps, extra=()):
    cmd = [os.path.join(args.build, "fluxmpi"), "--model", model, "--prompt", PROMPT, "--height", str(args.size), "--width",
           str(args.size), "--steps", str(steps), "--seed", "1", "--dtype", "fp32", "--threads", str(args.threads),
           "--max-sequence-length", str(TEXT_TOKENS), "--no-progress", "-o", os.path.join(args.work, "out.png")]
    for _ in range(references):
        cmd += ["--image", os.path.join(args.work, "ref.png")]
    out = sh(cmd + list(extra))
    m = re.search(r"denoise ([0-9.]+) s", out)
    if not m:
        sys.exit("no denoise time in fluxmpi's summary:\n" + out[-2000:])
    return float(m.group(1))


def fluxmpi_per_step(args, model, references):
    return (fluxmpi_denoise(args, model, references, STEPS[1]) - fluxmpi_denoise(args, model, references, STEPS[0])) / (
        STEPS[1] - STEPS[0])


def diffusers_per_step(args, model, references):
    out = sh(peer_cmd(args, "--side", "run", "--model", model, "--embeds", os.path.join(args.work, "embeds.h5"), "--image",
                      os.path.join(args.work, "ref.png"), "--references", str(references), "--size", str(args.size),
                      "--threads", str(args.threads)))
    line = [l for l in out.splitlines() if l.startswith("peer-result ")][-1]
    return json.loads(line[len("peer-result "):])["per_step_s"]


def cpu_flags():
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    wanted = ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16"]
    return " ".join(w for w in wanted if w in flags)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", choices=["make-model", "run"])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--diffusers", action="append", default=[])
    ap.add_argument("--work", default=os.path.join(REPO, "build", "multiref-bench"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    # --side arguments
    ap.add_argument("--out"), ap.add_argument("--image"), ap.add_argument("--model"), ap.add_argument("--embeds")
    ap.add_argument("--references", type=int, default=0)
    args = ap.parse_args()
    if args.side == "make-model":
        return peer_make_model(args)
    if args.side == "run":
        return peer_run(args)

    args.work = os.path.abspath(args.work)
    args.build = os.path.abspath(args.build)
    os.makedirs(args.work, exist_ok=True)
    model = os.path.join(args.work, "flux2-d512")
    if not os.path.exists(os.path.join(model, "model_index.json")):
        sh(peer_cmd(args, "--side", "make-model", "--out", model, "--image", os.path.join(args.work, "ref.png"), "--size",
                    str(args.size)))
    # The prompt embeddings diffusers gets: fluxmpi's, from a checkpoint.
    embeds = os.path.join(args.work, "embeds.h5")
    if os.path.exists(embeds):
        os.remove(embeds)
    fluxmpi_denoise(args, model, 0, 1, ["--checkpoint", embeds])

    load_before = os.getloadavg()
    modes = [0, 1, 2]
    results = {(who, r): [] for who in ("fluxmpi", "diffusers") for r in modes}
    for rnd in range(args.rounds):
        order = [(who, r) for r in modes for who in ("fluxmpi", "diffusers")]
        if rnd % 2:
            order.reverse()
        for who, r in order:
            t = fluxmpi_per_step(args, model, r) if who == "fluxmpi" else diffusers_per_step(args, model, r)
            results[(who, r)].append(t)
            print(f"round {rnd}: {who} with {r} reference(s): {t * 1000:.1f} ms/step", file=sys.stderr, flush=True)
    load_after = os.getloadavg()

    med = {k: statistics.median(v) for k, v in results.items()}
    L = (args.size // 16) ** 2
    print(f"FLUX.2 width 512 (8 x 64), 2 double + 4 single blocks, fp32, {args.size}x{args.size} ({L} image tokens), "
          f"{TEXT_TOKENS} text tokens, --threads {args.threads}, median of {args.rounds} interleaved rounds")
    print(f"CPU flags: {cpu_flags()}; load average before {load_before[0]:.2f}, after {load_after[0]:.2f}\n")
    print("| references | tokens in a call | fluxmpi ms/step | x text-to-image | diffusers ms/step | x text-to-image | "
          "fluxmpi / diffusers |")
    print("|---|---|---|---|---|---|---|")
    for r in modes:
        f, d = med[("fluxmpi", r)], med[("diffusers", r)]
        print(f"| {r} | {TEXT_TOKENS} + {L} + {r * L} | {f * 1000:.1f} | {f / med[('fluxmpi', 0)]:.2f} | {d * 1000:.1f} | "
              f"{d / med[('diffusers', 0)]:.2f} | {f / d:.2f} |")


if __name__ == "__main__":
    main()
