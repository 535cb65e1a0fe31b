#include "ckpt/checkpoint_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/error.h"

namespace fluxmpi::ckpt::detail {
namespace fs = std::filesystem;
using h5::Fault;
using h5::Handle;

namespace {

std::string shape_text(const std::vector<int64_t>& dims) {
  if (dims.empty()) return "scalar";
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += str_cat(i ? ", " : "", dims[i]);
  return s + "]";
}

bool type_matches(hid_t type, StoredType want) {
  H5T_class_t c = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  switch (want) {
    case StoredType::Float32: return c == H5T_FLOAT && size == 4;
    case StoredType::Int32: return c == H5T_INTEGER && size == 4 && H5Tget_sign(type) == H5T_SGN_2;
    case StoredType::Int64: return c == H5T_INTEGER && size == 8 && H5Tget_sign(type) == H5T_SGN_2;
    case StoredType::UInt8: return c == H5T_INTEGER && size == 1 && H5Tget_sign(type) == H5T_SGN_NONE;
    case StoredType::String: return c == H5T_STRING;
  }
  return false;
}

// Memory type and tensor dtype for reading a numeric dataset.
std::pair<hid_t, at::ScalarType> memory_type(StoredType t) {
  switch (t) {
    case StoredType::Float32: return {H5T_NATIVE_FLOAT, at::kFloat};
    case StoredType::Int32: return {H5T_NATIVE_INT32, at::kInt};
    case StoredType::Int64: return {H5T_NATIVE_INT64, at::kLong};
    case StoredType::UInt8: return {H5T_NATIVE_UINT8, at::kByte};
    case StoredType::String: break;
  }
  throw InternalError("memory_type: a string dataset is not numeric");
}

herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

// Whether another process holds the write lock a fluxmpi writer keeps on its checkpoint (an
// open file description lock, see CheckpointWriter); probing takes no lock.
bool held_by_writer(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct flock lk {};
  lk.l_type = F_WRLCK;
  lk.l_whence = SEEK_SET;
  bool held = ::fcntl(fd, F_OFD_GETLK, &lk) == 0 && lk.l_type != F_UNLCK;
  ::close(fd);
  return held;
}

// HDF5 1.14 retries a metadata read whose checksum fails (a SWMR reader meeting a writer's
// half-written entry) with a sleep that doubles from 1 ns each time: its default of 100 attempts
// never ends on a file that is simply damaged. 30 attempts wait about one second in all (1.10
// retries without sleeping); a live writer's entry is whole again long before that.
constexpr unsigned kSwmrReadAttempts = 30;

std::string truncated_message(const std::string& path, const std::string& size, const std::string& recorded) {
  return str_cat(path, ": truncated HDF5 file, shorter than its superblock says (", size,
                 " bytes, the superblock records ", recorded, ")");
}

}  // namespace

void CheckpointFile::check_not_truncated(const std::string& path, hid_t file, bool writer_may_be_live) {
  haddr_t eoa = 0;
  if (H5Fget_eoa(file, &eoa) < 0) {
    h5::take_error();
    return;
  }
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec || static_cast<haddr_t>(size) >= eoa) return;
  // HDF5 1.10 refused such a file when opening it; 1.14 opens it and then waits on the missing
  // metadata. A SWMR writer's end of allocation may run ahead of its data: only a file no writer
  // holds is known to be truncated.
  if (writer_may_be_live && held_by_writer(path)) return;
  throw CheckpointError(truncated_message(path, std::to_string(size), std::to_string(eoa)));
}

std::string CheckpointFile::open_failure(const std::string& path, const std::string& detail) {
  if (detail.find("signature not found") != std::string::npos)
    return str_cat(path, ": not an HDF5 file (no HDF5 signature)");
  if (detail.find("truncated file") != std::string::npos) {
    // HDF5 1.10 says "truncated file: eof = A, sblock->base_addr = 0, stored_eof = B": the same
    // line as check_not_truncated's, whichever HDF5 found it.
    std::smatch m;
    if (std::regex_search(detail, m, std::regex("eof = ([0-9]+).*stored_eof = ([0-9]+)")))
      return truncated_message(path, m[1].str(), m[2].str());
    return str_cat(path, ": truncated HDF5 file, shorter than its superblock says (HDF5: ", detail, ")");
  }
  if (detail.find("unable to lock") != std::string::npos)
    return str_cat(path, ": locked by a process that is creating or writing it (HDF5: ", detail, ")");
  return str_cat(path, ": cannot be opened as an HDF5 file (HDF5: ", detail, ")");
}

Handle CheckpointFile::open_for_reading(const std::string& path) {
  h5::silence_errors();
  std::error_code ec;
  if (!fs::exists(path, ec)) throw CheckpointError(str_cat(path, ": no such file"));
  if (fs::is_directory(path, ec)) throw CheckpointError(str_cat(path, ": is a directory, expected an HDF5 file"));
  if (!std::ifstream(path, std::ios::binary)) throw CheckpointError(str_cat(path, ": cannot be read (permission denied?)"));

  Handle swmr_fapl = h5::plist_handle(H5Pcreate(H5P_FILE_ACCESS), Fault::Checkpoint, path);
  h5::check_status(H5Pset_metadata_read_attempts(swmr_fapl.get(), kSwmrReadAttempts), Fault::Checkpoint, path);
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, swmr_fapl.get());
  if (f >= 0) {
    Handle opened(f, H5Fclose);
    check_not_truncated(path, f, /*writer_may_be_live=*/true);
    return opened;
  }
  std::string detail = h5::take_error();
  // A writer killed before it started SWMR leaves "open for writing" without the SWMR mark, which
  // SWMR readers refuse. The private property h5clear uses lets a read-only open ignore the mark
  // (nothing is written to the file).
  Handle fapl = h5::plist_handle(H5Pcreate(H5P_FILE_ACCESS), Fault::Checkpoint, path);
  hbool_t clear = true;
  if (H5Pset(fapl.get(), "clear_status_flags", &clear) >= 0) {
    f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
    if (f >= 0) {
      Handle opened(f, H5Fclose);
      check_not_truncated(path, f, /*writer_may_be_live=*/true);
      return opened;
    }
    detail = h5::take_error();
  }
  throw CheckpointError(open_failure(path, detail));
}

CheckpointFile::CheckpointFile(std::string path, Handle file, bool swmr_reader)
    : path_(std::move(path)), file_(std::move(file)), swmr_reader_(swmr_reader) {
  validate_root();
  for (int64_t i = 0; i < num_images(); ++i) validate_image(i);
}

const ImageAttributes& CheckpointFile::image(int64_t i) const {
  if (i < 0 || i >= num_images())
    throw CheckpointError(str_cat(path_, ": no image ", i, " (the checkpoint holds ", num_images(), ")"));
  return images_[i];
}

const ImageShape& CheckpointFile::shape(int64_t i) const {
  image(i);
  return shapes_[i];
}

const std::vector<DatasetSpec>& CheckpointFile::specs(int64_t i) const {
  image(i);
  return specs_[i];
}

const DatasetSpec& CheckpointFile::spec(int64_t i, const std::string& name) const {
  for (const DatasetSpec& s : specs(i))
    if (s.name == name) return s;
  throw CheckpointError(str_cat(where(i, name), ": no such dataset in a fluxmpi checkpoint"));
}

std::string CheckpointFile::where(int64_t i, const std::string& name) const {
  return str_cat(path_, ": ", image_object(i, name));
}

void CheckpointFile::validate_root() {
  const hid_t f = file_.get();
  if (!h5::has_attribute(f, "format"))
    throw CheckpointError(str_cat(path_, ": not a fluxmpi checkpoint (the root group has no 'format' attribute)"));
  std::string format = h5::read_string_attribute(f, "format", path_);
  if (format != kFormatName)
    throw CheckpointError(
        str_cat(path_, ": not a fluxmpi checkpoint (attribute 'format' is '", format, "', expected '", kFormatName, "')"));
  attrs_.format_version = h5::read_int_attribute(f, "format_version", path_);
  if (attrs_.format_version != kFormatVersion)
    throw CheckpointError(str_cat(path_, ": format_version ", attrs_.format_version,
                                  " is not supported (this fluxmpi reads version ", kFormatVersion, ")"));
  attrs_.fluxmpi_version = h5::read_string_attribute(f, "fluxmpi_version", path_);
  attrs_.model = h5::read_string_attribute(f, "model", path_);
  attrs_.model_config = h5::read_string_attribute(f, "model_config", path_);
  for (const auto& [name, value] : {std::pair<const char*, std::string*>{"source_transformer", &attrs_.sources.transformer},
                                    {"source_vae", &attrs_.sources.vae},
                                    {"source_text_encoder", &attrs_.sources.text_encoder},
                                    {"source_text_encoder_2", &attrs_.sources.text_encoder_2},
                                    {"source_model_config", &attrs_.sources.model_config},
                                    {"source_transformer_quantization", &attrs_.sources.transformer_quantization}})
    if (h5::has_attribute(f, name)) *value = h5::read_string_attribute(f, name, path_);
  attrs_.created = h5::read_string_attribute(f, "created", path_);
  attrs_.vae_scale_factor = h5::read_int_attribute(f, "vae_scale_factor", path_);
  config_ = stored_transformer_config(attrs_.model_config, str_cat(path_, ": attribute 'model_config'"));

  if (!h5::path_exists(f, "/images")) throw CheckpointError(str_cat(path_, ": /images is missing"));
  Handle images = h5::group_handle(H5Gopen2(f, "/images", H5P_DEFAULT), Fault::Checkpoint,
                                   str_cat(path_, ": /images is not a group"));
  std::vector<std::string> names;
  hsize_t idx = 0;
  h5::check_status(H5Literate(images.get(), H5_INDEX_NAME, H5_ITER_INC, &idx, collect_name, &names),
                   Fault::Checkpoint, str_cat(path_, ": /images cannot be listed"));
  if (names.empty()) throw CheckpointError(str_cat(path_, ": /images holds no image group"));
  for (size_t i = 0; i < names.size(); ++i) {
    std::string expected = image_group(static_cast<int64_t>(i)).substr(std::string("/images/").size());
    if (names[i] != expected)
      throw CheckpointError(str_cat(path_, ": /images: found '", names[i], "' where '", expected,
                                    "' was expected (image groups are numbered 00000, 00001, ... without gaps)"));
  }
  images_.resize(names.size());
  shapes_.resize(names.size());
  specs_.resize(names.size());
}

void CheckpointFile::validate_image(int64_t i) {
  const std::string group_where = str_cat(path_, ": ", image_group(i));
  Handle g = h5::group_handle(H5Gopen2(file_.get(), image_group(i).c_str(), H5P_DEFAULT), Fault::Checkpoint,
                              str_cat(group_where, " is not a group"));
  ImageAttributes& a = images_[i];
  a.prompt = h5::read_string_attribute(g.get(), "prompt", group_where);
  a.prompt_2 = h5::read_string_attribute(g.get(), "prompt_2", group_where);
  a.negative_prompt = h5::read_string_attribute(g.get(), "negative_prompt", group_where);
  a.seed = h5::read_int_attribute(g.get(), "seed", group_where);
  a.height = h5::read_int_attribute(g.get(), "height", group_where);
  a.width = h5::read_int_attribute(g.get(), "width", group_where);
  a.num_inference_steps = h5::read_int_attribute(g.get(), "num_inference_steps", group_where);
  a.guidance_scale = h5::read_float_attribute(g.get(), "guidance_scale", group_where);
  a.true_cfg_scale = h5::read_float_attribute(g.get(), "true_cfg_scale", group_where);
  a.max_sequence_length = h5::read_int_attribute(g.get(), "max_sequence_length", group_where);
  a.dtype = h5::read_string_attribute(g.get(), "dtype", group_where);
  if (h5::has_attribute(g.get(), "loras")) {
    auto loras = io::loras_from_json(h5::read_string_attribute(g.get(), "loras", group_where));
    if (!loras)
      throw CheckpointError(str_cat(group_where, ": attribute 'loras' is not a JSON array of {\"file\", \"scale\"}"));
    a.loras = std::move(*loras);
  }
  a.vae_tiling = h5::has_attribute(g.get(), "vae_tiling") ? h5::read_int_attribute(g.get(), "vae_tiling", group_where) : 0;
  // Patch pipelining came later: a file without these attributes ran every step exact.
  a.patches = h5::has_attribute(g.get(), "patches") ? h5::read_int_attribute(g.get(), "patches", group_where) : 1;
  a.warmup_steps =
      h5::has_attribute(g.get(), "warmup_steps") ? h5::read_int_attribute(g.get(), "warmup_steps", group_where) : 1;
  auto text_or = [&](const char* name, const std::string& fallback) {
    return h5::has_attribute(g.get(), name) ? h5::read_string_attribute(g.get(), name, group_where) : fallback;
  };
  auto int_or = [&](const std::string& name, int64_t fallback) {
    return h5::has_attribute(g.get(), name.c_str()) ? h5::read_int_attribute(g.get(), name.c_str(), group_where) : fallback;
  };
  // Image inputs came later: a file without these attributes is text-to-image.
  a.pipeline = text_or("pipeline", "text2img");
  a.family = text_or("family", "flux1");
  a.strength = h5::has_attribute(g.get(), "strength") ? h5::read_float_attribute(g.get(), "strength", group_where) : 1.0;
  a.t_start = int_or("t_start", 0);
  for (auto [name, in] : {std::pair<std::string, ImageAttributes::Input*>{"input_image", &a.image},
                          {"input_mask", &a.mask},
                          {"input_control_image", &a.control_image}}) {
    in->path = text_or(name.c_str(), "");
    in->height = int_or(name + "_height", 0);
    in->width = int_or(name + "_width", 0);
  }
  a.condition_height = int_or("condition_height", 0);
  a.condition_width = int_or("condition_width", 0);
  // FLUX.1 Redux came later: a file without the attribute has none.
  if (h5::has_attribute(g.get(), "redux")) {
    auto redux = redux_from_json(h5::read_string_attribute(g.get(), "redux", group_where));
    if (!redux)
      throw CheckpointError(str_cat(group_where, ": attribute 'redux' is not a JSON object of {\"model\", \"images\", "
                                                 "\"prompt_embeds_scale\", \"pooled_prompt_embeds_scale\", \"image_tokens\", \"text\"}"));
    a.redux = std::move(*redux);
  }
  if (h5::has_attribute(g.get(), "controlnets")) {
    auto runs = controlnets_from_json(h5::read_string_attribute(g.get(), "controlnets", group_where));
    if (!runs) throw CheckpointError(str_cat(group_where, ": attribute 'controlnets' is not a JSON array of ControlNet runs"));
    a.controlnets = std::move(*runs);
  }
  const int64_t references = int_or("reference_images", 0);
  if (references < 0 || references > kMaxReferenceImages)
    throw CheckpointError(str_cat(group_where, ": attribute 'reference_images' is ", references, ", expected 0 to ",
                                  kMaxReferenceImages));
  a.references.clear();
  for (int64_t k = 0; k < references; ++k) {
    ImageAttributes::Reference r;
    const std::string name = str_cat("input_image_", k);
    r.input.path = h5::read_string_attribute(g.get(), name.c_str(), group_where);
    r.input.height = h5::read_int_attribute(g.get(), (name + "_height").c_str(), group_where);
    r.input.width = h5::read_int_attribute(g.get(), (name + "_width").c_str(), group_where);
    r.height = h5::read_int_attribute(g.get(), str_cat("reference_height_", k).c_str(), group_where);
    r.width = h5::read_int_attribute(g.get(), str_cat("reference_width_", k).c_str(), group_where);
    a.references.push_back(std::move(r));
  }
  shapes_[i] = image_shape(config_, attrs_, a, group_where);
  specs_[i] = dataset_specs(shapes_[i]);
  for (const DatasetSpec& spec : specs_[i]) validate_dataset(i, spec);
  if (!shapes_[i].true_cfg)
    for (const char* extra : {"text/negative_prompt_embeds", "text/negative_pooled_prompt_embeds", "text/negative_input_ids",
                              "text/negative_attention_mask"})
      if (h5::path_exists(g.get(), extra))
        throw CheckpointError(str_cat(where(i, extra), ": present although true CFG is off (true_cfg_scale ",
                                      a.true_cfg_scale, ", negative_prompt '", a.negative_prompt, "')"));
  state(i);
}

void CheckpointFile::validate_dataset(int64_t i, const DatasetSpec& spec) {
  const std::string w = where(i, spec.name);
  if (!h5::path_exists(file_.get(), image_object(i, spec.name)))
    throw CheckpointError(str_cat(w, ": missing (expected ", spec_text(spec), ")"));
  Handle d = h5::dataset_handle(H5Dopen2(file_.get(), image_object(i, spec.name).c_str(), H5P_DEFAULT),
                                Fault::Checkpoint, str_cat(w, ": is not a dataset"));
  Handle type = h5::type_handle(H5Dget_type(d.get()), Fault::Checkpoint, w);
  Handle space = h5::space_handle(H5Dget_space(d.get()), Fault::Checkpoint, w);
  std::vector<int64_t> dims = h5::extent(space.get());
  bool ok = type_matches(type.get(), spec.type) && dims.size() == spec.shape.size();
  for (size_t k = 0; ok && k < dims.size(); ++k)
    if (!(spec.extendable && k == 0) && dims[k] != spec.shape[k]) ok = false;
  if (!ok)
    throw CheckpointError(
        str_cat(w, ": expected ", spec_text(spec), ", got ", h5::type_name(type.get()), " ", shape_text(dims)));
  if (spec.extendable && h5::max_extent(space.get())[0] != -1)
    throw CheckpointError(str_cat(w, ": not extendable (maximum shape ", shape_text(h5::max_extent(space.get())),
                                  "); rows could not be appended"));
}

Handle CheckpointFile::open_dataset(int64_t i, const std::string& name, Fault fault) const {
  const std::string w = where(i, name);
  Handle d = h5::dataset_handle(H5Dopen2(file_.get(), image_object(i, name).c_str(), H5P_DEFAULT), fault,
                                str_cat(w, ": cannot be opened"));
  // A SWMR reader must drop its cached metadata to see the writer's appends.
  if (swmr_reader_) h5::check_status(H5Drefresh(d.get()), fault, str_cat(w, ": cannot be refreshed"));
  return d;
}

at::Tensor CheckpointFile::read(int64_t i, const std::string& name) const {
  const DatasetSpec& s = spec(i, name);
  auto [mem, dtype] = memory_type(s.type);
  Handle d = open_dataset(i, name, Fault::Checkpoint);
  Handle space = h5::space_handle(H5Dget_space(d.get()), Fault::Checkpoint, where(i, name));
  at::Tensor t = at::empty(h5::extent(space.get()), at::TensorOptions().dtype(dtype));
  if (t.numel() > 0)
    h5::check_status(H5Dread(d.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()), Fault::Checkpoint,
                     str_cat(where(i, name), ": cannot be read"));
  return t;
}

at::Tensor CheckpointFile::read_rows(int64_t i, const std::string& name, int64_t first, int64_t count) const {
  const DatasetSpec& s = spec(i, name);
  FLUX_CHECK(s.extendable, name, " has no rows");
  auto [mem, dtype] = memory_type(s.type);
  std::vector<int64_t> shape = s.shape;
  shape[0] = count;
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
  if (count == 0) return t;
  const std::string w = where(i, name);
  Handle d = open_dataset(i, name, Fault::Checkpoint);
  Handle file_space = h5::space_handle(H5Dget_space(d.get()), Fault::Checkpoint, w);
  std::vector<hsize_t> start(shape.size(), 0), block(shape.begin(), shape.end());
  start[0] = static_cast<hsize_t>(first);
  if (h5::extent(file_space.get())[0] < first + count)
    throw CheckpointError(str_cat(w, ": rows ", first, "..", first + count - 1, " are not stored"));
  h5::check_status(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, block.data(), nullptr),
                   Fault::Checkpoint, w);
  Handle mem_space = h5::space_handle(H5Screate_simple(static_cast<int>(block.size()), block.data(), nullptr),
                                      Fault::Checkpoint, w);
  h5::check_status(H5Dread(d.get(), mem, mem_space.get(), file_space.get(), H5P_DEFAULT, t.data_ptr()),
                   Fault::Checkpoint, str_cat(w, ": rows cannot be read"));
  return t;
}

std::string CheckpointFile::read_status_text(int64_t i) const {
  const std::string w = where(i, "status");
  Handle d = open_dataset(i, "status", Fault::Checkpoint);
  Handle type = h5::type_handle(H5Dget_type(d.get()), Fault::Checkpoint, w);
  if (H5Tis_variable_str(type.get()) > 0) {
    char* p = nullptr;
    h5::check_status(H5Dread(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &p), Fault::Checkpoint,
                     str_cat(w, ": cannot be read"));
    std::string out = p != nullptr ? std::string(p) : std::string();
    H5free_memory(p);
    return out;
  }
  std::string out(H5Tget_size(type.get()), '\0');
  h5::check_status(H5Dread(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), Fault::Checkpoint,
                   str_cat(w, ": cannot be read"));
  out.resize(std::min(out.size(), out.find('\0')));
  return out;
}

CheckpointFile::Rows CheckpointFile::rows(int64_t i) const {
  Rows r;
  // last_step first: the writer flushes a row before it publishes last_step, so every row up to
  // the last_step read here is visible to the reads below.
  r.last_step = read(i, "last_step").item<int64_t>();
  const int64_t steps = shape(i).steps;
  if (r.last_step < -1 || r.last_step >= steps)
    throw CheckpointError(str_cat(where(i, "last_step"), ": is ", r.last_step, ", outside -1..", steps - 1,
                                  " (num_inference_steps ", steps, ")"));
  int64_t n = -1;
  for (const char* name : {"latents/steps", "latents/noise_pred", "latents/step_index"}) {
    Handle d = open_dataset(i, name, Fault::Checkpoint);
    Handle space = h5::space_handle(H5Dget_space(d.get()), Fault::Checkpoint, where(i, name));
    int64_t rows = h5::extent(space.get())[0];
    n = n < 0 ? rows : std::min(n, rows);
  }
  at::Tensor index = read_rows(i, "latents/step_index", 0, n);
  const int32_t* v = index.data_ptr<int32_t>();
  // Committed rows: increasing steps up to last_step. An append cut by a kill leaves a row whose
  // step_index is still the fill value -1 (or a step past last_step): the prefix ends there.
  for (int64_t k = 0; k < n; ++k) {
    int64_t s = v[k];
    if (s < 0 || s > r.last_step || (!r.steps.empty() && s <= r.steps.back())) break;
    r.steps.push_back(s);
  }
  if (r.last_step >= 0 && (r.steps.empty() || r.steps.back() != r.last_step)) {
    std::string stored;
    for (int64_t k = 0; k < n; ++k) stored += str_cat(k ? ", " : "", v[k]);
    throw CheckpointError(str_cat(where(i, "last_step"), ": is ", r.last_step,
                                  " but latents/step_index has no row for that step (stored: [", stored, "])"));
  }
  return r;
}

ImageState CheckpointFile::state(int64_t i) const {
  ImageState s;
  s.status = parse_status(read_status_text(i), where(i, "status"));
  Rows r = rows(i);
  s.last_step = r.last_step;
  s.rows = static_cast<int64_t>(r.steps.size());
  return s;
}

std::vector<int64_t> CheckpointFile::committed_steps(int64_t i) const { return rows(i).steps; }

}  // namespace fluxmpi::ckpt::detail
