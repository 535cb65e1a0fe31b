#!/usr/bin/env python3
"""GGUF benchmark (issue 36, docs/performance.md "GGUF weights"): per-step time and peak RSS per rank
of fluxmpi with a Q8_0 and a Q4_K GGUF transformer against the same transformer in bf16, on the tiny
and a medium random FLUX.1-dev model, and diffusers 0.40 + GGUF (torch 2.6, Debian 13 root) on the
same files, the runs taking turns (interleaved) so that a noisy machine hits every row alike.

  tools/bench/gguf_bench.py [--build build] [--work DIR] [--rounds 3] [--threads 2] [--ranks 1,2]
                            [--models tiny,medium] [--steps 4] [--size 256]

It makes the models once in --work (with the Debian 13 root's python, gguf-py 0.19 and diffusers
from /work/peer as tools/fixtures/gguf_fixtures.py says): a pipeline folder of the shared fixture
tiny-flux-dev's encoders and VAE with the model's transformer config, the transformer in the
original key layout as bf16 safetensors, Q8_0 GGUF and Q4_K GGUF (city96's storage choices). Each
row reports the median over the rounds: fluxmpi's denoise time / steps (its summary line), the peak
RSS of every rank (its own VmHWM lines), and for diffusers the transformer forward per step at the same
token counts (its from_single_file(GGUFQuantizationConfig(compute_dtype=bfloat16)) model) and its
process's peak RSS. The header names the CPU flags and the load average.
"""
import argparse, json, os, re, statistics, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import to_bytes  # noqa: E402  (tools/bench/bench.py)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PEER = "/work/peer"
PYPATH = ":".join([f"{PEER}/gguf-py", f"{PEER}/diffusers-0.40.0/src", f"{PEER}/huggingface_hub-1.28.0/src",
                   f"{PEER}/accelerate-1.14.0/src", os.path.join(REPO, "tools", "fixtures")])
D13 = [os.path.join(REPO, "scripts", "debian13.sh"), "env", f"PYTHONPATH={PYPATH}", "HF_HUB_OFFLINE=1"]
SHARED_TINY = os.path.join(REPO, "..", "shared", "fixtures", "tiny-flux-dev")

MODELS = {  # transformer configs; the encoders (joint 32, pooled 32) and VAE are tiny-flux-dev's
    "tiny": {"attention_head_dim": 128, "num_attention_heads": 2, "num_layers": 1, "num_single_layers": 2},
    "medium": {"attention_head_dim": 128, "num_attention_heads": 8, "num_layers": 2, "num_single_layers": 4},
}



def sh(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def make_models(work, names):
    for name in names:
        d = os.path.join(work, name)
        if os.path.exists(os.path.join(d, "done")):
            continue
        os.makedirs(d, exist_ok=True)
        sh(["rm", "-rf", os.path.join(d, "pipeline")])
        sh(["cp", "-r", SHARED_TINY, os.path.join(d, "pipeline")])
        for f in os.listdir(os.path.join(d, "pipeline", "transformer")):
            os.remove(os.path.join(d, "pipeline", "transformer", f))
        cfg = {"_class_name": "FluxTransformer2DModel", "_diffusers_version": "0.40.0", "axes_dims_rope": [16, 56, 56],
               "guidance_embeds": True, "in_channels": 64, "joint_attention_dim": 32, "patch_size": 1,
               "pooled_projection_dim": 32, **MODELS[name]}
        with open(os.path.join(d, "pipeline", "transformer", "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        script = f'''
import json, sys, numpy as np, torch
sys.argv = ["gguf_fixtures"]
import gguf_fixtures as g
from safetensors.torch import save_file
cfg = json.load(open({json.dumps(os.path.join(d, "pipeline", "transformer", "config.json"))}))
shapes = g.flux1_original_shapes(cfg)
rng = np.random.default_rng(7)
g.write_gguf({json.dumps(os.path.join(d, "Q8_0.gguf"))}, shapes, rng, [g.Q.Q8_0])
g.write_gguf({json.dumps(os.path.join(d, "Q4_K.gguf"))}, shapes, rng, [g.Q.Q4_K])
t = {{k: (torch.randn(s, dtype=torch.float32) / (s[-1] ** 0.5 if len(s) > 1 else 20)).to(torch.bfloat16)
     for k, s in shapes.items()}}
save_file(t, {json.dumps(os.path.join(d, "bf16.safetensors"))})
'''
        r = sh(D13 + ["python3", "-c", script])
        if r.returncode != 0:
            sys.exit(f"gguf_bench: making the {name} model failed:\n{r.stdout[-3000:]}")
        open(os.path.join(d, "done"), "w").close()


def fluxmpi_row(build, d, weights, ranks, threads, steps, size):
    exe = os.path.join(os.path.abspath(build), "fluxmpi")
    args = [exe, "--model", os.path.join(d, "pipeline"), "--transformer",
            os.path.join(d, weights), "--prompt", "a cat", "--steps", str(steps), "--height", str(size), "--width", str(size),
            "--max-sequence-length", "128", "--dtype", "bf16", "--threads", str(threads), "--seed", "1", "--no-progress",
            "--log-level", "debug", "-o", os.path.join(d, "out.png")]
    if ranks > 1:
        args = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + args
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    r = sh(args, env=env)
    m = re.search(r"denoise ([0-9.]+) s", r.stdout)
    if r.returncode != 0 or not m:
        sys.exit(f"gguf_bench: fluxmpi failed ({weights}, {ranks} ranks):\n{r.stdout[-3000:]}")
    # Each rank's own VmHWM: rank 0's summary line, the others' "denoised in" lines. (/usr/bin/time's
    # %M, the child's ru_maxrss, read 235 MiB for a job whose VmHWM was 368 MiB on this machine.)
    rss = [to_bytes(m.group(1), m.group(2)) for m in re.finditer(r"peak RSS of rank 0 ([0-9.]+) (\w+)", r.stdout)]
    rss += [to_bytes(m.group(1), m.group(2)) for m in re.finditer(r"denoised in .*?; peak RSS ([0-9.]+) (\w+)", r.stdout)]
    if len(rss) != ranks:
        sys.exit(f"gguf_bench: {len(rss)} peak RSS lines for {ranks} ranks ({weights}):\n{r.stdout[-3000:]}")
    return float(m.group(1)) / steps, rss


PEER_SCRIPT = r'''
import json, resource, sys, time, torch
sys.argv = ["gguf_fixtures"]
import gguf_fixtures  # noqa: F401  (the transformers placeholders, the gguf / accelerate versions)
from diffusers import FluxTransformer2DModel, GGUFQuantizationConfig
from diffusers.models.model_loading_utils import load_gguf_checkpoint
import gguf_fixtures as g
torch.set_num_threads(THREADS)
cfg = json.load(open(CFG))
D = cfg["num_attention_heads"] * cfg["attention_head_dim"]
m = FluxTransformer2DModel.from_single_file(g.flux1_to_diffusers(load_gguf_checkpoint(FILE), D), config=PIPE,
        subfolder="transformer", quantization_config=GGUFQuantizationConfig(compute_dtype=torch.bfloat16),
        torch_dtype=torch.bfloat16).eval()
L, S = TOKENS, 128
ids = torch.zeros(L, 3); ids[:, 1] = torch.arange(L) // SIDE; ids[:, 2] = torch.arange(L) % SIDE
x = dict(hidden_states=torch.randn(1, L, 64, dtype=torch.bfloat16), encoder_hidden_states=torch.randn(1, S, 32, dtype=torch.bfloat16),
         pooled_projections=torch.randn(1, 32, dtype=torch.bfloat16), timestep=torch.tensor([0.5], dtype=torch.bfloat16),
         guidance=torch.tensor([3.5], dtype=torch.bfloat16), img_ids=ids, txt_ids=torch.zeros(S, 3))
with torch.no_grad():
    m(**x)
    t = time.perf_counter()
    for _ in range(STEPS):
        m(**x)
    dt = (time.perf_counter() - t) / STEPS
hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print("peer-result", json.dumps({"step_s": dt, "peak_rss": hwm * 1024}))
'''


def diffusers_row(d, weights, threads, steps, size):
    side = size // 16
    script = (PEER_SCRIPT.replace("THREADS", str(threads)).replace("CFG", json.dumps(os.path.join(d, "pipeline", "transformer", "config.json")))
              .replace("FILE", json.dumps(os.path.join(d, weights))).replace("PIPE", json.dumps(os.path.join(d, "pipeline")))
              .replace("TOKENS", str(side * side)).replace("SIDE", str(side)).replace("STEPS", str(steps)))
    r = sh(D13 + [f"OMP_NUM_THREADS={threads}", "python3", "-c", script])
    m = re.search(r"peer-result (\{.*\})", r.stdout)
    if not m:
        sys.exit(f"gguf_bench: the diffusers side failed ({weights}):\n{r.stdout[-3000:]}")
    j = json.loads(m.group(1))
    return j["step_s"], [j["peak_rss"]]


def mib(b):
    return f"{b / 2**20:.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default=os.path.join(REPO, "build", "gguf-bench"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--models", default="tiny,medium")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--no-diffusers", action="store_true")
    a = ap.parse_args()
    names = a.models.split(",")
    os.makedirs(a.work, exist_ok=True)
    make_models(a.work, names)
    flags = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")
             if re.search(rf"\b{f}\b", open("/proc/cpuinfo").read())]
    print(f"# gguf_bench: {os.cpu_count()} CPUs ({' '.join(flags)}), load average {os.getloadavg()[0]:.2f} at the start; "
          f"{a.rounds} rounds interleaved, {a.steps} steps of {a.size}x{a.size} (+128 text tokens), bf16, --threads {a.threads} per rank")
    rows = []
    for name in names:
        d = os.path.join(a.work, name)
        for w in ("bf16.safetensors", "Q8_0.gguf", "Q4_K.gguf"):
            for ranks in map(int, a.ranks.split(",")):
                rows.append((name, "fluxmpi", w, ranks, os.path.getsize(os.path.join(d, w))))
            if not a.no_diffusers and w.endswith(".gguf"):
                rows.append((name, "diffusers", w, 1, os.path.getsize(os.path.join(d, w))))
    results = {r: [] for r in rows}
    for _ in range(a.rounds):
        for r in rows:
            name, side, w, ranks, _ = r
            d = os.path.join(a.work, name)
            if side == "fluxmpi":
                results[r].append(fluxmpi_row(a.build, d, w, ranks, a.threads, a.steps, a.size))
            else:
                results[r].append(diffusers_row(d, w, a.threads * ranks, a.steps, a.size))
    print("| model | program | weights | file MiB | ranks | step s (median) | peak RSS per rank MiB (median) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        name, side, w, ranks, size = r
        step = statistics.median(x[0] for x in results[r])
        rss = [statistics.median(x[1][i] for x in results[r]) for i in range(len(results[r][0][1]))]
        print(f"| {name} | {side} | {w} | {mib(size)} | {ranks} | {step:.3f} | {', '.join(mib(v) for v in rss)} |")
    print(f"# load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
