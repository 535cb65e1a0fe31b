#include "app/job.h"

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

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

namespace {

// The non-blank lines of a prompts file with their 1-based numbers: UTF-8 checked, "\r\n" or "\n"
// line ends, a leading byte-order mark dropped.
std::vector<std::pair<int64_t, std::string>> prompt_lines(const std::string& path) {
  const std::string label = str_cat("prompts file '", path, "'");
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UsageError(str_cat(label, ": not found"));
  if (fs::is_directory(path, ec)) throw UsageError(str_cat(label, ": is a directory, not a file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(str_cat(label, ": cannot be read"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw UsageError(str_cat(label, ": cannot be read"));
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);

  std::vector<std::pair<int64_t, std::string>> lines;
  size_t start = 0;
  for (int64_t line_number = 1; start <= text.size(); ++line_number) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t bad = find_invalid_utf8(line);
    if (bad != std::string_view::npos)
      throw UsageError(str_cat(label, ": line ", line_number, " is not valid UTF-8 (byte ", bad + 1, " of the line)"));
    if (!is_blank(line)) lines.emplace_back(line_number, std::string(line));
    start = end + 1;
  }
  if (lines.empty()) throw UsageError(str_cat(label, ": no prompts (the file is empty or has only blank lines)"));
  return lines;
}

}  // namespace

std::vector<std::string> read_prompts_file(const std::string& path) {
  std::vector<std::string> prompts;
  for (auto& [number, line] : prompt_lines(path)) prompts.push_back(std::move(line));
  return prompts;
}

PromptsFile read_prompts_or_json_lines(const std::string& path) {
  PromptsFile out;
  const auto lines = prompt_lines(path);
  const std::string& first = lines.front().second;
  if (first[first.find_first_not_of(" \t\v\f\r")] != '{') {
    for (const auto& [number, line] : lines) out.prompts.push_back(line);
    return out;
  }
  const fs::path folder = fs::absolute(fs::path(path)).parent_path();
  for (const auto& [number, line] : lines) {
    const std::string where = str_cat("prompts file '", path, "': line ", number);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw UsageError(str_cat(where, ": not valid JSON (a JSON Lines file has one object per line): ", e.what()));
    }
    if (!j.is_object()) throw UsageError(str_cat(where, ": not a JSON object"));
    PromptInputs in;
    in.line = number;
    auto text = [&](const char* key) -> std::string {
      if (!j.contains(key)) return "";
      if (!j[key].is_string()) throw UsageError(str_cat(where, ": \"", key, "\" must be a string"));
      return j[key].get<std::string>();
    };
    auto resolve = [&](const char* key, const std::string& p) -> std::string {
      if (p.empty()) throw UsageError(str_cat(where, ": \"", key, "\" must not be empty"));
      return (folder / p).lexically_normal().string();  // relative to the file; an absolute path stays
    };
    auto file = [&](const char* key) -> std::string {
      std::string p = text(key);
      if (!j.contains(key)) return "";
      return resolve(key, p);
    };
    for (const auto& [key, value] : j.items())
      if (key != "prompt" && key != "image" && key != "mask" && key != "control_image" && key != "strength")
        throw UsageError(str_cat(where, ": unknown key \"", key, "\" (expected prompt, image, mask, control_image, strength)"));
    if (!j.contains("prompt")) throw UsageError(str_cat(where, ": no \"prompt\""));
    out.prompts.push_back(text("prompt"));
    // "image": a path, or a list of paths (a FLUX.2 model's reference images, in order).
    if (j.contains("image") && j["image"].is_array()) {
      for (const auto& e : j["image"]) {
        if (!e.is_string()) throw UsageError(str_cat(where, ": \"image\" must be a string or a list of strings"));
        in.images.push_back(resolve("image", e.get<std::string>()));
      }
      if (in.images.empty()) throw UsageError(str_cat(where, ": \"image\" must not be an empty list"));
    } else if (j.contains("image")) {
      if (!j["image"].is_string()) throw UsageError(str_cat(where, ": \"image\" must be a string or a list of strings"));
      in.images = {file("image")};
    }
    if (!in.images.empty()) in.image = in.images.front();
    in.mask = file("mask");
    in.control_image = file("control_image");
    if (j.contains("strength")) {
      if (!j["strength"].is_number()) throw UsageError(str_cat(where, ": \"strength\" must be a number"));
      in.strength = j["strength"].get<double>();
      if (!(*in.strength > 0.0 && *in.strength <= 1.0))
        throw UsageError(str_cat(where, ": \"strength\" must be in (0, 1], got ", *in.strength));
    }
    out.inputs.push_back(std::move(in));
  }
  return out;
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
  for (size_t p = 0; p < config.prompts.size(); ++p) {
    const std::string& prompt = config.prompts[p];
    const PromptInputs* entry = p < config.prompt_inputs.size() ? &config.prompt_inputs[p] : nullptr;
    for (int64_t k = 0; k < config.num_images; ++k) {
      ImageJob image;
      image.index = static_cast<int64_t>(job.size());
      image.prompt = prompt;
      image.prompt_2 = config.prompt_2.empty() ? prompt : config.prompt_2;
      image.negative_prompt = config.negative_prompt.value_or("");
      image.seed = seed + image.index;
      image.output_path = image_output_path(config.output, image.index, count);
      // A JSON Lines entry's inputs replace the command line's, one by one.
      image.image = entry && !entry->image.empty() ? entry->image : config.image;
      image.images = entry && !entry->images.empty() ? entry->images : config.images;
      image.mask = entry && !entry->mask.empty() ? entry->mask : config.mask;
      image.control_image = entry && !entry->control_image.empty() ? entry->control_image : config.control_image;
      if (entry) image.strength = entry->strength, image.line = entry->line;
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
