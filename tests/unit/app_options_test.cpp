// The fluxmpi options table: command line, INI file, --help/--version, and every validation message.

#include <gtest/gtest.h>
#include <gmock/gmock.h>
#include <torch/version.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "app/options.h"
#include "core/error.h"
#include "core/version.h"

namespace fluxmpi::app {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;

class Options : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / str_cat("fluxmpi-options-", ::getpid(), "-", info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "model");
    model_ = (dir_ / "model").string();
    out_ = (dir_ / "out.png").string();
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }
  // --model and -o in the temp folder, then `extra`.
  std::vector<std::string> args(std::vector<std::string> extra) const {
    std::vector<std::string> a = {"--model", model_, "-o", out_};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  RunConfig parse(const std::vector<std::string>& a) const {
    ParseResult r = parse_options(a);
    EXPECT_EQ(r.action, ParseResult::Action::Run);
    return r.config;
  }
  // The UsageError message of parsing `a`, or a text saying there was none.
  static std::string usage_error(const std::vector<std::string>& a) {
    try {
      parse_options(a);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(no UsageError)";
  }

  fs::path dir_;
  std::string model_, out_;
};

TEST_F(Options, MinimalCommandLineTakesTheDocumentedDefaults) {
  RunConfig c = parse(args({"--prompt", "a cat"}));
  EXPECT_EQ(c.model, model_);
  EXPECT_EQ(c.prompts, std::vector<std::string>{"a cat"});
  EXPECT_TRUE(c.prompts_file.empty());
  EXPECT_EQ(c.prompt_2, "");
  EXPECT_FALSE(c.negative_prompt.has_value());
  EXPECT_EQ(c.true_cfg, 1.0);
  EXPECT_FALSE(c.true_cfg_enabled());
  EXPECT_EQ(c.num_images, 1);
  EXPECT_FALSE(c.seed || c.height || c.width || c.steps || c.guidance || c.max_sequence_length);
  EXPECT_EQ(c.output, out_);
  EXPECT_EQ(c.checkpoint, "");
  EXPECT_EQ(c.checkpoint_every, 1);
  EXPECT_EQ(c.resume, "");
  EXPECT_EQ(c.checkpoint_file(), "");
  EXPECT_EQ(c.dtype, "auto");
  EXPECT_EQ(c.device, "cpu");
  EXPECT_EQ(c.threads, 0);
  EXPECT_EQ(c.balance, "compute");
  EXPECT_EQ(c.partition, "");
  EXPECT_EQ(c.max_memory, "");
  EXPECT_EQ(c.stages, 0);
  EXPECT_EQ(c.microbatch, 1);
  EXPECT_EQ(c.patches, 1);
  EXPECT_EQ(c.warmup_steps, 1);
  EXPECT_FALSE(c.keep_encoders);
  EXPECT_FALSE(c.dry_run);
  EXPECT_FALSE(c.no_progress);
  EXPECT_EQ(c.log_level, log::Level::Info);
  EXPECT_EQ(c.given, (std::set<std::string>{"model", "output", "prompt"}));
}

TEST_F(Options, EveryOptionReachesTheRunConfig) {
  RunConfig c = parse(args({"--prompt", "a cat", "--prompt-2", "t5 text", "--negative-prompt", "blurry", "--true-cfg", "2.5",
                            "--num-images", "3", "--seed", "42", "--height", "512", "--width", "768", "--steps", "12",
                            "--guidance", "4", "--max-sequence-length", "128", "--checkpoint", path("run.h5"),
                            "--checkpoint-every", "5", "--dtype", "bf16", "--device", "cuda", "--threads", "8", "--balance",
                            "memory", "--partition", "0:0-8,1:9-56", "--max-memory", "0=16GiB,1=24GiB", "--microbatch", "2",
                            "--stages", "4", "--keep-encoders", "--vae-tiling", "--vae-slicing", "--dry-run", "--log-level", "debug", "--no-progress"}));
  EXPECT_EQ(c.prompt_2, "t5 text");
  EXPECT_EQ(c.negative_prompt, std::optional<std::string>("blurry"));
  EXPECT_EQ(c.true_cfg, 2.5);
  EXPECT_TRUE(c.true_cfg_enabled());
  EXPECT_EQ(c.num_images, 3);
  EXPECT_EQ(c.seed, 42);
  EXPECT_EQ(c.height, 512);
  EXPECT_EQ(c.width, 768);
  EXPECT_EQ(c.steps, 12);
  EXPECT_EQ(c.guidance, 4.0);
  EXPECT_EQ(c.max_sequence_length, 128);
  EXPECT_EQ(c.checkpoint, path("run.h5"));
  EXPECT_EQ(c.checkpoint_file(), path("run.h5"));
  EXPECT_EQ(c.checkpoint_every, 5);
  EXPECT_EQ(c.dtype, "bf16");
  EXPECT_EQ(c.device, "cuda");
  EXPECT_EQ(c.threads, 8);
  EXPECT_EQ(c.balance, "memory");
  EXPECT_EQ(c.partition, "0:0-8,1:9-56");
  EXPECT_EQ(c.max_memory, "0=16GiB,1=24GiB");
  EXPECT_EQ(c.microbatch, 2);
  EXPECT_EQ(c.stages, 4);
  EXPECT_TRUE(c.keep_encoders);
  EXPECT_TRUE(c.dry_run);
  EXPECT_EQ(c.log_level, log::Level::Debug);
  EXPECT_TRUE(c.no_progress);
  EXPECT_TRUE(c.was_given("max-memory"));
  EXPECT_FALSE(c.was_given("resume"));
}

TEST_F(Options, DtypeDefaultsToAutoOnEveryDevice) {
  // "auto" is resolved by prepare_run (tests/unit/app_defaults_test.cpp, AutoDtype).
  EXPECT_EQ(parse(args({"--prompt", "x"})).dtype, "auto");
  EXPECT_EQ(parse(args({"--prompt", "x", "--device", "cuda"})).dtype, "auto");
  EXPECT_EQ(parse(args({"--prompt", "x", "--dtype", "auto"})).dtype, "auto");
  EXPECT_EQ(parse(args({"--prompt", "x", "--device", "cuda", "--dtype", "fp32"})).dtype, "fp32");
  EXPECT_EQ(parse(args({"--prompt", "x", "--dtype", "bfloat16"})).dtype, "bf16");
  EXPECT_EQ(parse(args({"--prompt", "x", "--dtype", "float32"})).dtype, "fp32");
  EXPECT_EQ(parse(args({"--prompt", "x", "--device", "cuda", "--dtype", "fp16"})).dtype, "fp16");
}

TEST_F(Options, NumericValidationNamesTheOptionAndTheValue) {
  auto err = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"--prompt", "x"});
    return usage_error(args(extra));
  };
  EXPECT_EQ(err({"--height", "0"}), "--height must be positive, got 0");
  EXPECT_EQ(err({"--width=-16"}), "--width must be positive, got -16");
  EXPECT_EQ(err({"--height", "70000"}), "--height must be at most 65536, got 70000");
  EXPECT_EQ(err({"--steps", "0"}), "--steps must be positive, got 0");
  EXPECT_EQ(err({"--steps", "abc"}), "--steps must be an integer, got 'abc'");
  EXPECT_EQ(err({"--steps", "1.5"}), "--steps must be an integer, got '1.5'");
  EXPECT_EQ(err({"--steps", "4x"}), "--steps must be an integer, got '4x'");
  EXPECT_EQ(err({"--steps", "99999999999999999999"}), "--steps is out of range, got '99999999999999999999'");
  EXPECT_EQ(err({"--guidance=-1"}), "--guidance must not be negative, got -1");
  EXPECT_EQ(err({"--guidance", "nan"}), "--guidance must be a finite number, got 'nan'");
  EXPECT_EQ(err({"--guidance", "inf"}), "--guidance must be a finite number, got 'inf'");
  EXPECT_EQ(err({"--guidance", "3.5.1"}), "--guidance must be a number, got '3.5.1'");
  EXPECT_EQ(err({"--true-cfg", "0.5"}),
            "--true-cfg must be at least 1 (1 disables true classifier-free guidance), got 0.5");
  EXPECT_EQ(err({"--num-images", "100001"}), "--num-images must be at most 100000, got 100001");
  EXPECT_EQ(err({"--num-images", "0"}), "--num-images must be positive, got 0");
  EXPECT_EQ(err({"--microbatch", "0"}), "--microbatch must be positive, got 0");
  EXPECT_EQ(err({"--stages", "0"}), "--stages must be positive, got 0");
  EXPECT_EQ(err({"--patches", "0"}), "--patches must be positive, got 0");
  EXPECT_EQ(err({"--warmup-steps", "0"}), "--warmup-steps must be positive, got 0");
  EXPECT_EQ(err({"--checkpoint-every", "0"}), "--checkpoint-every must be positive, got 0");
  EXPECT_EQ(err({"--threads=-1"}), "--threads must not be negative, got -1");
  EXPECT_EQ(err({"--max-sequence-length", "0"}), "--max-sequence-length must be positive, got 0");
  EXPECT_EQ(err({"--max-sequence-length", "513"}), "--max-sequence-length must be at most 512, got 513");
  EXPECT_EQ(err({"--seed=-1"}), "--seed must not be negative, got -1");
  EXPECT_EQ(err({"--seed", ""}), "--seed must be an integer, got ''");
  EXPECT_EQ(parse(args({"--prompt", "x", "--max-sequence-length", "512"})).max_sequence_length, 512);
  EXPECT_EQ(parse(args({"--prompt", "x", "--guidance", "0"})).guidance, 0.0);
  EXPECT_EQ(parse(args({"--prompt", "x", "--seed", "9223372036854775807"})).seed, INT64_MAX);
}

TEST_F(Options, ChoicesListTheAllowedValues) {
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--device", "gpu"})), "--device must be one of cpu, cuda, got 'gpu'");
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--dtype", "fp64"})), "--dtype must be one of auto, fp32, bf16, fp16, got 'fp64'");
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--balance", "speed"})),
            "--balance must be one of compute, memory, got 'speed'");
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--log-level", "loud"})),
            "--log-level must be one of error, warn, info, debug, got 'loud'");
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--partition", ""})), "--partition must not be empty (e.g. 0:0-8,1:9-56)");
}

TEST_F(Options, BoostSyntaxErrorsAreReadable) {
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--frobnicate"})), "unknown option '--frobnicate' (see fluxmpi --help)");
  // No abbreviations: --step is not --steps.
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--step", "4"})), "unknown option '--step' (see fluxmpi --help)");
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--steps"})), "--steps needs a value");
  EXPECT_EQ(parse(args({"--prompt", "-x", "--guidance", "2"})).prompts, std::vector<std::string>{"-x"});
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--steps", "4", "--steps", "5"})), "--steps is given more than once");
  EXPECT_EQ(usage_error(args({"--prompt", "x", "-o", "a.png"})), "--output is given more than once");
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--dry-run=yes"})), "--dry-run takes no value");
  EXPECT_EQ(usage_error(args({"--prompt", "a", "cat"})),
            "unexpected argument 'cat' (every value follows its option, e.g. --prompt \"a cat\")");
}

TEST_F(Options, PromptSources) {
  EXPECT_EQ(usage_error(args({})), "no prompt: give --prompt TEXT or --prompts-file FILE");
  std::string file = write("prompts.txt", "a cat\r\n\r\na dog\n");
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--prompts-file", file})),
            "--prompt and --prompts-file cannot be used together: give one prompt or a file of prompts");
  RunConfig c = parse(args({"--prompts-file", file}));
  EXPECT_EQ(c.prompts, (std::vector<std::string>{"a cat", "a dog"}));
  EXPECT_EQ(c.prompts_file, file);
  EXPECT_THAT(usage_error(args({"--prompts-file", path("absent.txt")})), HasSubstr("absent.txt': not found"));
  // The prompt may be empty, as in diffusers; the prompts come from the checkpoint with --resume.
  EXPECT_EQ(parse(args({"--prompt", ""})).prompts, std::vector<std::string>{""});
  EXPECT_TRUE(parse(args({"--dry-run"})).prompts.empty());
}

TEST_F(Options, PromptsMustBeUtf8) {
  EXPECT_EQ(usage_error(args({"--prompt", "caf\xC3"})), "--prompt is not valid UTF-8 (byte 4)");
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--prompt-2", "\xFFx"})), "--prompt-2 is not valid UTF-8 (byte 1)");
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--negative-prompt", "ok \xED\xA0\x80"})),
            "--negative-prompt is not valid UTF-8 (byte 4)");
  EXPECT_EQ(parse(args({"--prompt", "caf\xC3\xA9 \xF0\x9F\x90\x88"})).prompts[0], "caf\xC3\xA9 \xF0\x9F\x90\x88");
}

TEST_F(Options, TrueCfgNeedsBothScaleAndNegativePrompt) {
  ::testing::internal::CaptureStderr();
  RunConfig only_negative = parse(args({"--prompt", "x", "--negative-prompt", "blurry"}));
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(only_negative.true_cfg_enabled());
  EXPECT_THAT(log, HasSubstr("--negative-prompt is ignored: true classifier-free guidance needs --true-cfg > 1"));

  ::testing::internal::CaptureStderr();
  RunConfig only_scale = parse(args({"--prompt", "x", "--true-cfg", "3"}));
  log = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(only_scale.true_cfg_enabled());
  EXPECT_THAT(log, HasSubstr("--true-cfg 3 is ignored: true classifier-free guidance needs --negative-prompt"));

  // An empty negative prompt is a negative prompt (diffusers: `negative_prompt is not None`).
  RunConfig empty_negative = parse(args({"--prompt", "x", "--true-cfg", "3", "--negative-prompt", ""}));
  EXPECT_TRUE(empty_negative.true_cfg_enabled());
  EXPECT_EQ(empty_negative.negative_prompt, std::optional<std::string>(""));
}

TEST_F(Options, ModelMustBeAnExistingFolderOrFile) {
  EXPECT_EQ(usage_error({"--prompt", "x", "-o", out_}),
            "--model is required: a diffusers FluxPipeline folder (DIR with model_index.json) or a .safetensors file");
  EXPECT_EQ(usage_error({"--model", path("nope"), "--prompt", "x", "-o", out_}), str_cat("--model '", path("nope"), "': not found"));
  // A file is a single-file checkpoint: what it holds is checked when it is opened, not here.
  std::string file = write("flux1-dev.safetensors", "x");
  RunConfig c = parse({"--model", file, "--prompt", "x", "-o", out_});
  EXPECT_EQ(c.model, file);
}

TEST_F(Options, ComponentSourcesAndModelConfig) {
  std::string vae = write("ae.safetensors", "x");
  RunConfig c = parse({"--model", model_, "--vae", vae, "--text-encoder", model_, "--model-config", model_, "--prompt", "x",
                       "-o", out_});
  EXPECT_EQ(c.vae, vae);
  EXPECT_EQ(c.text_encoder, model_);
  EXPECT_EQ(c.model_config, model_);
  EXPECT_EQ(usage_error({"--model", model_, "--vae", path("nope.safetensors"), "--prompt", "x", "-o", out_}),
            str_cat("--vae '", path("nope.safetensors"), "': not found"));
  EXPECT_EQ(usage_error({"--model", model_, "--model-config", vae, "--prompt", "x", "-o", out_}),
            str_cat("--model-config '", vae, "': not a directory"));
  // --transformer alone is enough: the other components then need their own options.
  RunConfig t = parse({"--transformer", vae, "--prompt", "x", "-o", out_});
  EXPECT_TRUE(t.model.empty());
  EXPECT_EQ(t.transformer, vae);
}

TEST_F(Options, OutputMustBeAPngInAWritableDirectory) {
  EXPECT_EQ(usage_error({"--model", model_, "--prompt", "x", "-o", path("img.jpg")}),
            str_cat("--output must name a .png file (fluxmpi writes PNG images), got '", path("img.jpg"), "'"));
  EXPECT_THAT(usage_error({"--model", model_, "--prompt", "x", "-o", path("model")}), HasSubstr("must name a .png file"));
  EXPECT_EQ(usage_error({"--model", model_, "--prompt", "x", "-o", path("missing/img.png")}),
            str_cat("--output '", path("missing/img.png"), "': directory '", path("missing"), "' does not exist"));
  std::string file = write("plain", "x");
  EXPECT_EQ(usage_error({"--model", model_, "--prompt", "x", "-o", file + "/img.png"}),
            str_cat("--output '", file, "/img.png': directory '", file, "' is not a directory"));
  EXPECT_EQ(parse({"--model", model_, "--prompt", "x", "-o", path("IMG-{i}.PNG")}).output, path("IMG-{i}.PNG"));
  // A directory that depends on {i} is checked per image by build_job.
  EXPECT_EQ(parse({"--model", model_, "--prompt", "x", "-o", path("{i}/img.png")}).output, path("{i}/img.png"));
}

TEST_F(Options, OutputDirectoryMustBeWritable) {
  fs::create_directories(path("readonly"));
  fs::permissions(path("readonly"), fs::perms::owner_read | fs::perms::owner_exec);
  if (::access(path("readonly").c_str(), W_OK) == 0) GTEST_SKIP() << "running as root: the read-only directory " << path("readonly") << " is writable";
  EXPECT_EQ(usage_error({"--model", model_, "--prompt", "x", "-o", path("readonly/img.png")}),
            str_cat("--output '", path("readonly/img.png"), "': directory '", path("readonly"), "' is not writable"));
}

TEST_F(Options, CheckpointAndResume) {
  const std::string run = path("run.h5");
  RunConfig fresh = parse(args({"--prompt", "x", "--checkpoint", run}));
  EXPECT_EQ(fresh.checkpoint_file(), run);
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--checkpoint", path("no/run.h5")})),
            str_cat("--checkpoint '", path("no/run.h5"), "': directory '", path("no"), "' does not exist"));
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--resume", run})), str_cat("--resume '", run, "': not found"));

  write("run.h5", "hdf5 stand-in");
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--checkpoint", run})),
            str_cat("--checkpoint '", run, "' already exists; continue it with --resume or remove it"));
  // --resume: prompts, sampling options and the model may come from the checkpoint.
  RunConfig resumed = parse({"--resume", run, "-o", out_});
  EXPECT_TRUE(resumed.prompts.empty());
  EXPECT_TRUE(resumed.model.empty());
  EXPECT_EQ(resumed.checkpoint_file(), run);
  EXPECT_EQ(parse(args({"--resume", run, "--checkpoint", path("./run.h5")})).checkpoint_file(), run);
  write("other.h5", "x");
  EXPECT_EQ(usage_error(args({"--resume", run, "--checkpoint", path("other.h5")})),
            str_cat("--checkpoint '", path("other.h5"), "' and --resume '", run,
                    "' name different files: a resumed run writes on into the --resume file"));
  EXPECT_EQ(usage_error(args({"--resume", path("model")})),
            str_cat("--resume '", path("model"), "': is a directory, not a checkpoint file"));
}

TEST_F(Options, ConfigFileSetsEveryOptionAndTheCommandLineWins) {
  std::string ini = write("run.ini",
                          "# a comment\n"
                          "model = " + model_ + "\n"
                          "prompt = \"  a cat  \"\n"
                          "output = " + out_ + "\n"
                          "steps = 7\n"
                          "seed = 11\n"
                          "dry-run = true\n"
                          "keep-encoders = off\n"
                          "no-progress = YES\n"
                          "threads = 3\n");
  RunConfig c = parse({"--config", ini, "--steps", "9"});
  EXPECT_EQ(c.config_file, ini);
  EXPECT_EQ(c.prompts, std::vector<std::string>{"  a cat  "});
  EXPECT_EQ(c.steps, 9);  // command line wins
  EXPECT_EQ(c.seed, 11);
  EXPECT_TRUE(c.dry_run);
  EXPECT_FALSE(c.keep_encoders);
  EXPECT_TRUE(c.no_progress);
  EXPECT_EQ(c.threads, 3);
  EXPECT_TRUE(c.was_given("keep-encoders"));
  EXPECT_TRUE(c.was_given("config"));

  // A prompt source on the command line replaces the INI's, of either kind.
  std::string file = write("p.txt", "from file\n");
  EXPECT_EQ(parse({"--config", ini, "--prompts-file", file}).prompts, std::vector<std::string>{"from file"});
  std::string ini_file = write("file.ini", "model = " + model_ + "\noutput = " + out_ + "\nprompts-file = " + file + "\n");
  EXPECT_EQ(parse({"--config", ini_file, "--prompt", "cli"}).prompts, std::vector<std::string>{"cli"});
  std::string both = write("both.ini", "prompt = a\nprompts-file = " + file + "\n");
  EXPECT_EQ(usage_error(args({"--config", both})),
            "--prompt and --prompts-file cannot be used together: give one prompt or a file of prompts");
}

TEST_F(Options, ConfigFileErrorsNameTheFileAndTheKey) {
  auto err = [&](const std::string& name, const std::string& text) {
    return usage_error(args({"--prompt", "x", "--config", write(name, text)}));
  };
  std::string label = str_cat("config file '", path("a.ini"), "'");
  EXPECT_EQ(err("a.ini", "stepz = 4\n"), label + ": unknown key 'stepz' (keys are the long option names, see fluxmpi --help)");
  EXPECT_EQ(err("a.ini", "[sampling]\nsteps = 4\n"),
            label + ": unknown key 'sampling.steps' (keys are the long option names at the top level, without [sections])");
  EXPECT_EQ(err("a.ini", "config = other.ini\n"),
            label + ": unknown key 'config' ('config' can only be given on the command line)");
  EXPECT_EQ(err("a.ini", "steps = 4\nsteps = 5\n"), label + ": key 'steps' is set more than once");
  EXPECT_EQ(err("a.ini", "steps\n"), label + ": invalid line 'steps' (expected key = value)");
  EXPECT_EQ(err("a.ini", "steps = four\n"), str_cat("--steps must be an integer, got 'four' (set in config file '", path("a.ini"), "')"));
  EXPECT_EQ(err("a.ini", "dry-run = maybe\n"),
            str_cat("--dry-run must be true or false, got 'maybe' (set in config file '", path("a.ini"), "')"));
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--config", path("none.ini")})), str_cat("--config '", path("none.ini"), "': not found"));
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--config", path("model")})),
            str_cat("--config '", path("model"), "': is a directory, not a file"));
}

TEST_F(Options, LorasAreRepeatableInOrderAndTheCommandLineReplacesTheIniLines) {
  const std::string a = write("a.safetensors", "x"), b = write("b.safetensors", "x");
  RunConfig c = parse(args({"--prompt", "x", "--lora", a + ":0.5", "--lora", b}));
  ASSERT_EQ(c.loras.size(), 2u);
  EXPECT_EQ(c.loras[0], (io::LoraSpec{a, 0.5}));
  EXPECT_EQ(c.loras[1], (io::LoraSpec{b, 1.0}));
  EXPECT_TRUE(c.was_given("lora"));
  EXPECT_TRUE(parse(args({"--prompt", "x"})).loras.empty());
  const std::string ini = write("l.ini", str_cat("lora = ", b, ":-0.25\nlora = ", a, "\n"));
  c = parse(args({"--prompt", "x", "--config", ini}));
  ASSERT_EQ(c.loras.size(), 2u);
  EXPECT_EQ(c.loras[0], (io::LoraSpec{b, -0.25}));
  EXPECT_EQ(c.loras[1], (io::LoraSpec{a, 1.0}));
  c = parse(args({"--prompt", "x", "--config", ini, "--lora", a + ":2"}));
  ASSERT_EQ(c.loras.size(), 1u) << "a --lora on the command line replaces the INI file's lora lines";
  EXPECT_EQ(c.loras[0], (io::LoraSpec{a, 2.0}));
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--lora", path("none.safetensors")})),
            str_cat("--lora '", path("none.safetensors"), "': not found"));
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--lora", a + ":inf"})),
            str_cat("--lora '", a, ":inf': the scale must be a finite number"));
  EXPECT_EQ(usage_error(args({"--prompt", "x", "--config", write("m.ini", "lora = " + path("model") + "\n")})),
            str_cat("--lora '", path("model"), "': not a file (set in config file '", path("m.ini"), "')"));
}

TEST_F(Options, HelpListsEveryOptionWithItsDefault) {
  ParseResult r = parse_options(std::vector<std::string>{"--help", "--steps", "0"});  // --help validates nothing
  ASSERT_EQ(r.action, ParseResult::Action::Help);
  EXPECT_EQ(r.text, help_text());
  for (const char* name : {"--model", "--prompt", "--prompt-2", "--negative-prompt", "--true-cfg", "--prompts-file",
                           "--num-images", "--seed", "--height", "--width", "--steps", "--guidance",
                           "--max-sequence-length", "--output", "--checkpoint", "--checkpoint-every", "--resume", "--dtype",
                           "--device", "--threads", "--balance", "--partition", "--max-memory", "--microbatch",
                           "--stages", "--patches", "--warmup-steps", "--keep-encoders", "--vae-tiling", "--vae-slicing", "--dry-run", "--log-level", "--no-progress", "--config", "--help", "--version",
                           "--lora"})
    EXPECT_THAT(r.text, HasSubstr(name));
  for (const char* group : {"Model options", "Sampling options", "Parallel options", "Output options", "General options"})
    EXPECT_THAT(r.text, HasSubstr(group));
  EXPECT_THAT(r.text, HasSubstr("--num-images N (=1)"));
  EXPECT_THAT(r.text, HasSubstr("--device cpu|cuda (=cpu)"));
  EXPECT_THAT(r.text, HasSubstr("--balance compute|memory (=compute)"));
  EXPECT_THAT(r.text, HasSubstr("default: 28 for dev, 4 for schnell"));
  EXPECT_EQ(parse_options(std::vector<std::string>{"-h"}).action, ParseResult::Action::Help);
}

TEST_F(Options, VersionNamesFluxmpiAndLibtorch) {
  ParseResult r = parse_options(std::vector<std::string>{"--version"});
  ASSERT_EQ(r.action, ParseResult::Action::Version);
  EXPECT_EQ(r.text, str_cat("fluxmpi ", kVersion, " (libtorch ", TORCH_VERSION, ")\n"));
  const char* argv[] = {"fluxmpi", "--version"};
  EXPECT_EQ(parse_options(2, argv).action, ParseResult::Action::Version);
}

}  // namespace
}  // namespace fluxmpi::app
