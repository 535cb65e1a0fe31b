// The T5 tokenizer and its trainer in a process that links libtorch: libtorch's protobuf 3.21
// and the one inside Debian's libsentencepiece (3.14) used to clash at load time. Here the
// tokenizer (reached through the dlmopen'ed libfluxmpi_spm.so) reproduces the t5_input_ids of
// every pipeline case of the manifest, a unigram model is trained and used, and libtorch
// computes with the ids in the same process.

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>

#include <ATen/ATen.h>

#include "support/fixtures.h"
#include "support/tensor_compare.h"
#include "text/sentencepiece_loader.h"
#include "text/t5_tokenizer.h"
#include "text/t5_unigram_trainer.h"

namespace fluxmpi::text {
namespace {
namespace fs = std::filesystem;

at::Tensor as_tensor(const std::vector<int64_t>& ids) {
  return at::tensor(at::ArrayRef<int64_t>(ids), at::TensorOptions().dtype(at::kLong));
}

class T5IdsOfPipelineCase : public testing::TestWithParam<test::CaseRef> {};

// FluxPipeline gives T5 `prompt_2` when there is one, else `prompt`, with max_sequence_length.
TEST_P(T5IdsOfPipelineCase, MatchTheRecordedT5InputIds) {
  const test::CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  const nlohmann::json& call = c.json.at("call");
  const std::string prompt = call.at(call.contains("prompt_2") ? "prompt_2" : "prompt").get<std::string>();
  const int64_t max_length = call.at("max_sequence_length").get<int64_t>();

  const T5Tokenizer tok(c.model_dir + "/tokenizer_2");
  const Encoding e = tok.encode(prompt, max_length);
  // t5_input_ids: [1, max_sequence_length] int64 in case file c.file; exact.
  const at::Tensor ref = test::CaseTensors(c.file).get("t5_input_ids");
  EXPECT_TRUE(test::identical(test::case_label(c) + " t5_input_ids", as_tensor(e.ids).unsqueeze(0), ref));
}

INSTANTIATE_TEST_SUITE_P(Manifest, T5IdsOfPipelineCase, testing::ValuesIn(test::cases_of_kind("pipeline")),
                         test::case_test_name);

TEST(TextWithTorch, TrainsAUnigramModelAndComputesWithItsIds) {
  const fs::path dir = fs::temp_directory_path() / ("fluxmpi_text_with_torch_" + std::to_string(::getpid()));
  const int64_t vocab_size = 300;
  train_t5_unigram(std::string(FLUXMPI_SOURCE_DIR) + "/tools/make_tiny_model/corpus.txt", vocab_size, dir.string());
  const T5Tokenizer tok(dir.string());
  fs::remove_all(dir);
  ASSERT_EQ(tok.vocab_size(), vocab_size);

  const Encoding e = tok.encode("a photo of a cat", 16);
  ASSERT_EQ(e.ids.size(), 16u);
  const at::Tensor ids = as_tensor(e.ids);
  // A histogram of the ids by libtorch (one-hot rows summed) equals the one counted here.
  const at::Tensor hist = at::one_hot(ids, vocab_size).sum(0);
  std::vector<int64_t> want(static_cast<size_t>(vocab_size), 0);
  for (int64_t id : e.ids) ++want[static_cast<size_t>(id)];
  EXPECT_TRUE(test::identical("id histogram", hist, as_tensor(want)));
  EXPECT_EQ(hist[tok.pad_id()].item<int64_t>(), 16 - e.num_tokens - 1);

  // An embedding lookup and a matmul over the ids: row i of (one_hot @ table) is table[ids[i]].
  const at::Tensor table = at::arange(vocab_size * 4, at::kFloat).reshape({vocab_size, 4});
  const at::Tensor looked_up = at::matmul(at::one_hot(ids, vocab_size).to(at::kFloat), table);
  EXPECT_TRUE(test::identical("embedding lookup", looked_up, at::embedding(table, ids)));
}

TEST(TextWithTorch, SentencepieceStaysOutOfTheProgramsNamespace) {
  const SentencePieceRuntime& rt = sentencepiece_runtime();
  ASSERT_TRUE(rt.own_namespace) << "the shim '" << rt.path
                                << "' was loaded with plain dlopen (a sanitizer build?): its protobuf would "
                                   "share the process with libtorch's";
  EXPECT_EQ(::dlopen("libsentencepiece.so.0", RTLD_NOW | RTLD_NOLOAD), nullptr);
  EXPECT_EQ(::dlopen("libsentencepiece_train.so.0", RTLD_NOW | RTLD_NOLOAD), nullptr);
  EXPECT_EQ(::dlsym(RTLD_DEFAULT, "fluxmpi_spm_encode"), nullptr);
  // libtorch still computes with the shim's namespace (and its protobuf) in the process.
  const at::Tensor x = at::ones({3, 3});
  EXPECT_EQ(at::matmul(x, x).sum().item<float>(), 27.0f);
}

}  // namespace
}  // namespace fluxmpi::text
