#include "pipeline/flux1/loras.h"

#include <sstream>

#include "core/log.h"
#include "models/flux/lora_targets.h"

namespace fluxmpi::pipeline {

LoraFiles open_lora_files(const std::vector<io::LoraSpec>& loras) {
  LoraFiles files;
  for (const auto& spec : loras) files.push_back(std::make_shared<const io::LoraFile>(spec));
  return files;
}

LoraCheck check_loras(const std::vector<io::LoraSpec>& loras, const io::ModelDir& dir, bool with_text) {
  LoraCheck c;
  if (loras.empty()) return c;
  c.files = open_lora_files(loras);
  c.with_text = with_text;
  c.transformer = flux::flux_lora_set(c.files, dir.transformer_config());
  c.transformer.check_alphas();
  bool text_pairs = false;
  for (const auto& f : c.files)
    for (const auto& p : f->pairs()) text_pairs = text_pairs || p.target != io::LoraTarget::Transformer;
  if (!text_pairs) return c;
  if (!with_text) {
    log::info("the text-encoder parts of the LoRAs are not used: every prompt's embeddings come from the checkpoint");
    return c;
  }
  auto resolve = [&](io::LoraTarget target, const char* component) {
    const nn::WeightShapes shapes = nn::linear_weight_shapes(dir.open_weights(component));
    nn::LoraSet set(c.files, target, shapes, nn::underscored_names(shapes));
    set.check_alphas();
    return set;
  };
  c.clip = resolve(io::LoraTarget::Clip, "text_encoder");
  c.t5 = resolve(io::LoraTarget::T5, "text_encoder_2");
  return c;
}

std::string lora_table(const LoraCheck& check, const parallel::StagePlan& stages) {
  if (check.files.empty()) return {};
  std::ostringstream os;
  os << "\nLoRAs (merged in this order; weights changed per rank):\n";
  const int P = stages.world_size();
  std::vector<std::vector<int64_t>> per_rank;
  for (int r = 0; r < P; ++r)
    per_rank.push_back(check.transformer.count([&](const std::string& m) { return stages.owns_key(r, m + ".weight"); }));
  const std::vector<int64_t> clip = check.clip.count({}), t5 = check.t5.count({});
  for (size_t f = 0; f < check.files.size(); ++f) {
    const io::LoraFile& file = *check.files[f];
    os << "  " << f << ": " << io::lora_spec_text(file.spec()) << " (" << io::lora_layout_name(file.layout()) << ", "
       << file.pairs().size() << " pairs)\n";
    for (int r = 0; r < P; ++r) {
      os << "     rank " << r << ": " << per_rank[r][f] << " transformer weights";
      if (r == 0 && !check.clip.empty()) os << ", " << clip[f] << " CLIP weights";
      if (r == 0 && !check.t5.empty()) os << ", " << t5[f] << " T5 weights";
      os << "\n";
    }
  }
  return os.str();
}

}  // namespace fluxmpi::pipeline
