#include "app/job.h"

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <sstream>

#include "app/paths.h"
#include "core/error.h"

namespace fluxmpi::app {
namespace fs = std::filesystem;

namespace {

const std::string kIndexField = "{i}";

std::string padded_index(int64_t index) {
  std::ostringstream os;
  os << std::setw(5) << std::setfill('0') << index;
  return os.str();
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\v\f\r") == std::string_view::npos;
}

}  // namespace

std::size_t find_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) { ++i; continue; }
    size_t len = 0;
    uint32_t cp = 0, min_cp = 0;
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min_cp = 0x80; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min_cp = 0x800; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min_cp = 0x10000; }
    else return i;  // a continuation byte without a lead byte, or 0xF8..0xFF
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::vector<std::string> read_prompts_file(const std::string& path) {
  const std::string label = str_cat("prompts file '", path, "'");
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UsageError(str_cat(label, ": not found"));
  if (fs::is_directory(path, ec)) throw UsageError(str_cat(label, ": is a directory, not a file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(str_cat(label, ": cannot be read"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw UsageError(str_cat(label, ": cannot be read"));
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);

  std::vector<std::string> prompts;
  size_t start = 0;
  for (int64_t line_number = 1; start <= text.size(); ++line_number) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t bad = find_invalid_utf8(line);
    if (bad != std::string_view::npos)
      throw UsageError(str_cat(label, ": line ", line_number, " is not valid UTF-8 (byte ", bad + 1, " of the line)"));
    if (!is_blank(line)) prompts.emplace_back(line);
    start = end + 1;
  }
  if (prompts.empty()) throw UsageError(str_cat(label, ": no prompts (the file is empty or has only blank lines)"));
  return prompts;
}

std::string image_output_path(const std::string& pattern, int64_t index, int64_t count) {
  std::string path = pattern.empty() ? std::string("fluxmpi.png") : pattern;
  if (path.find(kIndexField) == std::string::npos) {
    if (count <= 1) return path;
    fs::path p(path);
    path = (p.parent_path() / (p.stem().string() + "-" + kIndexField + p.extension().string())).string();
  }
  return replace_all(path, kIndexField, padded_index(index));
}

bool resolve_seed(RunConfig& config) {
  if (config.seed) return false;
  std::random_device device;
  config.seed = static_cast<int64_t>(device());
  return true;
}

std::vector<ImageJob> build_job(const RunConfig& config) {
  FLUX_CHECK(config.seed.has_value(), "resolve_seed() must run before build_job()");
  FLUX_CHECK(!config.prompts.empty(), "a job needs prompts (from the options or the resumed checkpoint)");
  FLUX_CHECK(config.num_images >= 1, "num_images ", config.num_images);
  const int64_t prompts = static_cast<int64_t>(config.prompts.size());
  if (config.num_images > kMaxImages / prompts)
    throw UsageError(str_cat("the job has ", prompts, " prompts x --num-images ", config.num_images,
                             " images; at most ", kMaxImages, " images fit the 5-digit image index"));
  const int64_t count = prompts * config.num_images;
  const int64_t seed = *config.seed;
  if (seed > std::numeric_limits<int64_t>::max() - (count - 1))
    throw UsageError(str_cat("--seed ", seed, ": the seeds of the ", count, " images (", seed, " + i) exceed the int64 range"));

  std::vector<ImageJob> job;
  job.reserve(static_cast<size_t>(count));
  for (const std::string& prompt : config.prompts) {
    for (int64_t k = 0; k < config.num_images; ++k) {
      ImageJob image;
      image.index = static_cast<int64_t>(job.size());
      image.prompt = prompt;
      image.prompt_2 = config.prompt_2.empty() ? prompt : config.prompt_2;
      image.negative_prompt = config.negative_prompt.value_or("");
      image.seed = seed + image.index;
      image.output_path = image_output_path(config.output, image.index, count);
      job.push_back(std::move(image));
    }
  }

  // parse_options checked the output directory unless it depends on the image index.
  if (parent_directory(config.output).find(kIndexField) != std::string::npos) {
    std::set<std::string> checked;
    for (const ImageJob& image : job)
      if (checked.insert(parent_directory(image.output_path)).second)
        require_writable_parent(image.output_path, "--output");
  }
  return job;
}

}  // namespace fluxmpi::app
