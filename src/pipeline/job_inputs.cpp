#include "pipeline/job_inputs.h"

#include <ATen/ATen.h>

#include <cstring>
#include <map>

#include "core/error.h"

namespace fluxmpi::pipeline {

bool JobInputs::encodes() const {
  switch (mode) {
    case PipelineMode::Text2Img: return false;
    case PipelineMode::Kontext: return condition.height > 0;
    case PipelineMode::Multiref: return !references.empty();
    default: return true;
  }
}

io::Image8 decode_input(const std::string& path, const std::string& where) {
  try {
    return io::read_image(path);
  } catch (const UsageError& e) {
    throw UsageError(str_cat(where, " ", e.what()));
  } catch (const ImageError& e) {
    throw ImageError(str_cat(where, " ", e.what()));
  }
}

io::Image8 stored_mask(const io::Image8& mask) { return io::to_grey(mask); }

void check_unchanged_inputs(const ckpt::CheckpointReader& r, const JobInputs& in) {
  std::map<std::string, io::Image8> decoded;
  auto pixels = [&](const std::string& path, bool grey) -> const io::Image8& {
    const std::string key = (grey ? "L:" : "RGB:") + path;
    auto it = decoded.find(key);
    if (it == decoded.end()) {
      io::Image8 image = decode_input(path, "input");
      it = decoded.emplace(key, grey ? stored_mask(image) : std::move(image)).first;
    }
    return it->second;
  };
  for (int64_t i = 0; i < r.num_images() && i < static_cast<int64_t>(in.images.size()); ++i) {
    const ckpt::ImageShape& shape = r.shape(i);
    const ImageSources& s = in.images[static_cast<size_t>(i)];
    const struct {
      const char* what;
      const char* dataset;
      const std::string& path;
      bool stored, grey;
    } inputs[] = {{"image", "inputs/image", s.image.path, shape.image_h > 0, false},
                  {"mask", "inputs/mask", s.mask.path, shape.mask_h > 0, true},
                  {"control image", "inputs/control_image", s.control.path, shape.control_h > 0, false}};
    auto compare = [&](const std::string& what, const std::string& dataset, const std::string& path, bool grey) {
      const io::Image8& now = pixels(path, grey);
      at::Tensor t = r.dataset(i, dataset).contiguous();
      const bool same = static_cast<size_t>(t.numel()) == now.pixels.size() &&
                        std::memcmp(t.data_ptr<uint8_t>(), now.pixels.data(), now.pixels.size()) == 0;
      if (!same)
        throw CheckpointError(str_cat(r.path(), ": input ", what, " '", path,
                                      "' has changed since the checkpoint was written (its pixels differ from ",
                                      ckpt::image_object(i, dataset), "); resume with the file it was made from"));
    };
    for (const auto& input : inputs) {
      // An input given to one side only is a difference check_matches names.
      if (!input.stored || input.path.empty()) continue;
      compare(input.what, input.dataset, input.path, input.grey);
    }
    // ControlNets: every run's control image (the same for every image of the job).
    for (size_t k = 0; k < shape.controlnet_inputs.size() && k < in.controlnet_images.size(); ++k)
      compare("control image", str_cat("inputs/controlnet_image_", k), in.controlnet_images[k].path, false);
    // FLUX.2 multi-reference: every reference image.
    for (size_t k = 0; k < shape.reference_inputs.size() && k < s.references.size(); ++k)
      compare(str_cat("reference image ", k), str_cat("inputs/image_", k), s.references[k].input.path, false);
  }
}

}  // namespace fluxmpi::pipeline
