#!/usr/bin/env python3
"""fluxsim: predicts a fluxmpi job's time from a profile, by simulating its step loop rank by rank
(tools/sim/README.md: the model and its assumptions).

  python3 tools/sim/fluxsim.py --profile PROFILE.json [--ranks P --stages S --microbatch m
      --patches M --warmup W --images N --steps K --height H --width W ...] [--json]
  python3 tools/sim/fluxsim.py --profile PROFILE.json --ranks 8 --images 64 --search

--search tries every stages S dividing P, patches M in 1, 2, 4, 8, 16 and microbatch 1, 2, 4 (or
--search-patches / --search-microbatch; slots S and 2S with several pipelines) and prints the best
for throughput and for one image's latency (M > 1 for latency only, unless --search-full).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fsim.model import Profile  # noqa: E402
from fsim.simulate import Config, simulate  # noqa: E402


def options(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True, help="profile JSON (tools/sim/profiles/, or calibrate.py's output)")
    ap.add_argument("--ranks", "-n", type=int, default=1, help="MPI ranks P")
    ap.add_argument("--stages", type=int, help="ranks per pipeline S (default P: one pipeline, today's fluxmpi)")
    ap.add_argument("--partition", help="one pipeline's blocks per rank, fluxmpi syntax: 0:0-5,1:6-11")
    ap.add_argument("--microbatch", type=int, default=1)
    ap.add_argument("--patches", type=int, default=1)
    ap.add_argument("--warmup", "--warmup-steps", type=int, default=1, dest="warmup")
    ap.add_argument("--images", type=int, default=1, help="images of the job")
    ap.add_argument("--steps", type=int, default=28)
    ap.add_argument("--height", type=int, default=1024)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--max-sequence-length", type=int, default=512, dest="text_tokens")
    ap.add_argument("--true-cfg", action="store_true", help="two transformer passes a step")
    ap.add_argument("--prompts", type=int, default=1, help="distinct prompts to encode")
    ap.add_argument("--checkpoint", action="store_true", help="rank 0 writes the HDF5 rows")
    ap.add_argument("--checkpoint-every", type=int, default=1)
    ap.add_argument("--decode", choices=["end", "inline"], help="decode after each leader's loop (fluxmpi, the default) / as each group finishes (a what-if)")
    ap.add_argument("--slots", type=int, help="work groups in flight per pipeline leader")
    ap.add_argument("--vae-tiling", action="store_true", help="decode in VAE tiles (when the latent exceeds one)")
    ap.add_argument("--vae-slicing", action="store_true", help="one image a decoder pass")
    ap.add_argument("--decode-ranks", type=int, help="ranks of a pipeline that decode tiles (default: all, "
                    "at most one a tile)")
    ap.add_argument("--vae-tile", type=int, default=128, help="latent cells of a VAE tile (FLUX.1: 128)")
    ap.add_argument("--vae-scale", type=int, default=8, help="pixels per latent cell (FLUX.1: 8)")
    ap.add_argument("--expect-transformer", metavar="L,S,H,D",
                    help="refuse a profile whose transformer is not L double + S single blocks of H heads x D")
    ap.add_argument("--ranks-per-node", type=int)
    ap.add_argument("--cores-per-node", type=int, help="processors the ranks of a node share (CPU runs)")
    ap.add_argument("--search", action="store_true", help="best stages / patches / microbatch for --ranks")
    ap.add_argument("--search-patches", default="1,2,4,8,16", help="patches M the search tries")
    ap.add_argument("--search-microbatch", default="1,2,4", help="microbatches the search tries")
    ap.add_argument("--search-full", action="store_true", help="also the throughput of every M > 1")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    return ap.parse_args(argv)


def config_of(a, **over):
    kw = dict(ranks=a.ranks, stages=a.stages, partition=a.partition, microbatch=a.microbatch, patches=a.patches,
              warmup=a.warmup, images=a.images, steps=a.steps, height=a.height, width=a.width,
              text_tokens=a.text_tokens, true_cfg=a.true_cfg, prompts=a.prompts, checkpoint=a.checkpoint,
              checkpoint_every=a.checkpoint_every, decode=a.decode, slots=a.slots, ranks_per_node=a.ranks_per_node,
              vae_tiling=a.vae_tiling, vae_slicing=a.vae_slicing, decode_ranks=a.decode_ranks, vae_tile=a.vae_tile,
              vae_scale=a.vae_scale)
    if a.cores_per_node is not None:
        kw["cores_per_node"] = a.cores_per_node
    kw.update(over)
    return Config(**kw)


def predict(profile, cfg):
    """The job's result, with one image's latency alone (the same layout, 1 image)."""
    r = simulate(profile, cfg)
    alone = Config(**dict(vars(cfg), images=1, microbatch=1, prompts=1))
    r["single_image_latency_s"] = simulate(profile, alone)["total_s"]
    return r


def report(profile, r):
    if r["images_per_hour"] is None:  # a search entry of one image's latency alone
        return "%d ranks = %d pipeline(s) x %d stages, patches %d (warm-up %d): one image alone %.3f s; plan %s" % (
            r["ranks"], r["pipelines"], r["stages"], r["patches"], r["warmup"], r["single_image_latency_s"],
            ", ".join(r["plan"]))
    lines = [
        "profile %s: %d ranks = %d pipeline(s) x %d stages; microbatch %d, patches %d (warm-up %d), %d image(s) "
        "x %d steps, %dx%d" % (profile.name, r["ranks"], r["pipelines"], r["stages"], r["microbatch"], r["patches"],
                               r["warmup"], r["images"], r["steps"], r["width"], r["height"]),
        "plan (one pipeline): " + ", ".join(r["plan"]),
        "encode %.3f s, denoise %.3f s, %stotal %.3f s; %.1f images/hour" % (
            r["encode_s"], r["denoise_s"], "" if r["decode_s"] is None else "decode %.3f s (%s), " % (
                r["decode_s"], r["vae"]), r["total_s"], r["images_per_hour"]),
        "image latency in this job: mean %.3f s, max %.3f s; one image alone: %.3f s" % (
            r["latency_mean_s"], r["latency_max_s"], r["single_image_latency_s"]),
        "idle share per rank: " + " ".join("%d:%.1f%%" % (i, 100 * x) for i, x in enumerate(r["idle_share"])),
        "blocked on messages (over each rank's loop): " +
        " ".join("%d:%.1f%%" % (i, 100 * x) for i, x in enumerate(r["blocked_share"])),
    ]
    return "\n".join(lines)


def ints(text):
    return [int(x) for x in text.split(",")]


def search(profile, a):
    """Every layout for a.ranks ranks; returns the list of results. Patches M > 1 are tried for
    throughput too with --search-full only (with at least S images in flight the exact schedule
    already fills the pipeline); without it they get one image's latency alone."""
    out = []
    P, B = a.ranks, profile.shape.num_blocks
    rows = a.height // 16
    for S in [s for s in range(1, P + 1) if P % s == 0 and s <= B]:
        pipes = P // S
        for M in [m for m in ints(a.search_patches) if m <= rows and (m == 1 or S > 1)]:
            if M > 1 and not a.search_full:
                cfg = config_of(a, stages=S, patches=M, microbatch=1, images=1, prompts=1, partition=None)
                r = simulate(profile, cfg)
                r.update(single_image_latency_s=r["total_s"], images_per_hour=None, latency_mean_s=None)
                out.append(r)
                continue
            for mb in ints(a.search_microbatch):
                if mb > a.images:
                    continue
                for slots in ([None] if pipes == 1 else [S, 2 * S]):
                    cfg = config_of(a, stages=S, patches=M, microbatch=mb, slots=slots, partition=None)
                    out.append(predict(profile, cfg))
    return out


def load_profile(a):
    """The profile, checked against --expect-transformer; ValueError naming the file otherwise."""
    try:
        profile = Profile.load(a.profile)
    except OSError as e:
        raise ValueError("profile '%s': %s" % (a.profile, e.strerror or e))
    except json.JSONDecodeError as e:
        raise ValueError("profile '%s' is not JSON: %s" % (a.profile, e))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError("profile '%s' is not a fluxsim profile (tools/sim/README.md): %s %s" % (
            a.profile, "missing key" if isinstance(e, KeyError) else "bad value", e))
    if a.expect_transformer:
        sh = profile.shape
        have = (sh.num_double, sh.num_single, sh.heads, sh.head_dim)
        want = tuple(int(x) for x in a.expect_transformer.split(","))
        if have != want:
            raise ValueError("profile '%s' (%s) models a transformer of %d double + %d single blocks, %d heads x %d; "
                             "the job's has %d + %d, %d x %d" % ((a.profile, profile.name) + have + want))
    return profile


def main(argv=None):
    a = options(argv)
    try:
        return run(load_profile(a), a)
    except ValueError as e:
        print("fluxsim: %s" % e, file=sys.stderr)
        return 2


def run(profile, a):
    if a.search:
        results = search(profile, a)
        best_tp = max((r for r in results if r["images_per_hour"] is not None), key=lambda r: r["images_per_hour"])
        best_lat = min(results, key=lambda r: r["single_image_latency_s"])
        if a.json:
            print(json.dumps({"best_throughput": best_tp, "best_latency": best_lat, "all": results}, indent=1))
            return 0
        print("%d layouts simulated for %d ranks, %d images" % (len(results), a.ranks, a.images))
        print("best throughput:\n" + report(profile, best_tp))
        print("best one-image latency:\n" + report(profile, best_lat))
        return 0
    r = predict(profile, config_of(a))
    print(json.dumps(r, indent=1) if a.json else report(profile, r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
