"""The rank programs: the step loop of src/pipeline/denoise.cpp, one generator per rank, yielding
the engine's actions (engine.py) in the order the C++ code makes its calls.

Static schedule (stages == ranks, what fluxmpi runs today): Worker::run_root and
Worker::run_downstream, loop for loop. Rank 0 walks the steps in order and, within a step, the
work groups in order; it collects a group's v of the previous step only when it comes back to
that group (collect_previous), and drains the last step of every group after the loop; then it
decodes every image (runner.cpp phase 4).

Pipelines (`stages` S < ranks P, fluxmpi's `--stages`, src/app/job_loop.cpp): P/S pipelines of S
consecutive ranks; each pipeline's first rank (its leader) plays rank 0's part for the images it
takes (Worker::run_root with a WorkSource). A leader keeps up to `slots` work groups in flight
and walks them round robin: on each visit it collects the group's previous step as above and runs
its next step; a group whose last step has come back is finished and its slot is refilled, in
place, with the next group of the job from a shared counter (MPI_Fetch_and_op on rank 0: a round
trip for leaders other than rank 0), whose first step runs in the same visit. The ranks behind a
leader take the units in the order they come (the header says which unit it is) until the
leader's End marker. After its loop each leader decodes its own images (decode "end", what fluxmpi
does; "inline", each group decoded as it finishes, is a what-if). Rank 0 stays the only writer:
the other leaders' checkpoint rows cost rank 0 their write time when it takes them — after each of
its own steps, between its decode batches and at the end until every leader is done
(app/leader_channel.h). With one pipeline, unbounded slots and the decode at the end, this is
exactly the static schedule (tests/test_schedule.py checks it). The decode is fsim/decode.py: with
tiling over several ranks a leader spreads its images' tiles over the ranks of its own pipeline,
once their loop is done."""
from . import decode as vae_decode
from .engine import Message
from .model import noise_message, state_message

NOISE_PRED = 3


def kind_of(joint):
    return 2 if joint else 1  # JointStream : DoubleStreams


class Unit:
    __slots__ = ("patch", "text", "first", "count")

    def __init__(self, patch, text, first, count):
        self.patch, self.text, self.first, self.count = patch, text, first, count

    @property
    def tokens(self):
        return self.text + self.count


def patch_ranges(rows, cols, patches, text=0):
    """pipeline::patch_ranges: runs of whole token rows holding equal tokens (patch 0's `text` text
    tokens included) as far as the rows allow: patch p ends at the row nearest to (p + 1) / patches
    of all tokens (ties: the later row), each patch at least one row."""
    if not 1 <= patches <= rows:
        raise ValueError("%d patches of %d token rows" % (patches, rows))
    total, out, row = rows * cols + text, [], 0
    for p in range(patches):
        image = max(0, (p + 1) * total - patches * text)
        end = (2 * image + patches * cols) // (2 * patches * cols)
        end = rows if p + 1 == patches else min(max(end, row + 1), rows - (patches - 1 - p))
        out.append((row * cols, (end - row) * cols))
        row = end
    return out


class Group:
    __slots__ = ("index", "first_image", "count", "start_step")

    def __init__(self, index, first_image, count, start_step=0):
        self.index, self.first_image, self.count, self.start_step = index, first_image, count, start_step


def make_groups(images, microbatch, start_steps=None):
    """app/prepare.cpp make_groups: consecutive images with the same start step, up to microbatch."""
    groups = []
    for i in range(images):
        s = start_steps[i] if start_steps else 0
        g = groups[-1] if groups else None
        if g and g.first_image + g.count == i and g.start_step == s and g.count < microbatch:
            g.count += 1
            continue
        groups.append(Group(len(groups), i, 1, s))
    return groups


class Job:
    """Everything a rank knows of the job (DenoiseSetup), the plan and the costs."""

    def __init__(self, profile, stages, groups, steps, text_tokens, latent_h, latent_w, passes=1, patches=1,
                 warmup=1, checkpoint=False, checkpoint_every=1, decode="end", slots=None, pixels=None,
                 microbatch=1, pipelines=1, decode_plan=None):
        if patches < 1 or warmup < 1:
            raise ValueError("patches %d, warm-up steps %d" % (patches, warmup))
        self.profile, self.costs, self.shape = profile, profile.costs, profile.shape
        self.dtype_bytes = profile.dtype_bytes
        self.stages = stages  # one Stage per rank of a pipeline
        self.S = len(stages)
        self.groups = groups
        self.steps, self.text_tokens, self.passes = steps, text_tokens, passes
        self.rows, self.cols = latent_h // 2, latent_w // 2
        self.patches, self.warmup = patches, warmup
        self.checkpoint, self.every = checkpoint, checkpoint_every
        self.decode, self.slots = decode, slots
        self.pixels = pixels if pixels is not None else latent_h * latent_w * 64
        self.microbatch = microbatch
        self.pipelines = pipelines
        # The VAE decode (fsim/decode.py): untiled on the leader unless told otherwise.
        self.decode_plan = decode_plan or vae_decode.DecodePlan(latent_h, latent_w)
        # Messages staged through pinned host buffers (MPI not CUDA-aware): a device-to-host copy
        # before each send, a host-to-device copy after each receive, on the rank's own timeline.
        self.staging_bw = profile.host.get("staging_bandwidth")
        L = self.image_tokens
        self.whole = [Unit(-1, text_tokens, 0, L)]
        self.patch_units = [] if patches <= 1 else [
            Unit(p, text_tokens if p == 0 else 0, first, count)
            for p, (first, count) in enumerate(patch_ranges(self.rows, self.cols, patches, text_tokens))]

    @property
    def image_tokens(self):
        return self.rows * self.cols

    def exact_step(self, g, step):
        return self.patches <= 1 or step < g.start_step + self.warmup

    def units(self, g, step):
        return self.whole if self.exact_step(g, step) else self.patch_units

    def staging(self, nbytes):
        return nbytes / self.staging_bw if self.staging_bw else 0.0

    def keep_row(self, step):
        return (step + 1) % self.every == 0 or step == self.steps - 1

    # --- costs of one unit (one pass) on pipeline rank i --------------------------------------
    def block_seconds(self, i, g, u):
        kv = self.text_tokens + self.image_tokens if u.patch >= 0 else u.tokens
        return self.costs.blocks(self.stages[i], g.count, u.tokens, kv, patch=u.patch >= 0)

    def state_msg(self, i, g, step, p, u):
        joint = not self.stages[i].ends_in_double()
        nbytes, parts = state_message(self.shape, self.dtype_bytes, g.count, u.text, u.count, joint)
        return Message((kind_of(joint), g.first_image, step, p, u.patch), nbytes, parts, (g, step, p, u))

    def noise_msg(self, g, step, p, u):
        nbytes, parts = noise_message(self.shape, self.dtype_bytes, g.count, u.count)
        return Message((NOISE_PRED, g.first_image, step, p, u.patch), nbytes, parts, (g, step, p, u))


class Dispatcher:
    """The job's shared counter of work groups (pipelines only)."""

    def __init__(self, groups):
        self.queue = list(groups)

    def take(self):
        return self.queue.pop(0) if self.queue else None


# --- rank 0 / a pipeline leader ----------------------------------------------------------------

class Leader:
    def __init__(self, job, ranks):
        self.job = job
        self.ranks = ranks  # global ranks of this pipeline, leader first
        self.last = ranks[-1]
        self.done_leaders = 0  # rank 0: the other leaders that said they are done
        self.decode_passes = 0  # tiled passes so far (their messages' tag)

    def finish_unit(self, g, step, u):
        """Rank 0's Euler step of the unit's rows; on_step (checkpoint rows) after the step's last unit."""
        job = self.job
        yield ("compute", job.costs.scheduler(g.count, u.count), "scheduler")
        if u.patch < 0 or u.patch == job.patches - 1:
            if job.checkpoint:
                t = g.count * job.costs.checkpoint_step()
                if job.keep_row(step):
                    t += g.count * job.costs.checkpoint_row()
                if self.ranks[0] == 0:
                    yield ("compute", t, "checkpoint")
                else:  # sent to rank 0, which writes it (rows as float32)
                    rows = 2 * g.count * job.image_tokens * 64 * 4 if job.keep_row(step) else 0
                    yield ("send", 0, Message(("row",), rows + 576, 2 if rows else 1, t))
            elif self.ranks[0] != 0:
                yield ("send", 0, Message(("row",), 576, 1, 0.0))  # the step, for rank 0's progress
            if self.ranks[0] == 0:
                yield from self.serve()
            if step == job.steps - 1:
                yield ("mark", "group_done", g.index)

    def other_leaders(self):
        return [j * self.job.S for j in range(1, self.job.pipelines)]

    def take(self, msg):
        """Rank 0 handles one message of another leader: writes its rows, or counts it done."""
        if msg.key == ("done",):
            self.done_leaders += 1
        elif msg.payload > 0:
            yield ("compute", msg.payload, "checkpoint")

    def serve(self):
        """Rank 0 takes what the other leaders have sent so far (LeaderInbox::poll)."""
        if self.job.pipelines > 1:
            for msg in (yield ("poll", self.other_leaders())):
                yield from self.take(msg)

    def serve_until_done(self):
        """Rank 0 after its own decode: the other leaders' messages until every one is done."""
        while self.done_leaders < self.job.pipelines - 1:
            msg = yield ("recv_any", self.other_leaders())
            yield from self.take(msg)

    def collect(self, g, step, u):
        for p in range(self.job.passes):
            msg = yield ("recv", self.last, (NOISE_PRED, g.first_image, step, p, u.patch))
            yield ("compute", self.job.staging(msg.nbytes), "staging")

    def collect_previous(self, g, step, ui):
        job = self.job
        prev, cur = job.units(g, step - 1), job.units(g, step)
        if len(prev) == len(cur):
            yield from self.collect(g, step - 1, prev[ui])
            yield from self.finish_unit(g, step - 1, prev[ui])
        elif ui == 0:
            for u in prev:
                yield from self.collect(g, step - 1, u)
                yield from self.finish_unit(g, step - 1, u)

    def run_step(self, g, step):
        """One group's step: for each unit, what it needs of the previous step, then each pass."""
        job, S = self.job, self.job.S
        if step == g.start_step:
            yield ("mark", "group_start", g.index)
        us = job.units(g, step)
        for ui, u in enumerate(us):
            if S > 1 and step > g.start_step:
                yield from self.collect_previous(g, step, ui)
            for p in range(job.passes):
                t = job.costs.embed(g.count, u.text, u.count) + job.block_seconds(0, g, u)
                if S == 1:
                    t += job.costs.final(g.count, u.count)
                if S > 1:
                    msg = job.state_msg(0, g, step, p, u)
                    yield ("compute", t + job.staging(msg.nbytes), "unit")
                    yield ("send", self.ranks[1], msg)
                else:
                    yield ("compute", t, "unit")
            if S == 1:
                yield from self.finish_unit(g, step, u)

    def drain(self, g):
        job = self.job
        if job.S > 1:
            for u in job.units(g, job.steps - 1):
                yield from self.collect(g, job.steps - 1, u)
                yield from self.finish_unit(g, job.steps - 1, u)

    def decode_group(self, g):
        yield from vae_decode.leader_passes(self.job, self, list(range(g.first_image, g.first_image + g.count)))

    def decode_all(self, groups):
        """job_loop.cpp phase 4: batches of `microbatch` images in image order (fsim/decode.py);
        rank 0 serves the other leaders between batches."""
        images = sorted(i for g in groups for i in range(g.first_image, g.first_image + g.count))
        yield from vae_decode.leader_passes(self.job, self, images, between=self.serve if self.ranks[0] == 0 else None)
        yield from vae_decode.leader_finish(self.job, self)

    def static(self):
        """Worker::run_root with every group in flight, then the decode stage."""
        job = self.job
        for step in range(job.steps):
            for g in job.groups:
                if step < g.start_step:
                    continue
                yield from self.run_step(g, step)
        for g in job.groups:
            if g.start_step < job.steps:
                yield from self.drain(g)
        if job.S > 1:
            yield ("wait_sends",)
        yield ("mark", "denoise_end", None)
        yield from self.decode_all(job.groups)

    def dynamic(self, dispatcher, fetch_seconds):
        """A pipeline leader with `slots` groups in flight, refilled from the dispatcher."""
        job = self.job
        slots = job.slots if job.slots is not None else float("inf")
        done = []

        def take():
            yield ("sleep", fetch_seconds)
            return dispatcher.take()

        active = []  # [group, next step]
        while len(active) < slots:
            g = yield from take()
            if g is None:
                break
            active.append([g, g.start_step])
        while active:
            i = 0
            while i < len(active):
                g, step = active[i]
                if step >= job.steps:
                    yield from self.drain(g)
                    done.append(g)
                    if job.decode == "inline":
                        yield from self.decode_group(g)
                    nxt = yield from take()
                    if nxt is None:
                        del active[i]
                        continue
                    active[i] = [nxt, nxt.start_step]  # the slot is refilled in place
                    g, step = active[i]
                yield from self.run_step(g, step)
                active[i][1] = step + 1
                i += 1
        if job.S > 1:
            yield ("send", self.ranks[1], Message(("end",), 0, 1))
            yield ("wait_sends",)
        yield ("mark", "denoise_end", None)
        if job.decode != "inline":
            yield from self.decode_all(done)
        if self.ranks[0] == 0:
            yield from self.serve_until_done()
        else:
            yield ("send", 0, Message(("done",), 576, 1))
            yield ("wait_sends",)


# --- ranks 1..S-1 of a pipeline -------------------------------------------------------------

def downstream_static(job, ranks, i):
    """Worker::run_downstream: every unit in the order rank 0 sends them."""
    prev = ranks[i - 1]
    last = i == job.S - 1
    prev_joint = not job.stages[i - 1].ends_in_double()
    for step in range(job.steps):
        for g in job.groups:
            if step < g.start_step:
                continue
            for u in job.units(g, step):
                for p in range(job.passes):
                    msg = yield ("recv", prev, (kind_of(prev_joint), g.first_image, step, p, u.patch))
                    yield from _run_unit(job, ranks, i, msg, g, step, p, u, last)
    yield ("wait_sends",)
    yield ("mark", "denoise_end", None)


def downstream_reactive(job, ranks, i):
    """A pipeline rank that takes whatever unit its leader sent next, until the end marker."""
    last = i == job.S - 1
    while True:
        msg = yield ("recv", ranks[i - 1], None)
        if msg.key == ("end",):
            if not last:
                yield ("send", ranks[i + 1], Message(("end",), 0, 1))
            break
        g, step, p, u = msg.payload
        yield from _run_unit(job, ranks, i, msg, g, step, p, u, last)
    yield ("wait_sends",)
    yield ("mark", "denoise_end", None)


def _run_unit(job, ranks, i, received, g, step, p, u, last):
    t = job.staging(received.nbytes) + job.block_seconds(i, g, u)
    if last:
        t += job.costs.final(g.count, u.count)
    out = job.noise_msg(g, step, p, u) if last else job.state_msg(i, g, step, p, u)
    yield ("compute", t + job.staging(out.nbytes), "unit")
    yield ("send", ranks[0] if last else ranks[i + 1], out)
