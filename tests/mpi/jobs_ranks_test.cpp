// `mpirun -np P fluxmpi` on every pipeline case of the manifest: P = 1, 2, 3 and partitions that
// cut inside the double blocks, exactly at the double/single boundary and inside the single
// blocks give bit-identical latents (every stored row) and PNG pixels, equal to the one-process
// result. Threads are pinned to 1 per rank (bit identity needs equal threads per rank).

#include <gtest/gtest.h>

#include <cstdio>
#include <set>

#include "io/model_dir.h"
#include "job_runner.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::test {
namespace {

std::vector<std::string> case_args(const CaseRef& c) {
  const auto& a = c.json["call"];
  std::vector<std::string> out = {"--model", c.model_dir, "--prompt", a["prompt"].get<std::string>(), "--dtype", "fp32",
                                  "--no-progress"};
  if (a.contains("prompt_2") && a["prompt_2"].is_string()) out.insert(out.end(), {"--prompt-2", a["prompt_2"].get<std::string>()});
  out.insert(out.end(), {"--height", std::to_string(a["height"].get<int64_t>()), "--width", std::to_string(a["width"].get<int64_t>()),
                         "--steps", std::to_string(a["num_inference_steps"].get<int64_t>()), "--guidance",
                         std::to_string(a["guidance_scale"].get<double>())});
  if (a.contains("max_sequence_length")) out.insert(out.end(), {"--max-sequence-length", std::to_string(a["max_sequence_length"].get<int64_t>())});
  if (a["seed"].is_array()) out.insert(out.end(), {"--seed", std::to_string(a["seed"][0].get<int64_t>()), "--num-images", std::to_string(a["seed"].size())});
  else out.insert(out.end(), {"--seed", std::to_string(a["seed"].get<int64_t>())});
  return out;
}

// The partitions to try for a transformer of `L` double and `S` single blocks, with P ranks each.
std::vector<std::pair<int, std::string>> partitions(int64_t L, int64_t S, bool all) {
  const int64_t B = L + S;
  std::vector<std::pair<int, std::string>> out;
  auto two = [&](int64_t cut) { return "0:0-" + std::to_string(cut - 1) + ",1:" + std::to_string(cut) + "-" + std::to_string(B - 1); };
  out.push_back({2, two(L)});  // exactly at the double/single boundary
  out.push_back({3, ""});      // the planner's own split
  if (all) {
    if (L >= 2) out.push_back({2, two(1)});      // inside the double blocks
    if (S >= 2) out.push_back({2, two(L + 1)});  // inside the single blocks
    out.push_back({2, ""});
  }
  return out;
}

class RanksBitIdentity : public testing::TestWithParam<CaseRef> {};

TEST_P(RanksBitIdentity, AnyRankCountAndPartitionGivesTheOneProcessResult) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  TempDir dir("ranks-" + case_test_name(testing::TestParamInfo<CaseRef>(c, 0)));
  auto base = case_args(c);
  auto run = [&](int ranks, const std::string& partition, const std::string& tag) {
    auto args = base;
    args.insert(args.end(), {"--checkpoint", dir / (tag + ".h5"), "-o", dir / (tag + "-{i}.png")});
    if (!partition.empty()) args.insert(args.end(), {"--partition", partition});
    JobResult r = run_fluxmpi(ranks, args);
    EXPECT_EQ(r.exit_code, 0) << tag << ":\n" << r.output;
    return r.exit_code == 0;
  };
  ASSERT_TRUE(run(1, "", "p1"));
  const at::Tensor ref_rows = all_latent_rows(dir / "p1.h5");
  const int64_t images = c.json["call"]["seed"].is_array() ? static_cast<int64_t>(c.json["call"]["seed"].size()) : 1;
  io::ModelDir model(c.model_dir);
  // Every case: the boundary cut and the planner's 3-rank split; the first case of each pipeline
  // also the cuts inside the double and the single blocks.
  static std::set<std::string> seen;
  const bool all = seen.insert(c.pipeline).second;
  int n = 0;
  for (const auto& [ranks, partition] : partitions(model.transformer_config().num_layers, model.transformer_config().num_single_layers, all)) {
    const std::string tag = "p" + std::to_string(ranks) + "-" + std::to_string(n++);
    if (!run(ranks, partition, tag)) continue;
    const std::string what = case_label(c) + " with " + std::to_string(ranks) + " ranks" +
                             (partition.empty() ? " (planned)" : " (--partition " + partition + ")");
    EXPECT_TRUE(identical(what + ": latents/steps", all_latent_rows(dir / (tag + ".h5")), ref_rows));
    for (int64_t i = 0; i < images; ++i) {
      char name[32];  // -o <tag>-{i}.png: {i} is the image index zero-padded to 5 digits
      std::snprintf(name, sizeof name, "-%05lld.png", static_cast<long long>(i));
      EXPECT_TRUE(identical(what + ": PNG pixels of image " + std::to_string(i), png_pixels(dir / (tag + name)),
                            png_pixels(dir / (std::string("p1") + name))));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RanksBitIdentity, testing::ValuesIn(cases_of_kind("pipeline")), case_test_name);

}  // namespace
}  // namespace fluxmpi::test
