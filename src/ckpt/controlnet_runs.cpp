#include "ckpt/controlnet_runs.h"

#include <nlohmann/json.hpp>

namespace fluxmpi::ckpt {

bool ControlNetUse::operator==(const ControlNetUse& o) const {
  return controlnet == o.controlnet && control_image == o.control_image && height == o.height && width == o.width &&
         mode == o.mode && scale == o.scale && guidance_start == o.guidance_start && guidance_end == o.guidance_end &&
         pixels == o.pixels;
}

std::string controlnets_to_json(const std::vector<ControlNetUse>& runs) {
  nlohmann::json j = nlohmann::json::array();
  for (const ControlNetUse& r : runs)
    j.push_back({{"controlnet", r.controlnet}, {"control_image", r.control_image}, {"height", r.height},
                 {"width", r.width}, {"mode", r.mode}, {"scale", r.scale}, {"guidance_start", r.guidance_start},
                 {"guidance_end", r.guidance_end}, {"pixels", r.pixels}});
  return j.dump();
}

std::optional<std::vector<ControlNetUse>> controlnets_from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return std::nullopt;
  std::vector<ControlNetUse> out;
  for (const auto& item : j) {
    if (!item.is_object()) return std::nullopt;
    auto string = [&](const char* k) { return item.contains(k) && item[k].is_string(); };
    auto integer = [&](const char* k) { return item.contains(k) && item[k].is_number_integer(); };
    auto number = [&](const char* k) { return item.contains(k) && item[k].is_number(); };
    if (!string("controlnet") || !string("control_image") || !integer("height") || !integer("width") ||
        !integer("mode") || !number("scale") || !number("guidance_start") || !number("guidance_end") ||
        !item.contains("pixels") || !item["pixels"].is_boolean())
      return std::nullopt;
    ControlNetUse r;
    r.controlnet = item["controlnet"].get<std::string>();
    r.control_image = item["control_image"].get<std::string>();
    r.height = item["height"].get<int64_t>();
    r.width = item["width"].get<int64_t>();
    r.mode = item["mode"].get<int64_t>();
    r.scale = item["scale"].get<double>();
    r.guidance_start = item["guidance_start"].get<double>();
    r.guidance_end = item["guidance_end"].get<double>();
    r.pixels = item["pixels"].get<bool>();
    if (r.height < 0 || r.width < 0) return std::nullopt;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace fluxmpi::ckpt
