#pragma once
/// The stage planner: cuts the transformer's blocks (num_layers double blocks, then
/// num_single_layers single blocks, numbered 0..B-1 in execution order) into P contiguous,
/// non-empty slices, one per rank in rank order, and estimates each rank's weights, FLOPs share
/// and peak memory from the config files alone. A pure function of configs: no libtorch, no MPI,
/// so `--dry-run` and the tests can run it anywhere. docs/partition.md explains the model.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/configs.h"
#include "io/controlnet_config.h"
#include "io/flux2_configs.h"
#include "parallel/decode_plan.h"

namespace fluxmpi::parallel {

/// `--balance compute` (equal block counts: every block costs the same FLOPs per token) or
/// `--balance memory` (equal estimated peak memory: a double block holds ~2.4x the weights of a
/// single block, and rank 0 carries the embedders, text encoders and VAE). Both compare plans
/// lexicographically over the sorted per-rank loads (the largest, then the next largest, ...):
/// compute by block counts, then peak memory, then FLOPs; memory by peak memory, then blocks.
enum class Balance { Compute, Memory };
/// "compute" | "memory"; UsageError naming --balance otherwise.
Balance parse_balance(const std::string& text);
const char* balance_name(Balance balance);

/// Parameter counts of FluxTransformer2DModel by formula from its config (checkable against the
/// weight headers and against the built modules' named_parameters()).
struct TransformerParamCounts {
  int64_t double_block = 0;  ///< one transformer_blocks.<i>
  int64_t single_block = 0;  ///< one single_transformer_blocks.<j>
  int64_t embedders = 0;     ///< x_embedder, context_embedder, time_text_embed
  int64_t final_layer = 0;   ///< norm_out, proj_out
  int64_t total = 0;         ///< everything: embedders + all blocks + final layer
};
TransformerParamCounts count_transformer_params(const io::TransformerConfig& config);
/// CLIPTextModel (`text_model.*`, no buffers).
int64_t count_clip_text_params(const io::ClipTextConfig& config);
/// T5EncoderModel (`shared`, `encoder.*`; the tied encoder.embed_tokens is counted once).
int64_t count_t5_encoder_params(const io::T5Config& config);
/// The parts of AutoencoderKL that decoding runs: `post_quant_conv` (if used) and `decoder.*`.
int64_t count_vae_decoder_params(const io::VaeConfig& config);

// Memory model constants (docs/partition.md). Estimates: the lead calibrates them against
// measured RSS; change them here only, with the measurement that justifies the change.

/// Resident memory of a fluxmpi process before any model is loaded: libtorch, OpenBLAS and Open
/// MPI initialised and matmuls run. Measured 160-180 MiB (Debian libtorch 1.13 CPU, Open MPI 4.1,
/// 1-32 threads; tests/mpi/env_test.cpp checks it stays below), plus room for the HDF5, ICU and
/// sentencepiece libraries of the full program.
inline constexpr uint64_t kRuntimeBaselineBytes = 256ull << 20;
/// [L, D] activations alive at once inside a block's forward: input/residual, normalised input,
/// q, k, v, rotated q and k, attention output.
inline constexpr int64_t kStreamTensors = 8;
/// [L, D] message buffers: the received input and one outstanding send of the previous output.
inline constexpr int64_t kMessageTensors = 2;
/// [L, 4D] MLP tensors alive at once: the hidden layer before and after its GELU (a single
/// block's [L, 5D] concatenation takes the room of q, k, v, dead by then).
inline constexpr int64_t kMlpTensors = 2;
/// Attention score chunks alive at once on the math path: the scores and their softmax.
inline constexpr int64_t kScoreTensors = 2;
/// [S, d] tensors alive at once in a text-encoder layer (residual, normed, q, k, v, output).
inline constexpr int64_t kTextStreamTensors = 6;
/// Largest-level VAE decoder activations alive at once (input, normalised, conv output,
/// residual / upsampled copy).
inline constexpr int64_t kVaeLiveTensors = 4;
/// diffusers' AutoencoderKL tile overlap (tile_overlap_factor), for the tiled decode estimate
/// (models/vae/tiling.h computes the same geometry for the decoder itself).
inline constexpr double kVaeTileOverlap = 0.25;

/// An inclusive range of global block indices.
struct BlockRange {
  int64_t first = 0;
  int64_t last = -1;
  int64_t count() const { return last - first + 1; }
};

/// Per-rank memory budgets from `--max-memory 0=16GiB,1=24GiB` (sizes as core/units.h
/// parse_bytes reads them, Slurm's 16G and 500M included). An entry without a rank (`16GiB`)
/// is the budget of every rank not named. Ranks not named otherwise are unbounded. UsageError
/// naming --max-memory for bad syntax, bad sizes, ranks outside 0..world_size-1 and ranks or
/// defaults given twice.
std::map<int, uint64_t> parse_max_memory(const std::string& text, int world_size);

/// `--partition 0:0-8,1:9-56` (entries in any order; "r:a" is a single block) -> one range per
/// rank, indexed by rank. UsageError naming --partition for bad syntax, ranks out of range or
/// named twice, ranks without blocks, block indices outside 0..num_blocks-1, overlaps, gaps,
/// slices not in rank order, and blocks no rank covers.
std::vector<BlockRange> parse_partition(const std::string& text, int world_size, int64_t num_blocks);
/// The checks of parse_partition on an already parsed override (indexed by rank).
void check_partition(const std::vector<BlockRange>& ranges, int world_size, int64_t num_blocks);

/// One rank's slice of blocks, in global and in diffusers numbering.
struct StageBlocks {
  int64_t first = 0;          ///< first global block index
  int64_t last = -1;          ///< last global block index (inclusive)
  int64_t first_double = 0;   ///< first index into transformer_blocks (when num_double > 0)
  int64_t num_double = 0;
  int64_t first_single = 0;   ///< first index into single_transformer_blocks (when num_single > 0)
  int64_t num_single = 0;

  int64_t count() const { return num_double + num_single; }
  /// The slice begins with a double block: its input is the separate txt and img streams.
  bool starts_in_double() const { return num_double > 0; }
  /// The slice ends with a double block: its output is the separate txt and img streams.
  bool ends_in_double() const { return num_double > 0 && num_single == 0; }
  /// "double 0-8", "double 9-18, single 0-37", "single 3-37".
  std::string describe() const;
};

/// Estimated load of one rank. Bytes in the run dtype.
struct StageEstimate {
  uint64_t weight_bytes = 0;      ///< transformer weights this rank loads (blocks + embedders / final layer)
  double step_flops = 0;          ///< transformer FLOPs of this rank in one step (one microbatch)
  double flops_share = 0;         ///< step_flops / the whole transformer's
  uint64_t activation_bytes = 0;  ///< transformer working set (streams, messages, MLP, scores, RoPE)
  uint64_t kv_cache_bytes = 0;    ///< patch pipelining: the key/value buffers of this rank's blocks
  uint64_t controlnet_weight_bytes = 0;  ///< rank 0: the ControlNets' weights
  uint64_t residual_bytes = 0;    ///< ControlNets: residual samples held while denoising (and rank 0's
                                  ///< embedded control images and ControlNet key/value buffers)
  uint64_t denoise_bytes = 0;     ///< runtime + weights (+ resident encoders) + activations + KV buffers
  uint64_t encode_bytes = 0;      ///< rank 0 while encoding prompts; 0 elsewhere
  uint64_t image_encode_bytes = 0;  ///< rank 0 while the VAE encodes input images; 0 elsewhere
  uint64_t redux_encode_bytes = 0;  ///< rank 0 while SigLIP and the Redux embedder encode; 0 elsewhere
  uint64_t decode_bytes = 0;      ///< while decoding: rank 0, and the decode helpers (their slice freed); else 0
  uint64_t job_bytes = 0;         ///< rank 0: per-image buffers of the whole job (text embeddings, latents)
  uint64_t peak_bytes = 0;        ///< max over this rank's stages
  const char* peak_stage = "denoise";  ///< "encode" | "encode images" | "encode redux" | "denoise" | "decode"
};

/// What a model family's blocks cost, when it is not FLUX.1 (parallel/flux2_costs.h for FLUX.2):
/// the parameter counts, and the shape of the token-wise work in a block.
struct FamilyCosts {
  TransformerParamCounts params;
  int64_t mlp_hidden = 0;       ///< the feed-forward's hidden width
  int64_t mlp_matrices = 2;     ///< matrices of width D x mlp_hidden per token and block (GELU 2, SwiGLU 3)
  bool block_modulation = true; ///< each block has its own modulation linears on temb (FLUX.1); else
                                ///< they are computed once per forward with the embedders (FLUX.2)
};

/// A decoder-only text encoder (FLUX.2) as rank 0 runs it: the embeddings and the layers up to the
/// last hidden state used, never the lm_head.
struct LlmEncoderCosts {
  io::LlmShape shape;
  int64_t layers = 0;        ///< decoder layers built
  bool final_norm = false;   ///< the final RMSNorm is used (a hidden state after the last layer)
};

/// Flux2Transformer2DModel by formula (no biases; the modulation linears counted with the
/// embedders; SwiGLU feed-forwards of int(D * mlp_ratio)).
FamilyCosts flux2_family_costs(const io::Flux2TransformerConfig& config);

/// ControlNets of the job (parallel/controlnet_costs.h): rank 0 of a pipeline loads every net,
/// runs each run once per step and sends every other rank the residual samples its blocks add.
struct ControlNetRequest {
  std::vector<io::ControlNetConfig> nets;  ///< each loaded once
  std::vector<size_t> runs;                ///< per run (a net on one control image): its net
  io::ResidualLayout layout;               ///< the merged samples and the blocks they feed
};
/// FluxControlNetModel's parameters by formula from its config (checkable against its weights).
int64_t count_controlnet_params(const io::ControlNetConfig& config);
/// The transformer's weights as the ranks hold them when they are not converted to the run dtype:
/// a GGUF file's block-quantized tensors stay as stored (models/common/quantized_linear.h), the
/// others are converted. Bytes per block (in execution order within each kind) and for the parts
/// of rank 0 and of the last rank.
struct StoredWeights {
  /// One part's tensors: the block-quantized ones at their stored bytes, the others by elements
  /// (held in the run dtype).
  struct Part {
    uint64_t quantized_bytes = 0, dense_elements = 0;
    uint64_t bytes(int64_t dtype_bytes) const { return quantized_bytes + dense_elements * static_cast<uint64_t>(dtype_bytes); }
  };
  std::vector<Part> double_blocks, single_blocks;
  Part embedders;    ///< rank 0's input embedders (and FLUX.2's global modulation)
  Part final_layer;  ///< norm_out, proj_out
  std::string label;  ///< how they are stored, for the table: "GGUF: Q8_0 x 304, F32 x 467, F16 x 6"
  uint64_t total(int64_t dtype_bytes) const;
};

/// What a plan is made from.
struct PlanRequest {
  io::TransformerConfig transformer;  ///< FLUX.2: io::transformer_shape() of its config
  std::optional<FamilyCosts> family;  ///< absent: FLUX.1's counts and shapes by formula
  /// Weights held as stored (a GGUF transformer): replaces parameters x dtype bytes per block.
  std::optional<StoredWeights> stored;
  std::optional<LlmEncoderCosts> llm; ///< FLUX.2: its text encoder (absent: nothing to encode)
  std::optional<io::ClipTextConfig> clip;  ///< absent: rank 0 loads no CLIP (nothing to encode)
  std::optional<io::T5Config> t5;          ///< absent: rank 0 loads no T5
  std::optional<io::VaeConfig> vae;        ///< absent: nothing is decoded
  int world_size = 1;
  int64_t dtype_bytes = 4;                 ///< bytes per element of the run dtype
  std::string dtype_label = "fp32";        ///< shown in the table
  Balance balance = Balance::Compute;
  std::map<int, uint64_t> max_memory;      ///< parse_max_memory(); unnamed ranks are unbounded
  std::vector<BlockRange> partition;       ///< parse_partition(); empty: the planner decides
  int64_t image_tokens = 4096;             ///< L_img per image (1024x1024: 4096)
  int64_t text_tokens = 512;               ///< L_txt = max_sequence_length
  int64_t microbatch = 1;                  ///< images per message
  int64_t images = 1;                      ///< images of the job (their buffers stay on rank 0)
  int64_t passes = 1;                      ///< transformer passes per step (2 with true CFG)
  int64_t latent_height = 0, latent_width = 0;  ///< VAE latent cells; 0: a square of 4 x image_tokens
  bool keep_encoders = false;              ///< text encoders stay resident on rank 0
  bool vae_tiling = false;                 ///< --vae-tiling: decode in tiles (when the latent exceeds one)
  bool vae_slicing = false;                ///< --vae-slicing: decode a microbatch one image at a time
  /// Turn tiling on when the decode stage would not fit rank 0's budget otherwise.
  bool auto_vae_tiling = true;
  /// Largest attention score chunk of the math path: pass nn::kAttentionChunkBytes (an input so
  /// that this file stays free of libtorch). 0: the scores of all heads at once (no chunking) —
  /// an upper bound, enough for callers that need only the slices.
  int64_t attention_chunk_bytes = 0;
  /// Patch pipelining (--patches > 1): bytes of the key/value buffers of one block, over every
  /// image and pass in flight (2 x (text + image tokens) x width x dtype bytes each); 0 = none.
  /// Held during denoising on the rank that runs the block, freed before decoding.
  uint64_t kv_cache_block_bytes = 0;
  /// Image inputs: rank 0's VAE encode stage, weights and activations of one input
  /// (parallel/encode_memory.h); 0 when the job encodes no image.
  uint64_t image_encode_bytes = 0;
  /// FLUX.1 Redux: rank 0's SigLIP + embedder stage (parallel/encode_memory.h); 0 without Redux.
  uint64_t redux_encode_bytes = 0;
  /// ControlNets (absent: none): their weights, compute and residuals count on the ranks.
  std::optional<ControlNetRequest> controlnet;
};

/// Which blocks each rank runs, and what each rank is estimated to hold. Rank 0 owns the
/// embedders (and the text encoders, scheduler, VAE); the last rank owns norm_out and proj_out.
class StagePlan {
 public:
  /// Plans (or checks the override of) `request`. UsageError when P exceeds the number of
  /// blocks, when no split fits the budgets, or when the override breaks a budget.
  static StagePlan make(const PlanRequest& request);

  int world_size() const { return static_cast<int>(blocks_.size()); }
  int64_t num_blocks() const { return num_double_ + num_single_; }
  Balance balance() const { return balance_; }
  bool overridden() const { return overridden_; }

  const StageBlocks& blocks(int rank) const;
  const StageEstimate& estimate(int rank) const;
  bool owns_embedders(int rank) const { return rank == 0; }
  bool owns_final_layer(int rank) const { return rank == world_size() - 1; }
  /// The rank that runs global block `block`.
  int rank_of_block(int64_t block) const;
  /// Whether `rank` loads the transformer weight `key`: its blocks, the embedders on rank 0,
  /// norm_out/proj_out on the last rank. Keys of no known module go to rank 0, whose loader
  /// then reports them as unclaimed.
  bool owns_key(int rank, const std::string& key) const;

  /// Whether rank 0 decodes in tiles: asked for (--vae-tiling) or switched on because the
  /// untiled decode stage does not fit rank 0's budget (auto_vae_tiling), and the latent is
  /// larger than one tile (else tiling changes nothing).
  bool vae_tiling() const { return vae_tiling_; }
  /// Tiling was switched on by the planner, not asked for.
  bool vae_tiling_auto() const { return vae_tiling_auto_; }
  /// Which ranks decode the VAE tiles (parallel/decode_plan.h): {0} unless tiles are spread.
  const std::vector<int>& decode_ranks() const { return decode_.ranks; }
  const DecodePlan& decode_plan() const { return decode_; }
  /// The transformer's parameter counts the plan was made from.
  const TransformerParamCounts& params() const { return params_; }
  /// The `--dry-run` table: a summary line, then one row per rank (blocks, weights, FLOPs share,
  /// estimated peak memory and its stage, budget), then rank 0's stages.
  std::string table() const;

 private:
  /// make() with the tiling decision taken: `auto_tiling` records that it was switched on.
  static StagePlan plan_fixed(const PlanRequest& request, bool auto_tiling);

  std::vector<StageBlocks> blocks_;
  std::vector<StageEstimate> estimates_;
  std::map<int, uint64_t> budgets_;
  TransformerParamCounts params_;
  int64_t num_double_ = 0;
  int64_t num_single_ = 0;
  Balance balance_ = Balance::Compute;
  bool overridden_ = false;
  bool vae_tiling_ = false;
  bool vae_tiling_auto_ = false;
  DecodePlan decode_;
  std::string header_;  ///< summary lines above the rows
  std::string footer_;  ///< rank 0's stages below them
};

}  // namespace fluxmpi::parallel
