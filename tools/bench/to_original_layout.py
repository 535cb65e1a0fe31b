#!/usr/bin/env python3
"""Writes a diffusers FluxTransformer2DModel folder as one safetensors file in the original Black
Forest Labs layout (flux1-dev.safetensors): q|k|v (and the single blocks' mlp) fused along dim 0,
RMSNorm weights as `*.scale`, norm_out's (scale, shift) halves stored as (shift, scale). Bytes
are copied, never converted. Standard library only.

  tools/bench/to_original_layout.py TRANSFORMER_DIR OUT.safetensors [--prefix model.diffusion_model.]

The inverse of diffusers' convert_flux_transformer_checkpoint_to_diffusers, for benchmarks and
cross-checks of the single-file loader (docs/performance.md).
"""
import argparse, json, os, re, struct


def read_folder(folder):
    index = os.path.join(folder, "diffusion_pytorch_model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else \
        ["diffusion_pytorch_model.safetensors"]
    tensors = {}
    for name in files:
        raw = open(os.path.join(folder, name), "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        head = json.loads(raw[8:8 + n])
        for key, v in head.items():
            if key == "__metadata__":
                continue
            b, e = v["data_offsets"]
            tensors[key] = (v["dtype"], v["shape"], raw[8 + n + b: 8 + n + e])
    return tensors


def convert(t):
    out = {}

    def cat(name, keys, order=None):
        parts = [t.pop(k) for k in keys]
        dtype = parts[0][0]
        shape = list(parts[0][1])
        shape[0] = sum(p[1][0] for p in parts)
        data = b"".join(p[2] for p in (parts if order is None else [parts[i] for i in order]))
        out[name] = (dtype, shape, data)

    def rename(new, old):
        out[new] = t.pop(old)

    def linear(new, old):
        for p in ("weight", "bias"):
            rename(f"{new}.{p}", f"{old}.{p}")

    linear("img_in", "x_embedder")
    linear("txt_in", "context_embedder")
    linear("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1")
    linear("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2")
    linear("vector_in.in_layer", "time_text_embed.text_embedder.linear_1")
    linear("vector_in.out_layer", "time_text_embed.text_embedder.linear_2")
    if "time_text_embed.guidance_embedder.linear_1.weight" in t:
        linear("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1")
        linear("guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2")
    doubles = sorted({int(m.group(1)) for k in t for m in [re.match(r"transformer_blocks\.(\d+)\.", k)] if m})
    for i in doubles:
        d, o = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        linear(o + "img_mod.lin", d + "norm1.linear")
        linear(o + "txt_mod.lin", d + "norm1_context.linear")
        for p in ("weight", "bias"):
            cat(f"{o}img_attn.qkv.{p}", [f"{d}attn.to_{x}.{p}" for x in "qkv"])
            cat(f"{o}txt_attn.qkv.{p}", [f"{d}attn.add_{x}_proj.{p}" for x in "qkv"])
        rename(o + "img_attn.norm.query_norm.scale", d + "attn.norm_q.weight")
        rename(o + "img_attn.norm.key_norm.scale", d + "attn.norm_k.weight")
        rename(o + "txt_attn.norm.query_norm.scale", d + "attn.norm_added_q.weight")
        rename(o + "txt_attn.norm.key_norm.scale", d + "attn.norm_added_k.weight")
        linear(o + "img_attn.proj", d + "attn.to_out.0")
        linear(o + "txt_attn.proj", d + "attn.to_add_out")
        linear(o + "img_mlp.0", d + "ff.net.0.proj")
        linear(o + "img_mlp.2", d + "ff.net.2")
        linear(o + "txt_mlp.0", d + "ff_context.net.0.proj")
        linear(o + "txt_mlp.2", d + "ff_context.net.2")
    singles = sorted({int(m.group(1)) for k in t for m in [re.match(r"single_transformer_blocks\.(\d+)\.", k)] if m})
    for i in singles:
        d, o = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        linear(o + "modulation.lin", d + "norm.linear")
        for p in ("weight", "bias"):
            cat(f"{o}linear1.{p}", [f"{d}attn.to_q.{p}", f"{d}attn.to_k.{p}", f"{d}attn.to_v.{p}", f"{d}proj_mlp.{p}"])
        rename(o + "norm.query_norm.scale", d + "attn.norm_q.weight")
        rename(o + "norm.key_norm.scale", d + "attn.norm_k.weight")
        linear(o + "linear2", d + "proj_out")
    linear("final_layer.linear", "proj_out")
    for p in ("weight", "bias"):
        dtype, shape, data = t.pop(f"norm_out.linear.{p}")
        half = len(data) // 2  # diffusers (scale, shift) -> original (shift, scale)
        out[f"final_layer.adaLN_modulation.1.{p}"] = (dtype, shape, data[half:] + data[:half])
    if t:
        raise SystemExit(f"unconverted tensors: {sorted(t)[:5]}")
    return out


def write(path, tensors, prefix):
    header, offset, order = {}, 0, sorted(tensors)
    for k in order:
        dtype, shape, data = tensors[k]
        header[prefix + k] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for k in order:
            f.write(tensors[k][2])
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder")
    ap.add_argument("out")
    ap.add_argument("--prefix", default="")
    a = ap.parse_args()
    write(a.out, convert(read_folder(a.folder)), a.prefix)
