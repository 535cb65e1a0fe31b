#pragma once
/// The C interface of libfluxmpi_spm.so, the one library that links sentencepiece.
///
/// Debian's libsentencepiece exports a bundled protobuf (3.14) that cannot share a process with
/// libtorch's protobuf (3.21), so fluxmpi loads this library into its own link namespace
/// (text/sentencepiece_loader.h) and talks to it only through these functions: plain C types,
/// no exceptions, and every object is freed by the library that made it (the namespace has its
/// own C runtime and heap). Errors come back as a NUL-terminated message in a caller buffer.

#include <stddef.h>
#include <stdint.h>

#define FLUXMPI_SPM_EXPORT __attribute__((visibility("default")))

/// Bumped whenever a signature or a struct below changes; the loader refuses another version.
#define FLUXMPI_SPM_ABI_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

/// A loaded sentencepiece model (sentencepiece::SentencePieceProcessor).
typedef struct fluxmpi_spm_model fluxmpi_spm_model;
/// The pieces of one encoded text.
typedef struct fluxmpi_spm_encoding fluxmpi_spm_encoding;
/// A byte string owned by the library (a serialised model from training).
typedef struct fluxmpi_spm_bytes fluxmpi_spm_bytes;

/// One piece of an encoding. `piece` points into the encoding and lives as long as it does.
typedef struct {
  int32_t id;
  /// Byte range [begin, end) of the piece in the text given to fluxmpi_spm_encode (the
  /// original text, before sentencepiece's normalisation).
  uint32_t begin;
  uint32_t end;
  const char* piece;
  size_t piece_size;
} fluxmpi_spm_piece;

/// The model's special ids; -1 where the model has none (T5 has no BOS).
typedef struct {
  int32_t unk;
  int32_t bos;
  int32_t eos;
  int32_t pad;
} fluxmpi_spm_special_ids;

/// FLUXMPI_SPM_ABI_VERSION of the built library.
FLUXMPI_SPM_EXPORT int32_t fluxmpi_spm_abi_version(void);

/// Loads a model file. NULL on failure, with sentencepiece's status text in `error`.
FLUXMPI_SPM_EXPORT fluxmpi_spm_model* fluxmpi_spm_open(const char* path, char* error, size_t error_size);
FLUXMPI_SPM_EXPORT void fluxmpi_spm_close(fluxmpi_spm_model* model);

FLUXMPI_SPM_EXPORT int32_t fluxmpi_spm_vocab_size(const fluxmpi_spm_model* model);
FLUXMPI_SPM_EXPORT fluxmpi_spm_special_ids fluxmpi_spm_special(const fluxmpi_spm_model* model);
/// The id of `piece`; the unknown id for a piece the model does not have.
FLUXMPI_SPM_EXPORT int32_t fluxmpi_spm_piece_to_id(const fluxmpi_spm_model* model, const char* piece, size_t size);
/// The piece of `id` in `*piece` / `*size` (storage of the model); 0 when id is out of range.
FLUXMPI_SPM_EXPORT int32_t fluxmpi_spm_id_to_piece(const fluxmpi_spm_model* model, int32_t id, const char** piece,
                                                   size_t* size);

/// Encodes `size` bytes of UTF-8 text. NULL on failure, with the reason in `error`.
FLUXMPI_SPM_EXPORT fluxmpi_spm_encoding* fluxmpi_spm_encode(const fluxmpi_spm_model* model, const char* text,
                                                            size_t size, char* error, size_t error_size);
FLUXMPI_SPM_EXPORT size_t fluxmpi_spm_encoding_size(const fluxmpi_spm_encoding* encoding);
/// The fluxmpi_spm_encoding_size() pieces, in text order.
FLUXMPI_SPM_EXPORT const fluxmpi_spm_piece* fluxmpi_spm_encoding_pieces(const fluxmpi_spm_encoding* encoding);
FLUXMPI_SPM_EXPORT void fluxmpi_spm_encoding_free(fluxmpi_spm_encoding* encoding);

/// Runs sentencepiece's trainer with the `count` options keys[i]=values[i] (the names of
/// spm_train's flags, e.g. "vocab_size"), after seeding its random generator with `seed`.
/// Returns the serialised model (nothing is written to disk unless the options say so); NULL
/// on failure, with sentencepiece's status text in `error`.
FLUXMPI_SPM_EXPORT fluxmpi_spm_bytes* fluxmpi_spm_train(const char* const* keys, const char* const* values,
                                                        size_t count, uint32_t seed, char* error,
                                                        size_t error_size);
FLUXMPI_SPM_EXPORT const char* fluxmpi_spm_bytes_data(const fluxmpi_spm_bytes* bytes, size_t* size);
FLUXMPI_SPM_EXPORT void fluxmpi_spm_bytes_free(fluxmpi_spm_bytes* bytes);

#ifdef __cplusplus
}
#endif
