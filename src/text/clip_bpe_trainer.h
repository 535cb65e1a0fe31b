#pragma once
/// Self-made CLIP tokenizers for demo models: byte-level BPE learnt from a corpus, written in
/// the layout of CLIP's tokenizer/ folder so that ClipTokenizer (and transformers) load it.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fluxmpi::text {

/// BPE merges in the order they were learnt (rank 0 first): ("a", "n") stands for "an".
using BpeMerges = std::vector<std::pair<std::string, std::string>>;

/// Learns merges from `corpus_text` with the standard BPE procedure over CLIP's pre-split words
/// (the same normalisation and split as ClipTokenizer, byte symbols, '</w>' on the last one):
/// repeatedly merge the most frequent adjacent pair, ties broken by the byte order of the pair's
/// (left, right) strings, until the vocabulary written by write_clip_tokenizer has `vocab_size`
/// entries or no pair occurs twice. vocab_size must be at least 514 (256 byte symbols, their
/// '</w>' forms and the two special tokens); UsageError otherwise. Deterministic.
BpeMerges train_clip_bpe(const std::string& corpus_text, int64_t vocab_size);

/// The vocabulary CLIP derives from its merges, in id order: the 256 byte symbols (in
/// byte_symbol_order()), the same with '</w>', each merge's joined symbol (skipping repeats),
/// then <|startoftext|> and <|endoftext|>.
std::vector<std::string> clip_vocab_from_merges(const BpeMerges& merges);

/// Writes vocab.json (sorted keys, two-space indent, as transformers saves it), merges.txt
/// ("#version: 0.2" header), tokenizer_config.json (CLIPTokenizer, model_max_length) and
/// special_tokens_map.json (bos <|startoftext|>; eos, pad, unk <|endoftext|>) into `out_dir`,
/// created when missing. Throws IoError.
void write_clip_tokenizer(const BpeMerges& merges, const std::string& out_dir, int64_t model_max_length = 77);

}  // namespace fluxmpi::text
