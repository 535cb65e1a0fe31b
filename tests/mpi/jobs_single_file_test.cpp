// `mpirun -np P fluxmpi` from single files (single-file/manifest.json) with the flags a user types
// (--model flux1-...safetensors --vae ... or the all-in-one file, --model-config): on 1 and 2 ranks,
// the checkpoint holds diffusers' text embeddings, every step's latents and noise prediction
// (kTolPipelineFp32) and the image (every pixel within +-1), and both rank counts give bit-identical
// rows and PNG pixels. The checkpoint records where each component came from.

#include <gtest/gtest.h>

#include <cstdio>
#include <regex>
#include <sstream>
#include <set>

#include "ckpt/checkpoint_reader.h"
#include "io/safetensors_writer.h"
#include "job_runner.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::test {
namespace {

std::vector<std::string> weight_args(const CaseRef& c) {
  const std::string dir = single_file_dir(c);
  const auto& files = c.pipeline_json["files"];
  std::vector<std::string> out;
  if (c.kind == "fp8-all") {
    out = {"--model", dir + "/" + files["all_in_one_fp8"].get<std::string>()};
  } else {
    out = {"--model", dir + "/" + files["transformer"].get<std::string>(), "--vae", dir + "/" + files["vae"].get<std::string>(),
           "--text-encoder", dir + "/" + files["text_encoder"].get<std::string>(), "--text-encoder-2",
           dir + "/" + files["text_encoder_2"].get<std::string>()};
  }
  out.insert(out.end(), {"--model-config", c.model_dir});
  return out;
}

std::vector<std::string> call_args(const CaseRef& c) {
  const auto& a = c.json["call"];
  std::vector<std::string> out = {"--prompt", a["prompt"].get<std::string>(), "--dtype", "fp32", "--no-progress"};
  if (a.contains("prompt_2") && a["prompt_2"].is_string()) out.insert(out.end(), {"--prompt-2", a["prompt_2"].get<std::string>()});
  out.insert(out.end(), {"--height", std::to_string(a["height"].get<int64_t>()), "--width", std::to_string(a["width"].get<int64_t>()),
                         "--steps", std::to_string(a["num_inference_steps"].get<int64_t>()), "--guidance",
                         std::to_string(a["guidance_scale"].get<double>()), "--seed", std::to_string(a["seed"].get<int64_t>())});
  if (a.contains("max_sequence_length"))
    out.insert(out.end(), {"--max-sequence-length", std::to_string(a["max_sequence_length"].get<int64_t>())});
  return out;
}

class SingleFileJobs : public testing::TestWithParam<CaseRef> {};

TEST_P(SingleFileJobs, OneAndTwoRanksMatchDiffusers) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_SINGLE_FILE_CASE(c);
  TempDir dir("single-file-" + case_test_name(testing::TestParamInfo<CaseRef>(c, 0)));
  CaseTensors ref(c.file);
  const int64_t steps = c.json["call"]["num_inference_steps"].get<int64_t>();
  for (int ranks : {1, 2}) {
    const std::string tag = "np" + std::to_string(ranks);
    auto args = weight_args(c);
    auto call = call_args(c);
    args.insert(args.end(), call.begin(), call.end());
    args.insert(args.end(), {"--checkpoint", dir / (tag + ".h5"), "-o", dir / (tag + ".png")});
    JobResult r = run_fluxmpi(ranks, args);
    ASSERT_EQ(r.exit_code, 0) << case_label(c) << " on " << ranks << " rank(s):\n" << r.output;
    const std::string where = case_label(c) + " (" + std::to_string(ranks) + " ranks): ";
    ckpt::CheckpointReader ck = ckpt::CheckpointReader::open(dir / (tag + ".h5"));
    ckpt::TextEmbeddings text = ck.text(0);
    EXPECT_TRUE(close_to(where + "prompt_embeds", text.prompt_embeds, ref.get("prompt_embeds")[0], kTolPipelineFp32));
    EXPECT_TRUE(close_to(where + "pooled_prompt_embeds", text.pooled_prompt_embeds, ref.get("pooled_prompt_embeds")[0],
                         kTolPipelineFp32));
    for (int64_t k = 0; k < steps; ++k) {
      ckpt::StepRow row = ck.step(0, k);
      const std::string at = "[" + std::to_string(k) + "]";
      EXPECT_TRUE(close_to(where + "noise_pred" + at, row.noise_pred, ref.get("noise_pred")[k][0], kTolPipelineFp32));
      EXPECT_TRUE(close_to(where + "latents_steps" + at, row.latents, ref.get("latents_steps")[k][0], kTolPipelineFp32));
    }
    const at::Tensor pixels = png_pixels(dir / (tag + ".png")).to(at::kInt);
    const at::Tensor want = ref.get("image_uint8")[0].to(at::kInt);
    ASSERT_EQ(pixels.sizes(), want.sizes()) << where << "PNG size";
    EXPECT_LE((pixels - want).abs().max().item<int>(), 1) << where << "PNG pixels differ from diffusers' by more than 1";
    // Each component's source file is recorded.
    EXPECT_EQ(ck.file().sources.transformer, weight_args(c)[1]) << where << "source_transformer";
    EXPECT_FALSE(ck.file().sources.vae.empty()) << where << "source_vae";
    EXPECT_FALSE(ck.file().sources.model_config.empty()) << where << "source_model_config";
  }
  EXPECT_TRUE(identical(case_label(c) + ": latents/steps, 2 ranks vs 1", all_latent_rows(dir / "np2.h5"),
                        all_latent_rows(dir / "np1.h5")));
  EXPECT_TRUE(identical(case_label(c) + ": PNG pixels, 2 ranks vs 1", png_pixels(dir / "np2.png"), png_pixels(dir / "np1.png")));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SingleFileJobs, testing::ValuesIn(single_file_cases()), case_test_name);

// A resumed run continues with the same files; another transformer file is refused by name.
TEST(SingleFileJobs, ResumeChecksTheSourceFiles) {
  const auto cases = single_file_cases();
  FLUXMPI_REQUIRE_SINGLE_FILE_CASE(cases.front());
  const CaseRef* files = nullptr;
  for (const auto& c : cases)
    if (c.kind == "files") files = &c;
  ASSERT_NE(files, nullptr);
  TempDir dir("single-file-resume");
  auto args = weight_args(*files);
  auto call = call_args(*files);
  args.insert(args.end(), call.begin(), call.end());
  auto first = args;
  first.insert(first.end(), {"--checkpoint", dir / "run.h5", "-o", dir / "run.png"});
  JobResult r = run_fluxmpi(1, first);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // fluxmpi-inspect decodes with the VAE file the checkpoint records: the run's own image.
  JobResult decoded = run_program(inspect_bin(), {dir / "run.h5", "--decode", dir / "decoded.png"});
  ASSERT_EQ(decoded.exit_code, 0) << decoded.output;
  EXPECT_TRUE(identical("fluxmpi-inspect --decode with the recorded ae.safetensors", png_pixels(dir / "decoded.png"),
                        png_pixels(dir / "run.png")));
  // The whole transformer from the all-in-one file instead: another source, refused.
  const std::string all = single_file_dir(*files) + "/" + files->pipeline_json["files"]["all_in_one_fp8"].get<std::string>();
  JobResult other = run_fluxmpi(1, {"--resume", dir / "run.h5", "--transformer", all, "-o", dir / "again.png"});
  EXPECT_EQ(other.exit_code, 3) << other.output;
  EXPECT_NE(other.output.find("'source_transformer' is"), std::string::npos) << other.output;
  // --resume alone takes every source from the checkpoint (all images are decoded: nothing to do).
  JobResult same = run_fluxmpi(1, {"--resume", dir / "run.h5", "-o", dir / "again.png"});
  EXPECT_EQ(same.exit_code, 0) << same.output;
}


// --- Real shapes ------------------------------------------------------------------------------
// Sparse ("hollow") single files with the real FLUX.1-dev tensor names and shapes: headers only,
// the data a file hole, so they take no disk. The names are written out here from the layouts of
// the published files (Black Forest Labs' flux1-dev.safetensors, ae.safetensors, the transformers
// CLIP-L and T5-XXL encoders), independently of fluxmpi's key maps.

constexpr int64_t kD = 3072, kHead = 128, kDoubles = 19, kSingles = 38;

// flux1-dev.safetensors: the transformer in the original layout; returns its element count.
int64_t add_flux1_dev(io::SafetensorsWriter& w, const std::string& prefix, io::DType matrices) {
  int64_t elements = 0;
  auto tensor = [&](const std::string& name, io::DType dtype, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    elements += n;
    w.add_hollow(prefix + name, dtype, shape);
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    tensor(name + ".weight", matrices, {out, in});
    tensor(name + ".bias", io::DType::BF16, {out});
  };
  auto norm = [&](const std::string& name) { tensor(name + ".scale", io::DType::BF16, {kHead}); };
  linear("img_in", kD, 64);
  linear("txt_in", kD, 4096);
  for (const char* mlp : {"time_in", "guidance_in"}) {
    linear(std::string(mlp) + ".in_layer", kD, 256);
    linear(std::string(mlp) + ".out_layer", kD, kD);
  }
  linear("vector_in.in_layer", kD, 768);
  linear("vector_in.out_layer", kD, kD);
  for (int64_t i = 0; i < kDoubles; ++i) {
    const std::string b = "double_blocks." + std::to_string(i) + ".";
    for (const char* s : {"img", "txt"}) {
      const std::string t = b + s;
      linear(t + "_mod.lin", 6 * kD, kD);
      linear(t + "_attn.qkv", 3 * kD, kD);
      linear(t + "_attn.proj", kD, kD);
      norm(t + "_attn.norm.query_norm");
      norm(t + "_attn.norm.key_norm");
      linear(t + "_mlp.0", 4 * kD, kD);
      linear(t + "_mlp.2", kD, 4 * kD);
    }
  }
  for (int64_t i = 0; i < kSingles; ++i) {
    const std::string b = "single_blocks." + std::to_string(i) + ".";
    linear(b + "linear1", 7 * kD, kD);
    linear(b + "linear2", kD, 5 * kD);
    linear(b + "modulation.lin", 3 * kD, kD);
    norm(b + "norm.query_norm");
    norm(b + "norm.key_norm");
  }
  linear("final_layer.linear", 64, kD);
  linear("final_layer.adaLN_modulation.1", 2 * kD, kD);
  return elements;
}

// ae.safetensors, decoder side (LDM names; 4 levels of 128, 256, 512, 512 channels, 3 resnets each).
void add_flux_ae_decoder(io::SafetensorsWriter& w, const std::string& prefix) {
  const io::DType t = io::DType::BF16;
  auto conv = [&](const std::string& name, int64_t out, int64_t in, int64_t k) {
    w.add_hollow(prefix + name + ".weight", t, {out, in, k, k});
    w.add_hollow(prefix + name + ".bias", t, {out});
  };
  auto norm = [&](const std::string& name, int64_t c) {
    w.add_hollow(prefix + name + ".weight", t, {c});
    w.add_hollow(prefix + name + ".bias", t, {c});
  };
  auto resnet = [&](const std::string& name, int64_t in, int64_t out) {
    norm(name + ".norm1", in);
    conv(name + ".conv1", out, in, 3);
    norm(name + ".norm2", out);
    conv(name + ".conv2", out, out, 3);
    if (in != out) conv(name + ".nin_shortcut", out, in, 1);
  };
  conv("decoder.conv_in", 512, 16, 3);
  resnet("decoder.mid.block_1", 512, 512);
  norm("decoder.mid.attn_1.norm", 512);
  for (const char* p : {"q", "k", "v", "proj_out"}) conv(std::string("decoder.mid.attn_1.") + p, 512, 512, 1);
  resnet("decoder.mid.block_2", 512, 512);
  const int64_t ch[] = {128, 256, 512, 512};
  int64_t in = 512;
  for (int level = 3; level >= 0; --level) {
    for (int j = 0; j < 3; ++j) {
      resnet("decoder.up." + std::to_string(level) + ".block." + std::to_string(j), in, ch[level]);
      in = ch[level];
    }
    if (level != 0) conv("decoder.up." + std::to_string(level) + ".upsample.conv", in, in, 3);
  }
  norm("decoder.norm_out", 128);
  conv("decoder.conv_out", 3, 128, 3);
}

void add_clip_l(io::SafetensorsWriter& w, const std::string& prefix) {
  const io::DType t = io::DType::F16;
  const std::string m = prefix + "text_model.";
  w.add_hollow(m + "embeddings.token_embedding.weight", t, {49408, 768});
  w.add_hollow(m + "embeddings.position_embedding.weight", t, {77, 768});
  for (int i = 0; i < 12; ++i) {
    const std::string l = m + "encoder.layers." + std::to_string(i) + ".";
    for (const char* p : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      w.add_hollow(l + "self_attn." + p + ".weight", t, {768, 768});
      w.add_hollow(l + "self_attn." + p + ".bias", t, {768});
    }
    for (const char* n : {"layer_norm1", "layer_norm2"}) {
      w.add_hollow(l + n + ".weight", t, {768});
      w.add_hollow(l + n + ".bias", t, {768});
    }
    w.add_hollow(l + "mlp.fc1.weight", t, {3072, 768});
    w.add_hollow(l + "mlp.fc1.bias", t, {3072});
    w.add_hollow(l + "mlp.fc2.weight", t, {768, 3072});
    w.add_hollow(l + "mlp.fc2.bias", t, {768});
  }
  w.add_hollow(m + "final_layer_norm.weight", t, {768});
  w.add_hollow(m + "final_layer_norm.bias", t, {768});
}

void add_t5xxl(io::SafetensorsWriter& w, const std::string& prefix, io::DType matrices) {
  const io::DType t = io::DType::F16;
  w.add_hollow(prefix + "shared.weight", t, {32128, 4096});
  for (int i = 0; i < 24; ++i) {
    const std::string b = prefix + "encoder.block." + std::to_string(i) + ".layer.";
    for (const char* p : {"q", "k", "v", "o"}) w.add_hollow(b + "0.SelfAttention." + p + ".weight", matrices, {4096, 4096});
    if (i == 0) w.add_hollow(b + "0.SelfAttention.relative_attention_bias.weight", t, {32, 64});
    w.add_hollow(b + "0.layer_norm.weight", t, {4096});
    w.add_hollow(b + "1.DenseReluDense.wi_0.weight", matrices, {10240, 4096});
    w.add_hollow(b + "1.DenseReluDense.wi_1.weight", matrices, {10240, 4096});
    w.add_hollow(b + "1.DenseReluDense.wo.weight", matrices, {4096, 10240});
    w.add_hollow(b + "1.layer_norm.weight", t, {4096});
  }
  w.add_hollow(prefix + "encoder.final_layer_norm.weight", t, {4096});
}

// The blocks each rank line of the plan names: "double 0-8" / "single 0-37" ranges.
void expect_sane_plan(const std::string& output, int ranks, const std::string& what) {
  std::set<int> seen_ranks;
  std::vector<int> doubles(kDoubles, 0), singles(kSingles, 0);
  static const std::regex rank_line(R"(^\s*(\d+)\s+((?:(?:double|single) \d+(?:-\d+)?(?:, )?)+))");
  static const std::regex range(R"((double|single) (\d+)(?:-(\d+))?)");
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, rank_line)) continue;
    seen_ranks.insert(std::stoi(m[1].str()));
    const std::string blocks = m[2].str();
    for (auto it = std::sregex_iterator(blocks.begin(), blocks.end(), range); it != std::sregex_iterator(); ++it) {
      const int a = std::stoi((*it)[2].str()), b = (*it)[3].matched ? std::stoi((*it)[3].str()) : a;
      auto& v = (*it)[1].str() == "double" ? doubles : singles;
      for (int k = a; k <= b && k < static_cast<int>(v.size()); ++k) ++v[static_cast<size_t>(k)];
    }
  }
  EXPECT_EQ(static_cast<int>(seen_ranks.size()), ranks) << what << ": one plan line per rank expected in\n" << output;
  for (int k = 0; k < kDoubles; ++k) EXPECT_EQ(doubles[static_cast<size_t>(k)], 1) << what << ": double block " << k << "\n" << output;
  for (int k = 0; k < kSingles; ++k) EXPECT_EQ(singles[static_cast<size_t>(k)], 1) << what << ": single block " << k << "\n" << output;
}

int64_t reported_parameters(const std::string& output) {
  static const std::regex params(R"(([0-9][0-9,]*) parameters)");
  std::smatch m;
  if (!std::regex_search(output, m, params)) return -1;
  std::string digits;
  for (char ch : m[1].str())
    if (ch != ',') digits += ch;
  return std::stoll(digits);
}

TEST(SingleFileRealShapes, DryRunOfFlux1DevFilesWithTheShippedConfigs) {
  TempDir dir("single-file-real");
  // flux1-dev.safetensors alone, bf16, original keys: the shipped FLUX.1-dev configs apply.
  io::SafetensorsWriter transformer;
  const int64_t elements = add_flux1_dev(transformer, "", io::DType::BF16);
  transformer.write(dir / "flux1-dev.safetensors");
  EXPECT_EQ(elements, 11901408320) << "FLUX.1-dev has 11,901,408,320 transformer parameters";
  // The other three files a FLUX.1-dev user downloads: --dry-run checks every component's headers.
  io::SafetensorsWriter ae, clip, t5;
  add_flux_ae_decoder(ae, "");
  ae.write(dir / "ae.safetensors");
  add_clip_l(clip, "");
  clip.write(dir / "clip_l.safetensors");
  add_t5xxl(t5, "", io::DType::F8_E4M3);
  t5.write(dir / "t5xxl_fp8_e4m3fn.safetensors");
  for (int ranks : {1, 2, 4}) {
    JobResult r = run_fluxmpi(ranks, {"--model", dir / "flux1-dev.safetensors", "--vae", dir / "ae.safetensors",
                                      "--text-encoder", dir / "clip_l.safetensors", "--text-encoder-2",
                                      dir / "t5xxl_fp8_e4m3fn.safetensors", "--dry-run"});
    const std::string what = "flux1-dev.safetensors --dry-run on " + std::to_string(ranks) + " rank(s)";
    ASSERT_EQ(r.exit_code, 0) << what << ":\n" << r.output;
    EXPECT_NE(r.output.find("FLUX.1-dev"), std::string::npos) << what << ": the shipped FLUX.1-dev configs\n" << r.output;
    EXPECT_NE(r.output.find("flux1-dev.safetensors (original FLUX keys)"), std::string::npos) << what << "\n" << r.output;
    EXPECT_EQ(reported_parameters(r.output), elements) << what << ": 11.9 B parameters expected\n" << r.output;
    expect_sane_plan(r.output, ranks, what);
  }

  // A ComfyUI-style all-in-one file: fp8 transformer, VAE, CLIP-L and T5-XXL under their prefixes.
  io::SafetensorsWriter all;
  add_flux1_dev(all, "model.diffusion_model.", io::DType::F8_E4M3);
  add_flux_ae_decoder(all, "vae.");
  add_clip_l(all, "text_encoders.clip_l.transformer.");
  add_t5xxl(all, "text_encoders.t5xxl.transformer.", io::DType::F8_E4M3);
  all.write(dir / "flux1-dev-fp8-all.safetensors");
  JobResult r = run_fluxmpi(2, {"--model", dir / "flux1-dev-fp8-all.safetensors", "--dry-run"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"transformer:    ", "vae:            ", "text_encoder:   ", "text_encoder_2: "})
    EXPECT_NE(r.output.find(std::string(line) + dir / "flux1-dev-fp8-all.safetensors ("), std::string::npos)
        << "all-in-one: " << line << "\n" << r.output;
  EXPECT_NE(r.output.find("(LDM keys under 'vae.')"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(original FLUX keys under 'model.diffusion_model.')"), std::string::npos) << r.output;
  EXPECT_EQ(reported_parameters(r.output), elements) << r.output;
  expect_sane_plan(r.output, 2, "all-in-one on 2 ranks");
}

}  // namespace
}  // namespace fluxmpi::test
