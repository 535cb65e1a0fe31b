#include "support/hollow_model.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "core/error.h"
#include "io/model_dir.h"
#include "io/safetensors_writer.h"
#include "models/clip_text.h"
#include "models/flux/transformer.h"
#include "models/t5_encoder.h"
#include "models/vae/vae_decoder.h"
#include "support/fixtures.h"

namespace fluxmpi::test {
namespace {
namespace fs = std::filesystem;

using Tensors = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// Names and shapes of a module's parameters: the keys its loader looks up. The parameters are
// uninitialised, so even the 4.8 B-parameter T5 costs no memory here.
void add_parameters(const torch::nn::Module& module, Tensors& out) {
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    out.emplace_back(p.key(), std::vector<int64_t>(p.value().sizes().begin(), p.value().sizes().end()));
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void copy_asset(const fs::path& from, const fs::path& to) {
  if (!fs::is_regular_file(from)) throw IoError(str_cat("hollow model: asset '", from.string(), "' not found"));
  fs::create_directories(to.parent_path());
  fs::copy_file(from, to);
}

// Writes `tensors` (hollow, bf16) into `dir`: one file `single` when `shard_of` is empty, else
// the shards it names plus `<stem>.safetensors.index.json`.
HollowComponent write_component(const fs::path& dir, const Tensors& tensors, const std::string& single,
                                const std::map<std::string, std::string>& shard_of, const std::string& index_name) {
  fs::create_directories(dir);
  HollowComponent c;
  std::map<std::string, io::SafetensorsWriter> files;
  nlohmann::json map = nlohmann::json::object();
  int64_t bytes = 0;
  for (const auto& [name, shape] : tensors) {
    std::string file = single;
    if (!shard_of.empty()) {
      auto it = shard_of.find(name);
      if (it == shard_of.end()) throw InternalError(str_cat("hollow model: no shard for '", name, "' in ", dir.string()));
      file = it->second;
      map[name] = file;
    }
    files[file].add_hollow(name, io::DType::BF16, shape);
    c.tensors += 1;
    c.elements += numel(shape);
    bytes += numel(shape) * 2;
  }
  for (const auto& [file, writer] : files) writer.write((dir / file).string());
  if (!shard_of.empty()) {
    nlohmann::json index = {{"metadata", {{"total_size", bytes}}}, {"weight_map", map}};
    std::ofstream(dir / index_name) << index.dump(2) << "\n";
  }
  return c;
}

// Consecutive tensors into `shards` files of about equal bytes, named as transformers does.
std::map<std::string, std::string> even_shards(const Tensors& tensors, int shards, const std::string& stem) {
  int64_t total = 0;
  for (const auto& t : tensors) total += numel(t.second);
  std::map<std::string, std::string> out;
  int64_t seen = 0;
  for (const auto& [name, shape] : tensors) {
    const int k = std::min<int>(shards, static_cast<int>(seen * shards / std::max<int64_t>(total, 1)) + 1);
    char file[96];
    std::snprintf(file, sizeof file, "%s-%05d-of-%05d.safetensors", stem.c_str(), k, shards);
    out[name] = file;
    seen += numel(shape);
  }
  return out;
}

}  // namespace

HollowModel write_hollow_model(const std::string& variant, const std::string& dir) {
  const fs::path configs = fs::path(assets_root()) / "configs" / variant;
  const fs::path tokenizers = fs::path(assets_root()) / "tokenizers";
  const fs::path root(dir);
  if (fs::exists(root)) throw InternalError(str_cat("hollow model: '", dir, "' exists"));
  for (const char* f : {"model_index.json", "scheduler/scheduler_config.json", "transformer/config.json", "vae/config.json",
                        "text_encoder/config.json", "text_encoder_2/config.json", "tokenizer/tokenizer_config.json",
                        "tokenizer_2/tokenizer_config.json"})
    copy_asset(configs / f, root / f);
  for (const char* f : {"vocab.json", "merges.txt", "special_tokens_map.json"})
    copy_asset(tokenizers / "clip" / f, root / "tokenizer" / f);
  for (const char* f : {"spiece.model", "special_tokens_map.json"}) copy_asset(tokenizers / "t5" / f, root / "tokenizer_2" / f);

  io::ModelDir model(dir);
  HollowModel out;
  out.root = dir;

  // The transformer, one block at a time (a block part holds the embedders / final layer at the ends).
  const io::TransformerConfig& tc = model.transformer_config();
  Tensors transformer;
  const int64_t B = tc.num_blocks();
  for (int64_t b = 0; b < B; ++b) {
    flux::FluxTransformer part(tc, flux::TransformerPart{b, b + 1, b == 0, b == B - 1});
    add_parameters(*part, transformer);
  }
  // FLUX.1-dev's published shards; schnell (no published index) the same shards for its keys.
  std::map<std::string, std::string> transformer_shards;
  const fs::path published = fs::path(assets_root()) / "configs" / "FLUX.1-dev" / "transformer" /
                             "diffusion_pytorch_model.safetensors.index.json";
  nlohmann::json index = nlohmann::json::parse(std::ifstream(published));
  for (const auto& [name, file] : index.at("weight_map").items()) transformer_shards[name] = file.get<std::string>();
  out.written["transformer"] = write_component(root / "transformer", transformer, "", transformer_shards,
                                               "diffusion_pytorch_model.safetensors.index.json");

  Tensors clip;
  add_parameters(*text_models::ClipTextModel(model.clip_config()), clip);
  out.written["text_encoder"] = write_component(root / "text_encoder", clip, "model.safetensors", {}, "");

  Tensors t5;
  add_parameters(*text_models::T5EncoderModel(model.t5_config()), t5);
  out.written["text_encoder_2"] =
      write_component(root / "text_encoder_2", t5, "", even_shards(t5, 2, "model"), "model.safetensors.index.json");

  Tensors vae;
  add_parameters(*vae::VaeDecoder(model.vae_config()), vae);
  out.written["vae"] = write_component(root / "vae", vae, "diffusion_pytorch_model.safetensors", {}, "");
  return out;
}

}  // namespace fluxmpi::test
