// Config parsing: diffusers defaults for absent keys, and errors naming file and key for
// ill-typed or impossible values.

#include <gtest/gtest.h>

#include "core/error.h"
#include "io/configs.h"
#include "io/model_dir.h"
#include "support/fixtures.h"

namespace fluxmpi::io {
namespace {

std::string config_error(const std::string& json, TransformerConfig (*parse)(const ConfigReader&)) {
  try {
    parse(ConfigReader::from_text(json, "model dir '/m': transformer/config.json"));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(TransformerConfig, AbsentKeysTakeDiffusersDefaults) {
  // The real FLUX.1-dev config has no axes_dims_rope and no out_channels.
  auto c = parse_transformer_config(ConfigReader::from_text(
      R"({"_class_name":"FluxTransformer2DModel","attention_head_dim":128,"guidance_embeds":true,"in_channels":64,
          "joint_attention_dim":4096,"num_attention_heads":24,"num_layers":19,"num_single_layers":38,
          "patch_size":1,"pooled_projection_dim":768})", "cfg"));
  EXPECT_EQ(c.axes_dims_rope, (std::vector<int64_t>{16, 56, 56}));
  EXPECT_EQ(c.out_channels, 64);
  EXPECT_EQ(c.inner_dim(), 3072);
  EXPECT_EQ(c.num_blocks(), 57);
  EXPECT_TRUE(c.guidance_embeds);
}

TEST(TransformerConfig, ErrorsNameFileAndKey) {
  EXPECT_EQ(config_error(R"({"num_layers":"19"})", parse_transformer_config),
            "model dir '/m': transformer/config.json: 'num_layers' must be a non-negative integer, got \"19\"");
  EXPECT_EQ(config_error(R"({"num_attention_heads":0})", parse_transformer_config),
            "model dir '/m': transformer/config.json: 'num_attention_heads' must be a positive integer, got 0");
  EXPECT_NE(config_error(R"({"attention_head_dim":64})", parse_transformer_config).find("'axes_dims_rope' must sum to attention_head_dim (64), got 128"),
            std::string::npos);
  EXPECT_NE(config_error(R"({"guidance_embeds":1})", parse_transformer_config).find("'guidance_embeds' must be true or false"),
            std::string::npos);
  EXPECT_NE(config_error(R"({"in_channels":62})", parse_transformer_config).find("'in_channels' must be a multiple of 4"),
            std::string::npos);
  EXPECT_NE(config_error(R"({"num_layers":0,"num_single_layers":0})", parse_transformer_config).find("no blocks"),
            std::string::npos);
  EXPECT_NE(config_error("[1]", parse_transformer_config).find("not a JSON object"), std::string::npos);
  EXPECT_NE(config_error("{", parse_transformer_config).find("not valid JSON"), std::string::npos);
}

TEST(SchedulerConfig, DefaultsAndUnsupportedOptions) {
  auto c = parse_scheduler_config(ConfigReader::from_text(R"({"shift":3.0,"use_dynamic_shifting":true})", "s"));
  EXPECT_EQ(c.base_image_seq_len, 256);
  EXPECT_EQ(c.max_image_seq_len, 4096);
  EXPECT_DOUBLE_EQ(c.base_shift, 0.5);
  EXPECT_DOUBLE_EQ(c.max_shift, 1.15);
  EXPECT_THROW(parse_scheduler_config(ConfigReader::from_text(R"({"use_karras_sigmas":true})", "s")), ConfigError);
  EXPECT_THROW(parse_scheduler_config(ConfigReader::from_text(R"({"shift":-1})", "s")), ConfigError);
}

TEST(VaeConfig, ScaleFactorAndChecks) {
  auto c = parse_vae_config(ConfigReader::from_text(
      R"({"block_out_channels":[128,256,512,512],"latent_channels":16,"scaling_factor":0.3611,"shift_factor":0.1159,
          "use_post_quant_conv":false,"use_quant_conv":false})", "v"));
  EXPECT_EQ(c.scale_factor(), 8);
  EXPECT_DOUBLE_EQ(c.shift_factor, 0.1159);
  EXPECT_THROW(parse_vae_config(ConfigReader::from_text(R"({"block_out_channels":[30],"norm_num_groups":32})", "v")), ConfigError);
}

TEST(T5Config, GatedGeluMeansTanhApproximation) {
  auto c = parse_t5_config(ConfigReader::from_text(R"({"feed_forward_proj":"gated-gelu","d_model":32})", "t5"));
  EXPECT_TRUE(c.gated);
  EXPECT_EQ(c.act, "gelu_new");
  EXPECT_THROW(parse_t5_config(ConfigReader::from_text(R"({"feed_forward_proj":"swish"})", "t5")), ConfigError);
}

TEST(ModelDir, FixturePipelinesParseAndAgree) {
  FLUXMPI_REQUIRE_FIXTURES();
  for (const auto& c : test::cases_of_kind("pipeline")) {
    ModelDir dir(c.model_dir);
    EXPECT_NO_THROW(dir.check_consistency()) << c.model_dir;
    auto store = dir.open_weights("transformer");
    EXPECT_NO_THROW(dir.check_transformer_weights(store)) << c.model_dir;
    EXPECT_EQ(std::string(variant_name(dir.variant())), c.pipeline_json["variant"].get<std::string>());
  }
}

TEST(ModelDir, MissingDirectoryAndIndex) {
  try {
    ModelDir("/nonexistent/model");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "model dir '/nonexistent/model': not found");
  }
}

}  // namespace
}  // namespace fluxmpi::io
