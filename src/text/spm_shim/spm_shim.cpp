// libfluxmpi_spm.so: sentencepiece behind the C interface of spm_shim.h. Nothing here may let a
// C++ exception or a C++ object cross the boundary: the caller runs another C++ runtime.

#include "text/spm_shim/spm_shim.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

struct fluxmpi_spm_model {
  sentencepiece::SentencePieceProcessor processor;
};

struct fluxmpi_spm_encoding {
  // The proto owns the piece strings that `pieces` points into.
  sentencepiece::ImmutableSentencePieceText text;
  std::vector<fluxmpi_spm_piece> pieces;
};

struct fluxmpi_spm_bytes {
  std::string data;
};

namespace {

void set_error(char* error, size_t error_size, const std::string& message) {
  if (error == nullptr || error_size == 0) return;
  const size_t n = std::min(message.size(), error_size - 1);
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

// Runs `body`, turning any exception into an error message and `fallback`.
template <typename T, typename F>
T guarded(char* error, size_t error_size, T fallback, F&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    set_error(error, error_size, "out of memory in sentencepiece");
  } catch (const std::exception& e) {
    set_error(error, error_size, std::string("exception in sentencepiece: ") + e.what());
  } catch (...) {
    set_error(error, error_size, "unknown exception in sentencepiece");
  }
  return fallback;
}

}  // namespace

extern "C" {

int32_t fluxmpi_spm_abi_version(void) { return FLUXMPI_SPM_ABI_VERSION; }

fluxmpi_spm_model* fluxmpi_spm_open(const char* path, char* error, size_t error_size) {
  return guarded<fluxmpi_spm_model*>(error, error_size, nullptr, [&]() -> fluxmpi_spm_model* {
    auto model = std::make_unique<fluxmpi_spm_model>();
    const sentencepiece::util::Status status = model->processor.Load(path);
    if (!status.ok()) {
      set_error(error, error_size, status.ToString());
      return nullptr;
    }
    return model.release();
  });
}

void fluxmpi_spm_close(fluxmpi_spm_model* model) { delete model; }

int32_t fluxmpi_spm_vocab_size(const fluxmpi_spm_model* model) { return model->processor.GetPieceSize(); }

fluxmpi_spm_special_ids fluxmpi_spm_special(const fluxmpi_spm_model* model) {
  const auto& p = model->processor;
  return {p.unk_id(), p.bos_id(), p.eos_id(), p.pad_id()};
}

int32_t fluxmpi_spm_piece_to_id(const fluxmpi_spm_model* model, const char* piece, size_t size) {
  return guarded<int32_t>(nullptr, 0, model->processor.unk_id(),
                          [&] { return model->processor.PieceToId(std::string(piece, size)); });
}

int32_t fluxmpi_spm_id_to_piece(const fluxmpi_spm_model* model, int32_t id, const char** piece, size_t* size) {
  if (id < 0 || id >= model->processor.GetPieceSize()) return 0;
  const std::string& s = model->processor.IdToPiece(id);
  *piece = s.data();
  *size = s.size();
  return 1;
}

fluxmpi_spm_encoding* fluxmpi_spm_encode(const fluxmpi_spm_model* model, const char* text, size_t size, char* error,
                                         size_t error_size) {
  return guarded<fluxmpi_spm_encoding*>(error, error_size, nullptr, [&]() -> fluxmpi_spm_encoding* {
    auto out = std::make_unique<fluxmpi_spm_encoding>();
    out->text = model->processor.EncodeAsImmutableProto(std::string(text, size));
    const size_t n = out->text.pieces_size();
    out->pieces.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const auto p = out->text.pieces(static_cast<int>(i));
      const std::string& s = p.piece();
      out->pieces.push_back({static_cast<int32_t>(p.id()), p.begin(), p.end(), s.data(), s.size()});
    }
    return out.release();
  });
}

size_t fluxmpi_spm_encoding_size(const fluxmpi_spm_encoding* encoding) { return encoding->pieces.size(); }

const fluxmpi_spm_piece* fluxmpi_spm_encoding_pieces(const fluxmpi_spm_encoding* encoding) {
  return encoding->pieces.data();
}

void fluxmpi_spm_encoding_free(fluxmpi_spm_encoding* encoding) { delete encoding; }

fluxmpi_spm_bytes* fluxmpi_spm_train(const char* const* keys, const char* const* values, size_t count, uint32_t seed,
                                     char* error, size_t error_size) {
  return guarded<fluxmpi_spm_bytes*>(error, error_size, nullptr, [&]() -> fluxmpi_spm_bytes* {
    std::unordered_map<std::string, std::string> options;
    for (size_t i = 0; i < count; ++i) options[keys[i]] = values[i];
    sentencepiece::SetRandomGeneratorSeed(seed);
    auto out = std::make_unique<fluxmpi_spm_bytes>();
    const sentencepiece::util::Status status = sentencepiece::SentencePieceTrainer::Train(options, nullptr, &out->data);
    if (!status.ok()) {
      set_error(error, error_size, status.ToString());
      return nullptr;
    }
    return out.release();
  });
}

const char* fluxmpi_spm_bytes_data(const fluxmpi_spm_bytes* bytes, size_t* size) {
  *size = bytes->data.size();
  return bytes->data.data();
}

void fluxmpi_spm_bytes_free(fluxmpi_spm_bytes* bytes) { delete bytes; }

}  // extern "C"
