#include "text/t5_tokenizer.h"

#include <optional>

#include "core/error.h"
#include "text/tokenizer_files.h"

namespace fluxmpi::text {
namespace {

SentencePieceModel load_model(const TokenizerDir& d) {
  const std::string path = require_tokenizer_file(d, "spiece.model");
  return SentencePieceModel(path, d.file_label("spiece.model"));
}

}  // namespace

T5Tokenizer::T5Tokenizer(const std::string& dir, const std::string& label)
    : label_(label.empty() ? dir : label), sp_(load_model(TokenizerDir{dir, label_})) {
  const TokenizerDir d{dir, label_};
  const std::string model_label = d.file_label("spiece.model");

  struct Special {
    const char* key;
    int64_t id;
    int64_t* out;
  };
  for (const Special& s : {Special{"eos_token", sp_.eos_id(), &eos_id_}, Special{"pad_token", sp_.pad_id(), &pad_id_},
                           Special{"unk_token", sp_.unk_id(), &unk_id_}}) {
    if (s.id < 0 || s.id >= sp_.vocab_size())
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
      const std::string piece = sp_.id_to_piece(id);
      if (token && *token != piece)
        throw TokenizerError(str_cat(f.label, ": '", key, "' is \"", *token, "\" but spiece.model has \"", piece,
                                     "\" (id ", id, ")"));
    }
  }
}

Encoding T5Tokenizer::encode(const std::string& text, int64_t max_length) const {
  check_max_length(max_length, str_cat(label_, ": T5 encode"));
  check_utf8(text, "prompt");
  const std::vector<SentencePiece> pieces = sp_.encode(text);
  std::vector<int64_t> ids;
  ids.reserve(pieces.size());
  for (const SentencePiece& p : pieces) ids.push_back(p.id);
  Encoding e = lay_out(ids, -1, eos_id_, pad_id_, max_length);
  if (e.truncated) {
    // Piece offsets are byte offsets into the original (unnormalised) text.
    const size_t begin = pieces[static_cast<size_t>(max_length - 1)].begin;
    const size_t end = pieces.back().end;
    e.dropped = trim_white_space(text.substr(begin, end - begin));
  }
  return e;
}

std::vector<std::string> T5Tokenizer::pieces(const std::string& text) const {
  check_utf8(text, "prompt");
  std::vector<std::string> out;
  for (SentencePiece& p : sp_.encode(text)) out.push_back(std::move(p.piece));
  return out;
}

}  // namespace fluxmpi::text
