// The ControlNet flags resolved into runs (pipeline/controlnet_options.h): pairing of nets and
// images, per-image values, Union modes, guidance windows, and the one-line errors of each misuse.

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "core/error.h"
#include "pipeline/controlnet_options.h"
#include "support/subtree_cases.h"

namespace fluxmpi::pipeline {
namespace {

std::string net(const std::string& name) {
  return (std::filesystem::path(test::project_subtree_dir("controlnet")) / name).string();
}

io::TransformerConfig tiny_dev() {  // ../shared/fixtures/tiny-flux-dev's transformer
  io::TransformerConfig t;
  t.num_layers = 2;
  t.num_single_layers = 3;
  t.attention_head_dim = 16;
  t.num_attention_heads = 2;
  t.joint_attention_dim = 32;
  t.pooled_projection_dim = 32;
  t.guidance_embeds = true;
  t.axes_dims_rope = {4, 6, 6};
  return t;
}

template <typename E>
std::string error_of(const ControlNetOptions& o, const io::TransformerConfig& t = tiny_dev()) {
  try {
    resolve_controlnets(o, t, 8);
  } catch (const E& e) {
    return e.what();
  }
  return "(no error of that kind)";
}

TEST(ControlNetOptions, RunsOfOneNetSeveralNetsAndAUnionWithConditions) {
  ControlNetOptions o;
  o.nets = {net("tiny-controlnet-plain")};
  o.images = {"a.png"};
  ControlNetSetup s = resolve_controlnets(o, tiny_dev(), 8);
  ASSERT_EQ(s.runs.size(), 1u);
  EXPECT_EQ(s.runs[0].scale, 1.0);
  EXPECT_EQ(s.runs[0].mode, -1);
  EXPECT_EQ(s.layout.double_samples, 1);
  EXPECT_EQ(s.layout.single_samples, 2);

  o.nets = {net("tiny-controlnet-plain"), net("tiny-controlnet-union")};
  o.images = {"a.png", "b.png"};
  o.modes = {-1, 3};
  o.scales = {0.7, 0.5};
  o.starts = {0.25};
  s = resolve_controlnets(o, tiny_dev(), 8);
  EXPECT_EQ(s.runs[1].net, 1u);
  EXPECT_EQ(s.runs[1].mode, 3);
  EXPECT_EQ(s.runs[1].scale, 0.5);
  EXPECT_EQ(s.runs[1].guidance_start, 0.25);  // one value for every image
  EXPECT_EQ(s.layout.double_samples, 1);      // zip: the shorter list

  o.nets = {net("tiny-controlnet-union")};
  o.modes = {0, 2};
  o.scales = {};
  o.starts = {};
  s = resolve_controlnets(o, tiny_dev(), 8);
  EXPECT_EQ(s.runs.size(), 2u);
  EXPECT_EQ(s.runs[1].net, 0u);
  EXPECT_EQ(s.runs[1].mode, 2);
}

TEST(ControlNetOptions, EachMisuseIsOneLine) {
  ControlNetOptions o;
  o.modes = {1};
  EXPECT_EQ(error_of<UsageError>(o), "--control-mode needs --controlnet DIR (a FLUX ControlNet folder)");
  o = {};
  o.scales = {0.5};
  EXPECT_EQ(error_of<UsageError>(o), "--controlnet-scale needs --controlnet DIR (a FLUX ControlNet folder)");
  o = {};
  o.nets = {net("tiny-controlnet-union")};
  o.images = {"a.png"};
  EXPECT_NE(error_of<UsageError>(o).find("--control-mode is needed for control image 'a.png'"), std::string::npos);
  o.modes = {4};
  EXPECT_NE(error_of<UsageError>(o).find("--control-mode 4 is out of range for the Union ControlNet"), std::string::npos);
  EXPECT_NE(error_of<UsageError>(o).find("(num_mode 4: modes 0 to 3)"), std::string::npos);
  o.nets = {net("tiny-controlnet-plain")};
  o.modes = {1};
  EXPECT_NE(error_of<UsageError>(o).find("has no control modes (not a Union model)"), std::string::npos);
  o.modes = {};
  o.starts = {0.8};
  o.ends = {0.5};
  EXPECT_NE(error_of<UsageError>(o).find("need 0 <= start < end <= 1"), std::string::npos);
  o.starts = o.ends = {};
  o.scales = {0.5, 0.6};
  EXPECT_NE(error_of<UsageError>(o).find("--controlnet-scale is given 2 times for 1 control images"), std::string::npos);
  o.scales = {};
  o.nets = {net("tiny-controlnet-plain"), net("tiny-controlnet-union")};
  EXPECT_EQ(error_of<UsageError>(o), "2 ControlNets (--controlnet) take one --control-image each, got 1");
  o.images = {};
  EXPECT_NE(error_of<UsageError>(o).find("--controlnet needs --control-image FILE"), std::string::npos);
  // Nets that cannot run together, and a net that does not fit the transformer.
  o.images = {"a.png", "b.png"};
  o.nets = {net("tiny-controlnet-plain"), net("tiny-controlnet-xlabs")};
  EXPECT_NE(error_of<ConfigError>(o).find("ControlNets of different layouts cannot run together"), std::string::npos);
  io::TransformerConfig wide = tiny_dev();
  wide.num_attention_heads = 4;
  o.nets = {net("tiny-controlnet-plain")};
  o.images = {"a.png"};
  EXPECT_NE(error_of<ConfigError>(o, wide).find("does not fit the transformer"), std::string::npos);
  o.nets = {"/nonexistent/net"};
  EXPECT_NE(error_of<ConfigError>(o).find("--controlnet '/nonexistent/net': config.json"), std::string::npos);
}

}  // namespace
}  // namespace fluxmpi::pipeline
