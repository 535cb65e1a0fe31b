#!/usr/bin/env python3
"""The LoRA measurements of docs/performance.md: each rank's peak RSS and loading time with a LoRA
against without, on the benchmark model of bench.py, in one run. Standard library only.

  tools/bench/lora_bench.py [--build build] [--work /tmp/fluxmpi-bench] [--rank 16] [--repeat 3]

Writes a diffusers-layout LoRA (rank --rank, fp32, alpha = rank / 2) on every linear layer of the
benchmark transformer (make-tiny-model --preset bench), then runs 1 image on 2 ranks (1 thread per
rank, fp32, 1 step) with and without it, the two taking turns --repeat times. Reports per rank the
weights of its slice, the LoRA bytes it reads, its peak RSS (target: <= 1.15 x slice weights +
400 MB) and its loading time (best of the repeats).
"""
import argparse, json, os, random, re, struct, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the benchmark model and the run helpers)

MiB = bench.MiB


def linear_layers(config):
    """(module, out, in) of every linear layer of a FluxTransformer2DModel config (diffusers names)."""
    D = config["num_attention_heads"] * config["attention_head_dim"]
    mlp = 4 * D
    out = [("x_embedder", D, config["in_channels"]), ("context_embedder", D, config["joint_attention_dim"]),
           ("norm_out.linear", 2 * D, D), ("proj_out", config.get("out_channels") or config["in_channels"], D)]
    for i in range(config["num_layers"]):
        b = "transformer_blocks.%d." % i
        out += [(b + "norm1.linear", 6 * D, D), (b + "norm1_context.linear", 6 * D, D)]
        out += [(b + "attn." + m, D, D) for m in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj",
                                                   "to_out.0", "to_add_out")]
        for ff in ("ff", "ff_context"):
            out += [(b + ff + ".net.0.proj", mlp, D), (b + ff + ".net.2", D, mlp)]
    for i in range(config["num_single_layers"]):
        b = "single_transformer_blocks.%d." % i
        out += [(b + "norm.linear", 3 * D, D), (b + "proj_mlp", mlp, D), (b + "proj_out", D, D + mlp)]
        out += [(b + "attn." + m, D, D) for m in ("to_q", "to_k", "to_v")]
    return out


def write_lora(path, config, rank, seed=7):
    """A diffusers/PEFT safetensors LoRA: small random down/up on every linear layer."""
    rng = random.Random(seed)
    header, blobs, offset = {}, [], 0

    def add(name, shape, values):
        nonlocal offset
        data = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)

    for module, rows, cols in linear_layers(config):
        add("transformer.%s.lora_A.weight" % module, [rank, cols], [rng.gauss(0, 0.02) for _ in range(rank * cols)])
        add("transformer.%s.lora_B.weight" % module, [rows, rank], [rng.gauss(0, 0.02) for _ in range(rows * rank)])
        add("transformer.%s.alpha" % module, [], [rank / 2.0])
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    os.replace(path + ".tmp", path)
    return offset


def per_rank(out, ranks):
    """Per rank: (slice weight bytes, peak RSS bytes, load seconds)."""
    loads = {}
    for m in re.finditer(r"fluxmpi\[rank (\d+)/\d+\]: loaded blocks .*? in ([0-9.]+) s", out):
        loads[int(m.group(1))] = float(m.group(2))
    return [(w, p, loads.get(r)) for r, (w, p) in enumerate(bench.rank_memory(out, ranks))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default="/tmp/fluxmpi-bench")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    model = os.path.join(a.work, "model")
    if not os.path.exists(os.path.join(model, "model_index.json")):
        os.makedirs(a.work, exist_ok=True)
        bench.run([os.path.join(a.build, "tools", "make_tiny_model", "make-tiny-model"), "--out", model, "--preset", "bench"])
    config = json.load(open(os.path.join(model, "transformer", "config.json")))
    lora = os.path.join(a.work, "lora-r%d.safetensors" % a.rank)
    lora_bytes = write_lora(lora, config, a.rank)
    base = ["--model", model, "--prompt", "a mountain village at dawn", "--height", "256", "--width", "256", "--steps", "1",
            "--max-sequence-length", "128", "--seed", "1", "--no-progress", "--log-level", "debug",
            "-o", os.path.join(a.work, "lora-bench-{i}.png")]
    configs = [("without LoRA", []), ("with LoRA", ["--lora", lora + ":0.8"])]
    best = {}
    for _ in range(a.repeat):
        for name, extra in configs:
            _, _, out = bench.fluxmpi(a.build, 2, base + extra)
            rows = per_rank(out, 2)
            if name not in best:
                best[name] = rows
            else:  # best loading time per rank; the largest peak (the peak is not noise)
                best[name] = [(w, max(p, bp), min(t, bt)) for (w, p, t), (_, bp, bt) in zip(rows, best[name])]
    print("# LoRA benchmark: %s, LoRA rank %d (%.1f MiB fp32 on every linear layer), 2 ranks x 1 thread, best of %d"
          % (model, a.rank, lora_bytes / MiB, a.repeat))
    print("| rank | slice weights | peak RSS without | peak RSS with LoRA | with / (1.15 x weights + 400 MB) "
          "| load without | load with LoRA |")
    print("|---|---|---|---|---|---|---|")
    for r in range(2):
        w, p0, t0 = best["without LoRA"][r]
        _, p1, t1 = best["with LoRA"][r]
        print("| %d | %.1f MiB | %.1f MiB | %.1f MiB | %.2f | %.2f s | %.2f s |"
              % (r, w / MiB, p0 / MiB, p1 / MiB, p1 / (1.15 * w + 400e6), t0, t1))


if __name__ == "__main__":
    main()
