#include "pipeline/text_split.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "models/common/tensor_utils.h"
#include "models/llm/text_encoder.h"

namespace fluxmpi::pipeline {
namespace {

using parallel::MessageHeader;
using parallel::MessageKind;
using parallel::MessageTag;
using parallel::TensorSpec;

// A prompt's messages carry its index as the image and the hidden-state index as the step:
// TextHidden the state the receiver starts from, TextStates the sender's first layer.
MessageTag tag_of(MessageKind kind, int64_t prompt, int64_t state) { return MessageTag{kind, prompt, state, 0, -1}; }

}  // namespace

std::optional<llm::DecoderPart> text_slice_part(const parallel::TextSplitPlan& plan, int rank,
                                                const llm::DecoderConfig& config,
                                                const std::vector<int64_t>& out_layers) {
  const llm::DecoderPart needed = llm::DecoderPart::for_out_layers(config, out_layers);
  FLUX_CHECK(plan.layers == needed.end_layer && plan.final_norm == needed.final_norm, "the text-encoder plan holds ",
             plan.layers, " layers", plan.final_norm ? " and the final norm" : "", "; the requested hidden states need ",
             needed.end_layer, needed.final_norm ? " and the final norm" : "");
  const parallel::TextSlice* slice = plan.slice_of(rank);
  if (slice == nullptr) return std::nullopt;
  return needed.slice(slice->first_layer, slice->end_layer);
}

llm::TextDecoder load_text_slice(const parallel::TextSplitPlan& plan, int rank, const llm::DecoderConfig& config,
                                 const io::TensorStore& store, const std::vector<int64_t>& out_layers,
                                 at::ScalarType dtype, at::Device device, nn::LoadStats* stats) {
  const std::optional<llm::DecoderPart> part = text_slice_part(plan, rank, config, out_layers);
  if (!part) return llm::TextDecoder{nullptr};
  return llm::load_text_decoder(config, store, *part, dtype, device, stats);
}

std::vector<int64_t> states_of_rank(const parallel::TextSplitPlan& plan, int rank,
                                    const std::vector<int64_t>& out_layers) {
  std::set<int64_t> mine;
  for (int64_t k : out_layers)
    if (plan.rank_of_state(k) == rank) mine.insert(k);
  return {mine.begin(), mine.end()};
}

std::vector<at::Tensor> encode_prompts_split(const parallel::TextSplitPlan& plan, const parallel::MpiEnv& env,
                                             parallel::Messenger* messenger, const llm::TextDecoder& part,
                                             const std::vector<PromptTokens>& prompts,
                                             const std::vector<int64_t>& out_layers, at::ScalarType dtype,
                                             at::Device device) {
  const int rank = env.rank();
  const int K = plan.ranks();
  FLUX_CHECK(K <= env.size(), "the text-encoder plan has ", K, " slices for ", env.size(), " ranks");
  c10::InferenceMode inference;

  // Every rank learns the number of prompts and their [B, S] from rank 0: they fix the headers
  // of the messages it expects.
  std::vector<int64_t> shapes;
  if (rank == 0) {
    shapes.push_back(static_cast<int64_t>(prompts.size()));
    for (size_t i = 0; i < prompts.size(); ++i) {
      const PromptTokens& p = prompts[i];
      FLUX_CHECK(p.ids.dim() == 2 && p.mask.sizes() == p.ids.sizes(), "prompt ", i, ": ids ",
                 nn::shape_string(p.ids.sizes().vec()), " and mask ", nn::shape_string(p.mask.sizes().vec()),
                 " must both be [B, S]");
      shapes.push_back(p.ids.size(0));
      shapes.push_back(p.ids.size(1));
    }
  }
  if (plan.split()) shapes = env.broadcast_int64s(shapes);
  const parallel::TextSlice* slice = plan.slice_of(rank);
  if (slice == nullptr) return {};
  FLUX_CHECK(!part.is_empty() && part->part().first_layer == slice->first_layer &&
                 part->part().end_layer == slice->end_layer,
             "rank ", rank, " holds no text-encoder part or not its slice [", slice->first_layer, ", ",
             slice->end_layer, ")");
  FLUX_CHECK(messenger != nullptr || !plan.split(), "a split text encoder needs a messenger");
  const int64_t N = shapes.at(0);
  const int64_t H = part->config().hidden_size;
  auto hidden_spec = [&](int64_t i) {
    return TensorSpec{dtype, {shapes.at(1 + 2 * i), shapes.at(2 + 2 * i), H}};
  };
  auto mask_spec = [&](int64_t i) {
    return TensorSpec{at::kFloat, {shapes.at(1 + 2 * i), shapes.at(2 + 2 * i)}};
  };
  const std::vector<int64_t> mine = states_of_rank(plan, rank, out_layers);
  const bool last = rank == K - 1;

  // Each prompt in order: take the hidden states (embed them on rank 0, receive them elsewhere),
  // run this slice's layers, pass the output on, send what was collected to rank 0.
  std::vector<llm::HiddenStates> collected;  // rank 0: its own states of every prompt
  for (int64_t i = 0; i < N; ++i) {
    at::Tensor hidden, mask;
    if (rank == 0) {
      const PromptTokens& p = prompts[static_cast<size_t>(i)];
      hidden = part->embed(p.ids.to(device));
      mask = p.mask.to(device);
    } else {
      MessageHeader expected{tag_of(MessageKind::TextHidden, i, slice->first_layer), {hidden_spec(i), mask_spec(i)}};
      std::vector<at::Tensor> got = messenger->recv(rank - 1, expected, device);
      hidden = got[0];
      mask = got[1];
    }
    llm::PartOutput out = part->run_layers(hidden, mask, out_layers);
    if (!last)
      messenger->send(rank + 1, tag_of(MessageKind::TextHidden, i, slice->end_layer),
                      {out.hidden.contiguous(), mask.to(at::kFloat).contiguous()});
    if (rank == 0) {
      collected.push_back(std::move(out.collected));
    } else if (!mine.empty()) {
      std::vector<at::Tensor> states;
      for (int64_t k : mine) states.push_back(out.collected.at(k));
      messenger->send(0, tag_of(MessageKind::TextStates, i, slice->first_layer), {at::stack(states, 0).contiguous()});
    }
  }

  // Rank 0 gathers the later slices' states, prompt by prompt, and stacks them as requested.
  std::vector<at::Tensor> result;
  if (rank == 0) {
    for (int64_t i = 0; i < N; ++i) {
      llm::HiddenStates& states = collected[static_cast<size_t>(i)];
      for (int r = 1; r < K; ++r) {
        const std::vector<int64_t> theirs = states_of_rank(plan, r, out_layers);
        if (theirs.empty()) continue;
        TensorSpec spec = hidden_spec(i);
        spec.shape.insert(spec.shape.begin(), static_cast<int64_t>(theirs.size()));
        MessageHeader expected{tag_of(MessageKind::TextStates, i, plan.slices[static_cast<size_t>(r)].first_layer),
                               {spec}};
        const at::Tensor got = messenger->recv(r, expected, device).at(0);
        for (size_t j = 0; j < theirs.size(); ++j) states[theirs[j]] = got[static_cast<int64_t>(j)];
      }
      result.push_back(llm::stack_hidden_states(states, out_layers));
    }
  }
  if (messenger != nullptr) messenger->wait_all();
  return result;
}

}  // namespace fluxmpi::pipeline
