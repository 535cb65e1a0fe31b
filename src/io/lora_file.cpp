#include "io/lora_file.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fluxmpi::io {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

enum class Role { Down, Up, Alpha };

struct KeyParts {
  std::string stem;
  Role role;
  std::optional<LoraLayout> layout;  // nullopt: ".alpha", decided by the stem
};

std::optional<KeyParts> split_key(const std::string& key) {
  static const struct {
    const char* suffix;
    Role role;
    std::optional<LoraLayout> layout;
  } kSuffixes[] = {
      {".lora_A.weight", Role::Down, LoraLayout::Diffusers}, {".lora_B.weight", Role::Up, LoraLayout::Diffusers},
      {".lora_down.weight", Role::Down, LoraLayout::Kohya},  {".lora_up.weight", Role::Up, LoraLayout::Kohya},
      {".alpha", Role::Alpha, std::nullopt},
  };
  for (const auto& s : kSuffixes) {
    const std::string suffix = s.suffix;
    if (ends_with(key, suffix) && key.size() > suffix.size())
      return KeyParts{key.substr(0, key.size() - suffix.size()), s.role, s.layout};
  }
  return std::nullopt;
}

struct Prefix {
  const char* text;
  LoraLayout layout;
  LoraTarget target;
};
// Longest first where one prefix starts another ("text_encoder_2." before "text_encoder.").
const Prefix kPrefixes[] = {
    {"transformer.", LoraLayout::Diffusers, LoraTarget::Transformer},
    {"text_encoder_2.", LoraLayout::Diffusers, LoraTarget::T5},
    {"text_encoder.", LoraLayout::Diffusers, LoraTarget::Clip},
    {"lora_unet_", LoraLayout::Kohya, LoraTarget::Transformer},
    {"lora_te1_", LoraLayout::Kohya, LoraTarget::Clip},
    {"lora_te_", LoraLayout::Kohya, LoraTarget::Clip},
    {"lora_te2_", LoraLayout::Kohya, LoraTarget::T5},
};

const Prefix* find_prefix(const std::string& stem, std::optional<LoraLayout> layout) {
  for (const Prefix& p : kPrefixes)
    if ((!layout || p.layout == *layout) && starts_with(stem, p.text) && stem.size() > std::strlen(p.text)) return &p;
  return nullptr;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const int exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    float v = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -v : v;
  }
  uint32_t bits = exponent == 31 ? (sign | 0x7f800000u | (mantissa << 13))
                                 : (sign | (static_cast<uint32_t>(exponent - 15 + 127) << 23) | (mantissa << 13));
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

const char* kLayoutsHelp =
    "a diffusers/PEFT LoRA key is transformer.|text_encoder.|text_encoder_2.<module>.lora_A.weight, .lora_B.weight or "
    ".alpha; a kohya one is lora_unet_|lora_te1_|lora_te2_<module>.lora_down.weight, .lora_up.weight or .alpha";

}  // namespace

LoraSpec parse_lora_spec(const std::string& text) {
  LoraSpec spec{text, 1.0};
  const size_t colon = text.rfind(':');
  if (colon != std::string::npos) {
    const std::string tail = text.substr(colon + 1);
    double scale = 0;
    auto [end, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), scale);
    if (!tail.empty() && ec == std::errc() && end == tail.data() + tail.size()) {
      if (!std::isfinite(scale)) throw UsageError(str_cat("'", text, "': the scale must be a finite number"));
      spec = {text.substr(0, colon), scale};
    }
  }
  if (spec.path.empty()) throw UsageError(str_cat("'", text, "': no file (expected FILE or FILE:SCALE)"));
  return spec;
}

std::string lora_spec_text(const LoraSpec& spec) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, spec.scale);
  return str_cat(spec.path, ":", std::string(buf, ec == std::errc() ? end : buf));
}

std::string loras_to_json(const std::vector<LoraSpec>& loras) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& l : loras) j.push_back({{"file", l.path}, {"scale", l.scale}});
  return j.dump();
}

std::optional<std::vector<LoraSpec>> loras_from_json(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return std::nullopt;
  std::vector<LoraSpec> out;
  for (const auto& item : j) {
    if (!item.is_object() || !item.contains("file") || !item["file"].is_string() || !item.contains("scale") ||
        !item["scale"].is_number())
      return std::nullopt;
    out.push_back({item["file"].get<std::string>(), item["scale"].get<double>()});
  }
  return out;
}

const char* lora_layout_name(LoraLayout layout) { return layout == LoraLayout::Kohya ? "kohya" : "diffusers"; }

const char* lora_target_name(LoraTarget target) {
  switch (target) {
    case LoraTarget::Transformer: return "transformer";
    case LoraTarget::Clip: return "text encoder (CLIP)";
    case LoraTarget::T5: return "text encoder 2 (T5)";
  }
  return "?";
}

LoraFile::LoraFile(const LoraSpec& spec) : spec_(spec), file_(std::make_shared<SafetensorsFile>(spec.path)) {
  std::optional<LoraLayout> layout;
  std::string first_key;
  std::map<std::string, LoraPair> by_stem;
  for (const TensorEntry& e : file_->header().tensors) {
    std::optional<KeyParts> parts = split_key(e.name);
    if (!parts) throw WeightError(str_cat(where(e.name), " is not a LoRA key of either layout (", kLayoutsHelp, ")"));
    const Prefix* prefix = find_prefix(parts->stem, parts->layout);
    if (prefix == nullptr)
      throw WeightError(str_cat(where(e.name), " names no model: ", kLayoutsHelp));
    if (layout && *layout != prefix->layout)
      throw WeightError(str_cat(where(e.name), " is a ", lora_layout_name(prefix->layout), " key, but '", first_key,
                                "' is a ", lora_layout_name(*layout), " one: a file holds one layout"));
    if (!layout) layout = prefix->layout, first_key = e.name;
    if (e.dtype != DType::F32 && e.dtype != DType::F16 && e.dtype != DType::BF16)
      throw WeightError(str_cat(where(e.name), " has dtype ", dtype_name(e.dtype), "; LoRA tensors must be F32, F16 or BF16"));
    LoraPair& pair = by_stem[parts->stem];
    pair.stem = parts->stem;
    pair.target = prefix->target;
    pair.module = parts->stem.substr(std::strlen(prefix->text));
    switch (parts->role) {
      case Role::Down:
        if (e.shape.size() != 2) throw WeightError(str_cat(where(e.name), " must be 2-D [rank, in], got ", e.shape.size(), " dimensions"));
        pair.down = &e;
        break;
      case Role::Up:
        if (e.shape.size() != 2) throw WeightError(str_cat(where(e.name), " must be 2-D [out, rank], got ", e.shape.size(), " dimensions"));
        pair.up = &e;
        break;
      case Role::Alpha:
        if (e.num_elements() != 1) throw WeightError(str_cat(where(e.name), " must be a scalar, got ", e.num_elements(), " values"));
        pair.alpha = &e;
        break;
    }
  }
  for (auto& [stem, pair] : by_stem) {
    const bool kohya = *layout == LoraLayout::Kohya;
    const std::string down_name = stem + (kohya ? ".lora_down.weight" : ".lora_A.weight");
    const std::string up_name = stem + (kohya ? ".lora_up.weight" : ".lora_B.weight");
    if (pair.down == nullptr) throw WeightError(str_cat(where(pair.up ? pair.up->name : pair.alpha->name), " has no '", down_name, "'"));
    if (pair.up == nullptr) throw WeightError(str_cat(where(pair.down->name), " has no '", up_name, "'"));
    if (pair.rank() <= 0 || pair.up->shape[1] != pair.rank())
      throw WeightError(str_cat(where(up_name), " has shape [", pair.up->shape[0], ", ", pair.up->shape[1], "] but '",
                                down_name, "' has rank ", pair.rank(), " (expected [out, ", pair.rank(), "])"));
    pairs_.push_back(pair);
  }
  if (pairs_.empty()) throw WeightError(str_cat("LoRA '", spec_.path, "': holds no LoRA tensors (", kLayoutsHelp, ")"));
  layout_ = *layout;
}

double LoraFile::alpha(const LoraPair& pair) const {
  if (pair.alpha == nullptr) return static_cast<double>(pair.rank());
  const uint8_t* p = file_->data(*pair.alpha);
  double v = 0;
  switch (pair.alpha->dtype) {
    case DType::F32: {
      float f;
      std::memcpy(&f, p, sizeof f);
      v = f;
      break;
    }
    case DType::F16: {
      uint16_t h;
      std::memcpy(&h, p, sizeof h);
      v = half_to_float(h);
      break;
    }
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, p, sizeof h);
      uint32_t bits = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      v = f;
      break;
    }
    default: throw InternalError(str_cat(where(pair.alpha->name), ": alpha dtype not checked"));
  }
  if (!std::isfinite(v)) throw WeightError(str_cat(where(pair.alpha->name), " is ", v, "; alpha must be finite"));
  return v;
}

std::string LoraFile::where(const std::string& key) const { return str_cat("LoRA '", spec_.path, "': '", key, "'"); }

}  // namespace fluxmpi::io
