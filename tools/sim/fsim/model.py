"""What the simulator is told about the machine and the model: the profile (costs, links, host),
the transformer's shape, the stage planner, and the message sizes of parallel/message.h."""
import json

# parallel/message.h: magic, version, kind, image, step, pass, count, per tensor dtype + rank +
# kMaxTensorDims sizes (8 tensors x 8 words), then the patch word.
HEADER_BYTES = 8 * (7 + 8 * (2 + 6) + 1)


class Shape:
    """The transformer's shape (a diffusers FluxTransformer2DModel config)."""

    def __init__(self, cfg):
        self.num_double = int(cfg["num_layers"])
        self.num_single = int(cfg["num_single_layers"])
        self.heads = int(cfg["num_attention_heads"])
        self.head_dim = int(cfg["attention_head_dim"])
        self.inner_dim = self.heads * self.head_dim
        self.in_channels = int(cfg.get("in_channels", 64))
        self.out_channels = int(cfg.get("out_channels") or self.in_channels)
        self.joint_dim = int(cfg.get("joint_attention_dim", 4096))
        self.pooled_dim = int(cfg.get("pooled_projection_dim", 768))
        self.guidance = bool(cfg.get("guidance_embeds", False))

    @property
    def num_blocks(self):
        return self.num_double + self.num_single

    def params(self):
        """count_transformer_params of partition.cpp: (double block, single block, embedders, final)."""
        D, F, Dh = self.inner_dim, 4 * self.inner_dim, self.head_dim

        def lin(i, o):
            return i * o + o

        double = 2 * (lin(D, 6 * D) + 4 * lin(D, D) + 2 * Dh + lin(D, F) + lin(F, D))
        single = lin(D, 3 * D) + 3 * lin(D, D) + 2 * Dh + lin(D, F) + lin(D + F, D)
        tmlp = lin(256, D) + lin(D, D)
        emb = lin(self.in_channels, D) + lin(self.joint_dim, D) + tmlp * (2 if self.guidance else 1) + \
            lin(self.pooled_dim, D) + lin(D, D)
        final = lin(D, 2 * D) + lin(D, self.out_channels)
        return double, single, emb, final

    def block_flops(self, tokens):
        """Planner FLOPs of one block on one image of `tokens` joint tokens (partition.cpp)."""
        D = float(self.inner_dim)
        return 2.0 * 12 * D * D * tokens + 4.0 * tokens * tokens * D


class Stage:
    """One rank's slice: global blocks first..last (inclusive)."""

    def __init__(self, first, last, num_double_total):
        self.first, self.last = first, last
        self.num_double = max(0, min(last, num_double_total - 1) - first + 1)
        self.num_single = (last - first + 1) - self.num_double

    @property
    def count(self):
        return self.last - self.first + 1

    def ends_in_double(self):
        return self.num_double > 0 and self.num_single == 0

    def describe(self):
        return "%d-%d (%dd+%ds)" % (self.first, self.last, self.num_double, self.num_single)


def plan_stages(shape, S, dtype_bytes=2, rank0_extra_bytes=0):
    """The compute-balanced plan of StagePlan::make for S ranks: the split whose per-rank block
    counts, sorted from the largest down, are lexicographically smallest, then the same for the
    ranks' memory, then their FLOPs (partition.cpp best_split). Memory here is the slice's weight
    bytes, plus the embedders and `rank0_extra_bytes` on rank 0 and the final layer on the last
    rank: the C++ estimate adds activations (equal on every rank) and rank 0's encode and decode
    stages, so where those decide a tie pass the plan with --partition instead."""
    B = shape.num_blocks
    if S > B:
        raise ValueError("cannot split %d blocks over %d ranks" % (B, S))
    pd, ps, pe, pf = shape.params()
    D = float(shape.inner_dim)
    per_block = shape.block_flops(4096 + 512)  # the planner's default tokens

    def cost(rank, first, last):
        st = Stage(first, last, shape.num_double)
        mem = (st.num_double * pd + st.num_single * ps) * dtype_bytes
        flops = st.num_double * (per_block + 24.0 * D * D) + st.num_single * (per_block + 6.0 * D * D)
        if rank == 0:
            mem += pe * dtype_bytes + rank0_extra_bytes
            flops += 2.0 * pe
        if rank == S - 1:
            mem += pf * dtype_bytes
            flops += 2.0 * pf
        return (st.count, mem, round(flops))

    def extend(key, c):
        out = [list(level) for level in key] if key else [[] for _ in c]
        for level, v in enumerate(c):
            out[level].append(v)
            out[level].sort(reverse=True)
        return out

    best = [[None] * (B + 1) for _ in range(S + 1)]
    choice = [[-1] * (B + 1) for _ in range(S + 1)]
    best[0][0] = []
    for r in range(1, S + 1):
        for j in range(r, B - (S - r) + 1):
            for i in range(r - 1, j):
                if best[r - 1][i] is None:
                    continue
                key = extend(best[r - 1][i], cost(r - 1, i, j - 1))
                if best[r][j] is None or key < best[r][j]:
                    best[r][j] = key
                    choice[r][j] = i
    firsts = [0] * S
    j = B
    for r in range(S, 0, -1):
        firsts[r - 1] = choice[r][j]
        j = choice[r][j]
    return [Stage(firsts[r], (firsts[r + 1] if r + 1 < S else B) - 1, shape.num_double) for r in range(S)]


def parse_partition(text, S, shape):
    """`--partition 0:0-5,1:6-11` (the fluxmpi syntax) -> stages, with its checks."""
    ranges = {}
    for part in text.split(","):
        rank, _, span = part.partition(":")
        a, _, b = span.partition("-")
        ranges[int(rank)] = (int(a), int(b) if b else int(a))
    if sorted(ranges) != list(range(S)):
        raise ValueError("--partition must name ranks 0..%d once each" % (S - 1))
    nxt = 0
    for r in range(S):
        a, b = ranges[r]
        if a != nxt or b < a:
            raise ValueError("--partition: rank %d must start at block %d" % (r, nxt))
        nxt = b + 1
    if nxt != shape.num_blocks:
        raise ValueError("--partition must cover blocks 0..%d" % (shape.num_blocks - 1))
    return [Stage(ranges[r][0], ranges[r][1], shape.num_double) for r in range(S)]


class Costs:
    """Seconds of each piece of work, from the profile's `costs` (tools/sim/README.md)."""

    def __init__(self, c):
        self.c = c

    def block(self, kind, m, q, kv, patch=False):
        """One block on a unit of m images x q query tokens attending to kv tokens; a patch of a
        pipelined step has costs of its own where the profile measured them (`*_block_patch`)."""
        b = self.c.get(kind + "_block_patch") if patch else None
        b = b or self.c[kind + "_block"]
        return b["c0"] + b["c1"] * m * q + b["c2"] * m * q * kv

    def blocks(self, stage, m, q, kv, patch=False):
        return (stage.num_double * self.block("double", m, q, kv, patch) +
                stage.num_single * self.block("single", m, q, kv, patch))

    def embed(self, m, text, image):
        e = self.c["embedder"]
        return e["c0"] + e["c_img"] * m * image + e["c_txt"] * m * text

    def final(self, m, image):
        f = self.c["final_layer"]
        return f["c0"] + f["c1"] * m * image

    def scheduler(self, m, image):
        s = self.c.get("scheduler", {"c0": 0.0, "c1": 0.0})
        return s["c0"] + s["c1"] * m * image

    def decode(self, images, pixels):
        d = self.c["decode"]
        return d["c0"] * images + d["c1"] * images * pixels

    def encode_prompt(self):
        return self.c["encode_prompt_s"]

    def checkpoint_step(self):
        return self.c["checkpoint"]["step_s"]

    def checkpoint_row(self):
        return self.c["checkpoint"]["row_s"]


class Profile:
    def __init__(self, data):
        self.data = data
        self.name = data.get("name", "?")
        self.shape = Shape(data["model"])
        self.dtype_bytes = int(data.get("dtype_bytes", 2))
        self.costs = Costs(data["costs"])
        self.links = data["links"]
        self.host = data.get("host", {})

    @staticmethod
    def load(path):
        with open(path) as f:
            return Profile(json.load(f))


def state_message(shape, dtype_bytes, m, text, image, joint):
    """(bytes, MPI messages) of the stream state leaving a slice (DoubleStreams or JointStream)."""
    D = shape.inner_dim
    elements = m * (text + image) * D + m * D
    tensors = 2 if joint else 3
    return elements * dtype_bytes + HEADER_BYTES, 1 + tensors


def noise_message(shape, dtype_bytes, m, image):
    return m * image * shape.out_channels * dtype_bytes + HEADER_BYTES, 2
