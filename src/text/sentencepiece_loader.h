#pragma once
/// sentencepiece for fluxmpi_text, loaded at run time from libfluxmpi_spm.so (spm_shim/).
///
/// Debian's libsentencepiece carries and exports its own protobuf 3.14; libtorch links protobuf
/// 3.21, and one process cannot hold both. So no fluxmpi target links sentencepiece: the shim
/// does, and it is loaded once per process with dlmopen(LM_ID_NEWLM) into a link namespace of
/// its own (own libstdc++, own protobuf), reached only through its C functions. Sanitizer
/// builds (torch-free; the ASan runtime does not support dlmopen namespaces) use plain dlopen.
///
/// Where the shim is looked for, first match wins:
///   1. $FLUXMPI_SPM_LIBRARY, when set (then nothing else is tried);
///   2. the path the build put it at (<build>/lib/libfluxmpi_spm.so);
///   3. next to the running executable, then in <executable dir>/../lib.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

struct fluxmpi_spm_model;

namespace fluxmpi::text {

/// How sentencepiece was loaded (for diagnostics). The first call loads the shim and throws
/// TokenizerError when it cannot be found or loaded; a failure is remembered and re-thrown.
struct SentencePieceRuntime {
  std::string path;            ///< the shim that was loaded
  bool own_namespace = false;  ///< dlmopen(LM_ID_NEWLM); false: dlopen (sanitizer builds)
};
const SentencePieceRuntime& sentencepiece_runtime();

/// One piece of an encoded text.
struct SentencePiece {
  int64_t id = -1;
  std::string piece;  ///< as in the vocabulary, e.g. "▁photo"
  /// Byte range [begin, end) of the piece in the text that was encoded (before normalisation).
  size_t begin = 0, end = 0;
};

/// A loaded sentencepiece model (the shim's SentencePieceProcessor), movable, not copyable.
class SentencePieceModel {
 public:
  /// Loads the model file `path`. `label` names it in errors: TokenizerError
  /// "<label>: not a sentencepiece model: <sentencepiece's status>", or the loader's error.
  SentencePieceModel(const std::string& path, const std::string& label);
  SentencePieceModel(SentencePieceModel&& other) noexcept;
  SentencePieceModel& operator=(SentencePieceModel&& other) noexcept;
  SentencePieceModel(const SentencePieceModel&) = delete;
  SentencePieceModel& operator=(const SentencePieceModel&) = delete;
  ~SentencePieceModel();

  int64_t vocab_size() const;
  /// Special ids; -1 when the model defines none.
  int64_t unk_id() const { return unk_id_; }
  int64_t bos_id() const { return bos_id_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  /// The piece of `id`; InternalError when id is not in [0, vocab_size()).
  std::string id_to_piece(int64_t id) const;
  /// The id of `piece`; unk_id() when the vocabulary does not have it.
  int64_t piece_to_id(const std::string& piece) const;
  /// sentencepiece's pieces of `text` (its normaliser included), with byte offsets into `text`.
  /// InternalError with sentencepiece's message when it fails.
  std::vector<SentencePiece> encode(const std::string& text) const;

 private:
  std::string label_;
  fluxmpi_spm_model* model_ = nullptr;
  int64_t unk_id_ = -1, bos_id_ = -1, eos_id_ = -1, pad_id_ = -1;
};

/// Runs sentencepiece's trainer with `options` (spm_train's flag names and values, e.g.
/// {"vocab_size", "1000"}) after seeding its random generator with `seed`, and returns the
/// serialised model. UsageError "<what> failed: <sentencepiece's status>" when training fails
/// (bad option, corpus too small for the vocabulary, ...).
std::string train_sentencepiece(const std::vector<std::pair<std::string, std::string>>& options, uint32_t seed,
                                const std::string& what);

}  // namespace fluxmpi::text
