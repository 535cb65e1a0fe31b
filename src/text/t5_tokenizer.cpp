#include "text/t5_tokenizer.h"

#include <optional>

#include <sentencepiece_processor.h>

#include "core/error.h"
#include "text/tokenizer_files.h"

namespace fluxmpi::text {

T5Tokenizer::T5Tokenizer(const std::string& dir, const std::string& label)
    : label_(label.empty() ? dir : label), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const TokenizerDir d{dir, label_};
  const std::string model_label = d.file_label("spiece.model");
  const std::string path = require_tokenizer_file(d, "spiece.model");
  const sentencepiece::util::Status status = sp_->Load(path);
  if (!status.ok())
    throw TokenizerError(str_cat(model_label, ": not a sentencepiece model: ", status.ToString()));

  struct Special {
    const char* key;
    int id;
    int64_t* out;
  };
  for (const Special& s : {Special{"eos_token", sp_->eos_id(), &eos_id_}, Special{"pad_token", sp_->pad_id(), &pad_id_},
                           Special{"unk_token", sp_->unk_id(), &unk_id_}}) {
    if (s.id < 0 || s.id >= sp_->GetPieceSize())
      throw TokenizerError(str_cat(model_label, ": the model defines no ", s.key, " piece (id ", s.id, ")"));
    *s.out = s.id;
  }

  // The JSON files are optional, but must not contradict the model.
  for (const char* name : {"special_tokens_map.json", "tokenizer_config.json"}) {
    if (!d.has(name)) continue;
    const JsonFile f = read_json_object(d, name);
    for (const auto& [key, id] : {std::pair<const char*, int64_t>{"eos_token", eos_id_}, {"pad_token", pad_id_},
                                  {"unk_token", unk_id_}}) {
      std::optional<std::string> token = special_token(f, key);
      const std::string& piece = sp_->IdToPiece(static_cast<int>(id));
      if (token && *token != piece)
        throw TokenizerError(str_cat(f.label, ": '", key, "' is \"", *token, "\" but spiece.model has \"", piece,
                                     "\" (id ", id, ")"));
    }
  }
}

T5Tokenizer::T5Tokenizer(T5Tokenizer&&) noexcept = default;
T5Tokenizer::~T5Tokenizer() = default;

int64_t T5Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }

Encoding T5Tokenizer::encode(const std::string& text, int64_t max_length) const {
  check_max_length(max_length, str_cat(label_, ": T5 encode"));
  check_utf8(text, "prompt");
  const sentencepiece::ImmutableSentencePieceText spt = sp_->EncodeAsImmutableProto(text);
  const size_t n = spt.pieces_size();
  std::vector<int64_t> ids;
  ids.reserve(n);
  for (size_t i = 0; i < n; ++i) ids.push_back(spt.pieces(static_cast<int>(i)).id());
  Encoding e = lay_out(ids, -1, eos_id_, pad_id_, max_length);
  if (e.truncated) {
    // Piece offsets are byte offsets into the original (unnormalised) text.
    const size_t begin = spt.pieces(static_cast<int>(max_length - 1)).begin();
    const size_t end = spt.pieces(static_cast<int>(n - 1)).end();
    e.dropped = trim_white_space(text.substr(begin, end - begin));
  }
  return e;
}

std::vector<std::string> T5Tokenizer::pieces(const std::string& text) const {
  check_utf8(text, "prompt");
  std::vector<std::string> out;
  const sentencepiece::util::Status status = sp_->Encode(text, &out);
  if (!status.ok()) throw InternalError(str_cat(label_, ": sentencepiece encode failed: ", status.ToString()));
  return out;
}

}  // namespace fluxmpi::text
