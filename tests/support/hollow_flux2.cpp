#include "support/hollow_flux2.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/configs.h"
#include "io/flux2_configs.h"
#include "io/json_config.h"
#include "io/safetensors_writer.h"
#include "models/flux2/config.h"
#include "models/flux2/transformer.h"
#include "models/flux2/vae.h"
#include "models/llm/decoder.h"
#include "models/llm/decoder_config.h"
#include "support/fixtures.h"

namespace fluxmpi::test {
namespace {
namespace fs = std::filesystem;

using Tensors = std::vector<std::pair<std::string, std::vector<int64_t>>>;

void add_parameters(const torch::nn::Module& module, const std::string& prefix, Tensors& out) {
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    out.emplace_back(prefix + p.key(), std::vector<int64_t>(p.value().sizes().begin(), p.value().sizes().end()));
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// `tensors` in `shards` files of about equal bytes plus the index (bf16 holes).
HollowComponent write_sharded(const fs::path& dir, const Tensors& tensors, int shards, const std::string& stem) {
  fs::create_directories(dir);
  int64_t total = 0;
  for (const auto& t : tensors) total += numel(t.second);
  std::map<std::string, io::SafetensorsWriter> files;
  nlohmann::json map = nlohmann::json::object();
  HollowComponent c;
  int64_t seen = 0;
  for (const auto& [name, shape] : tensors) {
    const int k = std::min<int>(shards, static_cast<int>(seen * shards / std::max<int64_t>(total, 1)) + 1);
    char file[96];
    std::snprintf(file, sizeof file, "%s-%05d-of-%05d.safetensors", stem.c_str(), k, shards);
    files[file].add_hollow(name, io::DType::BF16, shape);
    map[name] = file;
    seen += numel(shape);
    c.tensors += 1;
    c.elements += numel(shape);
  }
  for (const auto& [file, writer] : files) writer.write((dir / file).string());
  const nlohmann::json index = {{"metadata", {{"total_size", 2 * total}}}, {"weight_map", map}};
  std::ofstream(dir / (stem + ".safetensors.index.json")) << index.dump(2) << "\n";
  return c;
}

}  // namespace

HollowModel write_hollow_flux2_model(const std::string& model, const std::string& dir) {
  const fs::path shipped = fs::path(FLUXMPI_SOURCE_DIR) / "share/fluxmpi/models" / model;
  const fs::path root(dir);
  if (fs::exists(root)) throw InternalError(str_cat("hollow model: '", dir, "' exists"));
  if (!fs::is_directory(shipped)) throw IoError(str_cat("hollow model: no shipped configs '", shipped.string(), "'"));
  fs::create_directories(root);
  fs::copy(shipped, root, fs::copy_options::recursive);
  const io::Flux2Kind kind = io::parse_flux2_kind(io::ConfigReader::from_file((root / "model_index.json").string(), "model_index.json"));
  const std::string tokenizer_from = kind == io::Flux2Kind::Dev ? "tiny-flux2-dev" : "tiny-flux2-klein";
  fs::copy(fs::path(fixture_root()) / "flux2" / tokenizer_from / "tokenizer", root / "tokenizer", fs::copy_options::recursive);

  HollowModel out;
  out.root = dir;
  // The transformer, one block at a time (the first part holds the embedders and the modulation,
  // the last the final layer): its parameters are never initialised, so 32 B cost no memory.
  const flux2::TransformerConfig tc = flux2::read_transformer_config((root / "transformer").string());
  Tensors transformer;
  const int64_t B = tc.num_blocks();
  for (int64_t b = 0; b < B; ++b)
    add_parameters(*flux2::Flux2Transformer(tc, flux2::TransformerPart{b, b + 1, b == 0, b == B - 1}), "", transformer);
  out.written["transformer"] = write_sharded(root / "transformer", transformer, kind == io::Flux2Kind::Dev ? 7 : 2,
                                             "diffusion_pytorch_model");

  // The whole language model (every layer and the final norm), its lm_head and, for Mistral3, the
  // vision tower and projector the real checkpoint carries.
  const llm::DecoderConfig dc = llm::read_decoder_config((root / "text_encoder").string());
  llm::DecoderPart all;
  all.first_layer = 0;
  all.end_layer = dc.num_hidden_layers;
  all.final_norm = true;
  Tensors te;
  const bool mistral = kind == io::Flux2Kind::Dev;
  add_parameters(*llm::TextDecoder(dc, all), mistral ? "language_model.model." : "model.", te);
  te.emplace_back(mistral ? "language_model.lm_head.weight" : "lm_head.weight", std::vector<int64_t>{dc.vocab_size, dc.hidden_size});
  if (mistral) {
    te.emplace_back("vision_tower.patch_conv.weight", std::vector<int64_t>{1024, 3, 14, 14});
    te.emplace_back("vision_tower.transformer.layers.0.attention.q_proj.weight", std::vector<int64_t>{1024, 1024});
    te.emplace_back("multi_modal_projector.linear_1.weight", std::vector<int64_t>{5120, 4096});
  }
  out.written["text_encoder"] = write_sharded(root / "text_encoder", te, mistral ? 10 : 2, "model");

  // The VAE's decode path and its BatchNorm statistics.
  const io::ConfigReader vr = io::ConfigReader::from_file((root / "vae/config.json").string(), "vae/config.json");
  const flux2::Vae vae(flux2::parse_flux2_vae_config(vr));
  Tensors v;
  add_parameters(*const_cast<flux2::Vae&>(vae).bn(), "bn.", v);
  add_parameters(*const_cast<flux2::Vae&>(vae).decoder(), "", v);
  fs::create_directories(root / "vae");
  io::SafetensorsWriter vw;
  HollowComponent vc;
  for (const auto& [name, shape] : v) {
    vw.add_hollow(name, io::DType::BF16, shape);
    vc.tensors += 1;
    vc.elements += numel(shape);
  }
  vw.write((root / "vae/diffusion_pytorch_model.safetensors").string());
  out.written["vae"] = vc;
  return out;
}

}  // namespace fluxmpi::test
