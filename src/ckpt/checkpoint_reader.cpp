#include "ckpt/checkpoint_reader.h"

#include <cstring>

#include "ckpt/checkpoint_file.h"
#include "core/error.h"

namespace fluxmpi::ckpt {

CheckpointReader CheckpointReader::open(const std::string& path) {
  h5::Handle f = detail::CheckpointFile::open_for_reading(path);
  return CheckpointReader(std::make_shared<detail::CheckpointFile>(path, std::move(f), /*swmr_reader=*/true));
}

CheckpointReader::CheckpointReader(std::shared_ptr<detail::CheckpointFile> file) : file_(std::move(file)) {}
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;
CheckpointReader::~CheckpointReader() = default;

const std::string& CheckpointReader::path() const { return file_->path(); }
const FileAttributes& CheckpointReader::file() const { return file_->file(); }
const io::TransformerConfig& CheckpointReader::transformer_config() const { return file_->config(); }
int64_t CheckpointReader::num_images() const { return file_->num_images(); }
const std::vector<ImageAttributes>& CheckpointReader::attributes() const { return file_->images(); }
const ImageAttributes& CheckpointReader::attributes(int64_t image) const { return file_->image(image); }
const ImageShape& CheckpointReader::shape(int64_t image) const { return file_->shape(image); }
ImageState CheckpointReader::state(int64_t image) const { return file_->state(image); }

TextEmbeddings CheckpointReader::text(int64_t image) const {
  TextEmbeddings t;
  t.prompt_embeds = file_->read(image, "text/prompt_embeds");
  if (shape(image).flux2) {
    t.input_ids = file_->read(image, "text/input_ids").to(at::kLong);
    t.attention_mask = file_->read(image, "text/attention_mask").to(at::kLong);
    if (shape(image).true_cfg) {
      t.negative_prompt_embeds = file_->read(image, "text/negative_prompt_embeds");
      t.negative_input_ids = file_->read(image, "text/negative_input_ids").to(at::kLong);
      t.negative_attention_mask = file_->read(image, "text/negative_attention_mask").to(at::kLong);
    }
    return t;
  }
  t.pooled_prompt_embeds = file_->read(image, "text/pooled_prompt_embeds");
  if (shape(image).token_ids) {  // Redux without a prompt stores no ids
    t.clip_input_ids = file_->read(image, "text/clip_input_ids").to(at::kLong);
    t.t5_input_ids = file_->read(image, "text/t5_input_ids").to(at::kLong);
  }
  if (shape(image).redux_images > 0) t.redux_image_embeds = file_->read(image, "text/redux_image_embeds");
  if (shape(image).true_cfg) {
    t.negative_prompt_embeds = file_->read(image, "text/negative_prompt_embeds");
    t.negative_pooled_prompt_embeds = file_->read(image, "text/negative_pooled_prompt_embeds");
  }
  return t;
}

at::Tensor CheckpointReader::timesteps(int64_t image) const { return file_->read(image, "schedule/timesteps"); }
at::Tensor CheckpointReader::sigmas(int64_t image) const { return file_->read(image, "schedule/sigmas"); }
at::Tensor CheckpointReader::initial_latents(int64_t image) const { return file_->read(image, "latents/initial"); }
std::vector<int64_t> CheckpointReader::step_indices(int64_t image) const { return file_->committed_steps(image); }

StepRow CheckpointReader::row(int64_t image, int64_t row) const {
  std::vector<int64_t> steps = file_->committed_steps(image);
  if (row < 0 || row >= static_cast<int64_t>(steps.size()))
    throw CheckpointError(str_cat(file_->where(image, "latents/steps"), ": no committed row ", row, " (",
                                  steps.size(), " committed)"));
  StepRow r;
  r.step = steps[row];
  r.latents = file_->read_rows(image, "latents/steps", row, 1)[0];
  r.noise_pred = file_->read_rows(image, "latents/noise_pred", row, 1)[0];
  return r;
}

StepRow CheckpointReader::step(int64_t image, int64_t step) const {
  std::vector<int64_t> steps = file_->committed_steps(image);
  for (size_t k = 0; k < steps.size(); ++k)
    if (steps[k] == step) return row(image, static_cast<int64_t>(k));
  std::string stored;
  for (size_t k = 0; k < steps.size(); ++k) stored += str_cat(k ? ", " : "", steps[k]);
  throw CheckpointError(str_cat(file_->where(image, "latents/steps"), ": step ", step, " is not stored (stored steps: [",
                                stored, "])"));
}

at::Tensor CheckpointReader::latest_latents(int64_t image) const {
  int64_t rows = static_cast<int64_t>(file_->committed_steps(image).size());
  if (rows == 0) return initial_latents(image);
  return file_->read_rows(image, "latents/steps", rows - 1, 1)[0];
}

io::RgbImage CheckpointReader::image(int64_t image) const {
  at::Tensor t = file_->read(image, "image").contiguous();
  io::RgbImage out;
  out.height = t.size(0);
  out.width = t.size(1);
  out.pixels.resize(static_cast<size_t>(t.numel()));
  std::memcpy(out.pixels.data(), t.data_ptr<uint8_t>(), out.pixels.size());
  return out;
}

at::Tensor CheckpointReader::dataset(int64_t image, const std::string& name) const {
  const DatasetSpec& s = file_->spec(image, name);
  if (s.type == StoredType::String)
    throw CheckpointError(str_cat(file_->where(image, name), ": a string, not numeric data"));
  if (s.extendable) {
    int64_t rows = static_cast<int64_t>(file_->committed_steps(image).size());
    return file_->read_rows(image, name, 0, rows);
  }
  return file_->read(image, name);
}

}  // namespace fluxmpi::ckpt
