#!/usr/bin/env python3
"""Writes the FLUX.1-dev profile for an H100/H200-class GPU from the model's configs and stated
assumptions (nothing here is measured by fluxmpi: no GPU was lent to the session that made it).

  python3 tools/sim/make_gpu_profile.py [--configs ../shared/assets/configs/FLUX.1-dev] [--out FILE]

ASSUMPTIONS (each is also written into the profile's "assumptions"):
  A1 achieved rate. xDiT's docs/performance/flux.md (xdit-project/xDiT, commit 0124baf) gives
     FLUX.1-dev, 28 steps, 1024 px, on 1 H100 with PyTorch (no torch.compile): 6.71 s. All of it
     is charged to the transformer (text encoding and VAE decode are taken as free), which makes
     the implied rate a lower bound. With the planner's FLOPs (partition.cpp: 24 D^2 per token
     per block + 4 L^2 D attention), R = 28 x FLOPs(step) / 6.71 s. The same R is used for attention at 2048 px (16896 tokens), where
     attention is 48 % of a block's FLOPs (vs 20 % at 1024 px) - an assumption, not a measurement.
  A2 no fixed cost per block call (c0 = 0): libtorch launches kernels asynchronously, and a
     block's kernels (~35) take less CPU time to launch than the GPU takes to run them down to
     patches of a few hundred tokens; the stream synchronises only at the staging copies (A4).
     This is optimistic for small patches, where matmuls also lose efficiency: the search stops
     at M = 8 (512 image tokens a patch at 1024 px).
  A3 embedders, final layer, scheduler, T5-XXL + CLIP-L encode and the VAE decode: their FLOPs
     (from the configs) at rate R, plus 0.1 ms a call.
  A4 links: Debian's Open MPI is not CUDA-aware, so every message is staged through pinned host
     memory (DESIGN.md 3): a device-to-host copy before the send and a host-to-device copy after
     the receive at 40 GB/s (PCIe Gen5 x16, pinned); inside a node host-to-host at 10 GB/s (one
     shared-memory copy); between nodes 25 GB/s (InfiniBand NDR 400 Gb/s, host memory);
     latency 35 us per MPI message (fluxmpi's receive polls with pauses of up to 200 us).
     8 GPUs (ranks) per node.
  A5 checkpoint (off in the published predictions): 1 ms a step and image (HDF5 flush) plus the
     row's bytes (latents + v, float32) at 1 GB/s.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from fsim.model import Shape  # noqa: E402

XDIT_1XH100_S = 6.71  # FLUX.1-dev, 28 steps, 1024 px, 1 x H100, PyTorch: xDiT docs/performance/flux.md
XDIT_STEPS = 28
C0 = 0.0
CALL = 1e-4


def vae_decoder_flops(v, h, w):
    """Multiply-adds x 2 of AutoencoderKL's decoder on an h x w latent (convs, mid attention)."""
    ch = list(reversed(v["block_out_channels"]))
    f = 0.0

    def conv(cin, cout, hh, ww, k=3):
        return 2.0 * k * k * cin * cout * hh * ww

    f += conv(v["latent_channels"], ch[0], h, w)
    f += 4 * conv(ch[0], ch[0], h, w)  # mid block: 2 resnets
    if v.get("mid_block_add_attention", True):
        n = h * w
        f += 4.0 * n * n * ch[0] + 4 * 2.0 * n * ch[0] * ch[0]
    cin = ch[0]
    for i, c in enumerate(ch):
        for j in range(v["layers_per_block"] + 1):
            f += conv(cin if j == 0 else c, c, h, w) + conv(c, c, h, w)
            if j == 0 and cin != c:
                f += conv(cin, c, h, w, 1)
        cin = c
        if i + 1 < len(ch):
            h, w = 2 * h, 2 * w
            f += conv(c, c, h, w)
    f += conv(ch[-1], v["out_channels"], h, w)
    return f


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=os.path.join(HERE, "..", "..", "..", "shared", "assets", "configs", "FLUX.1-dev"))
    ap.add_argument("--out", default=os.path.join(HERE, "profiles", "flux1-dev-h100.json"))
    a = ap.parse_args()

    def load(part):
        with open(os.path.join(a.configs, part, "config.json")) as f:
            return json.load(f)

    cfg, vae, t5, clip = load("transformer"), load("vae"), load("text_encoder_2"), load("text_encoder")
    s = Shape(cfg)
    D = float(s.inner_dim)
    L = 4096 + 512
    step_flops = s.num_blocks * s.block_flops(L)
    R = XDIT_STEPS * step_flops / XDIT_1XH100_S
    pd, ps, pe, pf = s.params()

    t5_params = t5["vocab_size"] * t5["d_model"] + t5["num_layers"] * (
        4 * t5["d_model"] * t5["num_heads"] * t5["d_kv"] + 3 * t5["d_model"] * t5["d_ff"])
    clip_params = clip["num_hidden_layers"] * 12 * clip["hidden_size"] ** 2
    encode = (2.0 * t5_params * 512 + 2.0 * clip_params * 77) / R + CALL
    dec_1024 = vae_decoder_flops(vae, 128, 128)
    row_bytes = 2 * 4096 * 64 * 4
    profile = {
        "name": "FLUX.1-dev bf16 on an H100/H200-class GPU (assumed, tools/sim/make_gpu_profile.py)",
        "source": "derived from the FLUX.1-dev configs and xDiT's published 1 x H100 latency; not measured",
        "assumptions": [
            "A1: achieved %.0f TFLOP/s on the planner's FLOPs, from xDiT docs/performance/flux.md "
            "(xdit-project/xDiT@0124baf): FLUX.1-dev 28 steps 1024px on 1 x H100, PyTorch, 6.71 s, all of it "
            "charged to the transformer; the same rate for attention at 2048px" % (R / 1e12),
            "A2: no fixed cost per block call (asynchronous kernel launches); optimistic for small patches",
            "A3: embedders, final layer, encoders and VAE decode: their FLOPs at the same rate + 0.1 ms a call",
            "A4: messages staged through pinned host memory at 40 GB/s each way; host links 10 GB/s in a node, "
            "25 GB/s between nodes, 35 us per MPI message; 8 GPUs per node",
            "A5: checkpoint 1 ms per image-step + float32 rows at 1 GB/s",
        ],
        "model": cfg,
        "dtype_bytes": 2,
        "costs": {
            "double_block": {"c0": C0, "c1": 24.0 * D * D / R, "c2": 4.0 * D / R},
            "single_block": {"c0": C0, "c1": 24.0 * D * D / R, "c2": 4.0 * D / R},
            "embedder": {"c0": CALL + 2.0 * (pe - s.in_channels * D - s.joint_dim * D) / R,
                         "c_img": 2.0 * s.in_channels * D / R, "c_txt": 2.0 * s.joint_dim * D / R},
            "final_layer": {"c0": CALL + 2.0 * 2 * D * D / R, "c1": 2.0 * D * s.out_channels / R},
            "scheduler": {"c0": CALL, "c1": 0.0},
            # Per image: c0 + c1 x pixels; the decoder's FLOPs scale with the pixels (its mid-block
            # attention grows faster: at 2048 px this underestimates by the attention's share).
            "decode": {"c0": CALL, "c1": dec_1024 / R / (1024 * 1024)},
            "encode_prompt_s": encode,
            "checkpoint": {"step_s": 1e-3, "row_s": row_bytes / 1e9},
        },
        "host": {"cores_per_node": None, "ranks_per_node": 8, "staging_bandwidth": 40e9},
        "links": {"intra": {"bandwidth": 10e9, "latency": 35e-6}, "inter": {"bandwidth": 25e9, "latency": 35e-6}},
        "derived": {"rate_flops": R, "step_flops_1024": step_flops, "block_flops_1024": s.block_flops(L),
                    "block_s_1024": C0 + s.block_flops(L) / R, "block_s_2048": C0 + s.block_flops(16384 + 512) / R,
                    "vae_decode_flops_1024": dec_1024, "encode_s": encode,
                    "params": {"double": pd, "single": ps, "embedders": pe, "final": pf}},
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(profile, f, indent=1)
    d = profile["derived"]
    print("R = %.0f TFLOP/s; one block %.2f ms at 1024px, %.2f ms at 2048px; VAE decode %.1f ms at 1024px; "
          "encode %.1f ms; wrote %s" % (R / 1e12, 1e3 * d["block_s_1024"], 1e3 * d["block_s_2048"],
                                        1e3 * (CALL + dec_1024 / R), 1e3 * encode, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
