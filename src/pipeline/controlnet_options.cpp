#include "pipeline/controlnet_options.h"

#include <filesystem>

#include "core/error.h"

namespace fluxmpi::pipeline {
namespace {

// One value for every control image, or one per image; `fallback` when none is given.
template <typename T>
std::vector<T> per_image(const std::vector<T>& given, size_t images, T fallback, const char* flag) {
  if (given.empty()) return std::vector<T>(images, fallback);
  if (given.size() == 1) return std::vector<T>(images, given[0]);
  if (given.size() != images)
    throw UsageError(str_cat(flag, " is given ", given.size(), " times for ", images,
                             " control images: give it once (for every image) or once per --control-image"));
  return given;
}

}  // namespace

ControlNetSetup resolve_controlnets(const ControlNetOptions& o, const io::TransformerConfig& transformer,
                                    int64_t vae_scale_factor) {
  ControlNetSetup s;
  if (o.nets.empty()) {
    const char* flag = !o.modes.empty()    ? "--control-mode"
                       : !o.scales.empty() ? "--controlnet-scale"
                       : !o.starts.empty() ? "--control-guidance-start"
                                           : "--control-guidance-end";
    if (o.any_control_flag()) throw UsageError(str_cat(flag, " needs --controlnet DIR (a FLUX ControlNet folder)"));
    return s;
  }
  if (o.images.empty())
    throw UsageError(str_cat("--controlnet needs --control-image FILE (one per ControlNet, or one per condition of a "
                             "single Union ControlNet)"));
  if (o.nets.size() > 1 && o.images.size() != o.nets.size())
    throw UsageError(str_cat(o.nets.size(), " ControlNets (--controlnet) take one --control-image each, got ", o.images.size()));
  s.nets = o.nets;
  s.images = o.images;
  for (const std::string& dir : o.nets) {
    const std::string path = (std::filesystem::path(dir) / "config.json").string();
    s.configs.push_back(io::parse_controlnet_config(io::ConfigReader::from_file(path, str_cat("--controlnet '", dir, "': config.json"))));
    io::check_controlnet_fits(s.configs.back(), transformer, vae_scale_factor, str_cat("--controlnet '", dir, "'"));
  }
  for (size_t k = 1; k < s.configs.size(); ++k) {
    if (s.configs[k].takes_pixels() != s.configs[0].takes_pixels())
      throw ConfigError(str_cat("--controlnet '", o.nets[k], "' reads its control image as ",
                                s.configs[k].takes_pixels() ? "pixels (XLabs layout)" : "VAE latents",
                                ", --controlnet '", o.nets[0], "' as ",
                                s.configs[0].takes_pixels() ? "pixels (XLabs layout)" : "VAE latents",
                                ": ControlNets of different layouts cannot run together"));
    if (s.configs[k].guidance_embeds != s.configs[0].guidance_embeds)
      throw ConfigError(str_cat("--controlnet '", o.nets[k], "': 'guidance_embeds' is ", s.configs[k].guidance_embeds ? "true" : "false",
                                ", but ", s.configs[0].guidance_embeds ? "true" : "false", " for --controlnet '", o.nets[0],
                                "': every ControlNet of a job gets the guidance the first one asks for"));
  }
  s.pixels = s.configs[0].takes_pixels();
  const size_t n = o.images.size();
  const std::vector<int64_t> modes = per_image<int64_t>(o.modes, n, -1, "--control-mode");
  const std::vector<double> scales = per_image(o.scales, n, 1.0, "--controlnet-scale");
  const std::vector<double> starts = per_image(o.starts, n, 0.0, "--control-guidance-start");
  const std::vector<double> ends = per_image(o.ends, n, 1.0, "--control-guidance-end");
  std::vector<const io::ControlNetConfig*> run_configs;
  for (size_t k = 0; k < n; ++k) {
    ControlRun run;
    run.net = o.nets.size() == 1 ? 0 : k;
    const io::ControlNetConfig& c = s.configs[run.net];
    const std::string& dir = o.nets[run.net];
    if (c.is_union()) {
      if (modes[k] < 0)
        throw UsageError(str_cat("--control-mode is needed for control image '", o.images[k], "': --controlnet '", dir,
                                 "' is a Union ControlNet (num_mode ", *c.num_mode, ": modes 0 to ", *c.num_mode - 1, ")"));
      if (modes[k] >= *c.num_mode)
        throw UsageError(str_cat("--control-mode ", modes[k], " is out of range for the Union ControlNet '", dir,
                                 "' (num_mode ", *c.num_mode, ": modes 0 to ", *c.num_mode - 1, ")"));
    } else if (modes[k] >= 0) {
      throw UsageError(str_cat("--control-mode ", modes[k], " for control image '", o.images[k], "': --controlnet '", dir,
                               "' has no control modes (not a Union model); give -1 for it"));
    }
    if (!(starts[k] >= 0 && starts[k] < ends[k] && ends[k] <= 1))
      throw UsageError(str_cat("--control-guidance-start ", starts[k], " and --control-guidance-end ", ends[k],
                               " for control image '", o.images[k], "': need 0 <= start < end <= 1"));
    run.mode = modes[k];
    run.scale = scales[k];
    run.guidance_start = starts[k];
    run.guidance_end = ends[k];
    s.runs.push_back(run);
    run_configs.push_back(&c);
  }
  s.layout = io::merged_layout(run_configs);
  return s;
}

}  // namespace fluxmpi::pipeline
