#include "text/t5_unigram_trainer.h"

#include <filesystem>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/sentencepiece_loader.h"
#include "text/tokenizer_files.h"

namespace fluxmpi::text {
namespace {

// sentencepiece seeds its generator from std::random_device unless told otherwise.
constexpr unsigned kSeed = 1234;

nlohmann::ordered_json added_token(const std::string& content) {
  return {{"content", content}, {"lstrip", false}, {"normalized", false}, {"rstrip", false}, {"single_word", false}};
}

}  // namespace

void train_t5_unigram(const std::string& corpus_path, int64_t vocab_size, const std::string& out_dir,
                      int64_t model_max_length) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(corpus_path, ec))
    throw UsageError(str_cat("T5 tokenizer corpus '", corpus_path, "': not found or not a file"));
  if (vocab_size < 4) throw UsageError(str_cat("T5 unigram vocab_size must be at least 4, got ", vocab_size));

  const std::vector<std::pair<std::string, std::string>> options = {
      {"input", corpus_path},
      {"model_type", "unigram"},
      {"vocab_size", std::to_string(vocab_size)},
      {"pad_id", "0"}, {"pad_piece", "<pad>"},
      {"eos_id", "1"}, {"eos_piece", "</s>"},
      {"unk_id", "2"}, {"unk_piece", "<unk>"},
      {"bos_id", "-1"},
      {"normalization_rule_name", "nmt_nfkc"},
      {"add_dummy_prefix", "true"},
      {"remove_extra_whitespaces", "true"},
      {"character_coverage", "1.0"},
      // Determinism: every sentence, in file order, one thread.
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", "1"},
      {"minloglevel", "2"},
  };
  const std::string model =
      train_sentencepiece(options, kSeed, str_cat("training the T5 tokenizer on '", corpus_path, "'"));

  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw IoError(str_cat("cannot create directory '", out_dir, "': ", ec.message()));
  const std::filesystem::path dir(out_dir);
  write_text_file((dir / "spiece.model").string(), model);

  nlohmann::ordered_json config = {{"add_prefix_space", true},
                                   {"additional_special_tokens", nlohmann::ordered_json::array()},
                                   {"clean_up_tokenization_spaces", true},
                                   {"eos_token", "</s>"},
                                   {"extra_ids", 0},
                                   {"legacy", true},
                                   {"model_max_length", model_max_length},
                                   {"pad_token", "<pad>"},
                                   {"sp_model_kwargs", nlohmann::ordered_json::object()},
                                   {"tokenizer_class", "T5Tokenizer"},
                                   {"unk_token", "<unk>"}};
  write_text_file((dir / "tokenizer_config.json").string(), config.dump(2) + "\n");
  nlohmann::ordered_json special = {
      {"eos_token", added_token("</s>")}, {"pad_token", added_token("<pad>")}, {"unk_token", added_token("<unk>")}};
  write_text_file((dir / "special_tokens_map.json").string(), special.dump(2) + "\n");
}

}  // namespace fluxmpi::text
