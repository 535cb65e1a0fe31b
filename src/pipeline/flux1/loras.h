#pragma once
/// The run's LoRAs (--lora FILE[:SCALE], repeatable): opened and checked against the model on rank
/// 0 before any heavy work, listed by --dry-run, and opened again by every rank to merge the
/// updates of the modules it owns.

#include <memory>
#include <string>
#include <vector>

#include "io/lora_file.h"
#include "io/model_dir.h"
#include "models/common/lora.h"
#include "parallel/partition.h"

namespace fluxmpi::pipeline {

using LoraFiles = std::vector<std::shared_ptr<const io::LoraFile>>;

/// Opens (maps, parses the header of) every LoRA, in order. WeightError for a file of neither layout.
LoraFiles open_lora_files(const std::vector<io::LoraSpec>& loras);

/// The LoRAs resolved against each model of the pipeline.
struct LoraCheck {
  LoraFiles files;
  nn::LoraSet transformer, clip, t5;
  bool with_text = false;  ///< the text encoders' pairs were checked (they run in this job)
};

/// Opens the LoRAs and checks every pair against the module it changes, from headers alone (alpha
/// scalars are read): WeightError naming the file and the key. `with_text`: the text encoders run
/// in this job (their pairs are checked against their weights' headers); otherwise their pairs are
/// left unused, with a note.
LoraCheck check_loras(const std::vector<io::LoraSpec>& loras, const io::ModelDir& dir, bool with_text);

/// --dry-run: per LoRA its layout, scale, pairs, and the weights it changes on each rank.
std::string lora_table(const LoraCheck& check, const parallel::StagePlan& stages);

}  // namespace fluxmpi::pipeline
