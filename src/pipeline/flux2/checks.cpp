#include "pipeline/flux2/checks.h"

#include <algorithm>

#include "core/error.h"
#include "io/tensor_store.h"
#include "models/flux2/vae.h"
#include "text/flux2_prompts.h"
#include "parallel/partition.h"

namespace fluxmpi::pipeline {
namespace {

int64_t elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The key prefix of the language model's layers in a text_encoder folder: Qwen3's "model.",
// Mistral3's "language_model.model." (its legacy layout) or "model.language_model.".
std::string language_model_prefix(const io::TensorStore& store, const io::LlmShape& shape, const std::string& label) {
  for (const char* p : {"model.", "language_model.model.", "model.language_model."})
    if (store.contains(str_cat(p, "embed_tokens.weight"))) return p;
  throw WeightError(str_cat(label, ": no embed_tokens.weight under model., language_model.model. or model.language_model. (",
                            shape.architecture, " expected)"));
}

}  // namespace

Flux2Shapes read_flux2_shapes(const io::ModelDir& dir) {
  Flux2Shapes s;
  s.transformer = dir.flux2_transformer_config();
  const io::ConfigReader vae = dir.read_config("vae/config.json");
  const flux2::VaeConfig v = flux2::parse_flux2_vae_config(vae);  // refuses a FLUX.1 AutoencoderKL by its class
  s.vae = v.decoder;
  s.vae_quant_conv = v.use_quant_conv;
  if (4 * s.vae.latent_channels != s.transformer.in_channels)
    vae.fail("latent_channels", str_cat("x 4 must equal the transformer's in_channels (", s.transformer.in_channels,
                                        ": 2x2-patchified latents), got ", s.vae.latent_channels));
  const io::ConfigReader te = dir.read_config("text_encoder/config.json");
  s.text_encoder = io::parse_llm_shape(te);
  const bool mistral = s.text_encoder.architecture == "Mistral3ForConditionalGeneration";
  if (mistral != (dir.flux2_kind() == io::Flux2Kind::Dev))
    te.fail("architectures", str_cat("\"", s.text_encoder.architecture, "\" does not go with ", dir.pipeline_class(),
                                      dir.flux2_kind() == io::Flux2Kind::Dev ? " (FLUX.2 [dev] uses Mistral3ForConditionalGeneration)"
                                                                            : " (FLUX.2 [klein] uses Qwen3ForCausalLM)"));
  return s;
}

void check_text_encoder_layers(const std::vector<int64_t>& layers, const io::ModelDir& dir, const Flux2Shapes& s) {
  const int64_t depth = s.text_encoder.num_hidden_layers;
  if (layers.empty()) throw UsageError("--text-encoder-layers: give at least one layer");
  for (int64_t l : layers)
    if (l > depth)
      throw UsageError(str_cat("--text-encoder-layers: layer ", l, " is beyond the text encoder's ", depth, " layers (",
                               dir.label("text_encoder/config.json"), " num_hidden_layers; 0 = the embeddings, ", depth,
                               " = after the final norm)"));
  const int64_t width = static_cast<int64_t>(layers.size()) * s.text_encoder.hidden_size;
  if (width != s.transformer.joint_attention_dim)
    throw UsageError(str_cat("--text-encoder-layers: ", layers.size(), " layers of ", s.text_encoder.hidden_size,
                             " features make ", width, " but ", dir.label("transformer/config.json"),
                             " joint_attention_dim is ", s.transformer.joint_attention_dim));
}

void check_flux2_weights(const io::ModelDir& dir, const Flux2Shapes& s, const std::vector<int64_t>& layers, bool encodes,
                         bool dry_run) {
  {
    const io::TensorStore store = dir.open_weights("transformer");
    const std::string label = dir.label("transformer");
    if (store.contains("time_text_embed.timestep_embedder.linear_1.weight"))
      throw WeightError(str_cat(label, ": holds a FLUX.1 transformer (time_text_embed.*), not a Flux2Transformer2DModel"));
    for (const char* key : {"x_embedder.weight", "context_embedder.weight", "proj_out.weight"})
      if (!store.contains(key)) throw WeightError(str_cat(label, ": '", key, "' is missing"));
    int64_t stored = 0;
    for (const std::string& k : store.keys()) stored += elements(store.get(k).entry->shape);
    const int64_t expected = parallel::flux2_family_costs(s.transformer).params.total;
    if (stored != expected)
      throw WeightError(str_cat(label, ": the weights hold ", stored, " parameters, transformer/config.json describes ",
                                expected, " (another model's weights?)"));
  }
  flux2::check_vae(dir.component_dir("vae"));
  if (encodes) {
    // The tokenizer folder: read as the run will read it, and of the encoder's kind.
    const text::Flux2Tokenizer tokenizer(dir.component_dir("tokenizer"), dir.label("tokenizer"));
    const bool mistral = s.text_encoder.architecture == "Mistral3ForConditionalGeneration";
    if ((tokenizer.style() == text::Flux2TextStyle::Mistral) != mistral)
      throw ConfigError(str_cat(dir.label("tokenizer"), ": a ", text::to_string(tokenizer.style()), " tokenizer, but the text encoder is ",
                                s.text_encoder.architecture));
    const io::TensorStore store = dir.open_weights("text_encoder");
    const std::string label = dir.label("text_encoder");
    const std::string prefix = language_model_prefix(store, s.text_encoder, label);
    const int64_t last = *std::max_element(layers.begin(), layers.end());
    for (int64_t l = 0; l < (dry_run ? s.text_encoder.num_hidden_layers : last); ++l)
      for (const char* part : {"self_attn.q_proj.weight", "mlp.down_proj.weight"})
        if (!store.contains(str_cat(prefix, "layers.", l, ".", part)))
          throw WeightError(str_cat(label, ": '", prefix, "layers.", l, ".", part, "' is missing"));
  }
}

}  // namespace fluxmpi::pipeline
