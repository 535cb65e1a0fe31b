#pragma once
/// FLUX.2's text encoder run as a pipeline of layer slices over the leading ranks
/// (parallel/text_split.h plans them), for the encoding stage only. Rank 0 embeds each prompt and
/// runs its layers; the hidden states and the attention mask go to the next slice, and so on;
/// every slice after the first sends the requested hidden states it produced back to rank 0,
/// which stacks them in the requested order (llm::stack_hidden_states). Ranks beyond the slices
/// take part in one broadcast and nothing else.
///
/// Schedule: prompts go through in order, one at a time per rank, and no rank waits for a later
/// slice before it starts on its next prompt, so slices overlap on consecutive prompts (rank 0
/// collects the other slices' states after its last prompt). Each rank computes, for each prompt,
/// exactly the operations one process holding every layer computes, on the same inputs (the
/// hidden states travel bit for bit; the mask travels as fp32 0/1 and is only compared with 0):
/// the result is bit-identical to TextDecoder::encode in one process with equal --threads,
/// however the slices overlap in time.

#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "io/tensor_store.h"
#include "models/common/loader.h"
#include "models/llm/decoder.h"
#include "parallel/message.h"
#include "parallel/mpi_env.h"
#include "parallel/text_split.h"

namespace fluxmpi::pipeline {

/// One prompt (or a batch of prompts encoded together) as the text encoder takes it.
struct PromptTokens {
  at::Tensor ids;   ///< [B, S] int64 token ids
  at::Tensor mask;  ///< [B, S] 1 = token, 0 = pad
};

/// `rank`'s part of the decoder: the slice of DecoderPart::for_out_layers(config, out_layers) the
/// plan gives it; nullopt for a rank beyond the slices. InternalError when the plan was made for
/// other layers (its layer count or final norm differ from what `out_layers` needs).
std::optional<llm::DecoderPart> text_slice_part(const parallel::TextSplitPlan& plan, int rank,
                                                const llm::DecoderConfig& config,
                                                const std::vector<int64_t>& out_layers);

/// Builds and loads `rank`'s slice from `store` (llm::load_text_decoder); a null TextDecoder for a
/// rank beyond the slices. Not collective: the caller agrees on the outcome of every rank's load
/// (MpiEnv::agree) before encode_prompts_split, so that a rank whose load fails is reported and
/// the job ends instead of its neighbours waiting for it.
llm::TextDecoder load_text_slice(const parallel::TextSplitPlan& plan, int rank, const llm::DecoderConfig& config,
                                 const io::TensorStore& store, const std::vector<int64_t>& out_layers,
                                 at::ScalarType dtype, at::Device device, nn::LoadStats* stats = nullptr);

/// Called by every rank of `env` with the same plan, out_layers, dtype and device. `part` is this
/// rank's slice (load_text_slice; null beyond the slices); `prompts` are rank 0's (ignored
/// elsewhere: their number and shapes are broadcast from rank 0, a collective of all ranks when
/// the plan is split). `messenger` may be null when the plan is not split. Returns on rank 0 one
/// [B, S, n * H] tensor per prompt, n = out_layers.size(), as TextDecoder::encode stacks them;
/// empty on the other ranks. Errors after the loads (a message that does not match, a failing
/// layer) throw on the rank that sees them; others may be waiting for it, so the caller aborts
/// the job then (MpiEnv::abort), as in the denoising loop.
std::vector<at::Tensor> encode_prompts_split(const parallel::TextSplitPlan& plan, const parallel::MpiEnv& env,
                                             parallel::Messenger* messenger, const llm::TextDecoder& part,
                                             const std::vector<PromptTokens>& prompts,
                                             const std::vector<int64_t>& out_layers, at::ScalarType dtype,
                                             at::Device device);

/// The hidden states k of `out_layers` that `rank` produces under `plan`, ascending, each once: the
/// order of the TextStates message it sends to rank 0.
std::vector<int64_t> states_of_rank(const parallel::TextSplitPlan& plan, int rank,
                                    const std::vector<int64_t>& out_layers);

}  // namespace fluxmpi::pipeline
