#pragma once
/// Loading FLUX.2's text encoders (the `text_encoder/` folder of a Flux2Pipeline or
/// Flux2KleinPipeline) for the layers a run needs. Only the text tower is read: never the
/// lm_head, never Mistral3's vision_tower / multi_modal_projector (present in its checkpoints),
/// never a layer past the last requested hidden state, and the final norm only when
/// hidden_states[num_layers] is requested. With a sharded checkpoint only the shards holding those
/// keys are mapped (io::TensorStore maps a shard on first use).
///
/// Checkpoint key prefixes of the text tower: Qwen3 `model.`; Mistral3 `language_model.model.`
/// (the layout of transformers < 4.52, as in the fixtures) or `model.language_model.` (newer
/// transformers); both are accepted, the one present is used.

#include <string>
#include <vector>

#include "io/tensor_store.h"
#include "models/common/loader.h"
#include "models/llm/decoder.h"

namespace fluxmpi::llm {

/// The prefix of the text tower's keys in `store` for `config`'s architecture; WeightError naming
/// the store and the accepted prefixes when none is present.
std::string text_tower_prefix(const DecoderConfig& config, const io::TensorStore& store);

/// The loader's rules for `model`: the text tower prefix; keys outside the text tower of the
/// checkpoint class (lm_head, vision tower, projector) skipped; inside it, keys of the part that
/// no parameter claims are a WeightError, keys of other layers are not this part's.
nn::LoadRules text_encoder_load_rules(const TextDecoder& model, const io::TensorStore& store);

/// Builds `part` of the decoder and loads its weights from `store` in `dtype` on `device`.
/// `stats` (optional) receives the loader's count of tensors and bytes.
TextDecoder load_text_decoder(const DecoderConfig& config, const io::TensorStore& store, const DecoderPart& part,
                              at::ScalarType dtype, at::Device device, nn::LoadStats* stats = nullptr);

/// From a text encoder folder (config.json + safetensors, sharded or not): the part that produces
/// `out_layers` alone (DecoderPart::for_out_layers). Empty `out_layers`: the pipeline's default
/// layers of the architecture.
TextDecoder load_text_encoder(const std::string& dir, const std::vector<int64_t>& out_layers, at::ScalarType dtype,
                              at::Device device, nn::LoadStats* stats = nullptr);

}  // namespace fluxmpi::llm
