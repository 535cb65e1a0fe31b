"""The VAE decode stage of the simulator (fsim/decode.py): tiles round robin over the decode ranks,
hand-computed."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fsim.decode import DecodePlan, tile_grid  # noqa: E402
from fsim.simulate import simulate  # noqa: E402
from test_schedule import toy, toy_profile  # noqa: E402


class Tiles(unittest.TestCase):
    def test_grid_is_diffusers_order_with_cut_edges(self):
        # 6 x 6 cells, tiles of 4 every int(4 * 0.75) = 3: rows and columns start at 0 and 3.
        self.assertEqual(tile_grid(6, 6, 4, 3), [(4, 4), (4, 3), (3, 4), (3, 3)])
        # FLUX.1 at 2048 px: 9 tiles of 128 cells every 96.
        self.assertEqual(len(DecodePlan(256, 256, tiled=True).grid), 9)
        self.assertFalse(DecodePlan(128, 128, tiled=True).tiled)  # 1024 px: one tile, untiled

    def test_as_many_ranks_as_tiles(self):
        self.assertEqual(DecodePlan(6, 6, tiled=True, ranks=8, tile=4).ranks, [0, 1, 2, 3])
        self.assertEqual(DecodePlan(6, 6, tiled=False, ranks=8, tile=4).ranks, [0])


class HandComputed(unittest.TestCase):
    # 48 x 48 px: a 6 x 6 latent, 4 tiles of tile 4; every tile costs 1 s (decode c0 per image).
    def run_job(self, **kw):
        return simulate(toy_profile(latency=0.125), toy(height=48, width=48, steps=1, vae_tiling=True, vae_tile=4,
                                                        vae_scale=8, **kw))

    def test_one_rank_decodes_every_tile(self):
        r = self.run_job(ranks=1)
        self.assertAlmostEqual(r["decode_s"], 4.0)
        self.assertEqual(r["vae"], "4 tiles over 1 rank(s)")

    def test_two_ranks_share_the_tiles(self):
        """Rank 0 ends its loop at T and sends the latents (2 MPI messages of 0.125 s): rank 1 has
        them at T + 0.25 and decodes tile 1 in [T + 0.25, T + 1.25] (at T + 1.5 on rank 0) and
        tile 3 in [T + 1.25, T + 2.25] (at T + 2.5). Rank 0 decodes tile 0 in [T, T + 1], waits
        for tile 1 until T + 1.5, decodes tile 2 in [T + 1.5, T + 2.5], and takes tile 3 at once:
        2.5 s against 4 s on one rank."""
        r = self.run_job(ranks=2)
        self.assertAlmostEqual(r["decode_s"], 2.5)
        self.assertEqual(r["vae"], "4 tiles over 2 rank(s)")
        # The helper's wait for its passes is not its loop's blocked time.
        untiled = simulate(toy_profile(latency=0.125), toy(height=48, width=48, steps=1, ranks=2))
        self.assertAlmostEqual(r["blocked_share"][1], untiled["blocked_share"][1])

    def test_decode_ranks_one_keeps_the_tiles_on_the_leader(self):
        r = self.run_job(ranks=2, decode_ranks=1)
        self.assertAlmostEqual(r["decode_s"], 4.0)

    def test_passes_of_a_microbatch_and_slicing(self):
        """Two images in one pass cost 2 s a tile; sliced, two passes of 1 s a tile: 8 s either
        way on one rank."""
        self.assertAlmostEqual(self.run_job(ranks=1, images=2, microbatch=2)["decode_s"], 8.0)
        self.assertAlmostEqual(self.run_job(ranks=1, images=2, microbatch=2, vae_slicing=True)["decode_s"], 8.0)
        # One pass of two images on 2 ranks: tiles of 2 s, the same timeline as above doubled
        # except the latency: 0 -> tile 0 [0, 2], tile 1 on rank 1 [0.25, 2.25] back at 2.5,
        # tile 2 [2.5, 4.5], tile 3 [2.25, 4.25] back at 4.5: 4.5 s.
        self.assertAlmostEqual(self.run_job(ranks=2, images=2, microbatch=2)["decode_s"], 4.5)

    def test_each_pipeline_decodes_its_own_tiles(self):
        """--stages 2 on 4 ranks, 4 images, 2 slots a leader: rank 0 takes images 0 and 1, rank 2
        images 2 and 3. Each leader decodes its two images in two tiled passes over the ranks of
        its own pipeline: tiles 0 and 2 on the leader, 1 and 3 on the rank behind it. Busy time
        per rank: a leader's 2 units of 3 s and 2 x 2 tiles of 1 s = 10 s (untiled: 6 s + 2
        images of 1 s = 8 s); the rank behind it 2 units of 2 s and 2 x 2 tiles = 8 s (untiled
        4 s). Were pipeline 1's tiles sent to rank 1, rank 1 would be busy 12 s and rank 3 4 s."""
        tiled = self.run_job(ranks=4, stages=2, images=4)
        self.assertEqual(tiled["vae"], "4 tiles over 2 rank(s)")
        for r, busy in enumerate([10.0, 8.0, 10.0, 8.0]):
            self.assertAlmostEqual(tiled["busy_s"][r], busy)
        untiled = simulate(toy_profile(latency=0.125), toy(height=48, width=48, steps=1, ranks=4, stages=2, images=4))
        for r, busy in enumerate([8.0, 4.0, 8.0, 4.0]):
            self.assertAlmostEqual(untiled["busy_s"][r], busy)


if __name__ == "__main__":
    unittest.main()
