#include "text/sentencepiece_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "text/spm_shim/spm_shim.h"

#ifndef FLUXMPI_SPM_LIBRARY_PATH
#error "FLUXMPI_SPM_LIBRARY_PATH (the built libfluxmpi_spm.so) must be defined by the build"
#endif

namespace fluxmpi::text {
namespace {
namespace fs = std::filesystem;

constexpr const char* kLibraryName = "libfluxmpi_spm.so";
constexpr const char* kLibraryEnv = "FLUXMPI_SPM_LIBRARY";
// sentencepiece's status messages are one line; longer ones are cut, not lost entirely.
constexpr size_t kErrorSize = 2048;

// The shim's functions, typed by their declarations in spm_shim.h.
struct ShimApi {
  decltype(&fluxmpi_spm_abi_version) abi_version;
  decltype(&fluxmpi_spm_open) open;
  decltype(&fluxmpi_spm_close) close;
  decltype(&fluxmpi_spm_vocab_size) vocab_size;
  decltype(&fluxmpi_spm_special) special;
  decltype(&fluxmpi_spm_piece_to_id) piece_to_id;
  decltype(&fluxmpi_spm_id_to_piece) id_to_piece;
  decltype(&fluxmpi_spm_encode) encode;
  decltype(&fluxmpi_spm_encoding_size) encoding_size;
  decltype(&fluxmpi_spm_encoding_pieces) encoding_pieces;
  decltype(&fluxmpi_spm_encoding_free) encoding_free;
  decltype(&fluxmpi_spm_train) train;
  decltype(&fluxmpi_spm_bytes_data) bytes_data;
  decltype(&fluxmpi_spm_bytes_free) bytes_free;
};

struct Shim {
  SentencePieceRuntime runtime;
  ShimApi api{};
};

std::string executable_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

// Candidate paths in search order (see the header).
std::vector<std::string> candidates() {
  if (const char* env = std::getenv(kLibraryEnv); env != nullptr && *env != '\0') return {env};
  std::vector<std::string> out = {FLUXMPI_SPM_LIBRARY_PATH};
  const std::string dir = executable_dir();
  if (!dir.empty()) {
    out.push_back(dir + "/" + kLibraryName);
    out.push_back(dir + "/../lib/" + kLibraryName);
  }
  return out;
}

void* open_library(const std::string& path, bool* own_namespace) {
#ifdef FLUXMPI_SPM_PLAIN_DLOPEN
  *own_namespace = false;
  return ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
#else
  *own_namespace = true;
  return ::dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
}

template <typename F>
void resolve(void* handle, const std::string& path, const char* name, F* out) {
  ::dlerror();
  void* symbol = ::dlsym(handle, name);
  if (symbol == nullptr) {
    const char* why = ::dlerror();
    throw TokenizerError(str_cat("sentencepiece shim '", path, "' lacks '", name, "': ", why ? why : "null symbol",
                                 " (rebuild target fluxmpi_spm)"));
  }
  *out = reinterpret_cast<F>(symbol);
}

std::unique_ptr<Shim> load_shim() {
  const std::vector<std::string> paths = candidates();
  std::string path;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) {
      path = p;
      break;
    }
  }
  if (path.empty()) {
    if (std::getenv(kLibraryEnv) != nullptr && *std::getenv(kLibraryEnv) != '\0')
      throw TokenizerError(str_cat("sentencepiece shim not found: ", kLibraryEnv, "='", paths[0], "' is not a file"));
    std::string where;
    for (const std::string& p : paths) where += (where.empty() ? "'" : ", '") + p + "'";
    throw TokenizerError(str_cat("sentencepiece shim ", kLibraryName, " not found (looked at ", where,
                                 "); build target fluxmpi_spm, or set ", kLibraryEnv, " to its path"));
  }

  auto shim = std::make_unique<Shim>();
  shim->runtime.path = fs::absolute(path).lexically_normal().string();
  // The handle is never closed: the models and the namespace live until the process ends.
  void* handle = open_library(shim->runtime.path, &shim->runtime.own_namespace);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    throw TokenizerError(str_cat("cannot load the sentencepiece shim '", shim->runtime.path,
                                 shim->runtime.own_namespace ? "' into a new link namespace: " : "': ",
                                 why ? why : "unknown dynamic loader error"));
  }
  const std::string& p = shim->runtime.path;
  ShimApi& api = shim->api;
  resolve(handle, p, "fluxmpi_spm_abi_version", &api.abi_version);
  const int32_t version = api.abi_version();
  if (version != FLUXMPI_SPM_ABI_VERSION)
    throw TokenizerError(str_cat("sentencepiece shim '", p, "' has interface version ", version, ", this program needs ",
                                 FLUXMPI_SPM_ABI_VERSION, " (rebuild target fluxmpi_spm)"));
  resolve(handle, p, "fluxmpi_spm_open", &api.open);
  resolve(handle, p, "fluxmpi_spm_close", &api.close);
  resolve(handle, p, "fluxmpi_spm_vocab_size", &api.vocab_size);
  resolve(handle, p, "fluxmpi_spm_special", &api.special);
  resolve(handle, p, "fluxmpi_spm_piece_to_id", &api.piece_to_id);
  resolve(handle, p, "fluxmpi_spm_id_to_piece", &api.id_to_piece);
  resolve(handle, p, "fluxmpi_spm_encode", &api.encode);
  resolve(handle, p, "fluxmpi_spm_encoding_size", &api.encoding_size);
  resolve(handle, p, "fluxmpi_spm_encoding_pieces", &api.encoding_pieces);
  resolve(handle, p, "fluxmpi_spm_encoding_free", &api.encoding_free);
  resolve(handle, p, "fluxmpi_spm_train", &api.train);
  resolve(handle, p, "fluxmpi_spm_bytes_data", &api.bytes_data);
  resolve(handle, p, "fluxmpi_spm_bytes_free", &api.bytes_free);
  return shim;
}

// Loaded once per process: each dlmopen(LM_ID_NEWLM) takes one of glibc's few namespaces, so a
// failure is remembered rather than retried.
const Shim& shim() {
  struct Loaded {
    std::unique_ptr<Shim> shim;
    std::string error;
  };
  static const Loaded loaded = [] {
    Loaded l;
    try {
      l.shim = load_shim();
    } catch (const TokenizerError& e) {
      l.error = e.what();
    }
    return l;
  }();
  if (!loaded.shim) throw TokenizerError(loaded.error);
  return *loaded.shim;
}

const ShimApi& api() { return shim().api; }

}  // namespace

const SentencePieceRuntime& sentencepiece_runtime() { return shim().runtime; }

SentencePieceModel::SentencePieceModel(const std::string& path, const std::string& label) : label_(label) {
  const ShimApi& spm = api();
  char error[kErrorSize] = {};
  model_ = spm.open(path.c_str(), error, sizeof error);
  if (model_ == nullptr) throw TokenizerError(str_cat(label_, ": not a sentencepiece model: ", error));
  const fluxmpi_spm_special_ids ids = spm.special(model_);
  unk_id_ = ids.unk;
  bos_id_ = ids.bos;
  eos_id_ = ids.eos;
  pad_id_ = ids.pad;
}

SentencePieceModel::SentencePieceModel(SentencePieceModel&& other) noexcept
    : label_(std::move(other.label_)),
      model_(std::exchange(other.model_, nullptr)),
      unk_id_(other.unk_id_),
      bos_id_(other.bos_id_),
      eos_id_(other.eos_id_),
      pad_id_(other.pad_id_) {}

SentencePieceModel& SentencePieceModel::operator=(SentencePieceModel&& other) noexcept {
  if (this != &other) {
    if (model_ != nullptr) api().close(model_);
    label_ = std::move(other.label_);
    model_ = std::exchange(other.model_, nullptr);
    unk_id_ = other.unk_id_;
    bos_id_ = other.bos_id_;
    eos_id_ = other.eos_id_;
    pad_id_ = other.pad_id_;
  }
  return *this;
}

// api() cannot throw here: a model exists only once the shim is loaded.
SentencePieceModel::~SentencePieceModel() {
  if (model_ != nullptr) api().close(model_);
}

int64_t SentencePieceModel::vocab_size() const { return api().vocab_size(model_); }

std::string SentencePieceModel::id_to_piece(int64_t id) const {
  const char* piece = nullptr;
  size_t size = 0;
  if (id < 0 || id > INT32_MAX || !api().id_to_piece(model_, static_cast<int32_t>(id), &piece, &size))
    throw InternalError(str_cat(label_, ": id ", id, " is not in the vocabulary of ", vocab_size(), " pieces"));
  return std::string(piece, size);
}

int64_t SentencePieceModel::piece_to_id(const std::string& piece) const {
  return api().piece_to_id(model_, piece.data(), piece.size());
}

std::vector<SentencePiece> SentencePieceModel::encode(const std::string& text) const {
  const ShimApi& spm = api();
  char error[kErrorSize] = {};
  fluxmpi_spm_encoding* encoding = spm.encode(model_, text.data(), text.size(), error, sizeof error);
  if (encoding == nullptr) throw InternalError(str_cat(label_, ": sentencepiece encode failed: ", error));
  const std::unique_ptr<fluxmpi_spm_encoding, decltype(spm.encoding_free)> owned(encoding, spm.encoding_free);
  const size_t n = spm.encoding_size(encoding);
  const fluxmpi_spm_piece* pieces = spm.encoding_pieces(encoding);
  std::vector<SentencePiece> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const fluxmpi_spm_piece& p = pieces[i];
    out.push_back({p.id, std::string(p.piece, p.piece_size), p.begin, p.end});
  }
  return out;
}

std::string train_sentencepiece(const std::vector<std::pair<std::string, std::string>>& options, uint32_t seed,
                                const std::string& what) {
  const ShimApi& spm = api();
  std::vector<const char*> keys, values;
  for (const auto& [key, value] : options) {
    keys.push_back(key.c_str());
    values.push_back(value.c_str());
  }
  char error[kErrorSize] = {};
  fluxmpi_spm_bytes* bytes = spm.train(keys.data(), values.data(), options.size(), seed, error, sizeof error);
  if (bytes == nullptr) throw UsageError(str_cat(what, " failed: ", error));
  const std::unique_ptr<fluxmpi_spm_bytes, decltype(spm.bytes_free)> owned(bytes, spm.bytes_free);
  size_t size = 0;
  const char* data = spm.bytes_data(bytes, &size);
  return std::string(data, size);
}

}  // namespace fluxmpi::text
