#pragma once
/// Self-made T5 tokenizers for demo models: a sentencepiece unigram model with T5's special ids.

#include <cstdint>
#include <string>

namespace fluxmpi::text {

/// Trains a unigram sentencepiece model on `corpus_path` (UTF-8, one sentence per line) with
/// T5's conventions (pad=0 <pad>, eos=1 </s>, unk=2 <unk>, no BOS; nmt_nfkc normalisation,
/// dummy prefix, extra white space removed; every character of the corpus covered) and writes
/// `out_dir`/spiece.model, tokenizer_config.json (T5Tokenizer, legacy, no extra ids) and
/// special_tokens_map.json, creating `out_dir` when missing. Single-threaded with a fixed seed:
/// the same corpus gives byte-identical files. UsageError for a missing corpus or a vocab_size
/// the corpus cannot fill (sentencepiece's message included); IoError when writing fails.
void train_t5_unigram(const std::string& corpus_path, int64_t vocab_size, const std::string& out_dir,
                      int64_t model_max_length = 512);

}  // namespace fluxmpi::text
