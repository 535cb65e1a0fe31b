"""The VAE decode stage (runner.cpp phase 4, pipeline/tile_decode.h): after the step loop the
leader decodes the images in passes of `microbatch` images (one image a pass with --vae-slicing).
Untiled, a pass costs decode.c0 + decode.c1 x pixels per image. Tiled (--vae-tiling, a latent larger
than one tile), a pass is the tiles of diffusers' loop, each costing the decode's c0 + c1 x the
tile's pixels per image (or the profile's `decode_tile` costs), plus `blend.c1` x output pixels
per image on the leader. With decode ranks n > 1 the tiles go round robin (tile k to rank k % n of
the pipeline's decode ranks): the leader sends each helper the pass's latents, decodes its own
tiles and receives the others' in grid order; a helper, its blocks done, decodes its tiles of each
pass and sends them back."""
from .engine import Message
from .model import HEADER_BYTES

LATENTS, TILE = "DecodeLatents", "DecodedTile"


def tile_grid(h, w, tile, stride):
    """vae::tile_grid: (height, width) of each tile, row by row."""
    return [(min(i + tile, h) - i, min(j + tile, w) - j) for i in range(0, h, stride) for j in range(0, w, stride)]


class DecodePlan:
    """How the job's images are decoded: whole, or in tiles over `ranks` (pipeline indices, the
    leader 0 first)."""

    def __init__(self, latent_h, latent_w, tiled=False, slicing=False, ranks=None, tile=128, scale=8,
                 latent_channels=16, out_channels=3):
        self.latent_h, self.latent_w = latent_h, latent_w
        self.scale = scale
        self.latent_channels, self.out_channels = latent_channels, out_channels
        stride = int(tile * (1 - 0.25))
        self.tiled = tiled and (latent_h > tile or latent_w > tile)
        self.grid = tile_grid(latent_h, latent_w, tile, stride) if self.tiled else []
        self.slicing = slicing
        n = 1 if ranks is None else ranks
        self.ranks = list(range(min(n, len(self.grid)))) if self.tiled and n > 1 else [0]

    @property
    def spread(self):
        return len(self.ranks) > 1

    def describe(self):
        if not self.tiled:
            return "untiled"
        return "%d tiles over %d rank(s)" % (len(self.grid), len(self.ranks))

    def passes(self, images, microbatch):
        """runner.cpp: batches of `microbatch` images in image order; sliced, one image a pass."""
        batches = [images[k:k + microbatch] for k in range(0, len(images), microbatch)]
        return [[i] for b in batches for i in b] if self.slicing else batches

    def owner(self, k):
        return self.ranks[k % len(self.ranks)]

    def tile_pixels(self, k):
        th, tw = self.grid[k]
        return th * self.scale * tw * self.scale


def _tile_seconds(costs, m, pixels):
    c = costs.c.get("decode_tile", costs.c["decode"])
    return c["c0"] * m + c["c1"] * m * pixels


def _blend_seconds(costs, m, pixels):
    return costs.c.get("blend", {}).get("c1", 0.0) * m * pixels


def leader_passes(job, leader, images, between=None):
    """The decode of `images` by `leader` (a schedule.Leader: its pipeline's ranks and its count of
    tiled passes), a rank program fragment; `between` (a fragment) runs after each pass (rank 0
    serving the other pipelines' leaders)."""
    plan, costs, pipeline_ranks = job.decode_plan, job.costs, leader.ranks
    for batch in plan.passes(images, job.microbatch):
        m = len(batch)
        if not plan.tiled:
            yield ("compute", costs.decode(m, job.pixels), "decode")
        else:
            nbytes = m * plan.latent_channels * plan.latent_h * plan.latent_w * job.dtype_bytes + HEADER_BYTES
            for helper in plan.ranks[1:]:
                yield ("send", pipeline_ranks[helper], Message((LATENTS, leader.decode_passes, m), nbytes, 2))
            for k in range(len(plan.grid)):
                if plan.owner(k) == 0:
                    yield ("compute", _tile_seconds(costs, m, plan.tile_pixels(k)), "decode")
                else:
                    yield ("recv", pipeline_ranks[plan.owner(k)], (TILE, leader.decode_passes, k))
            yield ("compute", _blend_seconds(costs, m, job.pixels), "decode")
            leader.decode_passes += 1
        for i in batch:
            yield ("mark", "image_decoded", i)
        if between is not None:
            yield from between()


def leader_finish(job, leader):
    """The end marker to every helper (TileDecodeLeader::finish)."""
    plan = job.decode_plan
    for helper in plan.ranks[1:]:
        yield ("send", leader.ranks[helper], Message((LATENTS, leader.decode_passes, 0), HEADER_BYTES, 2))
    if plan.spread:
        yield ("wait_sends",)


def helper(job, pipeline_ranks, i):
    """A decode helper, after its part of the step loop: pass after pass until the end marker."""
    plan = job.decode_plan
    if i not in plan.ranks[1:]:
        return
    leader = pipeline_ranks[0]
    passes = 0
    while True:
        msg = yield ("recv", leader, None)
        kind, p, m = msg.key
        if kind != LATENTS or p != passes:
            raise ValueError("decode helper %d got %r" % (pipeline_ranks[i], msg.key))
        if m == 0:
            break
        for k in range(len(plan.grid)):
            if plan.owner(k) != i:
                continue
            yield ("compute", _tile_seconds(job.costs, m, plan.tile_pixels(k)), "decode")
            nbytes = m * plan.out_channels * plan.tile_pixels(k) * job.dtype_bytes + HEADER_BYTES
            yield ("send", leader, Message((TILE, p, k), nbytes, 2))
        passes += 1
    yield ("wait_sends",)
