#pragma once
/// Random-weight FLUX pipelines in the exact diffusers layout, made from a seed and a few size
/// options: the demo's model and the test suite's own (so tests do not depend on ../shared
/// alone), and the benchmark model. Tokenizers are trained on a corpus shipped with fluxmpi
/// (tools/make_tiny_model/corpus.txt): no download.

#include <cstdint>
#include <string>
#include <vector>

namespace fluxmpi::pipeline {

struct TinyModelSpec {
  std::string variant = "dev";  ///< "dev" (guidance embedding, dynamic shift) | "schnell"
  uint64_t seed = 0;
  std::string dtype = "fp32";   ///< weights on disk: "fp32" | "bf16"
  // Transformer.
  int64_t heads = 2;
  int64_t head_dim = 16;
  int64_t double_blocks = 2;
  int64_t single_blocks = 3;
  int64_t shards = 3;           ///< transformer weight files (with an index when > 1)
  // Text encoders: T5 d_model = joint_attention_dim, CLIP hidden = pooled_projection_dim.
  int64_t text_dim = 32;
  int64_t text_layers = 2;
  int64_t text_heads = 4;
  int64_t clip_vocab = 1024;    ///< BPE vocabulary learnt from the corpus
  int64_t t5_vocab = 1000;      ///< sentencepiece pieces learnt from the corpus
  // VAE decoder.
  std::vector<int64_t> vae_channels = {16, 16, 32, 32};
  int64_t vae_groups = 8;
  int64_t vae_sample_size = 32;  ///< config sample_size: the tile of tiled decoding, in pixels
  std::string corpus;           ///< training text; empty: the corpus shipped with fluxmpi
};

/// The presets of make-tiny-model: "tiny" (the demo; fixture-sized) and "bench" (a transformer
/// wide and deep enough to dominate the run time). UsageError for other names.
TinyModelSpec tiny_model_preset(const std::string& name);

/// RoPE axis sizes for a head dimension (FLUX.1: 128 -> 16, 56, 56): even, summing to head_dim.
std::vector<int64_t> rope_axes_for(int64_t head_dim);

/// Writes the pipeline folder `out_dir` (created; refuses a non-empty existing folder):
/// model_index.json, transformer/ (sharded + index), scheduler/, text_encoder/, tokenizer/,
/// text_encoder_2/, tokenizer_2/, vae/.
void write_tiny_model(const std::string& out_dir, const TinyModelSpec& spec);

/// The corpus shipped with fluxmpi (compile-time path; $FLUXMPI_CORPUS overrides).
std::string default_corpus_path();

}  // namespace fluxmpi::pipeline
