// FluxControlNetModel configs: diffusers' defaults, the three layouts, errors naming file and key,
// the fit against the transformer (widths, text and pooled widths, latent features, block counts,
// input_hint_block's cells), which block adds which sample, and the multi-ControlNet merge.

#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "io/controlnet_config.h"

namespace fluxmpi::io {
namespace {

ControlNetConfig parse(const std::string& json) {
  return parse_controlnet_config(ConfigReader::from_text(json, "--controlnet '/c': config.json"));
}

std::string config_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

// The real InstantX FLUX.1-dev ControlNet-Union's shape.
constexpr const char* kUnion =
    R"({"_class_name":"FluxControlNetModel","attention_head_dim":128,"guidance_embeds":true,"in_channels":64,
        "joint_attention_dim":4096,"num_attention_heads":24,"num_layers":5,"num_single_layers":10,"num_mode":10,
        "patch_size":1,"pooled_projection_dim":768})";

TransformerConfig flux_dev() {
  TransformerConfig t;
  t.guidance_embeds = true;
  return t;  // diffusers' defaults: FLUX.1-dev's shape
}

TEST(ControlNetConfig, DefaultsAndLayouts) {
  const ControlNetConfig u = parse(kUnion);
  EXPECT_TRUE(u.is_union());
  EXPECT_EQ(*u.num_mode, 10);
  EXPECT_FALSE(u.takes_pixels());
  EXPECT_EQ(u.inner_dim(), 3072);
  EXPECT_EQ(u.text_tokens(512), 513);
  const ControlNetConfig d = parse("{}");
  EXPECT_EQ(d.num_layers, 19);
  EXPECT_EQ(d.num_single_layers, 38);
  EXPECT_FALSE(d.is_union());
  EXPECT_EQ(d.text_tokens(512), 512);
  const ControlNetConfig x = parse(R"({"num_layers":2,"num_single_layers":0,"conditioning_embedding_channels":16,
                                       "patch_size":2,"num_mode":null})");
  EXPECT_TRUE(x.takes_pixels());
  EXPECT_FALSE(x.is_union());
  // The written config parses back to itself.
  EXPECT_EQ(to_json(parse(to_json(x))), to_json(x));
  EXPECT_EQ(to_json(parse(to_json(u))), to_json(u));
}

TEST(ControlNetConfig, ErrorsNameFileAndKey) {
  EXPECT_EQ(config_error([] { parse(R"({"_class_name":"ControlNetModel"})"); }),
            "--controlnet '/c': config.json: '_class_name' must be \"FluxControlNetModel\" (a FLUX ControlNet in the "
            "diffusers layout), got \"ControlNetModel\"");
  EXPECT_EQ(config_error([] { parse(R"({"num_mode":0})"); }),
            "--controlnet '/c': config.json: 'num_mode' must be a positive integer, got 0");
  EXPECT_EQ(config_error([] { parse(R"({"num_layers":0,"num_single_layers":0})"); }),
            "--controlnet '/c': config.json: 'num_layers' and 'num_single_layers' are both 0: the ControlNet has no blocks");
  EXPECT_NE(config_error([] { parse(R"({"axes_dims_rope":[16,56,54]})"); }).find("'axes_dims_rope' must sum to attention_head_dim (128)"),
            std::string::npos);
  EXPECT_NE(config_error([] { parse(R"({"conditioning_embedding_channels":16,"patch_size":1})"); })
                .find("'conditioning_embedding_channels' times patch_size^2 (1^2) must equal in_channels (64)"),
            std::string::npos);
}

TEST(ControlNetConfig, FitsTheTransformerItServes) {
  const TransformerConfig t = flux_dev();
  check_controlnet_fits(parse(kUnion), t, 8, "c");  // fits
  auto fit_error = [&](const std::string& json, const TransformerConfig& tc = flux_dev()) {
    return config_error([&] { check_controlnet_fits(parse(json), tc, 8, "--controlnet '/c'"); });
  };
  EXPECT_EQ(fit_error(R"({"num_attention_heads":16})"),
            "--controlnet '/c': its stream width num_attention_heads x attention_head_dim = 16 x 128 = 2048 does not fit "
            "the transformer: its residuals are added to hidden states of width 24 x 128 = 3072");
  EXPECT_EQ(fit_error(R"({"joint_attention_dim":2048})"),
            "--controlnet '/c': 'joint_attention_dim' 2048 does not fit the transformer: the prompt embeddings' width "
            "(the transformer's joint_attention_dim) is 4096");
  EXPECT_NE(fit_error(R"({"pooled_projection_dim":512})").find("'pooled_projection_dim' 512 does not fit"), std::string::npos);
  EXPECT_NE(fit_error(R"({"in_channels":128})").find("'in_channels' 128 does not fit the transformer: the packed latents' features"),
            std::string::npos);
  EXPECT_EQ(fit_error(R"({"num_layers":20})"),
            "--controlnet '/c': 'num_layers' 20 does not fit the transformer: the number of double blocks its residuals "
            "feed (the transformer's num_layers) is 19");
  EXPECT_NE(fit_error(R"({"num_single_layers":39})").find("'num_single_layers' 39 does not fit"), std::string::npos);
  // Same width, other heads: fits (only the stream width meets the transformer).
  check_controlnet_fits(parse(R"({"num_attention_heads":48,"attention_head_dim":64,"axes_dims_rope":[8,28,28]})"), t, 8, "c");
  // XLabs: samples repeat, so more of them than blocks is fine; the hint cells must be the tokens.
  check_controlnet_fits(parse(R"({"num_layers":25,"num_single_layers":0,"conditioning_embedding_channels":16,"patch_size":2})"),
                        t, 8, "c");
  EXPECT_NE(fit_error(R"({"num_layers":2,"num_single_layers":0,"conditioning_embedding_channels":4,"patch_size":4})")
                .find("'patch_size' 4 does not fit the transformer"),
            std::string::npos);
}

TEST(ResidualLayout, IntervalsAndRepetitionAsDiffusers) {
  const TransformerConfig t = flux_dev();  // 19 double, 38 single
  ResidualLayout l{5, 10, false};          // interval ceil(19/5) = 4 and ceil(38/10) = 4
  EXPECT_EQ(l.sample_of_block(0, t), 0);
  EXPECT_EQ(l.sample_of_block(3, t), 0);
  EXPECT_EQ(l.sample_of_block(4, t), 1);
  EXPECT_EQ(l.sample_of_block(18, t), 4);
  EXPECT_EQ(l.sample_of_block(19, t), 5);       // single 0
  EXPECT_EQ(l.sample_of_block(19 + 37, t), 14);  // single 37 -> 5 + 37 / 4
  EXPECT_EQ(l.samples_of_blocks(2, 9, t), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(l.samples_of_blocks(17, 24, t), (std::vector<int64_t>{4, 5, 6}));
  const ResidualLayout repeat{2, 0, true};
  EXPECT_EQ(repeat.sample_of_block(0, t), 0);
  EXPECT_EQ(repeat.sample_of_block(5, t), 1);
  EXPECT_EQ(repeat.sample_of_block(20, t), -1);  // no single samples
}

TEST(ResidualLayout, MergeKeepsTheShorterListAndTheFirstNetsNone) {
  ControlNetConfig a, b, c;
  a.num_layers = 5;
  a.num_single_layers = 10;
  b.num_layers = 2;
  b.num_single_layers = 0;  // None: later nets' single samples are not added, the first's stay
  c.num_layers = 0;
  c.num_single_layers = 4;
  ResidualLayout ab = merged_layout({&a, &b});
  EXPECT_EQ(ab.double_samples, 2);
  EXPECT_EQ(ab.single_samples, 10);
  ResidualLayout ca = merged_layout({&c, &a});  // the first net has no double samples: none at all
  EXPECT_EQ(ca.double_samples, 0);
  EXPECT_EQ(ca.single_samples, 4);
  EXPECT_FALSE(ca.repeat);
}

}  // namespace
}  // namespace fluxmpi::io
