#pragma once
/// What a ControlNet image records of its ControlNets (docs/hdf5-format.md): one entry per run (a
/// ControlNet on one control image), stored as the image attribute `controlnets`, a JSON array of
/// {"controlnet", "control_image", "height", "width", "mode", "scale", "guidance_start",
/// "guidance_end", "pixels"}. Torch- and HDF5-free.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fluxmpi::ckpt {

struct ControlNetUse {
  std::string controlnet;     ///< the ControlNet folder (absolute)
  std::string control_image;  ///< the control image file (absolute)
  int64_t height = 0, width = 0;  ///< the control image's size as decoded
  int64_t mode = -1;          ///< Union models: the control mode; -1 otherwise
  double scale = 1.0;         ///< controlnet_conditioning_scale
  double guidance_start = 0.0, guidance_end = 1.0;
  bool pixels = false;        ///< XLabs layout: the net reads the pixels, no latents are stored

  bool operator==(const ControlNetUse& o) const;
};

std::string controlnets_to_json(const std::vector<ControlNetUse>& runs);
/// nullopt for text that is not such an array.
std::optional<std::vector<ControlNetUse>> controlnets_from_json(const std::string& text);

}  // namespace fluxmpi::ckpt
