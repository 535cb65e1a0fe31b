#!/usr/bin/env python3
"""The diffusers half of tools/bench/peer/peer.py: runs in the peer's Python (any Python with
torch >= 2 and the numpy, PIL, h5py, safetensors, requests, filelock, regex, yaml, tqdm, httpx
packages), with diffusers and huggingface_hub found through --path (their source folders or an
install). It never downloads anything: every model is a local folder made by make-tiny-model.

  diffusers_side.py --path P [--path P2] forward --model DIR --height H --width W --msl S --dtype fp32|bf16
                    --threads N --repeat R
  diffusers_side.py --path P job --model DIR --embeds CKPT.h5 --height H --width W --steps N --seed S
                    --guidance G --dtype fp32|bf16 --threads N --output OUT.png
  diffusers_side.py --path P load --model DIR --dtype fp32|bf16 --threads N
  diffusers_side.py psnr A.png B.png

Each measurement prints one line `peer-result {json}`.

`transformers` and `tokenizers` are not packaged for Debian 13. FluxPipeline's module imports names
from them at import time, but the pipeline measured here never calls them: its text encoders and
tokenizers are None and it receives the prompt embeddings fluxmpi computed with the same tiny
encoders (read from a fluxmpi checkpoint). So when they are absent, importing them yields
placeholder classes, and diffusers is told that transformers is present (it would otherwise
replace FluxPipeline by a stub that refuses to run). Nothing of diffusers itself is changed.
"""
import argparse, importlib.abc, importlib.machinery, importlib.util, json, sys, time, types


class _Placeholders(types.ModuleType):
    """A module whose every attribute is a fresh empty class (never instantiated here)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (), {})
        setattr(self, name, cls)
        return cls


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = roots

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Placeholders(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def import_diffusers(paths):
    for p in reversed(paths):
        sys.path.insert(0, p)
    missing = tuple(m for m in ("transformers", "tokenizers") if importlib.util.find_spec(m) is None)
    if missing:
        sys.meta_path.append(_PlaceholderFinder(missing))
        import diffusers.utils.import_utils as iu
        if "transformers" in missing:
            iu._transformers_available, iu._transformers_version = True, "0+placeholder"
    import diffusers
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from diffusers.pipelines.flux.pipeline_flux import FluxPipeline
    return diffusers, AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel, FluxPipeline


def report(**fields):
    print("peer-result " + json.dumps(fields), flush=True)


def torch_dtype(torch, name):
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


def versions(torch, diffusers):
    return {"torch": torch.__version__, "diffusers": diffusers.__version__, "threads": torch.get_num_threads()}


def token_ids(torch, h, w, text_tokens):
    """FluxPipeline's position ids of an (h, w) packed latent grid of 2x2 patches and of the text."""
    img_ids = torch.zeros(h // 2, w // 2, 3)
    img_ids[..., 1] += torch.arange(h // 2)[:, None]
    img_ids[..., 2] += torch.arange(w // 2)[None, :]
    return img_ids.reshape((h // 2) * (w // 2), 3), torch.zeros(text_tokens, 3)


def forward(args, mods):
    import torch
    diffusers, _, _, FluxTransformer2DModel, _ = mods
    torch.set_num_threads(args.threads)
    dt = torch_dtype(torch, args.dtype)
    t0 = time.perf_counter()
    model = FluxTransformer2DModel.from_pretrained(args.model, subfolder="transformer", torch_dtype=dt).eval()
    load_s = time.perf_counter() - t0
    cfg = model.config
    h, w = 2 * (args.height // 16), 2 * (args.width // 16)
    tokens = (h // 2) * (w // 2)
    g = torch.Generator("cpu").manual_seed(1)
    latents = torch.randn(1, tokens, cfg.in_channels, generator=g).to(dt)
    text = torch.randn(1, args.msl, cfg.joint_attention_dim, generator=g).to(dt)
    pooled = torch.randn(1, cfg.pooled_projection_dim, generator=g).to(dt)
    img_ids, txt_ids = token_ids(torch, h, w, args.msl)
    timestep = torch.full((1,), 0.5, dtype=dt)
    guidance = torch.full((1,), 3.5, dtype=torch.float32) if cfg.guidance_embeds else None
    times = []
    with torch.inference_mode():
        for _ in range(1 + args.repeat):  # the first is the warm-up
            t0 = time.perf_counter()
            model(hidden_states=latents, encoder_hidden_states=text, pooled_projections=pooled, timestep=timestep,
                  img_ids=img_ids, txt_ids=txt_ids, guidance=guidance, return_dict=False)
            times.append(time.perf_counter() - t0)
    report(kind="forward", best_s=min(times[1:]), warmup_s=times[0], load_s=load_s, tokens=tokens,
           width=cfg.num_attention_heads * cfg.attention_head_dim, **versions(torch, diffusers))


def load_pipeline(model, mods, dt):
    """A FluxPipeline of the folder's transformer, VAE and scheduler, what FluxPipeline.from_pretrained
    reads besides the text encoders (which cannot be loaded here: module docstring)."""
    diffusers, AutoencoderKL, Scheduler, FluxTransformer2DModel, FluxPipeline = mods
    return FluxPipeline(
        scheduler=Scheduler.from_pretrained(model, subfolder="scheduler"),
        vae=AutoencoderKL.from_pretrained(model, subfolder="vae", torch_dtype=dt),
        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
        transformer=FluxTransformer2DModel.from_pretrained(model, subfolder="transformer", torch_dtype=dt))


def job(args, mods):
    import h5py
    import torch
    diffusers, AutoencoderKL, Scheduler, FluxTransformer2DModel, FluxPipeline = mods
    torch.set_num_threads(args.threads)
    dt = torch_dtype(torch, args.dtype)
    with h5py.File(args.embeds, "r") as f:
        text = f["images/00000/text"]
        prompt_embeds = torch.from_numpy(text["prompt_embeds"][()]).unsqueeze(0).to(dt)
        pooled = torch.from_numpy(text["pooled_prompt_embeds"][()]).unsqueeze(0).to(dt)
    t0 = time.perf_counter()
    pipe = load_pipeline(args.model, mods, dt)
    pipe.set_progress_bar_config(disable=True)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    image = pipe(prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled, height=args.height, width=args.width,
                 num_inference_steps=args.steps, guidance_scale=args.guidance,
                 generator=torch.Generator("cpu").manual_seed(args.seed), max_sequence_length=prompt_embeds.shape[1],
                 output_type="pil").images[0]
    call_s = time.perf_counter() - t0
    image.save(args.output)
    report(kind="job", call_s=call_s, load_s=load_s, **versions(torch, diffusers))


def process_start():
    """time.time() of this process's start (/proc/self/stat field 22, clock ticks after boot): the
    interpreter's own start-up counts, a wrapper that launched it (scripts/debian13.sh) does not."""
    import os
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def load(args, mods, imported):
    """From this process's start to a loaded FluxPipeline, and the peak RSS."""
    import resource
    import torch
    diffusers, AutoencoderKL, Scheduler, FluxTransformer2DModel, FluxPipeline = mods
    torch.set_num_threads(args.threads)
    dt = torch_dtype(torch, args.dtype)
    t0 = time.perf_counter()
    pipe = load_pipeline(args.model, mods, dt)
    load_s = time.perf_counter() - t0
    ready = time.time()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = process_start()
    report(kind="load", load_s=load_s, import_s=imported - start, ready_s=ready - start, peak_rss_bytes=peak,
           **versions(torch, diffusers))
    del pipe


def psnr(args):
    import numpy as np
    from PIL import Image
    a = np.asarray(Image.open(args.a).convert("RGB"), dtype=np.float64)
    b = np.asarray(Image.open(args.b).convert("RGB"), dtype=np.float64)
    if a.shape != b.shape:
        sys.exit("psnr: %s is %s but %s is %s" % (args.a, a.shape, args.b, b.shape))
    mse = float(np.mean((a - b) ** 2))
    report(kind="psnr", psnr_db=(float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)),
           max_abs=float(np.max(np.abs(a - b))))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", action="append", default=[], help="a folder holding diffusers or huggingface_hub")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("forward")
    j = sub.add_parser("job")
    for p in (f, j):
        p.add_argument("--model", required=True)
        p.add_argument("--height", type=int, required=True)
        p.add_argument("--width", type=int, required=True)
        p.add_argument("--dtype", choices=("fp32", "bf16"), required=True)
        p.add_argument("--threads", type=int, required=True)
    f.add_argument("--msl", type=int, required=True)
    f.add_argument("--repeat", type=int, default=1)
    j.add_argument("--embeds", required=True, help="a fluxmpi checkpoint with images/00000/text/prompt_embeds")
    j.add_argument("--steps", type=int, required=True)
    j.add_argument("--seed", type=int, required=True)
    j.add_argument("--guidance", type=float, required=True)
    j.add_argument("--output", required=True)
    lo = sub.add_parser("load")
    lo.add_argument("--model", required=True)
    lo.add_argument("--dtype", choices=("fp32", "bf16"), required=True)
    lo.add_argument("--threads", type=int, required=True)
    s = sub.add_parser("psnr")
    s.add_argument("a")
    s.add_argument("b")
    args = ap.parse_args()
    if args.cmd == "psnr":
        psnr(args)
        return
    mods = import_diffusers(args.path)
    if args.cmd == "load":
        load(args, mods, time.time())
        return
    (forward if args.cmd == "forward" else job)(args, mods)


if __name__ == "__main__":
    main()
