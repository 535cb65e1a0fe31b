#include "ckpt/checkpoint_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "ckpt/checkpoint_file.h"
#include "core/error.h"
#include "core/log.h"
#include "core/version.h"

namespace fluxmpi::ckpt {
namespace fs = std::filesystem;
using h5::Fault;
using h5::Handle;

namespace {

// The writer's liveness mark: an open-file-description lock on the checkpoint, held for the
// writer's lifetime and dropped by the kernel when the process dies. HDF5 itself unlocks the file
// once SWMR writing starts (readers need it), so without this a second --resume could open a file
// that a running job still writes. OFD locks are independent of HDF5's flock() and are not lost
// when some other descriptor of the file is closed. Where the file system has no such locks
// (some network file systems) the check is skipped.
class WriterLock {
 public:
  WriterLock() = default;
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;
  ~WriterLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  /// False when another process holds the lock.
  bool acquire(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd_ < 0) return true;
    struct flock lk {};
    lk.l_type = F_WRLCK;
    lk.l_whence = SEEK_SET;
    if (::fcntl(fd_, F_OFD_SETLK, &lk) == 0) return true;
    int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err == EAGAIN || err == EACCES) return false;
    log::debug(path, ": no writer lock (", std::strerror(err), "); concurrent resumes are not detected");
    return true;
  }

 private:
  int fd_ = -1;
};

hid_t file_type(StoredType t) {
  switch (t) {
    case StoredType::Float32: return H5T_IEEE_F32LE;
    case StoredType::Int32: return H5T_STD_I32LE;
    case StoredType::Int64: return H5T_STD_I64LE;
    case StoredType::UInt8: return H5T_STD_U8LE;
    case StoredType::String: break;
  }
  throw InternalError("file_type: strings have their own type");
}

std::string dims_text(at::IntArrayRef dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += str_cat(i ? ", " : "", dims[i]);
  return s + "]";
}

// The tensor as a contiguous CPU tensor of `dtype` with exactly `shape` (a leading batch
// dimension of 1 is dropped). A mismatch is the caller's bug.
at::Tensor prepare(const at::Tensor& t, const std::vector<int64_t>& shape, at::ScalarType dtype, const std::string& what) {
  if (!t.defined()) throw InternalError(str_cat("checkpoint: ", what, ": no tensor given"));
  at::Tensor x = t;
  if (x.dim() == static_cast<int64_t>(shape.size()) + 1 && x.size(0) == 1) x = x[0];
  if (x.sizes() != at::IntArrayRef(shape))
    throw InternalError(str_cat("checkpoint: ", what, ": expected shape ", dims_text(shape), ", got ", dims_text(t.sizes())));
  if (dtype == at::kInt && !at::isIntegralType(x.scalar_type(), /*includeBool=*/false))
    throw InternalError(str_cat("checkpoint: ", what, ": token ids must be integers, got ", x.scalar_type()));
  if (dtype == at::kFloat && !at::isFloatingType(x.scalar_type()))
    throw InternalError(str_cat("checkpoint: ", what, ": expected floating point data, got ", x.scalar_type()));
  return x.to(at::kCPU).to(dtype).contiguous();
}

// The name a checkpoint is created under before publish() moves it to `path`: in the same folder
// (a rename within one file system), hidden, and naming the creating process, so that a file left
// by a creator killed in that short window is recognisable (`.run.h5.creating-<pid>`).
std::string creation_name(const std::string& path) {
  const fs::path p(path);
  return (p.parent_path() / str_cat(".", p.filename().string(), ".creating-", ::getpid())).string();
}

// Moves the finished file `tmp` to `path` without ever replacing a file there (another creator
// may have made one since create() looked): renameat2(RENAME_NOREPLACE), or where the file system
// lacks it, a hard link plus unlink (link() refuses an existing name as well); a file system with
// neither gets a plain rename after a last look.
void publish(const std::string& tmp, const std::string& path) {
  auto exists_error = [&] {
    return UsageError(str_cat("--checkpoint '", path, "' already exists; continue it with --resume ", path, " or remove it"));
  };
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0) return;
  int err = errno;
  if (err == EEXIST) throw exists_error();
  if (err == EINVAL || err == ENOSYS || err == ENOTSUP) {
    if (::link(tmp.c_str(), path.c_str()) == 0) {
      ::unlink(tmp.c_str());
      return;
    }
    err = errno;
    if (err == EEXIST) throw exists_error();
    if (err == EPERM || err == ENOTSUP || err == EOPNOTSUPP) {
      std::error_code ec;
      if (fs::exists(path, ec)) throw exists_error();
      if (::rename(tmp.c_str(), path.c_str()) == 0) return;
      err = errno;
    }
  }
  throw IoError(str_cat(path, ": cannot create the checkpoint (renaming '", tmp, "' into place: ", std::strerror(err), ")"));
}

Handle latest_format_fapl(Fault fault, const std::string& path) {
  Handle fapl = h5::plist_handle(H5Pcreate(H5P_FILE_ACCESS), fault, path);
  // The 1.10 file format, the oldest that SWMR writing takes, and the newest 1.10 reads: a file
  // written with HDF5 1.14 (Debian 13) is read by 1.10 (Debian 12), and the other way round.
  // LATEST would mean "1.14's format" there.
  h5::check_status(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110), fault, path);
  return fapl;
}

// Linux copies a write() into the page cache one 4 KiB page at a time and stops between pages
// when the process gets SIGKILL, so a metadata entry that straddles a page boundary can be left
// half old, half new: its checksum then fails for every later reader, and --resume refuses the
// file. The extendable datasets' object headers are rewritten at every step (H5Dset_extent), and
// with HDF5's default file space some of them straddle a boundary in every job (which ones
// depends on the job's datasets); a killed writer then left an unreadable checkpoint once in a
// few hundred kills. Paged file space aggregation places every metadata entry smaller than a page
// inside one page (docs/hdf5-format.md, "Why the file is paged"); a page of 4 KiB also lies
// inside one page of any larger page size.
constexpr hsize_t kFileSpacePage = 4096;

Handle paged_fcpl(const std::string& path) {
  Handle fcpl = h5::plist_handle(H5Pcreate(H5P_FILE_CREATE), Fault::Io, path);
  h5::check_status(H5Pset_file_space_strategy(fcpl.get(), H5F_FSPACE_STRATEGY_PAGE, /*persist=*/false,
                                              /*threshold=*/1),
                   Fault::Io, path);
  h5::check_status(H5Pset_file_space_page_size(fcpl.get(), kFileSpacePage), Fault::Io, path);
  return fcpl;
}

}  // namespace

struct CheckpointWriter::Impl {
  std::string path;
  WriterLock lock;
  std::shared_ptr<detail::CheckpointFile> file;
  std::unique_ptr<CheckpointReader> reader;
  std::vector<int64_t> rows;       // committed rows per image
  std::vector<int64_t> last_step;  // per image
  bool closed = false;

  std::string where(int64_t i, const std::string& name) const { return file->where(i, name); }
  void check_image(int64_t i) const {
    if (i < 0 || i >= file->num_images())
      throw InternalError(str_cat("checkpoint ", path, ": no image ", i, " (", file->num_images(), " in the job)"));
    if (closed) throw InternalError(str_cat("checkpoint ", path, ": written after close()"));
  }
  void write_whole(int64_t i, const std::string& name, const at::Tensor& t, at::ScalarType dtype, hid_t mem_type);
  void write_scalar_int64(int64_t i, const std::string& name, int64_t value);
  void write_status(int64_t i, ImageStatus status);
  void append_row(int64_t i, const std::string& name, int64_t row, const at::Tensor& t, hid_t mem_type);
  void flush();
  void shrink_to_committed(int64_t i);
};

void CheckpointWriter::Impl::write_whole(int64_t i, const std::string& name, const at::Tensor& t, at::ScalarType dtype,
                                         hid_t mem_type) {
  const DatasetSpec& spec = file->spec(i, name);
  at::Tensor x = prepare(t, spec.shape, dtype, image_object(i, name));
  Handle d = file->open_dataset(i, name, Fault::Io);
  h5::check_status(H5Dwrite(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data_ptr()), Fault::Io,
                   str_cat(where(i, name), ": cannot be written"));
}

void CheckpointWriter::Impl::write_scalar_int64(int64_t i, const std::string& name, int64_t value) {
  Handle d = file->open_dataset(i, name, Fault::Io);
  h5::check_status(H5Dwrite(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &value), Fault::Io,
                   str_cat(where(i, name), ": cannot be written"));
}

void CheckpointWriter::Impl::write_status(int64_t i, ImageStatus status) {
  Handle d = file->open_dataset(i, "status", Fault::Io);
  Handle type = h5::fixed_string_type(kStatusBytes);
  char buf[kStatusBytes] = {};
  std::strncpy(buf, status_name(status), sizeof(buf) - 1);
  h5::check_status(H5Dwrite(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf), Fault::Io,
                   str_cat(where(i, "status"), ": cannot be written"));
}

void CheckpointWriter::Impl::append_row(int64_t i, const std::string& name, int64_t row, const at::Tensor& t,
                                        hid_t mem_type) {
  const std::string w = where(i, name);
  Handle d = file->open_dataset(i, name, Fault::Io);
  std::vector<hsize_t> dims(file->spec(i, name).shape.begin(), file->spec(i, name).shape.end());
  dims[0] = static_cast<hsize_t>(row + 1);
  h5::check_status(H5Dset_extent(d.get(), dims.data()), Fault::Io, str_cat(w, ": cannot be extended"));
  Handle space = h5::space_handle(H5Dget_space(d.get()), Fault::Io, w);
  std::vector<hsize_t> start(dims.size(), 0), count = dims;
  start[0] = static_cast<hsize_t>(row);
  count[0] = 1;
  h5::check_status(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
                   Fault::Io, w);
  Handle mem = h5::space_handle(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), Fault::Io, w);
  h5::check_status(H5Dwrite(d.get(), mem_type, mem.get(), space.get(), H5P_DEFAULT, t.data_ptr()), Fault::Io,
                   str_cat(w, ": row ", row, " cannot be written"));
}

void CheckpointWriter::Impl::flush() {
  h5::check_status(H5Fflush(file->id(), H5F_SCOPE_GLOBAL), Fault::Io, str_cat(path, ": flush failed"));
}

void CheckpointWriter::Impl::shrink_to_committed(int64_t i) {
  for (const char* name : {"latents/steps", "latents/noise_pred", "latents/step_index"}) {
    Handle d = file->open_dataset(i, name, Fault::Io);
    Handle space = h5::space_handle(H5Dget_space(d.get()), Fault::Io, where(i, name));
    std::vector<int64_t> ext = h5::extent(space.get());
    if (ext[0] == rows[i]) continue;
    log::info(where(i, name), ": removing ", ext[0] - rows[i], " unfinished row(s) left by an interrupted run");
    std::vector<hsize_t> dims(ext.begin(), ext.end());
    dims[0] = static_cast<hsize_t>(rows[i]);
    h5::check_status(H5Dset_extent(d.get(), dims.data()), Fault::Io, str_cat(where(i, name), ": cannot be shrunk"));
  }
}

namespace {

void create_layout(hid_t f, const FileAttributes& file, const std::vector<ImageAttributes>& images,
                   const std::vector<ImageShape>& shapes, const std::string& path) {
  h5::write_attribute(f, "format", std::string(kFormatName), path);
  h5::write_attribute(f, "format_version", kFormatVersion, path);
  h5::write_attribute(f, "fluxmpi_version", file.fluxmpi_version.empty() ? std::string(kVersion) : file.fluxmpi_version,
                      path);
  h5::write_attribute(f, "model", file.model, path);
  h5::write_attribute(f, "model_config", file.model_config, path);
  for (const auto& [name, value] : {std::pair<const char*, const std::string*>{"source_transformer", &file.sources.transformer},
                                    {"source_vae", &file.sources.vae},
                                    {"source_text_encoder", &file.sources.text_encoder},
                                    {"source_text_encoder_2", &file.sources.text_encoder_2},
                                    {"source_model_config", &file.sources.model_config},
                                    {"source_transformer_quantization", &file.sources.transformer_quantization}})
    if (!value->empty()) h5::write_attribute(f, name, *value, path);
  h5::write_attribute(f, "vae_scale_factor", file.vae_scale_factor, path);
  h5::write_attribute(f, "created", file.created.empty() ? iso8601_now() : file.created, path);

  Handle lcpl = h5::plist_handle(H5Pcreate(H5P_LINK_CREATE), Fault::Io, path);
  h5::check_status(H5Pset_create_intermediate_group(lcpl.get(), 1), Fault::Io, path);
  Handle status_type = h5::fixed_string_type(kStatusBytes);
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string group = image_group(static_cast<int64_t>(i));
    const std::string where = str_cat(path, ": ", group);
    Handle g = h5::group_handle(H5Gcreate2(f, group.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), Fault::Io,
                                str_cat(where, ": cannot be created"));
    const ImageAttributes& a = images[i];
    h5::write_attribute(g.get(), "prompt", a.prompt, where);
    h5::write_attribute(g.get(), "prompt_2", a.prompt_2, where);
    h5::write_attribute(g.get(), "negative_prompt", a.negative_prompt, where);
    h5::write_attribute(g.get(), "seed", a.seed, where);
    h5::write_attribute(g.get(), "height", a.height, where);
    h5::write_attribute(g.get(), "width", a.width, where);
    h5::write_attribute(g.get(), "num_inference_steps", a.num_inference_steps, where);
    h5::write_attribute(g.get(), "guidance_scale", a.guidance_scale, where);
    h5::write_attribute(g.get(), "true_cfg_scale", a.true_cfg_scale, where);
    h5::write_attribute(g.get(), "max_sequence_length", a.max_sequence_length, where);
    h5::write_attribute(g.get(), "dtype", a.dtype, where);
    h5::write_attribute(g.get(), "loras", io::loras_to_json(a.loras), where);
    h5::write_attribute(g.get(), "vae_tiling", a.vae_tiling, where);
    h5::write_attribute(g.get(), "patches", a.patches, where);
    h5::write_attribute(g.get(), "warmup_steps", a.warmup_steps, where);
    h5::write_attribute(g.get(), "pipeline", a.pipeline, where);
    h5::write_attribute(g.get(), "family", a.family, where);
    h5::write_attribute(g.get(), "strength", a.strength, where);
    h5::write_attribute(g.get(), "t_start", a.t_start, where);
    for (auto [name, in] : {std::pair<std::string, const ImageAttributes::Input*>{"input_image", &a.image},
                            {"input_mask", &a.mask},
                            {"input_control_image", &a.control_image}}) {
      if (in->path.empty()) continue;
      h5::write_attribute(g.get(), name.c_str(), in->path, where);
      h5::write_attribute(g.get(), (name + "_height").c_str(), in->height, where);
      h5::write_attribute(g.get(), (name + "_width").c_str(), in->width, where);
    }
    if (a.redux.enabled()) h5::write_attribute(g.get(), "redux", redux_to_json(a.redux), where);
    if (a.condition_height > 0) {
      h5::write_attribute(g.get(), "condition_height", a.condition_height, where);
      h5::write_attribute(g.get(), "condition_width", a.condition_width, where);
    }
    if (!a.controlnets.empty()) h5::write_attribute(g.get(), "controlnets", controlnets_to_json(a.controlnets), where);
    if (!a.references.empty()) {
      h5::write_attribute(g.get(), "reference_images", static_cast<int64_t>(a.references.size()), where);
      for (size_t k = 0; k < a.references.size(); ++k) {
        const ImageAttributes::Reference& r = a.references[k];
        const std::string name = str_cat("input_image_", k);
        h5::write_attribute(g.get(), name.c_str(), r.input.path, where);
        h5::write_attribute(g.get(), (name + "_height").c_str(), r.input.height, where);
        h5::write_attribute(g.get(), (name + "_width").c_str(), r.input.width, where);
        h5::write_attribute(g.get(), str_cat("reference_height_", k).c_str(), r.height, where);
        h5::write_attribute(g.get(), str_cat("reference_width_", k).c_str(), r.width, where);
      }
    }

    for (const DatasetSpec& spec : dataset_specs(shapes[i])) {
      const std::string name = image_object(static_cast<int64_t>(i), spec.name);
      const std::string w = str_cat(path, ": ", name);
      Handle dcpl = h5::plist_handle(H5Pcreate(H5P_DATASET_CREATE), Fault::Io, w);
      std::vector<hsize_t> dims(spec.shape.begin(), spec.shape.end());
      std::vector<hsize_t> max = dims;
      if (spec.extendable) {
        max[0] = H5S_UNLIMITED;
        std::vector<hsize_t> chunk = dims;
        chunk[0] = 1;  // one row per chunk: an append writes exactly one chunk
        h5::check_status(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), Fault::Io, w);
        if (spec.type == StoredType::Int32) {
          // A row whose step_index was never written reads -1, which marks it as unfinished.
          int32_t fill = -1;
          h5::check_status(H5Pset_fill_value(dcpl.get(), H5T_NATIVE_INT32, &fill), Fault::Io, w);
        }
      } else {
        // Storage is allocated now, so that writing under SWMR never changes a dataset's layout.
        h5::check_status(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), Fault::Io, w);
      }
      Handle space = h5::space_handle(
          spec.shape.empty() ? H5Screate(H5S_SCALAR)
                             : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), max.data()),
          Fault::Io, w);
      hid_t type = spec.type == StoredType::String ? status_type.get() : file_type(spec.type);
      Handle d = h5::dataset_handle(H5Dcreate2(f, name.c_str(), type, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
                                    Fault::Io, str_cat(w, ": cannot be created"));
      if (spec.name == "last_step") {
        int64_t none = -1;
        h5::check_status(H5Dwrite(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &none), Fault::Io, w);
      } else if (spec.name == "status") {
        char buf[kStatusBytes] = {};
        std::strncpy(buf, status_name(ImageStatus::Encoding), sizeof(buf) - 1);
        h5::check_status(H5Dwrite(d.get(), status_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf), Fault::Io, w);
      }
    }
  }
}

}  // namespace

CheckpointWriter CheckpointWriter::create(const std::string& path, const FileAttributes& file,
                                          const std::vector<ImageAttributes>& images) {
  h5::silence_errors();
  std::error_code ec;
  if (fs::exists(path, ec))
    throw UsageError(str_cat("--checkpoint '", path, "' already exists; continue it with --resume ", path, " or remove it"));
  if (images.empty()) throw InternalError("CheckpointWriter::create: a job without images");
  io::TransformerConfig config;
  try {
    config = stored_transformer_config(file.model_config, "checkpoint model_config");
  } catch (const CheckpointError& e) {
    throw InternalError(str_cat("CheckpointWriter::create: ", e.what()));
  }
  std::vector<ImageShape> shapes;
  for (size_t i = 0; i < images.size(); ++i)
    shapes.push_back(image_shape(config, file, images[i], str_cat(path, ": ", image_group(static_cast<int64_t>(i)))));

  auto impl = std::make_unique<Impl>();
  impl->path = path;
  // The file is made and laid out under a temporary name in the same folder and becomes visible
  // at `path` only once it is in SWMR-write mode, so a reader polling `path` (fluxmpi-inspect
  // --follow, h5py, h5dump) finds either no file or a complete SWMR file; it can never take
  // HDF5's file lock while the writer still needs it (H5Fcreate and H5Fstart_swmr_write lock).
  const std::string tmp = creation_name(path);
  Handle fapl = latest_format_fapl(Fault::Io, path);
  Handle fcpl = paged_fcpl(path);
  fs::remove(tmp, ec);  // left by a killed creator whose process id this one now has
  Handle f = h5::file_handle(H5Fcreate(tmp.c_str(), H5F_ACC_EXCL, fcpl.get(), fapl.get()), Fault::Io,
                             str_cat(path, ": cannot create the checkpoint"));
  try {
    impl->lock.acquire(tmp);
    create_layout(f.get(), file, images, shapes, path);
    h5::check_status(H5Fstart_swmr_write(f.get()), Fault::Io, str_cat(path, ": cannot start SWMR writing"));
    impl->file = std::make_shared<detail::CheckpointFile>(path, std::move(f), /*swmr_reader=*/false);
    publish(tmp, path);
  } catch (...) {
    // A half-made checkpoint is of no use: nothing is left behind, under either name.
    f.reset();
    impl->file.reset();
    fs::remove(tmp, ec);
    throw;
  }
  impl->rows.assign(images.size(), 0);
  impl->last_step.assign(images.size(), -1);
  impl->reader.reset(new CheckpointReader(impl->file));
  return CheckpointWriter(std::move(impl));
}

CheckpointWriter CheckpointWriter::resume(const std::string& path, const FileAttributes& requested_file,
                                          const std::vector<ImageAttributes>& requested_images) {
  h5::silence_errors();
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UsageError(str_cat("--resume '", path, "': no such file"));
  if (fs::is_directory(path, ec)) throw UsageError(str_cat("--resume '", path, "': is a directory"));

  auto impl = std::make_unique<Impl>();
  impl->path = path;
  if (!impl->lock.acquire(path))
    throw CheckpointError(str_cat(path, ": another process is writing this checkpoint (a running fluxmpi job?); "
                                        "wait for it to end or stop it before resuming"));
  Handle fapl = latest_format_fapl(Fault::Checkpoint, path);
  // A writer killed during SWMR writing leaves the superblock marked "open for writing", which a
  // plain open refuses; clearing the mark on open is what `h5clear -s` does, through the same
  // (private, stable since 1.10.0) file-access property. The writer lock above, not HDF5's file
  // lock, keeps two writers apart: HDF5's lock would also refuse while a SWMR reader is open.
  hbool_t clear = true;
  h5::check_status(H5Pset(fapl.get(), "clear_status_flags", &clear), Fault::Checkpoint,
                   str_cat(path, ": cannot request clearing the superblock status flags"));
  h5::check_status(H5Pset_file_locking(fapl.get(), false, true), Fault::Checkpoint, path);
  // Opened in SWMR-write mode at once: the file is never in plain write mode, in which SWMR
  // readers are refused and a plain read-only reader (the fallback of CheckpointFile) could see
  // metadata half flushed. Everything below (end of allocation, shrinking the extendable datasets
  // to the committed rows) is allowed under SWMR, and a reader sees the rows it drops only as
  // uncommitted rows, which it ignores anyway.
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDWR | H5F_ACC_SWMR_WRITE, fapl.get());
  if (id < 0) throw CheckpointError(detail::CheckpointFile::open_failure(path, h5::take_error()));
  Handle opened(id, H5Fclose);
  // A killed writer may have written objects past the end of allocation its superblock last
  // recorded (metadata evicted from its cache, the raw data of an unfinished row), and its flushed
  // metadata can point to some of them; were that space handed out again, new rows would
  // overwrite them. As `h5clear --increment` does, move the end of allocation to the end of the
  // file first (this changes nothing else, even if the file then turns out to be another job's).
  detail::CheckpointFile::check_not_truncated(path, id, /*writer_may_be_live=*/false);
  haddr_t eoa = 0;
  h5::check_status(H5Fget_eoa(id, &eoa), Fault::Checkpoint, str_cat(path, ": cannot read the end of allocation"));
  const auto eof = static_cast<haddr_t>(fs::file_size(path, ec));
  if (!ec && eof > eoa) {
    log::debug(path, ": end of file ", eof, " is past the recorded end of allocation ", eoa, "; keeping the tail");
    h5::check_status(H5Fincrement_filesize(id, 0), Fault::Io, str_cat(path, ": cannot extend the end of allocation"));
  }
  impl->file = std::make_shared<detail::CheckpointFile>(path, std::move(opened), /*swmr_reader=*/false);
  check_matches(path, impl->file->file(), impl->file->images(), requested_file, requested_images);

  const int64_t n = impl->file->num_images();
  impl->rows.resize(n);
  impl->last_step.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    ImageState s = impl->file->state(i);
    impl->rows[i] = s.rows;
    impl->last_step[i] = s.last_step;
    impl->shrink_to_committed(i);
  }
  impl->flush();
  impl->reader.reset(new CheckpointReader(impl->file));
  return CheckpointWriter(std::move(impl));
}

CheckpointWriter::CheckpointWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointWriter::CheckpointWriter(CheckpointWriter&&) noexcept = default;
CheckpointWriter& CheckpointWriter::operator=(CheckpointWriter&&) noexcept = default;

CheckpointWriter::~CheckpointWriter() {
  if (!impl_ || impl_->closed) return;
  try {
    close();
  } catch (const Error& e) {
    log::error(e.what());
  }
}

CheckpointWriter::Impl& CheckpointWriter::impl() const {
  if (!impl_) throw InternalError("CheckpointWriter used after it was moved from");
  return *impl_;
}

const CheckpointReader& CheckpointWriter::contents() const { return *impl().reader; }
int64_t CheckpointWriter::num_images() const { return impl().file->num_images(); }
const std::string& CheckpointWriter::path() const { return impl().path; }

void CheckpointWriter::write_text(int64_t i, const TextEmbeddings& text) {
  Impl& m = impl();
  m.check_image(i);
  m.write_whole(i, "text/prompt_embeds", text.prompt_embeds, at::kFloat, H5T_NATIVE_FLOAT);
  if (m.file->shape(i).flux2) {
    m.write_whole(i, "text/input_ids", text.input_ids, at::kInt, H5T_NATIVE_INT32);
    m.write_whole(i, "text/attention_mask", text.attention_mask, at::kInt, H5T_NATIVE_INT32);
    const bool cfg = m.file->shape(i).true_cfg;
    if (cfg != text.negative_prompt_embeds.defined())
      throw InternalError(str_cat("checkpoint: ", image_group(i), ": negative embeddings ", cfg ? "missing" : "given",
                                  " but true CFG is ", cfg ? "on" : "off", " for this image"));
    if (cfg) {
      m.write_whole(i, "text/negative_input_ids", text.negative_input_ids, at::kInt, H5T_NATIVE_INT32);
      m.write_whole(i, "text/negative_attention_mask", text.negative_attention_mask, at::kInt, H5T_NATIVE_INT32);
      m.write_whole(i, "text/negative_prompt_embeds", text.negative_prompt_embeds, at::kFloat, H5T_NATIVE_FLOAT);
    }
    return;
  }
  m.write_whole(i, "text/pooled_prompt_embeds", text.pooled_prompt_embeds, at::kFloat, H5T_NATIVE_FLOAT);
  if (m.file->shape(i).token_ids) {  // Redux without a prompt has none
    m.write_whole(i, "text/clip_input_ids", text.clip_input_ids, at::kInt, H5T_NATIVE_INT32);
    m.write_whole(i, "text/t5_input_ids", text.t5_input_ids, at::kInt, H5T_NATIVE_INT32);
  }
  const int64_t redux = m.file->shape(i).redux_images;
  if (redux > 0) {
    if (static_cast<int64_t>(text.redux_images.size()) != redux)
      throw InternalError(str_cat("checkpoint: ", image_group(i), ": ", text.redux_images.size(), " Redux images given, ",
                                  redux, " expected"));
    m.write_whole(i, "text/redux_image_embeds", text.redux_image_embeds, at::kFloat, H5T_NATIVE_FLOAT);
    for (int64_t k = 0; k < redux; ++k)
      m.write_whole(i, str_cat("inputs/redux_image_", k), text.redux_images[static_cast<size_t>(k)], at::kByte,
                    H5T_NATIVE_UINT8);
  }
  bool cfg = m.file->shape(i).true_cfg;
  bool given = text.negative_prompt_embeds.defined() || text.negative_pooled_prompt_embeds.defined();
  if (cfg != given)
    throw InternalError(str_cat("checkpoint: ", image_group(i), ": negative embeddings ", given ? "given" : "missing",
                                " but true CFG is ", cfg ? "on" : "off", " for this image"));
  if (cfg) {
    m.write_whole(i, "text/negative_prompt_embeds", text.negative_prompt_embeds, at::kFloat, H5T_NATIVE_FLOAT);
    m.write_whole(i, "text/negative_pooled_prompt_embeds", text.negative_pooled_prompt_embeds, at::kFloat,
                  H5T_NATIVE_FLOAT);
  }
}

void CheckpointWriter::write_schedule(int64_t i, const at::Tensor& timesteps, const at::Tensor& sigmas) {
  Impl& m = impl();
  m.check_image(i);
  m.write_whole(i, "schedule/timesteps", timesteps, at::kFloat, H5T_NATIVE_FLOAT);
  m.write_whole(i, "schedule/sigmas", sigmas, at::kFloat, H5T_NATIVE_FLOAT);
}

void CheckpointWriter::write_initial(int64_t i, const at::Tensor& latents) {
  Impl& m = impl();
  m.check_image(i);
  m.write_whole(i, "latents/initial", latents, at::kFloat, H5T_NATIVE_FLOAT);
}

void CheckpointWriter::write_condition(int64_t i, const std::string& name, const at::Tensor& values) {
  Impl& m = impl();
  m.check_image(i);
  const DatasetSpec& spec = m.file->spec(i, name);
  if (spec.type == StoredType::UInt8) m.write_whole(i, name, values, at::kByte, H5T_NATIVE_UINT8);
  else if (spec.type == StoredType::Float32) m.write_whole(i, name, values, at::kFloat, H5T_NATIVE_FLOAT);
  else if (spec.type == StoredType::Int32) m.write_whole(i, name, values, at::kInt, H5T_NATIVE_INT32);
  else throw InternalError(str_cat("checkpoint: ", image_object(i, name), " is not an image input"));
}

void CheckpointWriter::append_step(int64_t i, int64_t step, const at::Tensor& latents, const at::Tensor& noise_pred) {
  Impl& m = impl();
  m.check_image(i);
  const ImageShape& s = m.file->shape(i);
  if (step <= m.last_step[i] || step >= s.steps)
    throw InternalError(str_cat("checkpoint: ", image_group(i), ": append_step(", step, ") after step ", m.last_step[i],
                                " of ", s.steps));
  const std::vector<int64_t> row_shape = {s.image_tokens, s.token_dim};
  at::Tensor x = prepare(latents, row_shape, at::kFloat, image_object(i, "latents/steps"));
  at::Tensor v = prepare(noise_pred, row_shape, at::kFloat, image_object(i, "latents/noise_pred"));
  const int64_t row = m.rows[i];
  int32_t step32 = static_cast<int32_t>(step);
  m.append_row(i, "latents/steps", row, x, H5T_NATIVE_FLOAT);
  m.append_row(i, "latents/noise_pred", row, v, H5T_NATIVE_FLOAT);
  m.append_row(i, "latents/step_index", row, at::tensor({step32}), H5T_NATIVE_INT32);
  // The row is complete on disk before last_step names it: last_step is the commit point.
  m.flush();
  m.write_scalar_int64(i, "last_step", step);
  m.flush();
  m.rows[i] = row + 1;
  m.last_step[i] = step;
}

void CheckpointWriter::write_step_mode(int64_t i, int64_t step, bool exact) {
  Impl& m = impl();
  m.check_image(i);
  const ImageShape& s = m.file->shape(i);
  if (!s.patched) return;
  if (step < 0 || step >= s.steps)
    throw InternalError(str_cat("checkpoint: ", image_group(i), ": write_step_mode(", step, ") of ", s.steps, " steps"));
  const std::string w = m.where(i, "latents/exact");
  Handle d = m.file->open_dataset(i, "latents/exact", Fault::Io);
  Handle space = h5::space_handle(H5Dget_space(d.get()), Fault::Io, w);
  hsize_t start = static_cast<hsize_t>(step), count = 1;
  h5::check_status(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr), Fault::Io, w);
  Handle mem = h5::space_handle(H5Screate_simple(1, &count, nullptr), Fault::Io, w);
  const uint8_t value = exact ? 1 : 0;
  h5::check_status(H5Dwrite(d.get(), H5T_NATIVE_UINT8, mem.get(), space.get(), H5P_DEFAULT, &value), Fault::Io,
                   str_cat(w, ": step ", step, " cannot be written"));
}

void CheckpointWriter::set_status(int64_t i, ImageStatus status) {
  Impl& m = impl();
  m.check_image(i);
  m.flush();  // what the status announces is on disk first
  m.write_status(i, status);
  m.flush();
}

void CheckpointWriter::write_image(int64_t i, const io::RgbImage& pixels) {
  Impl& m = impl();
  m.check_image(i);
  const ImageShape& s = m.file->shape(i);
  if (pixels.height != s.height || pixels.width != s.width ||
      pixels.pixels.size() != static_cast<size_t>(s.height * s.width * 3))
    throw InternalError(str_cat("checkpoint: ", image_group(i), ": image of ", pixels.height, "x", pixels.width,
                                " pixels, expected ", s.height, "x", s.width));
  Handle d = m.file->open_dataset(i, "image", Fault::Io);
  h5::check_status(H5Dwrite(d.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, pixels.pixels.data()), Fault::Io,
                   str_cat(m.where(i, "image"), ": cannot be written"));
}

void CheckpointWriter::flush() {
  Impl& m = impl();
  if (m.closed) throw InternalError(str_cat("checkpoint ", m.path, ": flushed after close()"));
  m.flush();
}

void CheckpointWriter::close() {
  Impl& m = impl();
  if (m.closed) throw InternalError(str_cat("checkpoint ", m.path, ": closed twice"));
  m.closed = true;
  m.reader.reset();
  bool ok = m.file.use_count() == 1 ? m.file->close() : true;
  m.file.reset();
  if (!ok) h5::raise(Fault::Io, str_cat(m.path, ": closing the checkpoint failed"));
}

}  // namespace fluxmpi::ckpt
