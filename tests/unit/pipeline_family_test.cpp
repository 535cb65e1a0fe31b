// The model-family seam (pipeline/family.h): which family a model folder is, the names the run
// plan carries, and stage 1's loop over the job (each distinct prompt encoded once, in job order).

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/model_dir.h"
#include "pipeline/family.h"
#include "pipeline/prepared_run.h"
#include "support/fixtures.h"

namespace fluxmpi::pipeline {
namespace {
namespace fs = std::filesystem;

TEST(Family, FolderPicksItsFamilyAndThePlanNameFindsItAgain) {
  FLUXMPI_REQUIRE_FIXTURES();
  const struct {
    std::string folder;
    const char* name;
    bool second_prompt;
  } cases[] = {{"tiny-flux-dev", "flux1", true}, {"flux2/tiny-flux2-klein", "flux2", false}};
  for (const auto& c : cases) {
    const fs::path dir = fs::path(test::fixture_root()) / c.folder;
    FLUXMPI_REQUIRE_ASSET((dir / "model_index.json").string(), "model folder");
    const Family& family = family_of(io::ModelDir(dir.string()));
    EXPECT_STREQ(family.name(), c.name) << c.folder;
    EXPECT_EQ(&family_named(c.name), &family) << c.folder;
    EXPECT_EQ(&family.root()->family(), &family) << c.folder;
    EXPECT_EQ(family.second_prompt(), c.second_prompt) << c.folder;
  }
}

TEST(Family, AnUnknownNameInThePlanIsACommErrorNamingIt) {
  try {
    family_named("flux3");
    FAIL() << "no error";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("'flux3'"), std::string::npos) << e.what();
  }
}

// A job of four images: "a", "b", "a" (resumed: already encoded), "c" (decoded), two passes.
PreparedRun job_of_four() {
  PreparedRun run;
  for (const char* p : {"a", "b", "a", "c"}) {
    ImageJob j;
    j.index = static_cast<int64_t>(run.images.size());
    j.prompt = p;
    run.images.push_back(j);
  }
  run.progress.assign(4, ImageProgress{});
  run.progress[2].needs_encoding = false;
  run.progress[3].decoded = true;
  return run;
}

TEST(Family, StageOneEncodesEachDistinctPromptOnceInJobOrder) {
  const PreparedRun run = job_of_four();
  std::vector<std::string> calls;
  PromptEmbeddings out;
  const size_t distinct = encode_job_prompts(
      run, 2, [](const ImageJob& job, int pass) { return PromptKey{pass == 0 ? job.prompt : "", ""}; },
      [&](const PromptKey& key, size_t image, int pass) {
        calls.push_back(key.first + "@" + std::to_string(image) + "/" + std::to_string(pass));
        PromptEmbedding e;
        e.prompt_embeds = at::full({1}, static_cast<double>(calls.size()));
        return e;
      },
      out);
  EXPECT_EQ(distinct, 2u + 1u);  // "a", "b" and the negative ""
  EXPECT_EQ(calls, (std::vector<std::string>{"a@0/0", "@0/1", "b@1/0"}));
  ASSERT_EQ(out.text.size(), 4u);
  ASSERT_EQ(out.negative.size(), 4u);
  EXPECT_EQ(out.text[0].prompt_embeds.item<float>(), 1.0f);
  EXPECT_EQ(out.negative[0].prompt_embeds.item<float>(), 2.0f);
  EXPECT_EQ(out.text[1].prompt_embeds.item<float>(), 3.0f);
  EXPECT_EQ(out.negative[1].prompt_embeds.item<float>(), 2.0f);  // shared with image 0's
  EXPECT_FALSE(out.text[2].prompt_embeds.defined());  // resumed: its embeddings are in the checkpoint
  EXPECT_FALSE(out.text[3].prompt_embeds.defined());  // decoded
}

}  // namespace
}  // namespace fluxmpi::pipeline
