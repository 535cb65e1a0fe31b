#pragma once
/// The decoder of FLUX.2's text encoders (transformers Qwen3Model / MistralModel, the text tower
/// of Mistral3), built for a contiguous range of its layers: the whole encoder in one process,
/// only the layers up to the last hidden state the pipeline uses, or the slice of one MPI rank.
/// Layers keep their global transformers names (`layers.27.self_attn.q_proj.weight`) whatever
/// range is built; the loader adds the checkpoint's prefix (text_encoder.h).
///
/// Hidden states are numbered as transformers' `output_hidden_states`: hidden_states[0] = token
/// embeddings, hidden_states[k] = output of layer k-1, hidden_states[num_layers] = after the final
/// RMSNorm (the only normed one).
///
/// Splitting over ranks: a part holding layers [first, end) produces hidden_states[k] for
/// first < k <= end (and hidden_states[0] when first == 0); its run_layers() takes
/// hidden_states[first] un-normed and returns hidden_states[end] un-normed, the input of the next
/// part. A caller assembles the requested states by taking each requested k from the part that
/// produced it (exactly one part does) and stacking them in the requested order with
/// stack_hidden_states(). Chaining parts [0, k) and [k, n) gives bit-identical results to one
/// part [0, n): every part computes the same operations on the same inputs.

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <vector>

#include "models/common/layers.h"
#include "models/llm/decoder_config.h"

namespace fluxmpi::llm {

/// hidden state index -> [B, S, H] tensor.
using HiddenStates = std::map<int64_t, at::Tensor>;

/// The layers a process holds.
struct DecoderPart {
  int64_t first_layer = 0;   ///< global index of the first layer held
  int64_t end_layer = 0;     ///< one past the last layer held
  bool final_norm = false;   ///< `norm` (only with end_layer == num_layers)

  bool embeddings() const { return first_layer == 0; }  ///< `embed_tokens` comes with layer 0
  /// What one process needs to produce `out_layers`: layers [0, max k) and the final norm iff
  /// num_layers is requested. ConfigError when a requested k is outside 0..num_layers.
  static DecoderPart for_out_layers(const DecoderConfig& config, const std::vector<int64_t>& out_layers);
  /// The slice [first, end) of `needed` (a part from for_out_layers): embeddings iff first == 0,
  /// the final norm iff `needed` has it and end is its end.
  DecoderPart slice(int64_t first, int64_t end) const;
};

/// Attention inputs shared by every layer of one call: RoPE tables and the mask.
struct AttentionContext {
  at::Tensor cos, sin;   ///< [1, 1, S, head_dim] in the run dtype
  at::Tensor bias;       ///< [B, 1, S, S] 0 / -inf; undefined: no padding, plain causal attention
  at::Tensor empty_rows; ///< [B, 1, S, 1] bool: queries that see no key (their output is zero)
};

/// q/k/v/o projections without bias; Qwen3 also q_norm/k_norm over head_dim.
class DecoderAttentionImpl : public torch::nn::Module {
 public:
  explicit DecoderAttentionImpl(const DecoderConfig& config);
  /// x: [B, S, H] -> [B, S, H].
  at::Tensor forward(const at::Tensor& x, const AttentionContext& ctx) const;

  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  nn::RMSNorm q_norm{nullptr}, k_norm{nullptr};  ///< null for Mistral
  int64_t heads, kv_heads, head_dim;
};
TORCH_MODULE(DecoderAttention);

/// down_proj(silu(gate_proj(x)) * up_proj(x)), no biases.
class DecoderMlpImpl : public torch::nn::Module {
 public:
  explicit DecoderMlpImpl(const DecoderConfig& config);
  /// x: [B, S, H] -> [B, S, H].
  at::Tensor forward(const at::Tensor& x) const;

  nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(DecoderMlp);

/// Pre-norm layer: x + attn(input_layernorm(x)), then h + mlp(post_attention_layernorm(h)).
class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const DecoderConfig& config);
  /// x: [B, S, H] -> [B, S, H].
  at::Tensor forward(const at::Tensor& x, const AttentionContext& ctx) const;

  DecoderAttention self_attn{nullptr};
  DecoderMlp mlp{nullptr};
  nn::RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

/// What a part's run_layers() hands on.
struct PartOutput {
  at::Tensor hidden;       ///< hidden_states[end_layer], un-normed: the next part's input
  HiddenStates collected;  ///< the requested hidden states this part produced
};

class TextDecoderImpl : public torch::nn::Module {
 public:
  TextDecoderImpl(const DecoderConfig& config, const DecoderPart& part);

  /// ids: [B, S] integer token ids -> hidden_states[0] [B, S, H] in the run dtype. Needs embeddings.
  at::Tensor embed(const at::Tensor& ids) const;
  /// hidden: [B, S, H] = hidden_states[first_layer]; attention_mask: [B, S] (1 = token, 0 = pad;
  /// undefined = no padding). Runs the layers held and collects the states of `collect` that this
  /// part produces (see the file comment). Position ids are 0..S-1 in every row, also with left
  /// padding, as in the reference call (no position_ids passed). Under c10::InferenceMode.
  PartOutput run_layers(const at::Tensor& hidden, const at::Tensor& attention_mask,
                        const std::vector<int64_t>& collect) const;
  /// The whole call of a part that holds everything `out_layers` needs (for_out_layers):
  /// [B, S, n * H] stacked as stack_hidden_states does.
  at::Tensor encode(const at::Tensor& ids, const at::Tensor& attention_mask, const std::vector<int64_t>& out_layers) const;

  /// Whether a key (without the checkpoint prefix) belongs to this part: the loader reports keys
  /// of the part that no parameter claims. Layers outside the range, the final norm when not
  /// built and `embed_tokens` when first_layer > 0 are another part's (or nobody's).
  bool owns_key(const std::string& key) const;
  /// The RoPE tables and mask for a call (what run_layers computes first).
  AttentionContext attention_context(const at::Tensor& attention_mask, int64_t B, int64_t S) const;

  const DecoderConfig& config() const { return config_; }
  const DecoderPart& part() const { return part_; }

  nn::Embedding embed_tokens{nullptr};   ///< only with part().embeddings()
  std::vector<DecoderLayer> layers;      ///< registered as layers.<global index>
  nn::RMSNorm norm{nullptr};             ///< only with part().final_norm

 private:
  DecoderConfig config_;
  DecoderPart part_;
};
TORCH_MODULE(TextDecoder);

/// Checks that every k of `out_layers` is in 0..num_layers (ConfigError naming k and the depth).
void check_out_layers(const DecoderConfig& config, const std::vector<int64_t>& out_layers);

/// diffusers' stack(dim=1).permute(0, 2, 1, 3).reshape(B, S, n * H): [B, S, n * H] with feature
/// index slot * H + h, slots in the order of `out_layers`. InternalError when one is absent.
at::Tensor stack_hidden_states(const HiddenStates& states, const std::vector<int64_t>& out_layers);

/// rotate-half RoPE tables: cos/sin of cat(f, f), f = positions x inv_freq with
/// inv_freq = 1 / theta^(2i / head_dim) and the angles in fp32 -> [S, head_dim] each, fp32.
std::pair<at::Tensor, at::Tensor> rope_tables(int64_t S, int64_t head_dim, double theta, at::Device device);

}  // namespace fluxmpi::llm
