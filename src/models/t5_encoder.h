#pragma once
/// The T5 v1.1 encoder of FLUX (`text_encoder_2/`), with the semantics of transformers
/// T5EncoderModel: shared token embedding, blocks of RMS-normed self-attention (no 1/sqrt(d)
/// scaling, no attention mask, a relative position bias owned by block 0 and reused by every
/// block) and a (gated) feed-forward, then a final RMS norm. Parameter names are the transformers
/// keys (`encoder.block.0.layer.0.SelfAttention.q.weight`).

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <vector>

#include "io/configs.h"
#include "io/model_dir.h"
#include "io/tensor_store.h"
#include "models/common/layers.h"
#include "models/common/loader.h"
#include "models/text_encoder_common.h"

namespace fluxmpi::text_models {

/// Bucket of each relative position (key - query) for bidirectional attention: half of the
/// buckets per sign, of which the first half are exact distances and the rest logarithmic bins up
/// to `max_distance` (saturating beyond). relative_position: int64 tensor -> int64 tensor.
at::Tensor t5_relative_position_bucket(const at::Tensor& relative_position, int64_t num_buckets,
                                       int64_t max_distance);

/// transformers' guard for fp16 hidden states: clamps to the largest fp16 value (1000 less when
/// something already overflowed to inf) so that later layers stay finite. Other dtypes pass through.
at::Tensor t5_clamp_fp16(const at::Tensor& x);

/// q, k, v, o projections without bias; block 0 also owns the relative position bias table.
class T5AttentionImpl : public torch::nn::Module {
 public:
  T5AttentionImpl(const io::T5Config& config, bool has_relative_attention_bias);
  /// x: [B, L, d_model], position_bias: [1, H, L, L] -> [B, L, d_model].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& position_bias) const;
  /// The bias table looked up for a [query_length, key_length] grid: [1, H, Lq, Lk] in the
  /// weights' dtype. Only for the module that has the table.
  at::Tensor compute_bias(int64_t query_length, int64_t key_length) const;

  nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
  nn::Embedding relative_attention_bias{nullptr};  ///< null except in block 0
  int64_t heads, d_kv, num_buckets, max_distance;
};
TORCH_MODULE(T5Attention);

/// x + SelfAttention(layer_norm(x)).
class T5LayerSelfAttentionImpl : public torch::nn::Module {
 public:
  T5LayerSelfAttentionImpl(const io::T5Config& config, bool has_relative_attention_bias);
  /// x: [B, L, d_model] -> [B, L, d_model].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& position_bias) const;

  T5Attention SelfAttention{nullptr};
  nn::RMSNorm layer_norm{nullptr};
};
TORCH_MODULE(T5LayerSelfAttention);

/// Gated: wo(act(wi_0 x) * wi_1 x); otherwise wo(act(wi x)). No biases.
class T5DenseImpl : public torch::nn::Module {
 public:
  explicit T5DenseImpl(const io::T5Config& config);
  /// x: [B, L, d_model] -> [B, L, d_model] (in wo's dtype).
  at::Tensor forward(const at::Tensor& x) const;

  nn::Linear wi{nullptr}, wi_0{nullptr}, wi_1{nullptr}, wo{nullptr};
  Activation act;
  bool gated;
};
TORCH_MODULE(T5Dense);

/// x + DenseReluDense(layer_norm(x)).
class T5LayerFFImpl : public torch::nn::Module {
 public:
  explicit T5LayerFFImpl(const io::T5Config& config);
  /// x: [B, L, d_model] -> [B, L, d_model].
  at::Tensor forward(const at::Tensor& x) const;

  T5Dense DenseReluDense{nullptr};
  nn::RMSNorm layer_norm{nullptr};
};
TORCH_MODULE(T5LayerFF);

/// `encoder.block.N`: layer.0 = self-attention, layer.1 = feed-forward.
class T5BlockImpl : public torch::nn::Module {
 public:
  T5BlockImpl(const io::T5Config& config, bool has_relative_attention_bias);
  /// x: [B, L, d_model], position_bias: [1, H, L, L] -> [B, L, d_model]. In fp16 the hidden
  /// states are clamped after each sub-layer as transformers does, so an overflow stays finite.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& position_bias) const;

  T5LayerSelfAttention self_attention{nullptr};  ///< registered as layer.0
  T5LayerFF feed_forward{nullptr};               ///< registered as layer.1

 private:
  torch::nn::ModuleList layer_list_{nullptr};
};
TORCH_MODULE(T5Block);

/// transformers T5Stack of the encoder (`encoder.`). Its `embed_tokens` is the model's `shared`
/// table and is therefore not a parameter of its own here.
class T5StackImpl : public torch::nn::Module {
 public:
  explicit T5StackImpl(const io::T5Config& config);

  /// Typed handles of the modules registered in the `block` list, in order.
  std::vector<T5Block> blocks;
  nn::RMSNorm final_layer_norm{nullptr};

 private:
  torch::nn::ModuleList block_list_{nullptr};
};
TORCH_MODULE(T5Stack);

struct T5EncoderOutput {
  at::Tensor last_hidden_state;  ///< [B, L, d_model], after the final RMS norm
  /// Only with `trace`: token embeddings [B, L, d_model], the position bias of block 0
  /// [1, H, L, L] and every block's output [B, L, d_model].
  at::Tensor embeddings;
  at::Tensor position_bias;
  std::vector<at::Tensor> block_outputs;
};

class T5EncoderModelImpl : public torch::nn::Module {
 public:
  explicit T5EncoderModelImpl(const io::T5Config& config);
  /// ids: [B, L] integer token ids (any L; pad tokens take part: there is no attention mask).
  /// Runs under c10::InferenceMode on the device of the weights; outputs in the run dtype.
  /// The outputs are inference tensors: copy (clone) before modifying one in place outside
  /// InferenceMode.
  T5EncoderOutput forward(const at::Tensor& ids, bool trace = false) const;

  const io::T5Config& config() const { return config_; }
  nn::Embedding shared{nullptr};
  T5Stack encoder{nullptr};

 private:
  io::T5Config config_;
};
TORCH_MODULE(T5EncoderModel);

/// Builds the model from `config` and loads it from `store`. `shared.weight` may be stored under
/// `encoder.embed_tokens.weight` (the tied copy) or both; `decoder.*` and `lm_head.*` are ignored
/// (a full T5 checkpoint); every other unclaimed key is a WeightError. In fp16 the `wo` weights
/// are kept in fp32, as transformers' T5 (`_keep_in_fp32_modules`) does, which keeps the residual
/// stream in fp32 after the first feed-forward. `adjust` changes weights while they load (LoRA merges).
T5EncoderModel load_t5_encoder(const io::T5Config& config, const io::TensorStore& store, at::ScalarType dtype,
                               at::Device device, const nn::WeightAdjust& adjust = {});
/// The same from `dir`/text_encoder_2 (config.json + weights).
T5EncoderModel load_t5_encoder(const io::ModelDir& dir, at::ScalarType dtype, at::Device device);
/// What load_t5_encoder checks, from the safetensors headers alone (reads no tensor data):
/// every parameter stored with its shape, no unclaimed key. WeightError otherwise.
void check_t5_encoder_weights(const io::T5Config& config, const io::TensorStore& store);

}  // namespace fluxmpi::text_models
