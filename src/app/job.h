#pragma once
/// The job of one run (DESIGN.md §7): every prompt x --num-images, in prompt-major order; image i
/// (0-based over the whole job) is drawn with seed S + i and written to the output pattern with
/// {i} = i zero-padded to 5 digits, the name of its HDF5 group.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeline/image_job.h"
#include "pipeline/run_config.h"

namespace fluxmpi::app {

/// Image indices are zero-padded to 5 digits in file and HDF5 group names; a job stays within them.
inline constexpr int64_t kMaxImages = 100000;

using pipeline::ImageJob;
using pipeline::PromptInputs;
using pipeline::RunConfig;

/// One ImageJob per image. Needs a resolved seed and at least one prompt (InternalError
/// otherwise: parse_options and the resume path guarantee both). Throws UsageError when the
/// job has more than kMaxImages images, when S + i leaves the int64 range, or when an output
/// directory that depends on {i} is missing or not writable.
std::vector<ImageJob> build_job(const RunConfig& config);

/// The output file of image `index` of a job of `count` images: {i} -> index zero-padded to 5
/// digits; without {i}, a job of several images gets "-{i}" inserted before the extension
/// ("out/cat.png" -> "out/cat-00002.png"). An empty pattern means "fluxmpi.png".
std::string image_output_path(const std::string& pattern, int64_t index, int64_t count);

/// Draws a seed from std::random_device (a 32-bit value, easy to type back) when none was given.
/// Returns true when it drew one: the caller prints it, and it is stored with the images.
bool resolve_seed(RunConfig& config);

/// The prompts of a prompts file: UTF-8, one prompt per line, "\n" or "\r\n" line ends, blank
/// (empty or whitespace-only) lines skipped, a leading UTF-8 byte-order mark ignored. Throws
/// UsageError "prompts file '<path>': ..." for a missing file, a directory, an unreadable file,
/// invalid UTF-8 (naming line and byte) or a file without any prompt.
std::vector<std::string> read_prompts_file(const std::string& path);

/// A prompts file that may be JSON Lines: when its first non-blank line starts with '{', every
/// non-blank line is a JSON object {"prompt": TEXT, "image": FILE, "mask": FILE, "control_image":
/// FILE, "strength": S} ("prompt" required, the rest optional; paths relative to the file's folder,
/// made absolute; no other keys). Otherwise plain lines, as read_prompts_file. Throws UsageError
/// "prompts file '<path>': line N: ..." naming the line.
struct PromptsFile {
  std::vector<std::string> prompts;
  std::vector<PromptInputs> inputs;  ///< JSON Lines only: one per prompt
};
PromptsFile read_prompts_or_json_lines(const std::string& path);

/// Byte offset of the first invalid UTF-8 sequence in `text` (overlong forms, surrogates and
/// code points above U+10FFFF are invalid), or std::string_view::npos when it is valid.
std::size_t find_invalid_utf8(std::string_view text);

}  // namespace fluxmpi::app
