// Model-dependent defaults (dev vs schnell), size flooring, and the options of every pipeline case of
// the fixture manifest resolved to the sizes, seeds and steps that diffusers used.

#include <gtest/gtest.h>
#include <gmock/gmock.h>
#include <unistd.h>

#include <ATen/Context.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "app/defaults.h"
#include "app/job.h"
#include "app/options.h"
#include "core/error.h"
#include "pipeline/flux1/defaults.h"
#include "support/fixtures.h"

namespace fluxmpi::app {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;
using pipeline::resolve_defaults;

// A pipeline folder with just the configs resolve_defaults reads.
class Defaults : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / str_cat("fluxmpi-defaults-", ::getpid(), "-", info->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `vae_levels` entries in block_out_channels: vae_scale_factor = 2^(levels - 1).
  std::string make_model(const std::string& name, bool guidance_embeds, int vae_levels = 4) const {
    fs::path root = dir_ / name;
    fs::create_directories(root / "transformer");
    fs::create_directories(root / "vae");
    std::ofstream(root / "model_index.json") << R"({"_class_name": "FluxPipeline"})";
    std::ofstream(root / "transformer" / "config.json")
        << R"({"_class_name": "FluxTransformer2DModel", "in_channels": 64, "num_layers": 2, "num_single_layers": 3,)"
        << R"( "guidance_embeds": )" << (guidance_embeds ? "true" : "false") << "}";
    std::string channels;
    for (int i = 0; i < vae_levels; ++i) channels += i ? ", 32" : "32";
    std::ofstream(root / "vae" / "config.json")
        << R"({"_class_name": "AutoencoderKL", "latent_channels": 16, "norm_num_groups": 8, "block_out_channels": [)"
        << channels << "]}";
    return root.string();
  }

  fs::path dir_;
};

TEST_F(Defaults, DevTakes28StepsGuidance35And512Tokens) {
  io::ModelDir model(make_model("dev", true));
  RunConfig c;
  resolve_defaults(c, model);
  EXPECT_EQ(c.steps, 28);
  EXPECT_EQ(c.guidance, 3.5);
  EXPECT_EQ(c.max_sequence_length, 512);
  EXPECT_EQ(c.height, 1024);
  EXPECT_EQ(c.width, 1024);
}

TEST_F(Defaults, SchnellTakes4StepsAnd256TokensWithoutGuidance) {
  io::ModelDir model(make_model("schnell", false));
  RunConfig c;
  resolve_defaults(c, model);
  EXPECT_EQ(c.steps, 4);
  EXPECT_EQ(c.guidance, 0.0);
  EXPECT_EQ(c.max_sequence_length, 256);
  EXPECT_EQ(c.height, 1024);
  EXPECT_EQ(c.width, 1024);
}

TEST_F(Defaults, GivenValuesAreKept) {
  io::ModelDir model(make_model("dev", true));
  RunConfig c;
  c.steps = 9;
  c.guidance = 1.0;
  c.max_sequence_length = 77;
  c.height = 512;
  c.width = 768;
  resolve_defaults(c, model);
  EXPECT_EQ(c.steps, 9);
  EXPECT_EQ(c.guidance, 1.0);
  EXPECT_EQ(c.max_sequence_length, 77);
  EXPECT_EQ(c.height, 512);
  EXPECT_EQ(c.width, 768);
}

TEST_F(Defaults, GuidanceForSchnellIsIgnoredWithANote) {
  io::ModelDir model(make_model("schnell", false));
  RunConfig c;
  c.guidance = 3.5;
  ::testing::internal::CaptureStderr();
  resolve_defaults(c, model);
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(c.guidance, 0.0);
  EXPECT_THAT(log, HasSubstr("note: --guidance 3.5 is ignored: model dir '" + model.root() +
                             "': transformer/config.json has no guidance embedding (FLUX.1-schnell)"));
}

TEST_F(Defaults, SizesAreFlooredToMultiplesOfTwiceTheVaeScaleWithAWarning) {
  io::ModelDir model(make_model("dev", true));
  RunConfig c;
  c.height = 40;
  c.width = 120;
  ::testing::internal::CaptureStderr();
  resolve_defaults(c, model);
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(c.height, 32);
  EXPECT_EQ(c.width, 112);
  EXPECT_THAT(log, HasSubstr("warning: --height and --width must be multiples of 16 for this model (2 x the VAE scale "
                             "factor): 40x120 (height x width) is floored to 32x112"));

  RunConfig exact;
  exact.height = 48;
  exact.width = 80;
  ::testing::internal::CaptureStderr();
  resolve_defaults(exact, model);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(exact.height, 48);
  EXPECT_EQ(exact.width, 80);

  // The unit follows the VAE config: 2 levels -> scale factor 2 -> multiples of 4.
  io::ModelDir small(make_model("small-vae", true, 2));
  RunConfig s;
  s.height = 10;
  s.width = 13;
  ::testing::internal::CaptureStderr();
  resolve_defaults(s, small);
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(s.height, 8);
  EXPECT_EQ(s.width, 12);
}

TEST_F(Defaults, ASizeThatFloorsToZeroIsAUsageError) {
  io::ModelDir model(make_model("dev", true));
  for (auto [h, w, culprit] : {std::tuple<int64_t, int64_t, std::string>{8, 64, "--height 8"}, {64, 15, "--width 15"}}) {
    RunConfig c;
    c.height = h;
    c.width = w;
    try {
      resolve_defaults(c, model);
      ADD_FAILURE() << h << "x" << w << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), str_cat(culprit, " is smaller than 16 (2 x the VAE scale factor 8 of model dir '",
                                               model.root(), "': vae/config.json): the image would be empty"));
    }
  }
}

// --- Every pipeline case of the manifest, given as the command line a user would type -----------

class ManifestCases : public ::testing::TestWithParam<test::CaseRef> {};

TEST_P(ManifestCases, ResolveToTheSizesSeedsAndStepsOfDiffusers) {
  const test::CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  const nlohmann::json& call = c.json.at("call");
  const fs::path out = fs::temp_directory_path() / str_cat("fluxmpi-defaults-", ::getpid(), "-manifest");
  fs::create_directories(out);
  std::vector<std::string> args = {"--model", c.model_dir, "--prompt", call.at("prompt").get<std::string>(),
                                   "-o", (out / "img.png").string()};
  auto add = [&](const char* key, const char* option) {
    if (call.contains(key) && !call.at(key).is_null()) args.insert(args.end(), {option, call.at(key).dump()});
  };
  std::string t5_prompt = call.at("prompt").get<std::string>();
  if (call.contains("prompt_2") && !call.at("prompt_2").is_null()) {
    t5_prompt = call.at("prompt_2").get<std::string>();
    args.insert(args.end(), {"--prompt-2", t5_prompt});
  }
  add("height", "--height");
  add("width", "--width");
  add("num_inference_steps", "--steps");
  add("guidance_scale", "--guidance");
  add("max_sequence_length", "--max-sequence-length");
  // A list of generators seeded s, s+1, ... is fluxmpi's --seed s --num-images n.
  std::vector<int64_t> seeds;
  if (call.at("seed").is_array()) seeds = call.at("seed").get<std::vector<int64_t>>();
  else seeds = {call.at("seed").get<int64_t>()};
  args.insert(args.end(), {"--seed", std::to_string(seeds[0]), "--num-images", std::to_string(seeds.size())});

  ParseResult parsed = parse_options(args);
  ASSERT_EQ(parsed.action, ParseResult::Action::Run);
  RunConfig config = parsed.config;
  ::testing::internal::CaptureStderr();
  resolve_defaults(config, io::ModelDir(c.model_dir));
  ::testing::internal::GetCapturedStderr();
  std::vector<ImageJob> job = build_job(config);
  fs::remove_all(out);

  const auto output_hw = c.json.at("output_hw").get<std::vector<int64_t>>();
  EXPECT_EQ(config.height, output_hw.at(0)) << test::case_label(c) << ": output_hw";
  EXPECT_EQ(config.width, output_hw.at(1)) << test::case_label(c) << ": output_hw";
  EXPECT_EQ(config.steps, call.at("num_inference_steps").get<int64_t>()) << test::case_label(c);
  ASSERT_EQ(static_cast<int64_t>(job.size()), c.json.at("num_images").get<int64_t>()) << test::case_label(c) << ": num_images";
  for (size_t i = 0; i < job.size(); ++i) {
    EXPECT_EQ(job[i].seed, seeds.at(i)) << test::case_label(c) << ": seed of image " << i;
    EXPECT_EQ(job[i].prompt_2, t5_prompt) << test::case_label(c);
  }
  const bool dev = c.pipeline_json.at("variant").get<std::string>() == "dev";
  EXPECT_EQ(io::ModelDir(c.model_dir).variant() == io::Variant::Dev, dev) << test::case_label(c) << ": variant";
  if (!dev) EXPECT_EQ(config.guidance, 0.0) << test::case_label(c) << ": schnell ignores guidance";
}

// --- --dtype auto ----------------------------------------------------------------------------

// /proc/cpuinfo of two cores; `flags0` and `flags1` are the cores' flags lines.
std::string cpuinfo(const std::string& flags0, const std::string& flags1) {
  return str_cat("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon\nflags\t\t: ", flags0,
                 "\nbugs\t\t: spectre_v1\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\nflags\t\t: ", flags1,
                 "\nvmx flags\t: vnmi avx512_bf16\n\n");
}

TEST(AutoDtype, ReadsTheBf16FlagsOfEveryCore) {
  const std::string base = "fpu sse2 avx2 fma avx512f avx512bw avx512_vnni";
  CpuBf16 none = cpu_bf16_from_cpuinfo(cpuinfo(base, base));
  EXPECT_FALSE(none.native());
  EXPECT_EQ(none.source, "/proc/cpuinfo");
  CpuBf16 avx = cpu_bf16_from_cpuinfo(cpuinfo(base + " avx512_bf16", base + " avx512_bf16"));
  EXPECT_TRUE(avx.avx512_bf16);
  EXPECT_FALSE(avx.amx_bf16);
  CpuBf16 amx = cpu_bf16_from_cpuinfo(cpuinfo("amx_bf16 amx_tile " + base, "amx_tile amx_bf16 " + base));
  EXPECT_TRUE(amx.amx_bf16);
  EXPECT_FALSE(amx.avx512_bf16);
  // One core without the flag: not every thread could run it.
  EXPECT_FALSE(cpu_bf16_from_cpuinfo(cpuinfo(base + " avx512_bf16", base)).native());
  // Whole words only, and only the `flags` lines (not `vmx flags`, `bugs`).
  EXPECT_FALSE(cpu_bf16_from_cpuinfo(cpuinfo(base + " avx512_bf16x", base + " xavx512_bf16")).native());
  // Not x86 (no flags line) and empty text: no native bf16.
  EXPECT_FALSE(cpu_bf16_from_cpuinfo("processor\t: 0\nFeatures\t: fp asimd bf16\n").native());
  EXPECT_FALSE(cpu_bf16_from_cpuinfo("").native());
}

TEST(AutoDtype, ChoosesBf16OnCudaAndOnCpusWithNativeBf16) {
  const std::string base = "fpu avx2 avx512f";
  const CpuBf16 plain = cpu_bf16_from_cpuinfo(cpuinfo(base, base));
  const CpuBf16 avx = cpu_bf16_from_cpuinfo(cpuinfo(base + " avx512_bf16", base + " avx512_bf16"));
  const CpuBf16 both = cpu_bf16_from_cpuinfo(cpuinfo(base + " avx512_bf16 amx_bf16", base + " amx_bf16 avx512_bf16"));

  DtypeChoice c = choose_auto_dtype("cuda", plain, false);
  EXPECT_EQ(c.dtype, "bf16");
  EXPECT_THAT(c.reason, HasSubstr("--device cuda"));
  c = choose_auto_dtype("cpu", avx, true);
  EXPECT_EQ(c.dtype, "bf16");
  EXPECT_EQ(c.reason, "the CPU executes bf16 natively (avx512_bf16 in /proc/cpuinfo)");
  c = choose_auto_dtype("cpu", both, true);
  EXPECT_EQ(c.dtype, "bf16");
  EXPECT_EQ(c.reason, "the CPU executes bf16 natively (avx512_bf16 and amx_bf16 in /proc/cpuinfo)");
  c = choose_auto_dtype("cpu", plain, true);
  EXPECT_EQ(c.dtype, "fp32");
  EXPECT_THAT(c.reason, HasSubstr("no native bf16 (neither avx512_bf16 nor amx_bf16 in /proc/cpuinfo)"));
  c = choose_auto_dtype("cpu", avx, /*libtorch_has_onednn=*/false);
  EXPECT_EQ(c.dtype, "fp32");
  EXPECT_THAT(c.reason, HasSubstr("without oneDNN"));
}

TEST(AutoDtype, ResolvesOnlyAutoAndSaysWhatItChose) {
  for (const char* given : {"fp32", "bf16", "fp16"}) {
    RunConfig c;
    c.dtype = given;
    ::testing::internal::CaptureStderr();
    resolve_dtype(c);
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << given;
    EXPECT_EQ(c.dtype, given);
  }
  RunConfig c;
  c.dtype = "auto";
  ::testing::internal::CaptureStderr();
  resolve_dtype(c);
  const std::string log = ::testing::internal::GetCapturedStderr();
  const DtypeChoice expected = choose_auto_dtype("cpu", detect_cpu_bf16(), at::hasMKLDNN());
  EXPECT_EQ(c.dtype, expected.dtype);
  EXPECT_THAT(log, HasSubstr("--dtype auto chose " + expected.dtype + ": " + expected.reason));
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
}

TEST(AutoDtype, CpuinfoAndCpuidAgreeOnThisMachine) {
  // The fallback for systems without /proc/cpuinfo must read the same flags the kernel reports.
  const CpuBf16 here = detect_cpu_bf16();
  if (here.source != "/proc/cpuinfo") GTEST_SKIP() << "no /proc/cpuinfo flags on this machine";
  const CpuBf16 cpuid = cpu_bf16_from_cpuid();
  EXPECT_EQ(cpuid.source, "cpuid");
  EXPECT_EQ(cpuid.avx512_bf16, here.avx512_bf16);
  EXPECT_EQ(cpuid.amx_bf16, here.amx_bf16);
}

INSTANTIATE_TEST_SUITE_P(Pipeline, ManifestCases, ::testing::ValuesIn(test::cases_of_kind("pipeline")),
                         test::case_test_name);

}  // namespace
}  // namespace fluxmpi::app
