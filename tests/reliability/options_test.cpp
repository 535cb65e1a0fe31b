// Bad-input table, part 3: what the user types. The command line (numeric options out of range,
// unknown and conflicting options), INI files given to --config, prompts files, and output and
// checkpoint paths. All are usage errors (exit code 2) found before anything is loaded.

#include <sys/stat.h>

#include <filesystem>

#include "core/error.h"
#include "harness.h"

namespace fluxmpi::reliability {
namespace {
namespace fs = std::filesystem;

auto make_file(const std::string& relative, const std::string& bytes) {
  return [=](Workspace& w) { write_bytes(w.path(relative), bytes); };
}

std::vector<BadInput> rows() {
  return {
      // --- Command line ---------------------------------------------------------------------------
      BadInput("cli_unknown_option", kExitUsage, "UsageError", {"unknown option '--stepz' (see fluxmpi --help)"})
          .args({"--stepz", "3"}),
      BadInput("cli_steps_zero", kExitUsage, "UsageError", {"--steps must be positive, got 0"}).args({"--steps", "0"}),
      BadInput("cli_steps_not_integer", kExitUsage, "UsageError", {"--steps must be an integer, got '1e3'"}).args({"--steps", "1e3"}),
      BadInput("cli_integer_overflow", kExitUsage, "UsageError", {"--seed is out of range, got '99999999999999999999'"})
          .args({"--seed", "99999999999999999999"}),
      BadInput("cli_max_sequence_length_above_limit", kExitUsage, "UsageError", {"--max-sequence-length must be at most 512, got 513"})
          .args({"--max-sequence-length", "513"}),
      BadInput("cli_height_floors_to_zero", kExitUsage, "UsageError", {"--height 8 is smaller than 16"}).args({"--height", "8"}),
      BadInput("cli_guidance_negative", kExitUsage, "UsageError", {"--guidance must not be negative, got -1"}).args({"--guidance", "-1"}),
      BadInput("cli_dtype_unknown", kExitUsage, "UsageError", {"--dtype must be one of auto, fp32, bf16, fp16, got 'fp64'"})
          .args({"--dtype", "fp64"}),
      BadInput("cli_option_given_twice", kExitUsage, "UsageError", {"--steps is given more than once"})
          .args({"--steps", "2", "--steps", "3"}),
      BadInput("cli_stray_argument", kExitUsage, "UsageError", {"unexpected argument 'dog'"}).args({"dog"}),
      BadInput("cli_prompt_and_prompts_file", kExitUsage, "UsageError", {"--prompt and --prompts-file cannot be used together"})
          .setup(make_file("prompts.txt", "a dog\n"))
          .args({"--prompts-file", "{work}/prompts.txt"}),
      BadInput("cli_prompt_not_utf8", kExitUsage, "UsageError", {"--prompt is not valid UTF-8 (byte 3)"})
          .args({"--prompt", "a \xff cat"}),
      BadInput("cli_seeds_overflow", kExitUsage, "UsageError", {"--seed 9223372036854775807: the seeds of the 2 images"})
          .args({"--seed", "9223372036854775807", "--num-images", "2"}),
      // Without a bound a trillion steps passed validation, sized an 8 TB checkpoint and then
      // failed to allocate the schedule after the text encoders ran.
      BadInput("cli_steps_too_many", kExitUsage, "UsageError", {"--steps must be at most 10000, got 1000000000000"})
          .args({"--steps", "1000000000000", "--checkpoint", "{work}/out/run.h5"}),
      // Without a bound a million threads passed validation and the run never ended.
      BadInput("cli_threads_too_many", kExitUsage, "UsageError", {"--threads must be at most 1024, got 1000000"}).args({"--threads", "1000000"}),
      BadInput("cli_checkpoint_exists", kExitUsage, "UsageError",
               {"--checkpoint '{work}/out/run.h5' already exists; continue it with --resume or remove it"})
          .setup(make_file("out/run.h5", "an earlier run\n"))
          .args({"--checkpoint", "{work}/out/run.h5"}),
      BadInput("cli_checkpoint_and_resume_differ", kExitUsage, "UsageError",
               {"--checkpoint '{work}/out/new.h5' and --resume '{work}/old.h5' name different files"})
          .setup(make_file("old.h5", "an earlier run\n"))
          .args({"--checkpoint", "{work}/out/new.h5", "--resume", "{work}/old.h5"}),
      BadInput("cli_max_memory_too_small", kExitUsage, "UsageError", {"--max-memory: rank 0 denoise: ", " > 1.0 KiB; add ranks, raise the budget"})
          .args({"--max-memory", "0=1KiB"}),

      // --- INI files (--config) -------------------------------------------------------------------
      BadInput("ini_missing", kExitUsage, "UsageError", {"--config '{work}/run.ini': not found"}).args({"--config", "{work}/run.ini"}),
      BadInput("ini_unknown_key", kExitUsage, "UsageError", {"config file '{work}/run.ini': unknown key 'stepz'"})
          .setup(make_file("run.ini", "stepz = 3\n"))
          .args({"--config", "{work}/run.ini"}),
      BadInput("ini_ill_typed_value", kExitUsage, "UsageError",
               {"--guidance must be a number, got 'lots' (set in config file '{work}/run.ini')"})
          .setup(make_file("run.ini", "guidance = lots\n"))
          .args({"--config", "{work}/run.ini"}),
      BadInput("ini_out_of_range", kExitUsage, "UsageError", {"--width must be positive, got 0 (set in config file '{work}/run.ini')"})
          .setup(make_file("run.ini", "width = 0\n"))
          .args({"--config", "{work}/run.ini"})
          .without({"--width"}),
      BadInput("ini_section", kExitUsage, "UsageError",
               {"config file '{work}/run.ini': unknown key 'sampling.steps'", "without [sections]"})
          .setup(make_file("run.ini", "[sampling]\nsteps = 2\n"))
          .args({"--config", "{work}/run.ini"}),
      BadInput("ini_not_key_value", kExitUsage, "UsageError", {"config file '{work}/run.ini': invalid line"})
          .setup(make_file("run.ini", "steps 2\n"))
          .args({"--config", "{work}/run.ini"}),

      // --- Prompts files ----------------------------------------------------------------------------
      BadInput("prompts_file_missing", kExitUsage, "UsageError", {"prompts file '{work}/prompts.txt': not found"})
          .args({"--prompts-file", "{work}/prompts.txt"})
          .without({"--prompt"}),
      BadInput("prompts_file_empty", kExitUsage, "UsageError",
               {"prompts file '{work}/prompts.txt': no prompts (the file is empty or has only blank lines)"})
          .setup(make_file("prompts.txt", "\n   \r\n\t\n"))
          .args({"--prompts-file", "{work}/prompts.txt"})
          .without({"--prompt"}),
      BadInput("prompts_file_not_utf8", kExitUsage, "UsageError",
               {"prompts file '{work}/prompts.txt': line 2 is not valid UTF-8 (byte 7 of the line)"})
          .setup(make_file("prompts.txt", "a cat\r\nhello \xc3\x28 world\n"))
          .args({"--prompts-file", "{work}/prompts.txt"})
          .without({"--prompt"}),
      BadInput("prompts_file_is_directory", kExitUsage, "UsageError", {"prompts file '{work}/out': is a directory, not a file"})
          .args({"--prompts-file", "{work}/out"})
          .without({"--prompt"}),

      // --- Output and checkpoint paths --------------------------------------------------------------
      BadInput("output_directory_missing", kExitUsage, "UsageError",
               {"--output '{work}/missing/image.png': directory '{work}/missing' does not exist"})
          .args({"--output", "{work}/missing/image.png"}),
      // Root ignores permission bits, but not a path that runs through a regular file.
      BadInput("output_under_regular_file", kExitUsage, "UsageError",
               {"--output '{work}/somefile/out.png': directory '{work}/somefile' is not a directory"})
          .setup(make_file("somefile", "not a directory\n"))
          .args({"--output", "{work}/somefile/out.png"}),
      BadInput("output_not_writable", kExitUsage, "UsageError", {"--output '{work}/out/image.png': directory '{work}/out' is not writable"})
          .setup([](Workspace& w) { ::chmod(w.path("out").c_str(), 0555); })
          .not_as_root("permission bits do not stop root from writing into a read-only directory (output_under_regular_file covers the path check)"),
      BadInput("output_not_png", kExitUsage, "UsageError", {"--output must name a .png file (fluxmpi writes PNG images), got '{work}/out/image.jpg'"})
          .args({"--output", "{work}/out/image.jpg"}),
      BadInput("output_per_image_directory_missing", kExitUsage, "UsageError",
               {"--output '{work}/out/00001/image.png': directory '{work}/out/00001' does not exist"})
          .setup([](Workspace& w) { fs::create_directories(w.path("out/00000")); })
          .args({"--output", "{work}/out/{i}/image.png", "--num-images", "2"}),
      BadInput("checkpoint_directory_missing", kExitUsage, "UsageError",
               {"--checkpoint '{work}/missing/run.h5': directory '{work}/missing' does not exist"})
          .args({"--checkpoint", "{work}/missing/run.h5"}),
  };
}

class CommandLineAndFiles : public testing::TestWithParam<BadInput> {};

TEST_P(CommandLineAndFiles, FailsCleanly) { GetParam().check(); }

INSTANTIATE_TEST_SUITE_P(BadInputs, CommandLineAndFiles, testing::ValuesIn(rows()), row_name);

}  // namespace
}  // namespace fluxmpi::reliability
