// libFuzzer target: text::ClipTokenizer::encode and tokenize on arbitrary prompt bytes, over the
// real FLUX.1 tokenizer files (../shared/assets/tokenizers/clip), or a BPE tokenizer trained on
// tools/make_tiny_model/corpus.txt when they are absent.
// Contract: encode returns exactly max_length ids laid out as [BOS] content [EOS] padding, with
// consistent truncation fields, or throws UsageError (text that is not UTF-8). Anything else is a
// bug.

#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "core/error.h"
#include "text/clip_bpe_trainer.h"
#include "text/clip_tokenizer.h"

namespace {
namespace fs = std::filesystem;

void require(bool ok) {
  if (!ok) std::abort();
}

// $FLUXMPI_CLIP_TOKENIZER, else the shared assets ($FLUXMPI_ASSETS or ../shared/assets beside the
// source tree), else a tokenizer trained here into a temporary folder.
std::string tokenizer_dir() {
  if (const char* dir = std::getenv("FLUXMPI_CLIP_TOKENIZER"); dir != nullptr && *dir != '\0') return dir;
  const char* assets = std::getenv("FLUXMPI_ASSETS");
  const fs::path shared = assets != nullptr && *assets != '\0' ? fs::path(assets)
                                                                 : fs::path(FLUXMPI_SOURCE_DIR) / ".." / "shared" / "assets";
  if (fs::is_regular_file(shared / "tokenizers" / "clip" / "vocab.json")) return (shared / "tokenizers" / "clip").string();

  std::ifstream in(fs::path(FLUXMPI_SOURCE_DIR) / "tools" / "make_tiny_model" / "corpus.txt");
  require(static_cast<bool>(in));
  std::ostringstream corpus;
  corpus << in.rdbuf();
  std::string dir = (fs::temp_directory_path() / "fluxmpi-fuzz-clip-XXXXXX").string();
  require(::mkdtemp(dir.data()) != nullptr);
  fluxmpi::text::write_clip_tokenizer(fluxmpi::text::train_clip_bpe(corpus.str(), 1000), dir);
  return dir;
}

const fluxmpi::text::ClipTokenizer& tokenizer() {
  static const auto tok = std::make_unique<fluxmpi::text::ClipTokenizer>(tokenizer_dir());
  return *tok;
}

void check_encoding(const fluxmpi::text::ClipTokenizer& tok, const fluxmpi::text::Encoding& e, int64_t max_length,
                    int64_t num_tokens) {
  require(static_cast<int64_t>(e.ids.size()) == max_length);
  require(e.num_tokens == num_tokens);
  const int64_t kept = std::min(num_tokens, max_length - 2);
  require(e.truncated == (num_tokens > kept));
  require(e.dropped.empty() == !e.truncated);
  require(e.ids[0] == tok.bos_id());
  require(e.ids[static_cast<size_t>(kept + 1)] == tok.eos_id());
  for (size_t i = static_cast<size_t>(kept + 2); i < e.ids.size(); ++i) require(e.ids[i] == tok.pad_id());
  for (int64_t id : e.ids) require(id >= 0 && id < tok.vocab_size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fluxmpi::text::ClipTokenizer& tok = tokenizer();
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const int64_t num_tokens = static_cast<int64_t>(tok.tokenize(text).size());
    check_encoding(tok, tok.encode(text), tok.max_length(), num_tokens);
    // A short length as well, so that most inputs exercise truncation and the dropped-text quote.
    const int64_t short_length = 2 + static_cast<int64_t>(size % 8);
    check_encoding(tok, tok.encode(text, short_length), short_length, num_tokens);
  } catch (const fluxmpi::UsageError&) {
    // The documented rejection of text that is not UTF-8.
  }
  return 0;
}
