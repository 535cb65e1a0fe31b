// The step loop with ControlNets on P ranks (run with 1, 2 and 3): rank 0 runs the ControlNets
// and posts each rank the residual samples its blocks add; the final latents must equal, bit for
// bit, the same loop in one process (equal threads per rank). Scenarios: one net whose samples
// reach every rank, a plain and a Union net merged (a guidance window, true CFG, two work groups
// in flight), and patch pipelining (a Union net whose samples reach rank 0's block only, so the
// other ranks get no residual message). Tiny random models, no files.

#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <map>

#include <ATen/CPUGeneratorImpl.h>

#include "core/error.h"
#include "models/common/init.h"
#include "models/flux/controlnet.h"
#include "models/flux/transformer.h"
#include "mpi_test_main.h"
#include "parallel/message.h"
#include "parallel/partition.h"
#include "pipeline/control_residuals.h"
#include "pipeline/denoise.h"
#include "support/step_loop.h"
#include "support/tensor_compare.h"

namespace fluxmpi::pipeline {
namespace {

io::ControlNetConfig tiny_controlnet(int64_t doubles, int64_t singles, std::optional<int64_t> modes) {
  const io::TransformerConfig t = test::tiny_loop_transformer();
  io::ControlNetConfig c;
  c.num_layers = doubles;
  c.num_single_layers = singles;
  c.attention_head_dim = t.attention_head_dim;
  c.num_attention_heads = t.num_attention_heads;
  c.joint_attention_dim = t.joint_attention_dim;
  c.pooled_projection_dim = t.pooled_projection_dim;
  c.guidance_embeds = true;
  c.axes_dims_rope = t.axes_dims_rope;
  c.num_mode = modes;
  return c;
}

struct NetSpec {
  io::ControlNetConfig config;
  uint64_t seed;
};

struct Scenario {
  std::vector<NetSpec> nets;
  std::vector<ControlRun> runs;
  int passes = 1;
  int64_t patches = 1;
};

// Final latents of every group after the loop over `P` ranks of `world` (P = 1: this process alone).
std::vector<at::Tensor> run(const Scenario& sc, const parallel::Communicator* world, int rank, int P) {
  c10::InferenceMode guard;
  const io::TransformerConfig tc = test::tiny_loop_transformer();
  const test::TinyLoopPart tiny = test::tiny_loop_part(rank, P);
  const parallel::StagePlan& plan = tiny.plan;
  const flux::FluxTransformer& part = tiny.part;

  DenoiseSetup setup = test::two_group_setup(sc.passes, sc.patches);
  std::vector<flux::FluxControlNet> nets;
  for (const NetSpec& n : sc.nets) {
    flux::FluxControlNet net(n.config);
    nn::fill_random(*net, n.seed);
    net->fuse_projections();
    nets.push_back(net);
  }
  ControlResiduals control(std::move(nets), sc.runs, setup, 3.5);
  setup.control = control_routing(control.layout(), tc, sc.runs, setup.steps, setup.patches);

  std::optional<parallel::Messenger> messenger;
  if (P > 1) messenger.emplace(*world);
  RootState root;
  if (rank == 0) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(99);
    root = test::random_root(setup, tc, gen);
    for (size_t g = 0; g < setup.groups.size(); ++g) {
      std::vector<at::Tensor> controls;
      for (size_t k = 0; k < sc.runs.size(); ++k) controls.push_back(at::randn({1, setup.image_tokens(), 64}, gen));
      control.set_group(g, controls);
    }
    root.control = &control;
  }
  denoise(setup, *part, plan, rank, messenger ? &*messenger : nullptr, rank == 0 ? &root : nullptr);
  std::vector<at::Tensor> out;
  for (const GroupInputs& in : root.groups) out.push_back(in.latents);
  return out;
}

void expect_same_as_one_process(const Scenario& sc, const std::string& what) {
  const parallel::MpiEnv& env = test::mpi_env();
  const std::vector<at::Tensor> got = run(sc, &env.world(), env.rank(), env.size());
  if (env.rank() != 0) return;
  const std::vector<at::Tensor> alone = run(sc, nullptr, 0, 1);
  ASSERT_EQ(got.size(), alone.size());
  for (size_t g = 0; g < got.size(); ++g)
    test::expect_identical(str_cat(what, " on ", env.size(), " ranks: group ", g, " final latents"), got[g], alone[g]);
  // The residuals matter: without the ControlNets the latents differ.
  Scenario off = sc;
  for (ControlRun& r : off.runs) r.scale = 0.0;
  const std::vector<at::Tensor> without = run(off, nullptr, 0, 1);
  EXPECT_FALSE(at::equal(without[0], alone[0])) << what << ": the ControlNets changed nothing";
}

TEST(ControlNetLoop, OneNetEveryRankGetsItsSamples) {
  Scenario sc;
  sc.nets = {{tiny_controlnet(1, 2, std::nullopt), 11}};
  sc.runs = {ControlRun{0, -1, 0.8, 0.0, 1.0}};
  expect_same_as_one_process(sc, "one net");
}

TEST(ControlNetLoop, TwoNetsMergedWithWindowAndTrueCfg) {
  Scenario sc;
  sc.nets = {{tiny_controlnet(1, 2, std::nullopt), 12}, {tiny_controlnet(1, 0, 4), 13}};
  sc.runs = {ControlRun{0, -1, 0.7, 0.25, 1.0}, ControlRun{1, 3, 0.5, 0.0, 0.5}};
  sc.passes = 2;
  expect_same_as_one_process(sc, "two nets, windows, true CFG");
}

TEST(ControlNetLoop, PatchPipelining) {
  Scenario sc;
  sc.nets = {{tiny_controlnet(1, 0, 3), 14}};
  sc.runs = {ControlRun{0, 2, 0.9, 0.0, 0.75}, ControlRun{0, 0, 0.6, 0.25, 1.0}};
  sc.patches = 2;
  expect_same_as_one_process(sc, "patches 2, a Union net with two conditions");
}

}  // namespace
}  // namespace fluxmpi::pipeline
