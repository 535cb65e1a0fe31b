// The job: prompts files, UTF-8 checks, seeds S + i, output naming, prompt-major order.

#include <gtest/gtest.h>
#include <gmock/gmock.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "app/job.h"
#include "core/error.h"

namespace fluxmpi::app {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;

class Job : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / str_cat("fluxmpi-job-", ::getpid(), "-", info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  std::string prompts_error(const std::string& file) const {
    try {
      read_prompts_file(file);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(no UsageError)";
  }

  fs::path dir_;
};

using Prompts = std::vector<std::string>;

TEST_F(Job, PromptsFileLinesCrlfAndBlankLines) {
  EXPECT_EQ(read_prompts_file(write("a.txt", "a cat\na dog\n")), (Prompts{"a cat", "a dog"}));
  EXPECT_EQ(read_prompts_file(write("b.txt", "a cat\r\na dog\r\n")), (Prompts{"a cat", "a dog"}));
  EXPECT_EQ(read_prompts_file(write("c.txt", "\n\na cat\n \t \r\n\r\na dog")), (Prompts{"a cat", "a dog"}));
  // Inner spaces are kept; a byte-order mark is not part of the first prompt.
  EXPECT_EQ(read_prompts_file(write("d.txt", "\xEF\xBB\xBF" "caf\xC3\xA9  au lait \n")), (Prompts{"caf\xC3\xA9  au lait "}));
  EXPECT_EQ(read_prompts_file(write("e.txt", "one")), (Prompts{"one"}));
}

TEST_F(Job, PromptsFileErrors) {
  const std::string empty = write("empty.txt", "");
  EXPECT_EQ(prompts_error(empty), str_cat("prompts file '", empty, "': no prompts (the file is empty or has only blank lines)"));
  const std::string blank = write("blank.txt", "\n  \r\n\t\n");
  EXPECT_EQ(prompts_error(blank), str_cat("prompts file '", blank, "': no prompts (the file is empty or has only blank lines)"));
  EXPECT_EQ(prompts_error(path("missing.txt")), str_cat("prompts file '", path("missing.txt"), "': not found"));
  EXPECT_EQ(prompts_error(dir_.string()), str_cat("prompts file '", dir_.string(), "': is a directory, not a file"));
  const std::string bad = write("bad.txt", "fine\n\nbad \xC3\x28 here\n");
  EXPECT_EQ(prompts_error(bad), str_cat("prompts file '", bad, "': line 3 is not valid UTF-8 (byte 5 of the line)"));
  const std::string latin1 = write("latin1.txt", "caf\xE9\r\n");
  EXPECT_EQ(prompts_error(latin1), str_cat("prompts file '", latin1, "': line 1 is not valid UTF-8 (byte 4 of the line)"));
}

TEST_F(Job, Utf8Validation) {
  constexpr auto ok = std::string_view::npos;
  EXPECT_EQ(find_invalid_utf8(""), ok);
  EXPECT_EQ(find_invalid_utf8("plain ascii"), ok);
  EXPECT_EQ(find_invalid_utf8("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF"), ok);  // é € 😀 U+10FFFF
  EXPECT_EQ(find_invalid_utf8("a\x80"), 1u);                // continuation byte without a lead byte
  EXPECT_EQ(find_invalid_utf8("ab\xC3"), 2u);               // truncated sequence
  EXPECT_EQ(find_invalid_utf8("\xC0\xAF"), 0u);             // overlong '/'
  EXPECT_EQ(find_invalid_utf8("\xE0\x80\xAF"), 0u);         // overlong, 3 bytes
  EXPECT_EQ(find_invalid_utf8("x\xED\xA0\x80"), 1u);        // UTF-16 surrogate
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);     // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("\xF8\x88\x80\x80\x80"), 0u); // 5-byte form
  EXPECT_EQ(find_invalid_utf8("\xC3\x28"), 0u);             // lead byte followed by ASCII
}

TEST_F(Job, OutputNaming) {
  // One image: the pattern as given, {i} replaced if present.
  EXPECT_EQ(image_output_path("", 0, 1), "fluxmpi.png");
  EXPECT_EQ(image_output_path("out/cat.png", 0, 1), "out/cat.png");
  EXPECT_EQ(image_output_path("out/cat-{i}.png", 0, 1), "out/cat-00000.png");
  // Several images: {i} replaced (every occurrence), or -{i} inserted before the extension.
  EXPECT_EQ(image_output_path("", 3, 4), "fluxmpi-00003.png");
  EXPECT_EQ(image_output_path("out/cat.png", 2, 4), "out/cat-00002.png");
  EXPECT_EQ(image_output_path("out.d/cat.v1.png", 12, 20), "out.d/cat.v1-00012.png");
  EXPECT_EQ(image_output_path("run_{i}/img{i}.png", 7, 10), "run_00007/img00007.png");
  EXPECT_EQ(image_output_path("img_{i}.png", 99999, 100000), "img_99999.png");
}

TEST_F(Job, OneImageDefaults) {
  RunConfig c;
  c.prompts = {"a cat"};
  c.seed = 5;
  std::vector<ImageJob> job = build_job(c);
  ASSERT_EQ(job.size(), 1u);
  EXPECT_EQ(job[0].index, 0);
  EXPECT_EQ(job[0].prompt, "a cat");
  EXPECT_EQ(job[0].prompt_2, "a cat");  // diffusers: prompt_2 or prompt
  EXPECT_EQ(job[0].negative_prompt, "");
  EXPECT_EQ(job[0].seed, 5);
  EXPECT_EQ(job[0].output_path, "fluxmpi.png");
}

TEST_F(Job, PromptMajorOrderSeedsAndNames) {
  RunConfig c;
  c.prompts = {"a cat", "a dog"};
  c.num_images = 3;
  c.seed = 100;
  c.prompt_2 = "t5 side";
  c.negative_prompt = "blurry";
  c.output = path("img.png");
  std::vector<ImageJob> job = build_job(c);
  ASSERT_EQ(job.size(), 6u);
  for (int64_t i = 0; i < 6; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(job[i].index, i);
    EXPECT_EQ(job[i].prompt, i < 3 ? "a cat" : "a dog");
    EXPECT_EQ(job[i].prompt_2, "t5 side");
    EXPECT_EQ(job[i].negative_prompt, "blurry");
    EXPECT_EQ(job[i].seed, 100 + i);
    EXPECT_EQ(job[i].output_path, path(str_cat("img-0000", i, ".png")));
  }
  c.output = "";
  EXPECT_EQ(build_job(c)[4].output_path, "fluxmpi-00004.png");
  c.output = path("{i}-img.png");
  EXPECT_EQ(build_job(c)[5].output_path, path("00005-img.png"));
}

TEST_F(Job, Limits) {
  RunConfig c;
  c.prompts = {"a", "b"};
  c.seed = 0;
  c.num_images = kMaxImages / 2;
  EXPECT_EQ(build_job(c).size(), static_cast<size_t>(kMaxImages));
  c.num_images = kMaxImages / 2 + 1;
  try {
    build_job(c);
    ADD_FAILURE() << "a job over kMaxImages images was accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "the job has 2 prompts x --num-images 50001 images; at most 100000 images fit the 5-digit image index");
  }
  c.num_images = 2;
  c.seed = INT64_MAX - 3;  // seeds up to S + 3
  EXPECT_EQ(build_job(c).back().seed, INT64_MAX);
  c.seed = INT64_MAX - 2;
  try {
    build_job(c);
    ADD_FAILURE() << "a seed past the int64 range was accepted";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("exceed the int64 range"));
  }
}

TEST_F(Job, PerImageOutputDirectoriesAreChecked) {
  RunConfig c;
  c.prompts = {"a"};
  c.num_images = 2;
  c.seed = 1;
  c.output = path("run{i}/img.png");
  fs::create_directories(path("run00000"));
  try {
    build_job(c);
    ADD_FAILURE() << "a missing output directory was accepted";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              str_cat("--output '", path("run00001/img.png"), "': directory '", path("run00001"), "' does not exist"));
  }
  fs::create_directories(path("run00001"));
  EXPECT_EQ(build_job(c).size(), 2u);
}

TEST_F(Job, SeedIsResolvedOnce) {
  RunConfig c;
  c.prompts = {"a"};
  EXPECT_THROW(build_job(c), InternalError);
  EXPECT_TRUE(resolve_seed(c));
  ASSERT_TRUE(c.seed.has_value());
  EXPECT_GE(*c.seed, 0);
  EXPECT_LE(*c.seed, int64_t{0xFFFFFFFF});
  const int64_t drawn = *c.seed;
  EXPECT_FALSE(resolve_seed(c));  // a given (or already drawn) seed is kept
  EXPECT_EQ(c.seed, drawn);
  EXPECT_EQ(build_job(c)[0].seed, drawn);
  RunConfig no_prompts;
  no_prompts.seed = 1;
  EXPECT_THROW(build_job(no_prompts), InternalError);
}

}  // namespace
}  // namespace fluxmpi::app

namespace fluxmpi::app {
namespace {

// JSON Lines prompts files (docs/cli.md): one object per line, paths relative to the file.
class JsonLines : public Job {
 protected:
  std::string error(const std::string& text) const {
    try {
      read_prompts_or_json_lines(write("p.jsonl", text));
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(no UsageError)";
  }
};

TEST_F(JsonLines, EntriesWithInputsRelativeToTheFile) {
  const std::string file = write("p.jsonl",
                                 "{\"prompt\": \"a red door\", \"image\": \"in/a.png\", \"strength\": 0.5}\n"
                                 "\n"
                                 "{\"prompt\": \"a blue door\", \"image\": \"/abs/b.png\", \"mask\": \"m.png\"}\r\n");
  const PromptsFile f = read_prompts_or_json_lines(file);
  EXPECT_EQ(f.prompts, (Prompts{"a red door", "a blue door"}));
  ASSERT_EQ(f.inputs.size(), 2u);
  EXPECT_EQ(f.inputs[0].image, path("in/a.png"));
  EXPECT_EQ(f.inputs[0].strength, 0.5);
  EXPECT_EQ(f.inputs[0].line, 1);
  EXPECT_EQ(f.inputs[1].image, "/abs/b.png");
  EXPECT_EQ(f.inputs[1].mask, path("m.png"));
  EXPECT_FALSE(f.inputs[1].strength.has_value());
  EXPECT_EQ(f.inputs[1].line, 3);
}

TEST_F(JsonLines, PlainLinesStayPlain) {
  const PromptsFile f = read_prompts_or_json_lines(write("p.txt", "a cat\n  {not json} a dog\n"));
  EXPECT_EQ(f.prompts, (Prompts{"a cat", "  {not json} a dog"}));
  EXPECT_TRUE(f.inputs.empty());
}

TEST_F(JsonLines, ErrorsNameTheLine) {
  EXPECT_THAT(error("{\"prompt\": \"a\"}\n{\"prompt\": \"b\", \"image\": 3}\n"), HasSubstr("line 2: \"image\" must be a string"));
  EXPECT_THAT(error("{\"prompt\": \"a\"}\n{\"prompt\": \"b\"\n"), HasSubstr("line 2: not valid JSON"));
  EXPECT_THAT(error("{\"image\": \"a.png\"}\n"), HasSubstr("line 1: no \"prompt\""));
  EXPECT_THAT(error("{\"prompt\": \"a\", \"seed\": 4}\n"), HasSubstr("line 1: unknown key \"seed\""));
  EXPECT_THAT(error("{\"prompt\": \"a\", \"strength\": 0}\n"), HasSubstr("line 1: \"strength\" must be in (0, 1], got 0"));
  EXPECT_THAT(error("{\"prompt\": \"a\"}\n[1, 2]\n"), HasSubstr("line 2: not a JSON object"));
}

TEST_F(JsonLines, BuildJobTakesEachEntrysInputsElseTheCommandLines) {
  RunConfig c;
  c.seed = 3;
  c.num_images = 2;
  c.image = "/cli/photo.png";
  c.mask = "/cli/mask.png";
  c.prompts = {"a", "b"};
  PromptInputs first;
  first.image = "/lines/one.png";
  first.strength = 0.4;
  first.line = 1;
  PromptInputs second;
  second.line = 2;
  c.prompt_inputs = {first, second};
  const std::vector<ImageJob> job = build_job(c);
  ASSERT_EQ(job.size(), 4u);
  EXPECT_EQ(job[1].image, "/lines/one.png");
  EXPECT_EQ(job[1].mask, "/cli/mask.png");
  EXPECT_EQ(job[1].strength, 0.4);
  EXPECT_EQ(job[1].line, 1);
  EXPECT_EQ(job[2].image, "/cli/photo.png");
  EXPECT_FALSE(job[2].strength.has_value());
  EXPECT_EQ(job[3].line, 2);
}

}  // namespace
}  // namespace fluxmpi::app
