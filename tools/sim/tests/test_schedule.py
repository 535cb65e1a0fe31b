"""Unit tests of the schedule simulator (run: python3 -m unittest discover -s tools/sim/tests)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fsim.engine import Engine, Link, Message, ScheduleError  # noqa: E402
from fsim.model import HEADER_BYTES, Profile, Shape, noise_message, plan_stages, state_message  # noqa: E402
from fsim.schedule import make_groups, patch_ranges  # noqa: E402
from fsim.simulate import Config, simulate  # noqa: E402

FLUX_DEV = {"num_layers": 19, "num_single_layers": 38, "num_attention_heads": 24, "attention_head_dim": 128,
            "in_channels": 64, "joint_attention_dim": 4096, "pooled_projection_dim": 768, "guidance_embeds": True}
BENCH = {"num_layers": 4, "num_single_layers": 8, "num_attention_heads": 6, "attention_head_dim": 128,
         "in_channels": 64, "joint_attention_dim": 64, "pooled_projection_dim": 32, "guidance_embeds": True}


def toy_profile(double=2.0, single=1.0, embed=1.0, final=1.0, decode=1.0, latency=0.125, c1=0.0, c2=0.0,
                cores=None, model=None, staging=None):
    """One double and one single block; every cost a constant unless c1/c2 are given."""
    return Profile({
        "model": model or {"num_layers": 1, "num_single_layers": 1, "num_attention_heads": 1,
                           "attention_head_dim": 8, "in_channels": 4, "joint_attention_dim": 8,
                           "pooled_projection_dim": 8},
        "dtype_bytes": 2,
        "costs": {"double_block": {"c0": double, "c1": c1, "c2": c2},
                  "single_block": {"c0": single, "c1": c1, "c2": c2},
                  "embedder": {"c0": embed, "c_img": 0.0, "c_txt": 0.0},
                  "final_layer": {"c0": final, "c1": 0.0},
                  "decode": {"c0": decode, "c1": 0.0},
                  "encode_prompt_s": 0.0, "checkpoint": {"step_s": 0.0, "row_s": 0.0}},
        "host": {"cores_per_node": cores, "staging_bandwidth": staging},
        "links": {"intra": {"bandwidth": float("inf"), "latency": latency}}})


def toy(**kw):
    base = dict(height=64, width=64, text_tokens=4, steps=2)
    base.update(kw)
    return Config(**base)


class HandComputed(unittest.TestCase):
    def test_two_stages_three_microbatches(self):
        """2 ranks, 3 work groups of 1 image, 2 steps, decode at the end.

        Rank 0 runs the embedder (1 s) and the double block (2 s): A = 3 s a unit; rank 1 the
        single block (1 s) and the final layer (1 s): B = 2 s. Latency 0.125 s per MPI message:
        DoubleStreams is a header + 3 tensors (0.5 s), NoisePred a header + 1 tensor (0.25 s).
        Decoding: 1 s an image, on rank 0 after the loop.

          rank 0  step 0: g0 [0,3] g1 [3,6] g2 [6,9]          (arrive at rank 1: 3.5, 6.5, 9.5)
          rank 1  step 0: g0 [3.5,5.5] g1 [6.5,8.5] g2 [9.5,11.5]   (v back at 5.75, 8.75, 11.75)
          rank 0  step 1: each v is back when rank 0 returns to its group:
                          g0 [9,12] g1 [12,15] g2 [15,18]     (arrive 12.5, 15.5, 18.5)
          rank 1  step 1: g0 [12.5,14.5] g1 [15.5,17.5] g2 [18.5,20.5]  (v at 14.75, 17.75, 20.75)
          rank 0  drain:  waits 18 -> 20.75 for the last v; decodes [20.75, 23.75]

        Total 23.75 s. Busy: rank 0 6 x 3 + 3 = 21 s, rank 1 6 x 2 = 12 s, so idle shares
        2.75 / 23.75 = 0.1158 and 11.75 / 23.75 = 0.4947. Blocked on messages, over each rank's
        own loop: rank 0 2.75 s of 20.75 s; rank 1 3.5 + 5 x 1 = 8.5 s of 20.5 s (these messages
        are below the 4 KiB eager limit, so its last send is complete when posted). Images decoded at 21.75, 22.75, 23.75, their groups
        started at 0, 3, 6: latencies 21.75, 19.75, 17.75 (mean 19.75 s); 3 x 3600 / 23.75
        images an hour."""
        r = simulate(toy_profile(), toy(ranks=2, images=3))
        self.assertEqual(r["plan"], ["0-0 (1d+0s)", "1-1 (0d+1s)"])
        self.assertAlmostEqual(r["denoise_s"], 20.75)
        self.assertAlmostEqual(r["total_s"], 23.75)
        self.assertAlmostEqual(r["idle_share"][0], 2.75 / 23.75)
        self.assertAlmostEqual(r["idle_share"][1], 11.75 / 23.75)
        self.assertAlmostEqual(r["blocked_share"][0], 2.75 / 20.75)
        self.assertAlmostEqual(r["blocked_share"][1], 8.5 / 20.5)
        self.assertAlmostEqual(r["latency_mean_s"], 19.75)
        self.assertAlmostEqual(r["latency_max_s"], 21.75)
        self.assertAlmostEqual(r["images_per_hour"], 3 * 3600 / 23.75)

    def test_patches_after_one_warmup_step(self):
        """1 image, 2 ranks, 3 steps, --patches 2 --warmup-steps 1, constant costs A = 3, B = 2,
        no latency. Step 0 is exact: [0,3] on rank 0, [3,5] on rank 1. Step 1 is pipelined and
        the first after the warm-up: rank 0 collects all of step 0 first (at 5), then patch 0
        [5,8] and patch 1 [8,11]; rank 1 runs them [8,10], [11,13]. Step 2: patch 0 needs
        step 1's patch 0 (back at 10): [11,14]; patch 1 needs its patch 1 (13): [14,17];
        rank 1 [14,16], [17,19]. Total 19 s plus a decode of 1 s = 20 s."""
        r = simulate(toy_profile(latency=0.0), toy(ranks=2, images=1, steps=3, patches=2))
        self.assertAlmostEqual(r["denoise_s"], 19.0)
        self.assertAlmostEqual(r["total_s"], 20.0)

    def test_one_rank_is_the_sum(self):
        """P = 1: every unit embeds, runs both blocks and the final layer: 5 s a step and image."""
        r = simulate(toy_profile(), toy(ranks=1, images=3, steps=4))
        self.assertAlmostEqual(r["denoise_s"], 3 * 4 * 5.0)
        self.assertAlmostEqual(r["total_s"], 60.0 + 3.0)  # then 3 decodes of 1 s
        self.assertEqual(r["idle_share"], [0.0])

    def test_staging_through_host_memory(self):
        """1 image, 1 step, 2 ranks, no latency, staging at 912 B/s. The toy DoubleStreams message
        (txt [1,4,8] + img [1,16,8] + temb [1,8] in 2-byte elements, + the 576-byte header) is 912
        bytes: 1 s to copy out on rank 0, 1 s in on rank 1; NoisePred ([1,16,4] + header, 704
        bytes) 704/912 s out on rank 1 and in on rank 0. 3 + 1 + (1 + 2 + 704/912) + 704/912 s,
        then the 1 s decode."""
        r = simulate(toy_profile(latency=0.0, staging=912.0), toy(ranks=2, images=1, steps=1))
        self.assertAlmostEqual(r["total_s"], 3 + 1 + 1 + 2 + 2 * 704 / 912 + 1)

    def test_true_cfg_doubles_the_units(self):
        one = simulate(toy_profile(), toy(ranks=1, images=2))
        two = simulate(toy_profile(), toy(ranks=1, images=2, true_cfg=True))
        self.assertAlmostEqual(two["denoise_s"], 2 * one["denoise_s"])

    def test_token_costs(self):
        """c1 per query token and c2 per query x key token: 64 x 64 px -> 4 x 4 = 16 image tokens,
        plus 4 text tokens; one step of one image on one rank runs both blocks on 20 tokens."""
        r = simulate(toy_profile(double=0, single=0, embed=0, final=0, c1=0.5, c2=0.01), toy(ranks=1, steps=1))
        self.assertAlmostEqual(r["denoise_s"], 2 * (0.5 * 20 + 0.01 * 20 * 20))

    def test_patch_costs_of_their_own(self):
        """A profile with `*_block_patch` charges each patch of a pipelined step those costs, the
        exact steps the whole-sequence ones. 1 image, 1 rank, 2 steps, --patches 2: step 0 exact
        (both blocks on 20 tokens: 2 x 0.5 x 20 = 20 s), step 1 two patches: patch 0 the 4 text +
        8 image tokens, patch 1 8 image tokens, each reading 20 keys, both blocks at c0 = 0.25,
        c1 = 0.1, c2 = 0.01: 2 x [(0.25 + 1.2 + 2.4) + (0.25 + 0.8 + 1.6)] = 13 s."""
        prof = toy_profile(double=0, single=0, embed=0, final=0, c1=0.5)
        for kind in ("double", "single"):
            prof.costs.c[kind + "_block_patch"] = {"c0": 0.25, "c1": 0.1, "c2": 0.01, "patches": 2}
        r = simulate(prof, toy(ranks=1, steps=2, patches=2))
        self.assertAlmostEqual(r["denoise_s"], 20.0 + 13.0)
        # Without them a patch costs what the whole-sequence fit says: 2 x 0.5 x (12 + 8) = 20 s.
        r = simulate(toy_profile(double=0, single=0, embed=0, final=0, c1=0.5), toy(ranks=1, steps=2, patches=2))
        self.assertAlmostEqual(r["denoise_s"], 40.0)


class Equivalence(unittest.TestCase):
    def test_dynamic_with_one_pipeline_is_the_static_schedule(self):
        prof = toy_profile(c1=0.01, c2=0.0003)
        for kw in (dict(images=5), dict(images=3, microbatch=2), dict(images=2, patches=3, steps=5, warmup=2)):
            a = simulate(prof, toy(ranks=2, **kw))
            b = simulate(prof, toy(ranks=2, slots=10 ** 6, **kw))  # slots given: the leader's program
            self.assertAlmostEqual(a["total_s"], b["total_s"], msg=str(kw))
            self.assertEqual(a["idle_share"], b["idle_share"])

    def test_stages_hand_out_images_dynamically(self):
        """4 ranks as 2 pipelines of 2 (A = 3, B = 2, no latency), slots 1: each pipeline runs one
        image at a time (10 s of steps: [0,3] [3,5] [5,8] [8,10] for 2 steps) and takes the next;
        after its loop it decodes its 2 images (1 s each, as fluxmpi does): 20 + 2 = 22 s, twice the
        rate of one pipeline; the first image waits for the second's loop (latency 21 s). Decoded
        inline (the what-if) each image takes 11 s."""
        prof = toy_profile(latency=0.0)
        r = simulate(prof, toy(ranks=4, stages=2, images=4, slots=1))
        self.assertEqual(r["decode"], "end")
        self.assertAlmostEqual(r["total_s"], 22.0)
        self.assertAlmostEqual(r["latency_max_s"], 21.0)
        inline = simulate(prof, toy(ranks=4, stages=2, images=4, slots=1, decode="inline"))
        self.assertAlmostEqual(inline["total_s"], 22.0)
        self.assertAlmostEqual(inline["latency_max_s"], 11.0)
        one = simulate(prof, toy(ranks=2, stages=2, images=4, slots=1, decode="inline"))
        self.assertAlmostEqual(one["total_s"], 44.0)

    def test_rank_zero_writes_every_pipelines_rows(self):
        """2 pipelines of 1 rank, 2 images of 2 steps, slots 1 (A + B = 5 s a step on one rank);
        each row costs 1 s to write. Rank 0 writes its own row after each step and then the row the
        other leader sent meanwhile: [0,5] step, [5,6] its row, [6,7] rank 1's, [7,12] step,
        [12,13] [13,14]. So the job takes 14 s, and rank 0 works 4 s more than rank 1, which writes
        nothing."""
        prof = toy_profile(latency=0.0, decode=0)
        prof.costs.c["checkpoint"] = {"step_s": 1.0, "row_s": 0.0}
        r = simulate(prof, toy(ranks=2, stages=1, images=2, slots=1, checkpoint=True))
        self.assertAlmostEqual(r["busy_s"][0] - r["busy_s"][1], 4.0)
        self.assertAlmostEqual(r["total_s"], 2 * 5 + 4)

    def test_processor_sharing(self):
        """2 ranks on one core: while both compute, each runs at half speed. With one image of
        one step nothing overlaps, so one core costs nothing; with many images it doubles the
        time of the overlapped part."""
        alone = simulate(toy_profile(latency=0.0, decode=0), toy(ranks=2, images=1, steps=1))
        shared = simulate(toy_profile(latency=0.0, decode=0, cores=1), toy(ranks=2, images=1, steps=1))
        self.assertAlmostEqual(alone["total_s"], shared["total_s"])
        many = simulate(toy_profile(latency=0.0, decode=0, cores=1), toy(ranks=2, images=8, steps=2))
        one_rank = simulate(toy_profile(latency=0.0, decode=0), toy(ranks=1, images=8, steps=2))
        self.assertAlmostEqual(many["total_s"], one_rank["total_s"])


    def test_capacity_of_a_shared_machine(self):
        """One rank that gets half a processor (other users' processes) takes twice as long."""
        full = simulate(toy_profile(cores=2), toy(ranks=1, images=2))
        half = simulate(toy_profile(cores=2), toy(ranks=1, images=2, capacity={1: 0.5}))
        self.assertAlmostEqual(half["total_s"], 2 * full["total_s"])


class Model(unittest.TestCase):
    def test_flux_dev_messages(self):
        s = Shape(FLUX_DEV)
        # 1024^2, bf16: txt [1, 512, 3072], img [1, 4096, 3072], temb [1, 3072].
        self.assertEqual(state_message(s, 2, 1, 512, 4096, False), ((4608 * 3072 + 3072) * 2 + HEADER_BYTES, 4))
        self.assertEqual(noise_message(s, 2, 1, 4096), (4096 * 64 * 2 + HEADER_BYTES, 2))
        self.assertEqual(HEADER_BYTES, 576)

    def test_flux_dev_params(self):
        d, s, e, f = Shape(FLUX_DEV).params()
        self.assertEqual((d, s, e, f), (339831296, 141591808, 45047808, 19077184))  # docs/partition.md
        self.assertEqual(e + 19 * d + 38 * s + f, 11901408320)

    def test_planner(self):
        plan = plan_stages(Shape(BENCH), 2, 4)
        self.assertEqual([p.describe() for p in plan], ["0-5 (4d+2s)", "6-11 (0d+6s)"])
        counts = sorted(p.count for p in plan_stages(Shape(FLUX_DEV), 8, 2))
        self.assertEqual(counts, [7] * 7 + [8])

    def test_patch_ranges_and_groups(self):
        self.assertEqual(patch_ranges(16, 16, 3), [(0, 80), (80, 96), (176, 80)])
        self.assertEqual(patch_ranges(32, 32, 4, 128), [(0, 160), (160, 288), (448, 288), (736, 288)])
        self.assertEqual([(g.first_image, g.count) for g in make_groups(5, 2)], [(0, 2), (2, 2), (4, 1)])

    def test_engine_checks_headers(self):
        def sender():
            yield ("send", 1, Message(("a",), 10))

        def receiver():
            yield ("recv", 0, ("b",))

        eng = Engine([0, 0], None, lambda a, b: Link(float("inf"), 0.0))
        with self.assertRaises(ScheduleError):
            eng.run([sender(), receiver()])

    def test_engine_detects_deadlock(self):
        def waits():
            yield ("recv", 1, None)

        eng = Engine([0, 0], None, lambda a, b: Link(1e9, 0.0))
        with self.assertRaisesRegex(ScheduleError, "deadlock"):
            eng.run([waits(), waits()])


if __name__ == "__main__":
    unittest.main()
