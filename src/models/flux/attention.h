#pragma once
/// FLUX attention (diffusers Attention with FluxAttnProcessor): q/k/v projections, per-head
/// RMSNorm of q and k (eps 1e-6), RoPE on the joint sequence (text first, then image),
/// softmax(q k^T / sqrt(Dh)) v. The double-stream variant adds the text-stream projections
/// (add_*_proj, norm_added_*) and both output projections (to_out.0, to_add_out); the
/// single-stream variant has no output projection (the block's proj_out follows).
///
/// On the CPU in fp32 and bf16 the path from the projections to the attention output runs through
/// the kernels of flux/fused.h (one pass per tensor from the projection to the attention input)
/// and the tiled attention (nn::tiled_attention_into: no score matrix), with or without a KV
/// cache; elsewhere through the operators below (project, rope_attention), which are the
/// reference semantics.
///
/// After loading, fuse() concatenates projections that read the same input into one matrix, so a
/// forward does one matmul instead of three; the registered parameters stay (as views into the
/// fused weight) so the module keeps the diffusers names.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include "models/common/layers.h"
#include "models/flux/modulation.h"
#include "models/flux/rope.h"

namespace fluxmpi::flux {

/// Keys and values of one attention layer over the whole joint sequence, kept between calls
/// (patch pipelining, pipeline/denoise.h). A call on the `n` tokens at positions
/// [offset, offset + n) of the sequence first writes their rotated keys and their values into
/// those rows, then attends to all rows: rows before them hold what earlier calls wrote (this
/// step's patches), rows after them what the previous step left. With `tail` > 0 the call's last
/// `tail` tokens are the sequence's last `tail` rows instead (reference tokens, which follow the
/// image tokens, travelling with the first patch): its tokens are the rows [offset, offset + n -
/// tail) and [N - tail, N).
///
/// Two layouts hold the same numbers. The sequence-first one, k and v [B, N, H, Dh], is the
/// reference. With `heads_first` (make_kv_cache's choice where the tiled CPU attention runs) the
/// keys are kept transposed, [B, H, Dh, N], and the values [B, H, N, Dh]: the tiled kernel's own
/// operands, which it then reads in place; from the sequence-first layout it copies every row of
/// both at each call, which for a patch's call is every patch's rows (docs/performance.md,
/// "Page faults and the patches' own cost").
struct KvCache {
  at::Tensor k;        ///< [B, N, H, Dh], RoPE applied; heads_first: [B, H, Dh, N]
  at::Tensor v;        ///< [B, N, H, Dh]; heads_first: [B, H, N, Dh]
  int64_t offset = 0;  ///< position of the current call's first token in the sequence
  int64_t tail = 0;    ///< the current call's last tokens that are the sequence's last rows
  /// The block's modulation vectors (AdaNorm::chunks; a double block has two AdaNorms).
  ModulationCache modulation[2];
  bool heads_first = false;  ///< the layout (above)

  /// N, the rows of the sequence.
  int64_t rows() const { return heads_first ? k.size(3) : k.size(1); }
  /// The keys and the values as [B, H, N, Dh] views, whatever the layout.
  at::Tensor keys() const { return heads_first ? k.transpose(2, 3) : k.transpose(1, 2); }
  at::Tensor values() const { return heads_first ? v : v.transpose(1, 2); }
};

/// An uninitialised cache of `rows` rows: heads-first where the attention of a query of `options`
/// runs the tiled CPU kernel (CPU fp32 and bf16), else sequence-first.
KvCache make_kv_cache(int64_t batch, int64_t rows, int64_t heads, int64_t head_dim, const at::TensorOptions& options);

class FluxAttentionImpl : public torch::nn::Module {
 public:
  FluxAttentionImpl(int64_t dim, int64_t heads, int64_t head_dim, bool joint);

  /// Double-stream: txt [B, S, D], img [B, L, D] -> (txt_out, img_out), each projected.
  /// With `kv`: the tokens are a window of the sequence (see KvCache; `rope` holds its rows).
  std::pair<at::Tensor, at::Tensor> forward_joint(const at::Tensor& txt, const at::Tensor& img,
                                                  const RopeTables& rope, KvCache* kv = nullptr) const;
  /// Single-stream: given q, k, v already projected ([B, S+L, D] each) -> attention output
  /// [B, S+L, D] before any output projection.
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RopeTables& rope,
                    KvCache* kv = nullptr) const;
  /// attend() written into `out` [B, S+L, H*Dh] (unit last stride; e.g. a column slice of a larger
  /// buffer, so that no cat follows).
  void attend_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RopeTables& rope,
                   at::Tensor out, KvCache* kv = nullptr) const;

  /// Builds the fused q|k|v weights of the image stream (and text stream when joint).
  void fuse();

  nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr};
  nn::RMSNorm norm_q{nullptr}, norm_k{nullptr};
  nn::Linear add_q_proj{nullptr}, add_k_proj{nullptr}, add_v_proj{nullptr};
  nn::RMSNorm norm_added_q{nullptr}, norm_added_k{nullptr};
  torch::nn::ModuleList to_out{nullptr};  ///< [0] = output projection of the image stream
  nn::Linear to_add_out{nullptr};
  int64_t heads, head_dim;

 private:
  /// [B, N, D] -> q, k, v [B, N, H, Dh], q and k normalised.
  std::tuple<at::Tensor, at::Tensor, at::Tensor> project(const at::Tensor& x, bool text) const;
  /// Whether `x` takes the fused CPU path (fp32 or bf16 on the CPU).
  bool fused_path(const at::Tensor& x) const;
  /// attend() through the reference operators (norms, rope_attention), with or without a cache.
  at::Tensor attend_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RopeTables& rope,
                              KvCache* kv) const;
  nn::Linear out_proj_{nullptr};  ///< to_out[0], typed
  nn::FusedLinear fused_, fused_add_;  ///< q|k|v of the image stream, of the text stream
};
TORCH_MODULE(FluxAttention);

/// Joint attention core: q, k, v [B, N, H, Dh] (N = S + L, RoPE not yet applied) -> [B, N, H*Dh].
/// With `kv`, q, k, v are the window of the sequence the cache's offset says: k (rotated) and v
/// go into the cache first, then q attends to every row of it (a window of the whole sequence
/// gives the same result as no cache, bit for bit).
at::Tensor rope_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RopeTables& rope,
                          KvCache* kv = nullptr);

}  // namespace fluxmpi::flux
