// The `redux` attribute of an image group (ckpt/format.h, docs/hdf5-format.md) as JSON.

#include <nlohmann/json.hpp>

#include "ckpt/format.h"

namespace fluxmpi::ckpt {

std::string redux_to_json(const ImageAttributes::Redux& r) {
  nlohmann::json images = nlohmann::json::array();
  for (const auto& in : r.images) images.push_back({{"path", in.path}, {"height", in.height}, {"width", in.width}});
  const nlohmann::json j = {{"model", r.model},
                            {"images", images},
                            {"prompt_embeds_scale", r.prompt_scales},
                            {"pooled_prompt_embeds_scale", r.pooled_scales},
                            {"image_tokens", r.image_tokens},
                            {"text", r.zero_text ? "zeros" : "prompt"}};
  return j.dump();
}

std::optional<ImageAttributes::Redux> redux_from_json(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    ImageAttributes::Redux r;
    r.model = j.at("model").get<std::string>();
    for (const auto& in : j.at("images"))
      r.images.push_back({in.at("path").get<std::string>(), in.at("height").get<int64_t>(), in.at("width").get<int64_t>()});
    r.prompt_scales = j.at("prompt_embeds_scale").get<std::vector<double>>();
    r.pooled_scales = j.at("pooled_prompt_embeds_scale").get<std::vector<double>>();
    r.image_tokens = j.at("image_tokens").get<int64_t>();
    const std::string t = j.at("text").get<std::string>();
    if (t != "zeros" && t != "prompt") return std::nullopt;
    r.zero_text = t == "zeros";
    return r;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

}  // namespace fluxmpi::ckpt
