#include "parallel/encode_memory.h"

#include <algorithm>
#include <vector>

#include "parallel/param_formulas.h"
#include "parallel/partition.h"

namespace fluxmpi::parallel {
namespace {

int64_t conv(int64_t in, int64_t out, int64_t kernel) { return in * out * kernel * kernel + out; }
int64_t norm(int64_t channels) { return 2 * channels; }
// A ResnetBlock2D: two GroupNorm + 3x3 conv pairs, a 1x1 shortcut when the width changes.
int64_t resnet(int64_t in, int64_t out) {
  return norm(in) + conv(in, out, 3) + norm(out) + conv(out, out, 3) + (in != out ? conv(in, out, 1) : 0);
}

}  // namespace

int64_t count_vae_encoder_params(const io::VaeConfig& v, bool use_quant_conv) {
  const std::vector<int64_t>& ch = v.block_out_channels;
  int64_t n = conv(v.in_channels, ch.front(), 3);
  int64_t in = ch.front();
  for (size_t i = 0; i < ch.size(); ++i) {
    for (int64_t j = 0; j < v.layers_per_block; ++j) n += resnet(j == 0 ? in : ch[i], ch[i]);
    if (i + 1 < ch.size()) n += conv(ch[i], ch[i], 3);  // downsamplers.0.conv
    in = ch[i];
  }
  const int64_t top = ch.back();
  n += 2 * resnet(top, top);
  if (v.mid_block_add_attention) n += norm(top) + 4 * (top * top + top);
  n += norm(top) + conv(top, 2 * v.latent_channels, 3);
  if (use_quant_conv) n += conv(2 * v.latent_channels, 2 * v.latent_channels, 1);
  return n;
}

EncodeStage vae_encode_stage(const io::VaeConfig& v, bool use_quant_conv, int64_t height, int64_t width,
                             int64_t dtype_bytes, int64_t attention_chunk_bytes) {
  EncodeStage s;
  s.weight_bytes = static_cast<uint64_t>(count_vae_encoder_params(v, use_quant_conv) * dtype_bytes);
  // Level i runs at (H / 2^i) x (W / 2^i) with block_out_channels[i]; the image and conv_in's
  // output are alive at the top.
  int64_t largest = (v.in_channels + v.block_out_channels.front()) * height * width;
  int64_t h = height, w = width;
  for (size_t i = 0; i < v.block_out_channels.size(); ++i) {
    largest = std::max(largest, v.block_out_channels[i] * h * w);
    if (i + 1 < v.block_out_channels.size()) h = (h + 1) / 2, w = (w + 1) / 2;
  }
  uint64_t bytes = static_cast<uint64_t>(kVaeLiveTensors * largest * dtype_bytes);
  if (v.mid_block_add_attention) {
    // One head over the h x w cells of the bottom level, its query rows chunked (as the decoder's).
    const int64_t L = h * w, row = L * dtype_bytes;
    int64_t rows = L;
    if (attention_chunk_bytes > 0) rows = std::min(L, std::max<int64_t>(1, attention_chunk_bytes / row));
    bytes += static_cast<uint64_t>(kScoreTensors * rows * row);
  }
  s.activation_bytes = bytes;
  return s;
}

EncodeStage redux_encode_stage(const io::SiglipVisionConfig& e, const io::ReduxEmbedderConfig& m, int64_t images,
                               int64_t dtype_bytes, int64_t attention_chunk_bytes) {
  EncodeStage s;
  const int64_t b = dtype_bytes, L = e.num_positions();
  s.weight_bytes = static_cast<uint64_t>((e.parameters() + m.parameters()) * b);
  // An encoder layer: the stream's tensors, the MLP's two [L, F], the scores; the pixels beside.
  const uint64_t encoder = static_cast<uint64_t>(kTextStreamTensors * L * e.hidden_size * b +
                                                 kMlpTensors * L * e.intermediate_size * b +
                                                 e.num_channels * e.image_size * e.image_size * 4) +
                           kScoreTensors * detail::score_chunk_bytes(e.num_attention_heads, L, L, b, attention_chunk_bytes);
  // The embedder: its input and the [L, 3T] hidden layer before and after the SiLU.
  const uint64_t embedder = static_cast<uint64_t>((L * m.redux_dim + 2 * L * 3 * m.txt_in_features) * b);
  s.activation_bytes = std::max(encoder, embedder) + static_cast<uint64_t>(images * L * m.txt_in_features * b);
  return s;
}

}  // namespace fluxmpi::parallel
