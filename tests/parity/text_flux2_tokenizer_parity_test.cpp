// FLUX.2 tokenizers and chat templates: every case of flux2/tokenizer_cases.json for both tiny
// tokenizers (raw ids and tokens, rendered chat text, chat ids, ids and mask at max_length 64),
// and the prompt_input_ids / prompt_attention_mask (and negative_*) of every flux2 pipeline case,
// all exact.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include "core/error.h"
#include "support/fixtures.h"
#include "support/subtree_cases.h"
#include "support/tensor_compare.h"
#include "text/flux2_prompts.h"

namespace fluxmpi::text {
namespace {
namespace fs = std::filesystem;

std::string tokenizer_cases_file() { return test::flux2_subtree() + "/tokenizer_cases.json"; }

// The two tiny tokenizers by the key tokenizer_cases.json files their ids under.
std::string tokenizer_dir(const std::string& which) {
  return test::flux2_subtree() + (which == "qwen3" ? "/tiny-flux2-klein/tokenizer" : "/tiny-flux2-dev/tokenizer");
}

const Flux2Tokenizer& tiny_tokenizer(const std::string& which) {
  static const Flux2Tokenizer qwen3(tokenizer_dir("qwen3"));
  static const Flux2Tokenizer tekken(tokenizer_dir("tekken"));
  return which == "qwen3" ? qwen3 : tekken;
}

struct TokCase {
  std::string name;  ///< "<tokenizer>_<index>"; empty: no tokenizer_cases.json
  std::string which;
  nlohmann::json json;
};

std::vector<TokCase> tok_cases() {
  std::vector<TokCase> out;
  if (fs::is_regular_file(tokenizer_cases_file())) {
    const nlohmann::json all = nlohmann::json::parse(std::ifstream(tokenizer_cases_file()));
    for (const char* which : {"qwen3", "tekken"}) {
      const auto& cases = all.at("cases");
      for (size_t i = 0; i < cases.size(); ++i) out.push_back({str_cat(which, "_", i), which, cases[i]});
    }
  }
  if (out.empty()) out.push_back(TokCase{});
  return out;
}

std::string tok_case_name(const testing::TestParamInfo<TokCase>& info) {
  return info.param.name.empty() ? "no_tokenizer_cases" : info.param.name;
}

void PrintTo(const TokCase& c, std::ostream* os) { *os << (c.name.empty() ? "<no case>" : c.name); }

class Flux2TokenizerCase : public testing::TestWithParam<TokCase> {};

TEST_P(Flux2TokenizerCase, IdsTemplateAndPaddingMatchReference) {
  FLUXMPI_REQUIRE_ASSET(tokenizer_cases_file(), "flux2 tokenizer cases");
  const TokCase& c = GetParam();
  ASSERT_FALSE(c.name.empty());
  const Flux2Tokenizer& tok = tiny_tokenizer(c.which);
  const std::string text = c.json.at("text").get<std::string>();
  const nlohmann::json& want = c.json.at(c.which);
  const std::string where = str_cat("tokenizer_cases.json ", c.which, " case '", text.substr(0, 40), "'");

  const auto raw = tok.bpe().encode(text);
  const auto want_raw = want.at("raw_ids").get<std::vector<int64_t>>();
  EXPECT_EQ(raw, want_raw) << where << ": raw_ids differ at " << test::first_difference(raw, want_raw);
  EXPECT_EQ(tok.bpe().tokenize(text), want.at("raw_tokens").get<std::vector<std::string>>()) << where << ": raw_tokens";

  const std::string chat = flux2_chat_text(tok, text);
  EXPECT_EQ(chat, want.at("chat_text").get<std::string>()) << where << ": chat_text";
  const auto chat_ids = tok.bpe().encode(chat);
  const auto want_chat = want.at("chat_ids").get<std::vector<int64_t>>();
  EXPECT_EQ(chat_ids, want_chat) << where << ": chat_ids differ at " << test::first_difference(chat_ids, want_chat);

  const PromptTokens p = tokenize_flux2_prompt(tok, text, 64);
  const auto want_ids = want.at("chat_ids_msl64").get<std::vector<int64_t>>();
  const auto want_mask = want.at("chat_mask_msl64").get<std::vector<int64_t>>();
  EXPECT_EQ(p.ids, want_ids) << where << ": chat_ids_msl64 differ at " << test::first_difference(p.ids, want_ids);
  EXPECT_EQ(p.mask, want_mask) << where << ": chat_mask_msl64 differ at " << test::first_difference(p.mask, want_mask);
  EXPECT_EQ(p.num_tokens, static_cast<int64_t>(want_chat.size())) << where << ": num_tokens";
  EXPECT_EQ(p.real_tokens, std::min<int64_t>(64, static_cast<int64_t>(want_chat.size()))) << where << ": real_tokens";
}

INSTANTIATE_TEST_SUITE_P(TokenizerCases, Flux2TokenizerCase, testing::ValuesIn(tok_cases()), tok_case_name);

TEST(Flux2Tokenizer, StyleAndSpecialTokensComeFromTheFolder) {
  FLUXMPI_REQUIRE_ASSET(tokenizer_cases_file(), "flux2 tokenizer cases");
  const Flux2Tokenizer& qwen = tiny_tokenizer("qwen3");
  EXPECT_EQ(qwen.style(), Flux2TextStyle::Qwen3);
  EXPECT_EQ(qwen.pad_id(), qwen.bpe().token_to_id("<|endoftext|>").value());
  EXPECT_FALSE(qwen.pads_left());
  EXPECT_FALSE(qwen.truncates_left());
  EXPECT_TRUE(qwen.bos_token().empty());
  const Flux2Tokenizer& tekken = tiny_tokenizer("tekken");
  EXPECT_EQ(tekken.style(), Flux2TextStyle::Mistral);
  EXPECT_EQ(tekken.pad_id(), tekken.bpe().token_to_id("<pad>").value());
  EXPECT_TRUE(tekken.pads_left());
  EXPECT_FALSE(tekken.truncates_left());
  EXPECT_EQ(tekken.bos_token(), "<s>");
  // The layout the fixtures document (README flux2/ "Tokenizers"), read back through the files.
  EXPECT_EQ(qwen.pad_id(), 1256);
  EXPECT_EQ(tekken.pad_id(), 11);
  EXPECT_EQ(qwen.bpe().vocab_size(), 1282);
  EXPECT_EQ(tekken.bpe().vocab_size(), 2256);
  EXPECT_EQ(tekken.bpe().id_to_token(17).value_or(""), "[SYSTEM_PROMPT]");
  EXPECT_FALSE(tekken.bpe().id_to_token(2256).has_value());
}

// ---- pipeline cases: the ids and masks the text encoder got --------------------------------

class Flux2PromptIds : public testing::TestWithParam<test::SubtreeCase> {};

std::vector<std::string> call_prompts(const nlohmann::json& call) {
  const nlohmann::json& p = call.at("prompt");
  if (p.is_string()) return {p.get<std::string>()};
  return p.get<std::vector<std::string>>();
}

// [B, S] ids and mask of `prompts`, plus the chat texts, as the pipeline would feed them.
struct Batch {
  at::Tensor ids, mask;
  std::vector<std::string> texts;
  std::vector<int64_t> real;
};
Batch tokenize_batch(const Flux2Tokenizer& tok, const std::vector<std::string>& prompts, int64_t msl) {
  Batch b;
  std::vector<int64_t> ids, mask;
  for (const std::string& p : prompts) {
    const PromptTokens t = tokenize_flux2_prompt(tok, p, msl);
    ids.insert(ids.end(), t.ids.begin(), t.ids.end());
    mask.insert(mask.end(), t.mask.begin(), t.mask.end());
    b.texts.push_back(flux2_chat_text(tok, p));
    b.real.push_back(t.real_tokens);
  }
  const auto n = static_cast<int64_t>(prompts.size());
  b.ids = torch::tensor(ids, torch::kInt64).view({n, msl});
  b.mask = torch::tensor(mask, torch::kInt64).view({n, msl});
  return b;
}

TEST_P(Flux2PromptIds, InputIdsAndMasksAreIdentical) {
  const test::SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  const Flux2Tokenizer tok(c.model_dir + "/tokenizer");
  const nlohmann::json& call = c.json.at("call");
  const int64_t msl = call.value("max_sequence_length", kFlux2MaxSequenceLength);
  const std::vector<std::string> prompts = call_prompts(call);
  const test::CaseTensors tensors(c.file);

  const Batch pos = tokenize_batch(tok, prompts, msl);
  test::expect_identical(c.name + " prompt_input_ids", pos.ids, tensors.get("prompt_input_ids"));
  test::expect_identical(c.name + " prompt_attention_mask", pos.mask, tensors.get("prompt_attention_mask"));
  EXPECT_EQ(pos.real, c.json.at("prompt_tokens_real").get<std::vector<int64_t>>()) << c.name << ": prompt_tokens_real";

  std::vector<std::string> texts = pos.texts;
  if (tensors.has("negative_input_ids")) {
    // CFG: one negative prompt "" per prompt.
    const Batch neg = tokenize_batch(tok, std::vector<std::string>(prompts.size(), ""), msl);
    test::expect_identical(c.name + " negative_input_ids", neg.ids, tensors.get("negative_input_ids"));
    test::expect_identical(c.name + " negative_attention_mask", neg.mask, tensors.get("negative_attention_mask"));
    texts.insert(texts.end(), neg.texts.begin(), neg.texts.end());
  }
  // The manifest records the rendered texts per text-encoder call (klein: one per prompt, dev:
  // one call for the batch); flattened they are the texts in order.
  std::vector<std::string> recorded;
  for (const auto& group : c.json.at("chat_texts"))
    for (const auto& t : group) recorded.push_back(t.get<std::string>());
  EXPECT_EQ(texts, recorded) << c.name << ": chat_texts";
}

INSTANTIATE_TEST_SUITE_P(Flux2Pipelines, Flux2PromptIds,
                         testing::ValuesIn(test::flux2_cases([](const std::string& k) { return k == "pipeline"; })),
                         test::image_case_name);

}  // namespace
}  // namespace fluxmpi::text
