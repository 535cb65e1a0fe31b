#pragma once
/// Stage 1 on rank 0: prompts -> (T5 sequence, CLIP pooled vector), as FluxPipeline.encode_prompt:
/// CLIP on `prompt` (77 tokens, pooled output), T5 on `prompt_2` (or `prompt`) padded to
/// max_sequence_length (no attention mask); text position ids are zeros. Each distinct prompt is
/// encoded once, alone (batch 1, so a job of many images computes exactly what one-image jobs
/// compute). Truncation is reported once per tokenizer and prompt, quoting the dropped text.

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "io/lora_file.h"
#include "io/model_dir.h"

namespace fluxmpi::pipeline {

struct PromptEmbedding {
  at::Tensor prompt_embeds;  ///< [S, joint_attention_dim], run dtype
  at::Tensor pooled;         ///< [pooled_projection_dim], run dtype
  at::Tensor clip_ids;       ///< [77] int64
  at::Tensor t5_ids;         ///< [S] int64
  // FLUX.2 (pipeline/flux2/stages.h): one decoder-only encoder, no pooled output, no CLIP/T5 ids.
  at::Tensor input_ids;       ///< [S] int64
  at::Tensor attention_mask;  ///< [S] int64, 1 = real token
};

class TextEncoders {
 public:
  /// Loads both tokenizers and both encoders of `dir` in `dtype` on `device`, with the text-encoder
  /// parts of `loras` merged (CLIP: text_encoder.* / lora_te1_*, T5: text_encoder_2.* / lora_te2_*).
  TextEncoders(const io::ModelDir& dir, at::ScalarType dtype, at::Device device,
               const std::vector<std::shared_ptr<const io::LoraFile>>& loras = {});
  ~TextEncoders();
  TextEncoders(TextEncoders&&) noexcept;

  /// `what` names the prompt in truncation warnings ("prompt 3").
  PromptEmbedding encode(const std::string& prompt, const std::string& prompt_2, int64_t max_sequence_length,
                         const std::string& what);
  /// Bytes of the encoders' parameters.
  int64_t parameter_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxmpi::pipeline
