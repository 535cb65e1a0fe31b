#include "pipeline/family.h"

#include <map>

#include "core/error.h"
#include "pipeline/prepared_run.h"

namespace fluxmpi::pipeline {

// The registration: one line per family (docs/architecture.md, "Model families and modes").
const Family& flux1_family();  // pipeline/flux1/family.cpp
const Family& flux2_family();  // pipeline/flux2/family.cpp

namespace {

const std::vector<const Family*>& families() {
  static const std::vector<const Family*> all = {&flux1_family(), &flux2_family()};
  return all;
}

}  // namespace

const Family& family_of(const io::ModelDir& dir) {
  for (const Family* f : families())
    if (f->holds(dir)) return *f;
  throw ConfigError(str_cat(dir.label("model_index.json"), ": a model of no family fluxmpi runs"));
}

const Family& family_named(const std::string& name) {
  for (const Family* f : families())
    if (name == f->name()) return *f;
  throw CommError(str_cat("malformed run plan from rank 0: unknown model family '", name, "'"));
}

std::unique_ptr<SplitTextStage> Family::split_text_stage(const io::ModelDir&, const RunPlan&, int, at::ScalarType,
                                                         at::Device) const {
  throw InternalError(str_cat("the ", name(), " family does not split its text encoder over ranks"));
}

ControlRouting Family::control_routing(const io::ModelDir&, const RunPlan&) const { return {}; }

std::unique_ptr<ResidualSource> Family::residual_source(const RunPlan&, at::ScalarType, at::Device) const { return nullptr; }

std::vector<EncodedImage> FamilyRoot::encode_images(const PreparedRun& run, at::ScalarType, at::Device) {
  return std::vector<EncodedImage>(run.images.size());
}

std::string FamilyRoot::inputs_text(const PreparedRun&) const { return ""; }

void FamilyRoot::write_conditioning(ckpt::CheckpointWriter&, int64_t, const PreparedRun&, const EncodedImage&) const {}

Conditioning FamilyRoot::stored_conditioning(const ckpt::CheckpointReader&, int64_t, const PreparedRun&, at::ScalarType) const {
  return {};
}

size_t encode_job_prompts(const PreparedRun& run, int passes, const std::function<PromptKey(const ImageJob&, int)>& key,
                          const std::function<PromptEmbedding(const PromptKey&, size_t, int)>& encode,
                          PromptEmbeddings& out) {
  std::map<PromptKey, PromptEmbedding> cache;
  out.text.resize(run.images.size());
  out.negative.resize(run.images.size());
  for (size_t i = 0; i < run.images.size(); ++i) {
    if (run.progress[i].decoded || !run.progress[i].needs_encoding) continue;
    for (int pass = 0; pass < passes; ++pass) {
      const PromptKey k = key(run.images[i], pass);
      auto it = cache.find(k);
      if (it == cache.end()) it = cache.emplace(k, encode(k, i, pass)).first;
      (pass == 0 ? out.text : out.negative)[i] = it->second;
    }
  }
  return cache.size();
}

}  // namespace fluxmpi::pipeline
