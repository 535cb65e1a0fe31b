"""The command line and the assumed GPU profile."""
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

SIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, SIM)

import fluxsim  # noqa: E402

GPU = os.path.join(SIM, "profiles", "flux1-dev-h100.json")
CONFIGS = os.path.join(SIM, "..", "..", "..", "shared", "assets", "configs", "FLUX.1-dev")


def cli(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = fluxsim.main(list(args))
    return rc, out.getvalue()


class Cli(unittest.TestCase):
    def test_json_report(self):
        rc, out = cli("--profile", GPU, "--ranks", "2", "--images", "4", "--steps", "4", "--json")
        self.assertEqual(rc, 0)
        r = json.loads(out)
        self.assertEqual(len(r["idle_share"]), 2)
        rc1, out1 = cli("--profile", GPU, "--ranks", "1", "--images", "4", "--steps", "4", "--json")
        # Two pipeline stages on four images: more images an hour than one rank, not more than 2x.
        ratio = r["images_per_hour"] / json.loads(out1)["images_per_hour"]
        self.assertGreater(ratio, 1.2)
        self.assertLess(ratio, 2.0)

    def test_text_report_and_errors(self):
        rc, out = cli("--profile", GPU, "--ranks", "4", "--stages", "2", "--images", "4", "--steps", "2")
        self.assertEqual(rc, 0)
        self.assertIn("2 pipeline(s) x 2 stages", out)
        with contextlib.redirect_stderr(io.StringIO()) as err:
            rc, _ = cli("--profile", GPU, "--ranks", "64")
        self.assertEqual(rc, 2)
        self.assertIn("cannot split 57 blocks over 64 ranks", err.getvalue())


    def test_search(self):
        """2 ranks, 2 images: the best throughput is two 1-rank pipelines (no bubbles), the best
        latency of one image is one pipeline of 2 with patches."""
        rc, out = cli("--profile", GPU, "--ranks", "2", "--images", "2", "--steps", "4", "--search", "--json")
        self.assertEqual(rc, 0)
        r = json.loads(out)
        self.assertEqual(r["best_throughput"]["stages"], 1)
        self.assertEqual(r["best_latency"]["stages"], 2)
        self.assertGreater(r["best_latency"]["patches"], 1)


@unittest.skipUnless(os.path.isdir(CONFIGS), "FLUX.1-dev configs not found at %s" % CONFIGS)
class GpuProfile(unittest.TestCase):
    def test_profile_reproduces_its_source(self):
        """The derived rate charges xDiT's 6.71 s (28 steps, 1024 px, 1 x H100) to the blocks, so
        57 blocks x 28 steps of the profile's block time give it back; the committed profile is
        what the script makes."""
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "p.json")
            subprocess.run([sys.executable, os.path.join(SIM, "make_gpu_profile.py"), "--configs", CONFIGS,
                            "--out", out], check=True, stdout=subprocess.DEVNULL)
            with open(out) as f:
                made = json.load(f)
        self.assertAlmostEqual(made["derived"]["block_s_1024"] * 57 * 28, 6.71, places=6)
        with open(GPU) as f:
            committed = json.load(f)
        self.assertEqual(made["costs"], committed["costs"])


if __name__ == "__main__":
    unittest.main()
