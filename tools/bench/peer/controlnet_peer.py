#!/usr/bin/env python3
"""What a ControlNet adds to one denoising step, fluxmpi against diffusers, in one table.

  tools/bench/peer/controlnet_peer.py --diffusers DIR [--diffusers DIR2] [--build build] [--build-d13 build-debian13]
                                      [--peer-python "scripts/debian13.sh python3"] [--work DIR] [--threads 2]
                                      [--sizes 512] [--rounds 3] [--repeat 3] [--cn-double 1] [--cn-single 2]
                                      [--cn-modes 0] [--dtype fp32]

Uses peer.py's d512 model (make-tiny-model: width 512, 2 double + 4 single blocks) and a random
FluxControlNetModel of the same width with --cn-double / --cn-single blocks (the InstantX ratio of
about a quarter of the transformer's blocks; --cn-modes > 0: a Union model). Each process times,
after a warm-up, the plain step's transformer forward and the ControlNet step (the ControlNet's
forward, then the transformer with its residuals), best of --repeat; the implementations take turns
process after process for --rounds rounds (fluxmpi-bench-controlnet; FluxControlNetModel and
FluxTransformer2DModel in the peer's Python, by the `side` command of this script). Prints a
Markdown table: each side's times, the ControlNet step's cost against its own plain step, and
fluxmpi's ControlNet step against diffusers'.

  controlnet_peer.py side --path P [--path P2] --model DIR --height H --width W --msl S --threads N --repeat R
                     --cn-double N --cn-single M --cn-modes K --dtype fp32|bf16    (runs in the peer's Python)
"""
import argparse, json, os, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peer  # noqa: E402  (make_models, run, interleaved, loadavg, cpu_flags, Side, libtorch_version)


def side(args):
    from diffusers_side import import_diffusers, report, token_ids, torch_dtype, versions
    mods = import_diffusers(args.path)
    import torch
    from diffusers.models.controlnets.controlnet_flux import FluxControlNetModel
    diffusers, FluxTransformer2DModel = mods[0], mods[3]
    torch.set_num_threads(args.threads)
    dt = torch_dtype(torch, args.dtype)
    model = FluxTransformer2DModel.from_pretrained(args.model, subfolder="transformer", torch_dtype=dt).eval()
    cfg = model.config
    torch.manual_seed(7)
    net = FluxControlNetModel(in_channels=cfg.in_channels, num_layers=args.cn_double, num_single_layers=args.cn_single,
                              attention_head_dim=cfg.attention_head_dim, num_attention_heads=cfg.num_attention_heads,
                              joint_attention_dim=cfg.joint_attention_dim, pooled_projection_dim=cfg.pooled_projection_dim,
                              guidance_embeds=cfg.guidance_embeds, axes_dims_rope=list(cfg.axes_dims_rope),
                              num_mode=args.cn_modes or None).to(dt).eval()
    h, w = 2 * (args.height // 16), 2 * (args.width // 16)
    tokens = (h // 2) * (w // 2)
    g = torch.Generator("cpu").manual_seed(1)
    latents = torch.randn(1, tokens, cfg.in_channels, generator=g).to(dt)
    cond = torch.randn(1, tokens, cfg.in_channels, generator=g).to(dt)
    text = torch.randn(1, args.msl, cfg.joint_attention_dim, generator=g).to(dt)
    pooled = torch.randn(1, cfg.pooled_projection_dim, generator=g).to(dt)
    img_ids, txt_ids = token_ids(torch, h, w, args.msl)
    timestep = torch.full((1,), 0.5, dtype=dt)
    guidance = torch.full((1,), 3.5) if cfg.guidance_embeds else None
    mode = torch.zeros(1, 1, dtype=torch.long) if args.cn_modes else None
    common = dict(encoder_hidden_states=text, pooled_projections=pooled, timestep=timestep, img_ids=img_ids,
                  txt_ids=txt_ids, guidance=guidance, return_dict=False)

    def plain():
        model(hidden_states=latents, **common)

    cn_only = [float("inf")]

    def controlled():
        t0 = time.perf_counter()
        d, s = net(hidden_states=latents, controlnet_cond=cond, controlnet_mode=mode, conditioning_scale=0.8, **common)
        cn_only[0] = min(cn_only[0], time.perf_counter() - t0)
        model(hidden_states=latents, controlnet_block_samples=d, controlnet_single_block_samples=s, **common)

    best = {"plain": float("inf"), "controlnet": float("inf")}
    with torch.inference_mode():
        plain()
        controlled()
        cn_only[0] = float("inf")
        for i in range(args.repeat):
            for name in (("plain", "controlnet") if i % 2 == 0 else ("controlnet", "plain")):
                t0 = time.perf_counter()
                (plain if name == "plain" else controlled)()
                best[name] = min(best[name], time.perf_counter() - t0)
    report(kind="controlnet_step", plain_s=best["plain"], controlnet_s=best["controlnet"], controlnet_only_s=cn_only[0],
           tokens=tokens, **versions(torch, diffusers))


def measure(args, s, model, size):
    flags = ["--height", str(size), "--width", str(size), "--msl", str(peer.TEXT_TOKENS), "--threads", str(args.threads),
             "--repeat", str(args.repeat), "--cn-double", str(args.cn_double), "--cn-single", str(args.cn_single),
             "--cn-modes", str(args.cn_modes), "--dtype", args.dtype]
    if s.name == "diffusers":
        cmd = peer.shlex.split(args.peer_python) + [os.path.abspath(__file__), "side"]
        for d in args.diffusers:
            cmd += ["--path", os.path.abspath(d)]
        r = peer.peer_result(peer.run(cmd + ["--model", model] + flags, "diffusers ControlNet step"), "diffusers")
        s.version = "torch %s, diffusers %s" % (r["torch"], r["diffusers"])
    else:
        out = peer.run(peer.fluxmpi_exe(s, "tools/bench/fluxmpi-bench-controlnet") + ["--model", model] + flags,
                       s.name + " ControlNet step")
        line = next((l for l in out.splitlines() if l.startswith("bench-result ")), None)
        if line is None:
            peer.fail("no result from %s:\n%s" % (s.name, out))
        r = json.loads(line[len("bench-result "):])
    return r["controlnet_s"], r


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "side":
        ap = argparse.ArgumentParser()
        ap.add_argument("side")
        ap.add_argument("--path", action="append", default=[])
        for k in ("model", "dtype"):
            ap.add_argument("--" + k, required=True)
        for k in ("height", "width", "msl", "threads", "repeat", "cn-double", "cn-single", "cn-modes"):
            ap.add_argument("--" + k, type=int, required=True)
        side(ap.parse_args())
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--diffusers", action="append", required=True)
    ap.add_argument("--build", default="build")
    ap.add_argument("--build-d13", default="build-debian13")
    ap.add_argument("--peer-python", default=os.path.join(peer.REPO, "scripts", "debian13.sh") + " python3")
    ap.add_argument("--work", default="/tmp/fluxmpi-peer")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default="512")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cn-double", type=int, default=1)
    ap.add_argument("--cn-single", type=int, default=2)
    ap.add_argument("--cn-modes", type=int, default=0)
    ap.add_argument("--dtype", default="fp32")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    model = peer.make_models(args, args.work, ["d512"])["d512"]
    sides = [peer.Side("diffusers", []), peer.Side("fluxmpi", [], os.path.abspath(args.build))]
    if os.path.isdir(args.build_d13):
        sides.append(peer.Side("fluxmpi (libtorch 2.6)", peer.shlex.split(os.path.join(peer.REPO, "scripts", "debian13.sh")),
                               os.path.abspath(args.build_d13)))
    print("CPU: %s; load average before: %s; %d threads, %s; ControlNet %d double + %d single blocks%s over d512" %
          (peer.cpu_flags(), peer.loadavg(), args.threads, args.dtype, args.cn_double, args.cn_single,
           " (Union, %d modes)" % args.cn_modes if args.cn_modes else ""))
    print("\n| size | side | plain step | ControlNet step | ControlNet alone | step cost | against diffusers |")
    print("|---|---|---|---|---|---|---|")
    for size in [int(x) for x in args.sizes.split(",")]:
        results = {}

        def one(s):
            t, r = measure(args, s, model, size)
            if t < results.get(s.name, ({"controlnet_s": float("inf")},))[0]["controlnet_s"]:
                results[s.name] = (r,)
            return t, ""
        peer.interleaved(sides, args.rounds, one)
        ref = results["diffusers"][0]["controlnet_s"]
        for s in sides:
            r = results[s.name][0]
            print("| %d² | %s | %.1f ms | %.1f ms | %.1f ms | %.2fx | %s |" %
                  (size, s.name, r["plain_s"] * 1e3, r["controlnet_s"] * 1e3, r["controlnet_only_s"] * 1e3,
                   r["controlnet_s"] / r["plain_s"], "-" if s.name == "diffusers" else "**%.2f**" % (r["controlnet_s"] / ref)))
    print("\n%s; load average after: %s" % ("; ".join("%s: %s" % (s.name, getattr(s, "version", "")) for s in sides if s.name == "diffusers"),
                                           peer.loadavg()))


if __name__ == "__main__":
    main()
