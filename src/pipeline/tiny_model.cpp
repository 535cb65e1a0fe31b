#include "pipeline/tiny_model.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "io/configs.h"
#include "models/clip_text.h"
#include "models/common/init.h"
#include "models/flux/transformer.h"
#include "models/t5_encoder.h"
#include "io/safetensors_writer.h"
#include "models/vae/vae_decoder.h"
#include "models/vae/vae_encoder.h"
#include "text/clip_bpe_trainer.h"
#include "text/t5_unigram_trainer.h"

namespace fluxmpi::pipeline {
namespace fs = std::filesystem;

std::string default_corpus_path() {
  if (const char* env = std::getenv("FLUXMPI_CORPUS"); env && *env) return env;
  return FLUXMPI_CORPUS_PATH;
}

TinyModelSpec tiny_model_preset(const std::string& name) {
  TinyModelSpec s;
  if (name == "tiny") return s;
  if (name == "bench") {
    // ~150M transformer parameters in 4 + 8 blocks of width 768: the transformer dominates a
    // step, and the model still fits in a few seconds of loading.
    s.heads = 6;
    s.head_dim = 128;
    s.double_blocks = 4;
    s.single_blocks = 8;
    s.shards = 4;
    s.text_dim = 64;
    return s;
  }
  throw UsageError(str_cat("--preset must be tiny or bench, got '", name, "'"));
}

std::vector<int64_t> rope_axes_for(int64_t head_dim) {
  if (head_dim % 2 != 0 || head_dim < 6) throw UsageError(str_cat("--head-dim must be even and >= 6, got ", head_dim));
  // FLUX.1 gives the first (index) axis 1/8 of the head, the two spatial axes the rest.
  int64_t first = std::max<int64_t>(2, head_dim / 8 / 2 * 2);
  int64_t rest = head_dim - first;
  int64_t second = rest / 2 / 2 * 2;
  return {first, second, rest - second};
}

namespace {

io::DType disk_dtype(const std::string& name) {
  if (name == "fp32") return io::DType::F32;
  if (name == "bf16") return io::DType::BF16;
  throw UsageError(str_cat("--dtype must be fp32 or bf16, got '", name, "'"));
}

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path);
  out << text;
  if (!out) throw IoError(str_cat("cannot write '", path.string(), "'"));
}

}  // namespace

void write_tiny_model(const std::string& out_dir, const TinyModelSpec& s) {
  const fs::path root(out_dir);
  std::error_code ec;
  if (fs::exists(root, ec) && !(fs::is_directory(root, ec) && fs::is_empty(root, ec)))
    throw UsageError(str_cat("--out '", out_dir, "' exists and is not an empty directory"));
  if (s.variant != "dev" && s.variant != "schnell")
    throw UsageError(str_cat("--variant must be dev or schnell, got '", s.variant, "'"));
  const io::DType dtype = disk_dtype(s.dtype);
  const std::string corpus = s.corpus.empty() ? default_corpus_path() : s.corpus;
  fs::create_directories(root);

  write_text(root / "model_index.json", R"({
  "_class_name": "FluxPipeline",
  "_diffusers_version": "0.40.0",
  "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
  "text_encoder": ["transformers", "CLIPTextModel"],
  "text_encoder_2": ["transformers", "T5EncoderModel"],
  "tokenizer": ["transformers", "CLIPTokenizer"],
  "tokenizer_2": ["transformers", "T5TokenizerFast"],
  "transformer": ["diffusers", "FluxTransformer2DModel"],
  "vae": ["diffusers", "AutoencoderKL"]
}
)");

  // Tokenizers first: the encoders' vocabulary sizes follow from them.
  std::ifstream corpus_in(corpus);
  if (!corpus_in) throw UsageError(str_cat("corpus '", corpus, "' cannot be read"));
  std::string corpus_text((std::istreambuf_iterator<char>(corpus_in)), std::istreambuf_iterator<char>());
  text::BpeMerges merges = text::train_clip_bpe(corpus_text, s.clip_vocab);
  text::write_clip_tokenizer(merges, (root / "tokenizer").string());
  const int64_t clip_vocab = static_cast<int64_t>(text::clip_vocab_from_merges(merges).size());
  text::train_t5_unigram(corpus, s.t5_vocab, (root / "tokenizer_2").string());

  io::TransformerConfig tc;
  tc.num_attention_heads = s.heads;
  tc.attention_head_dim = s.head_dim;
  tc.num_layers = s.double_blocks;
  tc.num_single_layers = s.single_blocks;
  tc.joint_attention_dim = s.text_dim;
  tc.pooled_projection_dim = s.text_dim;
  tc.guidance_embeds = s.variant == "dev";
  tc.axes_dims_rope = rope_axes_for(s.head_dim);
  {
    flux::FluxTransformer t(tc, flux::TransformerPart::whole(tc));
    nn::fill_random(*t, s.seed + 1);
    nn::save_component((root / "transformer").string(), io::to_json(tc), *t, "diffusion_pytorch_model", dtype, s.shards);
  }

  io::SchedulerConfig sc;  // FLUX.1-dev: dynamic shifting; schnell: static shift 1.0
  sc.use_dynamic_shifting = s.variant == "dev";
  sc.shift = s.variant == "dev" ? 3.0 : 1.0;
  write_text(root / "scheduler" / "scheduler_config.json", io::to_json(sc));

  io::ClipTextConfig cc;
  cc.vocab_size = clip_vocab;
  cc.hidden_size = s.text_dim;
  cc.intermediate_size = 2 * s.text_dim;
  cc.num_hidden_layers = s.text_layers;
  cc.num_attention_heads = s.text_heads;
  cc.eos_token_id = clip_vocab - 1;  // <|endoftext|> is the last entry of the vocabulary
  {
    text_models::ClipTextModel clip(cc);
    nn::fill_random(*clip, s.seed + 2);
    nn::save_component((root / "text_encoder").string(), io::to_json(cc), *clip, "model", dtype);
  }

  io::T5Config t5c;
  t5c.vocab_size = s.t5_vocab;
  t5c.d_model = s.text_dim;
  t5c.d_kv = s.text_dim / s.text_heads;
  t5c.d_ff = 2 * s.text_dim;
  t5c.num_layers = s.text_layers;
  t5c.num_heads = s.text_heads;
  t5c.gated = true;
  t5c.act = "gelu_new";
  {
    text_models::T5EncoderModel t5(t5c);
    nn::fill_random(*t5, s.seed + 3);
    nn::save_component((root / "text_encoder_2").string(), io::to_json(t5c), *t5, "model", dtype);
  }

  io::VaeConfig vc;
  vc.block_out_channels = s.vae_channels;
  vc.latent_channels = tc.latent_channels();
  vc.norm_num_groups = s.vae_groups;
  vc.sample_size = s.vae_sample_size;
  vc.scaling_factor = 0.3611;
  vc.shift_factor = 0.1159;
  vc.use_post_quant_conv = false;
  {
    // Both halves of AutoencoderKL in one file, as diffusers saves it: the image-input modes encode.
    vae::VaeDecoder decoder(vc);
    nn::fill_random(*decoder, s.seed + 4);
    vae::VaeEncoderConfig ec;
    ec.vae = vc;
    ec.use_quant_conv = false;
    vae::VaeEncoder encoder(ec);
    nn::fill_random(*encoder, s.seed + 5);
    nn::save_component((root / "vae").string(), io::to_json(vc), *decoder, "diffusion_pytorch_model", dtype);
    io::SafetensorsWriter w;
    nn::add_parameters(w, *decoder, "", dtype);
    nn::add_parameters(w, *encoder, "", dtype);
    w.write((root / "vae" / "diffusion_pytorch_model.safetensors").string());
  }
  log::info("wrote a ", s.variant, " pipeline to ", out_dir, ": transformer ", tc.num_layers, " + ", tc.num_single_layers,
            " blocks of width ", tc.inner_dim(), ", text width ", s.text_dim, ", vocabularies ", clip_vocab, " / ", s.t5_vocab);
}

}  // namespace fluxmpi::pipeline
