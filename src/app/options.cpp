#include "app/options.h"

#include <torch/version.h>

#include <algorithm>
#include <charconv>
#include <sstream>

#include "app/job.h"
#include "app/option_checks.h"
#include "app/option_settings.h"
#include "app/option_table.h"
#include "core/error.h"
#include "core/version.h"

namespace fluxmpi::app {

using namespace options;

namespace {

RunConfig validate(const Settings& s) {
  RunConfig c;
  c.given = s.names();
  c.config_file = s.text("config");
  c.log_level = log::parse_level(s.choice("log-level", {"error", "warn", "info", "debug"}));
  c.device = s.choice("device", {"cpu", "cuda"});
  c.dtype = normalise_dtype(s);  // "auto" by default: prepare_run resolves it (app/defaults.h)

  c.true_cfg = *s.number("true-cfg", 1.0, "must be at least 1 (1 disables true classifier-free guidance)");
  c.num_images = *s.integer("num-images", 1, kMaxImages);
  c.seed = s.integer("seed", 0, kNoMax);
  c.height = s.integer("height", 1, kMaxImageSide);
  c.width = s.integer("width", 1, kMaxImageSide);
  c.steps = s.integer("steps", 1, kMaxSteps);
  c.guidance = s.number("guidance", 0.0, "must not be negative");
  c.max_sequence_length = s.integer("max-sequence-length", 1, kMaxSequenceLength);

  c.threads = *s.integer("threads", 0, kMaxThreads);
  c.balance = s.choice("balance", {"compute", "memory"});
  if (s.has("text-encoder-layers")) {
    // "9,18,27": non-negative layer indices (0 = the embeddings), checked against the encoder's
    // depth once the model is known.
    const std::string text = s.text("text-encoder-layers");
    size_t start = 0;
    while (start <= text.size()) {
      const size_t comma = std::min(text.find(',', start), text.size());
      const std::string item = text.substr(start, comma - start);
      int64_t v = -1;
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
      if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0)
        s.fail("text-encoder-layers", str_cat("must be comma-separated layer indices >= 0 (e.g. 9,18,27), got '", text, "'"));
      c.text_encoder_layers.push_back(v);
      start = comma + 1;
    }
  }
  c.partition = s.text("partition");
  if (s.has("partition") && c.partition.empty()) s.fail("partition", "must not be empty (e.g. 0:0-8,1:9-56)");
  c.max_memory = s.text("max-memory");
  if (s.has("max-memory") && c.max_memory.empty()) s.fail("max-memory", "must not be empty (e.g. 0=16GiB,1=24GiB)");
  c.stages = s.integer("stages", 1, kMaxRanks).value_or(0);
  c.microbatch = *s.integer("microbatch", 1, kNoMax);
  c.keep_encoders = s.flag("keep-encoders");
  c.vae_tiling = s.flag("vae-tiling");
  c.vae_slicing = s.flag("vae-slicing");
  c.patches = *s.integer("patches", 1, kMaxSteps);
  c.warmup_steps = *s.integer("warmup-steps", 1, kMaxSteps);
  c.checkpoint_every = *s.integer("checkpoint-every", 1, kNoMax);
  c.no_progress = s.flag("no-progress");
  c.dry_run = s.flag("dry-run");
  c.predict = s.text("predict");
  if (s.has("predict") && c.predict.empty()) s.fail("predict", "must name a profile (e.g. tools/sim/profiles/local-cpu.json)");
  if (!c.predict.empty() && !c.dry_run) s.fail("predict", "needs --dry-run (the prediction is for the job a dry run describes)");

  check_model(s, c);
  check_loras(s, c);
  check_image_inputs(s, c);
  check_redux(s, c);
  check_prompts(s, c);
  check_output_and_checkpoints(s, c);
  return c;
}

}  // namespace

ParseResult parse_options(const std::vector<std::string>& args) {
  Settings settings;
  read_command_line(args, settings);
  ParseResult result;
  if (settings.has("help")) {
    result.action = ParseResult::Action::Help;
    result.text = help_text();
    return result;
  }
  if (settings.has("version")) {
    result.action = ParseResult::Action::Version;
    result.text = version_text();
    return result;
  }
  if (settings.has("config")) read_config_file(settings.text("config"), settings);
  result.config = validate(settings);
  return result;
}

ParseResult parse_options(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse_options(args);
}

std::string help_text() {
  std::ostringstream os;
  os << "Usage: fluxmpi --model DIR|FILE (--prompt TEXT | --prompts-file FILE) [options]\n"
        "       mpirun -np P fluxmpi ...   (the transformer's blocks are split over the P ranks)\n"
        "       fluxmpi --resume RUN.h5 [options]\n\n"
        "FLUX.1 text-to-image inference (diffusers FluxPipeline semantics).\n"
     << full_table(false)
     << "\nEvery option except --config, --help and --version can also be set in the INI file given to\n"
        "--config, one `long-option-name = value` per line (flags: true/false); the command line wins.\n"
        "Exit codes: 0 ok, 1 runtime failure, 2 usage error, 3 bad input data (model files, checkpoint).\n";
  return os.str();
}

std::string version_text() { return str_cat("fluxmpi ", kVersion, " (libtorch ", TORCH_VERSION, ")\n"); }

}  // namespace fluxmpi::app