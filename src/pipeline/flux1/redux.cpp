#include "pipeline/flux1/redux.h"

#include <cstring>

#include "core/error.h"
#include "core/units.h"
#include "models/common/attention.h"
#include "pipeline/job_inputs.h"
#include "pipeline/redux_stage.h"

namespace fluxmpi::pipeline {
namespace {

// One scale per image: none given -> 1, one -> every image's.
std::vector<double> per_image(const std::vector<double>& given, size_t images) {
  if (given.empty()) return std::vector<double>(images, 1.0);
  if (given.size() == 1) return std::vector<double>(images, given.front());
  return given;
}

std::string scales_text(const std::vector<double>& s) {
  std::string out;
  for (double v : s) out += str_cat(out.empty() ? "" : ",", v);
  return out;
}

}  // namespace

std::optional<ReduxJob> ReduxJob::resolve(RunConfig& c, const ckpt::CheckpointReader* checkpoint) {
  // --resume: what the command line leaves out comes from the checkpoint (every image has the same).
  if (checkpoint != nullptr && checkpoint->num_images() > 0 && checkpoint->attributes(0).redux.enabled()) {
    const ckpt::ImageAttributes::Redux& r = checkpoint->attributes(0).redux;
    if (!c.was_given("redux-model")) c.redux_model = r.model;
    if (!c.was_given("redux-image")) {
      c.redux_images.clear();
      for (const auto& in : r.images) c.redux_images.push_back(in.path);
    }
    if (!c.was_given("redux-prompt-scale")) c.redux_prompt_scales = r.prompt_scales;
    if (!c.was_given("redux-pooled-scale")) c.redux_pooled_scales = r.pooled_scales;
    if (c.prompts.empty()) c.redux_zero_text = r.zero_text;  // the prompts come from the checkpoint too
  }
  if (c.redux_model.empty()) return std::nullopt;
  if (c.true_cfg_enabled())
    throw UsageError("--true-cfg: a FLUX.1 Redux job has no negative side (FluxPriorReduxPipeline makes the positive "
                     "embeddings only); leave out --true-cfg or --negative-prompt");
  if (c.redux_images.empty()) throw UsageError("--redux-model needs at least one --redux-image");
  // The prior encodes the prompt at 512 tokens whatever the model (FLUX.1-schnell's default is 256).
  if (!c.max_sequence_length) c.max_sequence_length = 512;
  ReduxJob job{io::ReduxDir(c.redux_model)};
  const size_t n = c.redux_images.size();
  job.attributes_.model = c.redux_model;
  job.attributes_.prompt_scales = per_image(c.redux_prompt_scales, n);
  job.attributes_.pooled_scales = per_image(c.redux_pooled_scales, n);
  job.attributes_.image_tokens = job.tokens();
  job.attributes_.zero_text = c.redux_zero_text;
  for (const std::string& path : c.redux_images) {
    job.images_.push_back(decode_input(path, "--redux-image"));
    job.attributes_.images.push_back({path, job.images_.back().height, job.images_.back().width});
  }
  return job;
}

void ReduxJob::check_weights(const io::ModelDir& model) const {
  check_redux(dir_, model.transformer_config(), model.label("transformer/config.json"));
}

void ReduxJob::plan(parallel::PlanRequest& request, bool encodes) {
  const int64_t L = tokens();
  // Patch pipelining's key/value buffers hold every text token too.
  if (request.kv_cache_block_bytes > 0) {
    const uint64_t tokens_before = static_cast<uint64_t>(request.image_tokens + request.text_tokens);
    request.kv_cache_block_bytes = request.kv_cache_block_bytes / tokens_before * (tokens_before + static_cast<uint64_t>(L));
  }
  request.text_tokens += L;
  if (encodes) {
    stage_ = parallel::redux_encode_stage(dir_.encoder_config(), dir_.embedder_config(),
                                          static_cast<int64_t>(images_.size()), request.dtype_bytes,
                                          nn::kAttentionChunkBytes);
    request.redux_encode_bytes = stage_->total();
  }
}

std::string ReduxJob::describe() const {
  std::string s = str_cat("redux: ", dir_.root(), ", ", images_.size(), " image", images_.size() == 1 ? "" : "s", " (");
  for (size_t k = 0; k < images_.size(); ++k)
    s += str_cat(k ? ", " : "", attributes_.images[k].path, " ", images_[k].width, "x", images_[k].height);
  s += str_cat("), ", tokens(), " tokens appended to ", attributes_.zero_text ? "zeros (no prompt)" : "the prompt",
               ", prompt_embeds_scale ", scales_text(attributes_.prompt_scales), ", pooled_prompt_embeds_scale ",
               scales_text(attributes_.pooled_scales), "\n");
  if (stage_)
    s += str_cat("Redux stage (rank 0, after the text encoders, before its blocks load): SigLIP + embedder ",
                 format_bytes(stage_->weight_bytes), " + activations ", format_bytes(stage_->activation_bytes), " = ",
                 format_bytes(stage_->total()), "\n");
  return s;
}

void ReduxJob::check_unchanged(const ckpt::CheckpointReader& r) const {
  for (int64_t i = 0; i < r.num_images(); ++i) {
    if (r.shape(i).redux_images != static_cast<int64_t>(images_.size()) ||
        r.state(i).status == ckpt::ImageStatus::Encoding)
      continue;  // no pixels stored yet (a different count is a difference check_matches names)
    for (size_t k = 0; k < images_.size(); ++k) {
      const at::Tensor t = r.dataset(i, str_cat("inputs/redux_image_", k)).contiguous();
      const io::Image8& now = images_[k];
      if (static_cast<size_t>(t.numel()) != now.pixels.size() ||
          std::memcmp(t.data_ptr<uint8_t>(), now.pixels.data(), now.pixels.size()) != 0)
        throw CheckpointError(str_cat(r.path(), ": Redux image '", attributes_.images[k].path,
                                      "' has changed since the checkpoint was written"));
    }
    return;  // every image of the job stores the same references
  }
}

int64_t ReduxJob::encode(const PreparedRun& run, at::ScalarType dtype, at::Device device, PromptEmbeddings& out) {
  int64_t bytes = 0;
  {
    const ReduxEncoder encoder(dir_, dtype, device);
    embeds_ = encoder.encode(images_);
    bytes = encoder.parameter_bytes();
  }  // SigLIP and the embedder are freed before the transformer slice loads
  const int64_t msl = *run.config.max_sequence_length;
  for (size_t i = 0; i < out.text.size() && i < run.progress.size(); ++i) {
    if (!run.progress[i].needs_encoding) continue;
    PromptEmbedding& e = out.text[i];
    const bool zeros = attributes_.zero_text;
    const siglip::ReduxPrompt p =
        redux_text(zeros ? at::Tensor() : e.prompt_embeds, zeros ? at::Tensor() : e.pooled, msl,
                   run.model->transformer_config(), embeds_, attributes_.prompt_scales, attributes_.pooled_scales);
    e.prompt_embeds = p.prompt_embeds;
    e.pooled = p.pooled;
  }
  return bytes;
}

void ReduxJob::to_checkpoint(ckpt::TextEmbeddings& text) const {
  FLUX_CHECK(embeds_.defined(), "Redux: the images were not encoded");
  text.redux_image_embeds = embeds_;
  for (const io::Image8& im : images_)
    text.redux_images.push_back(
        at::from_blob(const_cast<uint8_t*>(im.pixels.data()), {im.height, im.width, 3}, at::kByte).clone());
}

}  // namespace fluxmpi::pipeline
