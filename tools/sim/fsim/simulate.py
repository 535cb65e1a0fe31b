"""One simulated job: builds the rank programs of schedule.py, runs them, and summarises."""
import math

from . import decode as vae_decode
from .engine import Engine, Link
from .model import parse_partition, plan_stages
from .schedule import Dispatcher, Job, Leader, downstream_reactive, downstream_static, make_groups


class Config:
    """A job as fluxmpi's options describe it (defaults: fluxmpi's, FLUX.1-dev at 1024^2)."""

    def __init__(self, **kw):
        self.ranks = 1
        self.stages = None          # ranks per pipeline; None = all ranks (one pipeline)
        self.partition = None       # "0:0-5,1:6-11" for one pipeline's S ranks
        self.microbatch = 1
        self.patches = 1
        self.warmup = 1
        self.images = 1
        self.steps = 28
        self.height = 1024
        self.width = 1024
        self.text_tokens = 512      # --max-sequence-length
        self.true_cfg = False       # two passes per step
        self.prompts = 1            # distinct prompts to encode
        self.checkpoint = False
        self.checkpoint_every = 1
        self.decode = None          # "end" (fluxmpi: each leader after its loop) | "inline" (a what-if)
        self.slots = None           # groups in flight per leader; None: all (one pipeline) or S (several)
        self.ranks_per_node = None  # None: the profile's host.ranks_per_node, else all ranks on one node
        self.vae_tiling = False     # --vae-tiling (when the latent exceeds one tile)
        self.vae_slicing = False    # --vae-slicing: one image a decoder pass
        self.decode_ranks = None    # ranks of a pipeline that decode tiles; None: min(S, tiles) when tiled
        self.vae_tile = 128         # latent cells of a VAE tile (FLUX.1: sample_size 1024 / 8)
        self.vae_scale = 8          # pixels per latent cell
        self.cores_per_node = "profile"
        self.capacity = None        # {n: processors n computing ranks get} (a shared CPU machine)
        for k, v in kw.items():
            if not hasattr(self, k):
                raise TypeError("unknown option %r" % k)
            setattr(self, k, v)

    def latent(self):
        """The packed latent's cells: 2 * (H // 16) per side (FLUX VAE)."""
        return 2 * (self.height // 16), 2 * (self.width // 16)


def _then(first, second):
    """One rank program after the other."""
    yield from first
    yield from second


def simulate(profile, cfg):
    P = cfg.ranks
    S = cfg.stages or P
    if P % S != 0:
        raise ValueError("--stages %d does not divide --ranks %d" % (S, P))
    pipes = P // S
    stages = parse_partition(cfg.partition, S, profile.shape) if cfg.partition else \
        plan_stages(profile.shape, S, profile.dtype_bytes)
    lh, lw = cfg.latent()
    groups = make_groups(cfg.images, cfg.microbatch)
    decode = cfg.decode or "end"
    slots = cfg.slots if cfg.slots is not None else (None if pipes == 1 else S)
    # Decoding as each group finishes, the ranks behind a leader are still denoising: it decodes
    # its tiles alone.
    decode_ranks = 1 if decode == "inline" else (cfg.decode_ranks if cfg.decode_ranks is not None else S)
    if decode_ranks < 1 or decode_ranks > S:
        raise ValueError("--decode-ranks %d: a pipeline has %d rank(s)" % (decode_ranks, S))
    plan = vae_decode.DecodePlan(lh, lw, tiled=cfg.vae_tiling, slicing=cfg.vae_slicing, ranks=decode_ranks,
                                 tile=cfg.vae_tile, scale=cfg.vae_scale, latent_channels=profile.shape.in_channels // 4)
    job = Job(profile, stages, groups, cfg.steps, cfg.text_tokens, lh, lw, passes=2 if cfg.true_cfg else 1,
              patches=cfg.patches, warmup=cfg.warmup, checkpoint=cfg.checkpoint,
              checkpoint_every=cfg.checkpoint_every, decode=decode, slots=slots,
              pixels=cfg.height * cfg.width, microbatch=cfg.microbatch, pipelines=pipes, decode_plan=plan)

    rpn = cfg.ranks_per_node or profile.host.get("ranks_per_node") or P
    cores = profile.host.get("cores_per_node") if cfg.cores_per_node == "profile" else cfg.cores_per_node
    node_of = [r // rpn for r in range(P)]
    core_map = None if cores is None else {n: cores for n in set(node_of)}
    intra = Link(**profile.links["intra"])
    inter = Link(**profile.links.get("inter", profile.links["intra"]))

    def link(a, b):
        return intra if node_of[a] == node_of[b] else inter

    static = pipes == 1 and slots is None and decode == "end"
    programs = []
    dispatcher = Dispatcher(groups)
    for j in range(pipes):
        ranks = list(range(j * S, (j + 1) * S))
        leader = Leader(job, ranks)
        fetch = 0.0 if j == 0 else 2 * link(ranks[0], 0).latency
        programs.append(leader.static() if static else leader.dynamic(dispatcher, fetch))
        for i in range(1, S):
            programs.append(_then(downstream_static(job, ranks, i) if static else downstream_reactive(job, ranks, i),
                                  vae_decode.helper(job, ranks, i)))

    capacity = None
    if cfg.capacity:
        def capacity(n):
            return cfg.capacity.get(n, cores)
    res = Engine(node_of, core_map, link, capacity).run(programs).result()

    # Stage 1 (before the loop): rank 0 encodes each distinct prompt (and the negative prompt once);
    # with several pipelines it then broadcasts every work group's inputs to the leaders
    # (app/leader_job.cpp: per image its embeddings for each pass and its initial latents).
    encode = (cfg.prompts + (1 if cfg.true_cfg else 0)) * profile.costs.encode_prompt()
    if pipes > 1:
        passes = 2 if cfg.true_cfg else 1
        D_emb = (cfg.text_tokens * profile.shape.joint_dim + profile.shape.pooled_dim) * profile.dtype_bytes
        latents = (lh // 2) * (lw // 2) * 64 * profile.dtype_bytes
        nbytes = cfg.images * (passes * D_emb + latents)
        encode += math.ceil(math.log2(pipes)) * (inter.latency + nbytes / inter.bandwidth)

    def marks(name):
        return [(t, v) for r in res for (t, n, v) in r["log"] if n == name]

    denoise_end = [t for t, _ in marks("denoise_end")]
    denoise = res[0]["log"] and max(t for t, n, _ in res[0]["log"] if n == "denoise_end")
    span = max(r["end"] for r in res)
    starts = {}
    for t, gi in marks("group_start"):
        starts.setdefault(gi, t)
    group_of = {i: g for g in groups for i in range(g.first_image, g.first_image + g.count)}
    latencies = [t - starts[group_of[i].index] for t, i in marks("image_decoded")]
    own_end = [max(t for t, n, _ in r["log"] if n == "denoise_end") for r in res]
    # Rank 0's decode stage after its loop (decode "end"; inline decodes sit inside the loop).
    decode_s = res[0]["end"] - own_end[0] if decode == "end" else None
    total = encode + span
    return {
        "ranks": P, "stages": S, "pipelines": pipes, "microbatch": cfg.microbatch, "patches": cfg.patches,
        "warmup": cfg.warmup, "images": cfg.images, "steps": cfg.steps, "height": cfg.height, "width": cfg.width,
        "slots": slots, "decode": decode, "vae": plan.describe(),
        "plan": [s.describe() for s in stages],
        "encode_s": encode,
        "denoise_s": max(denoise_end) if not static else denoise,
        "decode_s": decode_s,
        "total_s": total,
        "images_per_hour": 3600.0 * cfg.images / total if total > 0 else float("inf"),
        "latency_mean_s": sum(latencies) / len(latencies) if latencies else None,
        "latency_max_s": max(latencies) if latencies else None,
        "idle_share": [1.0 - r["busy"] / span if span > 0 else 0.0 for r in res],
        # The loop's own blocked time: a decode helper's wait for its passes comes after it.
        "blocked_share": [r["blocked_at"].get("denoise_end", r["blocked"]) / e if e > 0 else 0.0
                          for r, e in zip(res, own_end)],
        "busy_s": [r["busy"] for r in res],
    }
