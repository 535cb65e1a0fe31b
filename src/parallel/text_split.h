#pragma once
/// FLUX.2's text encoder over ranks when it does not fit rank 0 (docs/partition.md): for the
/// encoding stage only, the leading ranks 0..k-1 each hold a contiguous slice of the decoder
/// layers the run builds (rank 0 also the token embeddings, the last slice the final norm when
/// it is built) and pass each prompt's hidden states on; every rank frees its slice before it
/// loads its transformer blocks. With k = 1 (rank 0's budget holds the whole encoder) nothing
/// travels. A pure function of the config and the budgets: no libtorch, no MPI, so --dry-run and
/// every rank compute the same plan.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "parallel/partition.h"

namespace fluxmpi::parallel {

/// One rank's slice of the text encoder and its estimated memory while encoding.
struct TextSlice {
  int rank = 0;
  int64_t first_layer = 0;        ///< global index of its first decoder layer
  int64_t end_layer = 0;          ///< one past its last layer
  bool embeddings = false;        ///< embed_tokens (rank 0)
  bool final_norm = false;        ///< the final RMSNorm (the last slice, when the run uses it)
  uint64_t weight_bytes = 0;      ///< the slice's parameters in the run dtype
  uint64_t activation_bytes = 0;  ///< one prompt's working set, with the message buffers when split
  uint64_t job_bytes = 0;         ///< rank 0: the job's buffers held meanwhile; 0 elsewhere
  uint64_t peak_bytes = 0;        ///< runtime + weights + activations + job buffers

  int64_t layers() const { return end_layer - first_layer; }
};

struct TextSplitPlan {
  std::vector<TextSlice> slices;  ///< ranks 0..k-1 in order; contiguous, covering [0, layers)
  int64_t layers = 0;             ///< decoder layers built (the last hidden state used)
  bool final_norm = false;
  std::map<int, uint64_t> budgets;  ///< as given (unnamed ranks unbounded)

  /// More than one rank holds layers: hidden states travel.
  bool split() const { return slices.size() > 1; }
  int ranks() const { return static_cast<int>(slices.size()); }
  /// `rank`'s slice, or nullptr for a rank beyond the slices (it does nothing while encoding).
  const TextSlice* slice_of(int rank) const;
  /// The rank that produces hidden_states[k], 0 <= k <= layers: hidden_states[0] (the embeddings)
  /// is rank 0's, hidden_states[k] (the output of layer k - 1, normed for k = num_hidden_layers)
  /// that of the slice holding layer k - 1.
  int rank_of_state(int64_t k) const;
  /// For --dry-run: "text encoder: layers 0-14 on rank 0 (19.2 GiB), 15-29 on rank 1 (17.9 GiB)".
  std::string table() const;
};

/// Plans the text encoder `llm` (layers built, final norm) over `world_size` ranks. Rank 0's slice
/// holds the job's buffers `rank0_job_bytes` too (the text embeddings and latents it keeps, as
/// StageEstimate::job_bytes); `text_tokens` is S; `attention_chunk_bytes` bounds the score chunks
/// as PlanRequest's does (0: all heads at once). All layers on rank 0 when its budget allows (or
/// it has none); else the fewest leading ranks whose slices fit their budgets, the largest slice
/// as small as the budgets allow (equal counts, the remainder on the later ranks, when the
/// budgets are equal). UsageError naming --max-memory and the numbers when the layers do not fit
/// even over all ranks; InternalError for a world size < 1 or no layers.
TextSplitPlan plan_text_encoder(const LlmEncoderCosts& llm, int world_size, const std::map<int, uint64_t>& budgets,
                                int64_t dtype_bytes, int64_t text_tokens, uint64_t rank0_job_bytes,
                                int64_t attention_chunk_bytes = 0);

}  // namespace fluxmpi::parallel
