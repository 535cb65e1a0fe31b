#!/usr/bin/env python3
"""What FLUX.1 Redux costs, against plain text-to-image and against its peer, in one Markdown table.

  tools/bench/redux_bench.py --diffusers DIR [--diffusers DIR2] [--build build] [--build-d13 build-debian13]
                             [--threads 2] [--rounds 1] [--size 512] [--forward-model d3072] [--only forward|encode]

Redux adds, once per image, the image side of FluxPriorReduxPipeline (the SigLIP processor, the 27-layer
SigLIP so400m encoder on 729 patches, the Redux embedder), and on every step 729 more tokens in the text
stream (512 + 729 = 1241 instead of 512). So, the implementations taking turns process after process as in
tools/bench/peer/peer.py (whose models and helpers this reuses):
  1. forward: one transformer forward at --size², fp32, with 512 text tokens (plain text-to-image) and with
     1241 (Redux), fluxmpi-bench-matmul against diffusers' FluxTransformer2DModel.forward (diffusers_side.py);
     the per-step cost of Redux is the ratio of the two rows;
  2. encode: the image side at the shipped FLUX.1-Redux-dev size (random weights, fp32, one 512² image):
     fluxmpi-bench-siglip against the Python side here (`--peer-encode`): the generator's transformers-4.x
     SigLIP processor and vision model (tools/fixtures/redux.py, the same torch ops transformers runs) and
     diffusers' own ReduxImageEncoder, on torch 2.6.
Prints the CPU flags, both libtorch versions and the load average before and after.
"""
import argparse, json, os, re, shlex, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "peer"))
import peer  # noqa: E402

REDUX_TOKENS = 729  # (384 // 14)^2
PLAIN_TOKENS = 512


def peer_encode(args):
    """The Python side of part 2 (run in the peer's Python): prints one `peer-result` line."""
    import numpy as np
    import torch
    from PIL import Image
    sys.path.insert(0, os.path.join(REPO, "tools", "fixtures"))
    for p in reversed(args.path):
        sys.path.insert(0, p)
    import redux as gen
    mods = gen.import_diffusers([])  # noqa: F841  (placeholder transformers, as the generator)
    from diffusers.pipelines.flux.modeling_flux import ReduxImageEncoder
    torch.set_num_threads(args.threads)
    folder = os.path.join(REPO, "share", "fluxmpi", "models", "FLUX.1-Redux-dev")
    cfg = json.load(open(os.path.join(folder, "image_encoder", "config.json")))
    proc_cfg = json.load(open(os.path.join(folder, "feature_extractor", "preprocessor_config.json")))
    emb_cfg = json.load(open(os.path.join(folder, "image_embedder", "config.json")))
    siglip_cfg = {k: cfg[k] for k in gen.SIGLIP}
    enc = gen.RefSiglipVision(siglip_cfg, gen.siglip_state(siglip_cfg, 1), torch.float32)
    emb = ReduxImageEncoder(redux_dim=emb_cfg["redux_dim"], txt_in_features=emb_cfg["txt_in_features"]).eval()
    proc = gen.RefSiglipProcessor(proc_cfg)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (512, 512, 3), dtype=np.uint8))

    def best(f):
        f()
        t = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
        return min(t)

    out = {}
    with torch.inference_mode():
        proc_s = best(lambda: out.__setitem__("x", proc.preprocess(images=image)["pixel_values"]))
        enc_s = best(lambda: out.__setitem__("h", enc(pixel_values=out["x"]).last_hidden_state))
        emb_s = best(lambda: emb(out["h"]))
    print("peer-result " + json.dumps({"processor_s": proc_s, "encoder_s": enc_s, "embedder_s": emb_s,
                                       "torch": torch.__version__}), flush=True)


def encode_times(args, side):
    """(processor, encoder, embedder) seconds of one process of `side`."""
    if side.name == "diffusers":
        cmd = shlex.split(args.peer_python) + [os.path.abspath(__file__), "--peer-encode", "--threads",
                                              str(args.threads), "--repeat", "1"]
        for d in args.diffusers:
            cmd += ["--path", os.path.abspath(d)]
        r = peer.peer_result(peer.run(cmd, "python encode"), "python encode")
        side.version = side.version if getattr(side, "version", None) else "torch %s" % r["torch"]
        return r["processor_s"], r["encoder_s"], r["embedder_s"]
    out = peer.run(peer.fluxmpi_exe(side, "tools/bench/fluxmpi-bench-siglip") +
                   ["--threads", str(args.threads), "--repeat", "1"], side.name + " encode")
    ms = [float(re.search(r"%s: ([0-9.]+) ms" % k, out).group(1)) / 1e3
          for k in ("siglip processor", "siglip encoder", "redux embedder")]
    return tuple(ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-encode", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--repeat", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--diffusers", action="append", default=[], help="folder holding diffusers (repeatable)")
    ap.add_argument("--peer-python", default=os.path.join(REPO, "scripts", "debian13.sh") + " python3")
    ap.add_argument("--build", default="build")
    ap.add_argument("--build-d13", default="build-debian13")
    ap.add_argument("--work", default=None, help="models (default BUILD/peer-bench, shared with peer.py)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--forward-model", choices=("d512", "d3072"), default="d3072")
    ap.add_argument("--only", choices=("forward", "encode"), action="append")
    args = ap.parse_args()
    if args.peer_encode:
        peer_encode(args)
        return
    if not args.diffusers:
        peer.fail("--diffusers is required")
    os.chdir(REPO)
    args.build = os.path.abspath(args.build)
    work = os.path.abspath(args.work or os.path.join(args.build, "peer-bench"))
    os.makedirs(work, exist_ok=True)
    parts = args.only or ["forward", "encode"]
    sides = [peer.Side("diffusers", None), peer.Side("fluxmpi", [], args.build)]
    if os.path.exists(os.path.join(args.build_d13, "fluxmpi")):
        sides.append(peer.Side("fluxmpi-2.6", [os.path.join(REPO, "scripts", "debian13.sh")],
                               os.path.abspath(args.build_d13)))
    start, load_before = time.time(), peer.loadavg()
    header = "| measurement | peer | fluxmpi | ratio |" + "".join(" fluxmpi (2.6) | ratio |" for s in sides[2:])
    print(header)
    print("|" + "---|" * (header.count("|") - 1), flush=True)
    if "forward" in parts:
        model = peer.make_models(args, work, [args.forward_model])[args.forward_model]
        for tokens, what in ((PLAIN_TOKENS, "text-to-image"), (PLAIN_TOKENS + REDUX_TOKENS, "Redux")):
            peer.TEXT_TOKENS = tokens
            best = peer.interleaved(sides, args.rounds, lambda s: (peer.forward_time(args, s, model, args.size, "fp32", 1), ""))
            print(peer.row_text("forward, width %s, %d², fp32, %d text tokens (%s)" % (args.forward_model[1:], args.size,
                                                                                       tokens, what), sides, best), flush=True)
    if "encode" in parts:
        times = {s.name: [] for s in sides}
        for i in range(args.rounds):
            for s in (sides if i % 2 == 0 else sides[::-1]):
                times[s.name].append(encode_times(args, s))
        for k, what in enumerate(("SigLIP processor (512² -> 384²)", "SigLIP so400m encoder, 729 tokens",
                                  "Redux embedder, 729 tokens")):
            best = {n: (min(t[k] for t in ts), "") for n, ts in times.items()}
            print(peer.row_text("encode: %s, fp32" % what, sides, best), flush=True)
    print()
    print("peer: diffusers %s (forward); the encode rows' peer is the generator's transformers-semantics SigLIP "
          "and diffusers' ReduxImageEncoder" % ", ".join(args.diffusers))
    print("CPU: %s" % peer.cpu_flags())
    print("libtorch of the fluxmpi builds: %s" % ", ".join("%s %s" % (s.name, peer.libtorch_version(s)) for s in sides[1:]))
    print("threads %d per process; load average before %s, after %s; %.0f s" % (args.threads, load_before, peer.loadavg(),
                                                                                 time.time() - start))
    print("command: %s" % " ".join(map(shlex.quote, sys.argv)))


if __name__ == "__main__":
    main()
