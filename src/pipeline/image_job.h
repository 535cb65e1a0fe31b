#pragma once
/// One image of a run's job (app/job.h builds them): its prompts, seed, output file and inputs.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fluxmpi::pipeline {

struct ImageJob {
  int64_t index = 0;            ///< 0-based position in the job
  std::string prompt;           ///< CLIP prompt
  std::string prompt_2;         ///< T5 prompt (= prompt when --prompt-2 is not given)
  std::string negative_prompt;  ///< used only when RunConfig::true_cfg_enabled()
  int64_t seed = 0;             ///< S + index
  std::string output_path;      ///< PNG file of this image
  /// Image inputs (absolute paths; empty: none): a JSON Lines entry's, else the command line's.
  std::string image, mask, control_image;
  /// Every --image (or the JSON Lines entry's list): a FLUX.2 model's reference images; `image` is
  /// the first.
  std::vector<std::string> images;
  std::optional<double> strength;  ///< a JSON Lines entry's --strength, when it gives one
  int64_t line = 0;                ///< the prompts file's line (JSON Lines), 0 otherwise
};

}  // namespace fluxmpi::pipeline
