#include "pipeline/run_plan.h"

#include <iterator>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fluxmpi::pipeline {

std::string to_json(const RunPlan& p) {
  nlohmann::json j;
  j["model"] = p.model;
  const io::ModelSources& m = p.sources;
  j["sources"] = {m.model, m.transformer, m.vae, m.text_encoder, m.text_encoder_2, m.model_config, m.shipped_models};
  j["dtype"] = p.dtype;
  j["device"] = p.device;
  j["threads"] = p.threads;
  j["log_level"] = p.log_level;
  j["steps"] = p.steps;
  j["text_tokens"] = p.text_tokens;
  j["latent"] = {p.latent_height, p.latent_width};
  j["references"] = nlohmann::json::array();
  for (const LatentSize& r : p.references) j["references"].push_back({r.height, r.width});
  j["passes"] = p.passes;
  j["family"] = p.family;
  j["guidance"] = p.guidance ? nlohmann::json(*p.guidance) : nlohmann::json();
  j["text_encoder_layers"] = p.text_encoder_layers;
  nlohmann::json slices = nlohmann::json::array();
  for (const auto& r : p.text_slices) slices.push_back({r.first, r.last});
  j["text_slices"] = slices;
  j["patches"] = {p.patches, p.warmup_steps};
  j["groups"] = nlohmann::json::array();
  for (const auto& g : p.groups) j["groups"].push_back({g.first_image, g.count, g.start_step});
  j["ranges"] = nlohmann::json::array();
  for (const auto& r : p.ranges) j["ranges"].push_back({r.first, r.last});
  j["stages"] = {p.stages, p.world_size};
  const flux::LatentGeometry& g = p.geometry;
  j["geometry"] = {g.height, g.width, g.latent_height, g.latent_width, g.channels};
  j["decode"] = {p.vae_tiling, p.vae_slicing, p.microbatch};
  j["checkpoint"] = {p.checkpoint, p.checkpoint_every};
  j["decode_ranks"] = p.decode_ranks;
  j["loras"] = nlohmann::json::parse(io::loras_to_json(p.loras));
  j["controlnets"] = p.controlnets;
  j["control_runs"] = nlohmann::json::array();
  for (const ControlRun& r : p.control_runs)
    j["control_runs"].push_back({r.net, r.mode, r.scale, r.guidance_start, r.guidance_end});
  j["control_layout"] = {p.control_layout.double_samples, p.control_layout.single_samples, p.control_layout.repeat};
  j["controlnet_guidance"] = p.controlnet_guidance;
  return j.dump();
}

RunPlan run_plan_from_json(const std::string& text) {
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    RunPlan p;
    p.model = j.at("model").get<std::string>();
    const nlohmann::json& m = j.at("sources");
    std::string* fields[] = {&p.sources.model,          &p.sources.transformer,  &p.sources.vae,
                             &p.sources.text_encoder,   &p.sources.text_encoder_2, &p.sources.model_config,
                             &p.sources.shipped_models};
    for (size_t i = 0; i < std::size(fields); ++i) *fields[i] = m.at(i).get<std::string>();
    p.dtype = j.at("dtype").get<std::string>();
    p.device = j.at("device").get<std::string>();
    p.threads = j.at("threads").get<int64_t>();
    p.log_level = j.at("log_level").get<int>();
    p.steps = j.at("steps").get<int64_t>();
    p.text_tokens = j.at("text_tokens").get<int64_t>();
    p.latent_height = j.at("latent").at(0).get<int64_t>();
    p.latent_width = j.at("latent").at(1).get<int64_t>();
    for (const auto& r : j.at("references")) p.references.push_back({r.at(0).get<int64_t>(), r.at(1).get<int64_t>()});
    p.passes = j.at("passes").get<int>();
    p.family = j.at("family").get<std::string>();
    if (!j.at("guidance").is_null()) p.guidance = j.at("guidance").get<double>();
    p.text_encoder_layers = j.at("text_encoder_layers").get<std::vector<int64_t>>();
    for (const auto& r : j.at("text_slices")) p.text_slices.push_back({r.at(0).get<int64_t>(), r.at(1).get<int64_t>()});
    p.patches = j.at("patches").at(0).get<int64_t>();
    p.warmup_steps = j.at("patches").at(1).get<int64_t>();
    for (const auto& g : j.at("groups"))
      p.groups.push_back({g.at(0).get<int64_t>(), g.at(1).get<int64_t>(), g.at(2).get<int64_t>()});
    for (const auto& r : j.at("ranges")) p.ranges.push_back({r.at(0).get<int64_t>(), r.at(1).get<int64_t>()});
    p.stages = j.at("stages").at(0).get<int>();
    p.world_size = j.at("stages").at(1).get<int>();
    const nlohmann::json& g = j.at("geometry");
    p.geometry = {g.at(0).get<int64_t>(), g.at(1).get<int64_t>(), g.at(2).get<int64_t>(), g.at(3).get<int64_t>(),
                  g.at(4).get<int64_t>()};
    p.vae_tiling = j.at("decode").at(0).get<bool>();
    p.vae_slicing = j.at("decode").at(1).get<bool>();
    p.microbatch = j.at("decode").at(2).get<int64_t>();
    p.checkpoint = j.at("checkpoint").at(0).get<bool>();
    p.checkpoint_every = j.at("checkpoint").at(1).get<int64_t>();
    p.decode_ranks = j.at("decode_ranks").get<std::vector<int>>();
    auto loras = io::loras_from_json(j.at("loras").dump());
    if (!loras) throw CommError("malformed run plan from rank 0: 'loras'");
    p.loras = std::move(*loras);
    p.controlnets = j.at("controlnets").get<std::vector<std::string>>();
    for (const auto& r : j.at("control_runs"))
      p.control_runs.push_back(ControlRun{r.at(0).get<size_t>(), r.at(1).get<int64_t>(), r.at(2).get<double>(),
                                          r.at(3).get<double>(), r.at(4).get<double>()});
    const nlohmann::json& l = j.at("control_layout");
    p.control_layout = io::ResidualLayout{l.at(0).get<int64_t>(), l.at(1).get<int64_t>(), l.at(2).get<bool>()};
    p.controlnet_guidance = j.at("controlnet_guidance").get<double>();
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw CommError(str_cat("malformed run plan from rank 0: ", e.what()));
  }
}

}  // namespace fluxmpi::pipeline
