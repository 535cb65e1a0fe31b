// Replays a fuzz target's seed corpus (tests/fuzz/corpus/<target>/) and the inputs that once broke
// it (tests/fuzz/regressions/<target>/) through its LLVMFuzzerTestOneInput, one test per file, in
// the normal build: regressions stay checked without clang or libFuzzer. A crash or a broken
// invariant aborts the executable (ctest reports the test); an exception that escapes the target
// fails the test with its message.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {
namespace fs = std::filesystem;

struct Input {
  std::string kind;  ///< "corpus" or "regressions"; empty: none found
  fs::path path;
};

std::vector<Input> inputs() {
  std::vector<Input> out;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path dir = fs::path(FLUXMPI_FUZZ_DIR) / kind / FLUXMPI_FUZZ_TARGET;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && e.path().filename().string()[0] != '.') files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) out.push_back({kind, f});
  }
  if (out.empty()) out.push_back({});
  return out;
}

void PrintTo(const Input& in, std::ostream* os) { *os << (in.kind.empty() ? std::string("<none>") : in.path.string()); }

std::string input_name(const testing::TestParamInfo<Input>& info) {
  if (info.param.kind.empty()) return "no_inputs";
  std::string s = info.param.kind + "_" + info.param.path.filename().string();
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

class Replay : public testing::TestWithParam<Input> {};

TEST_P(Replay, TargetAcceptsOrRejectsCleanly) {
  const Input& in = GetParam();
  ASSERT_FALSE(in.kind.empty()) << "no seed corpus in " << FLUXMPI_FUZZ_DIR << "/corpus/" << FLUXMPI_FUZZ_TARGET;
  std::ifstream file(in.path, std::ios::binary);
  ASSERT_TRUE(file) << "cannot read " << in.path;
  std::ostringstream os;
  os << file.rdbuf();
  const std::string bytes = os.str();
  // Say which file runs before running it: a crash ends the process without gtest's report.
  std::fprintf(stderr, "replaying %s (%zu bytes)\n", in.path.c_str(), bytes.size());
  EXPECT_EQ(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 0);
}

INSTANTIATE_TEST_SUITE_P(FUZZ, Replay, testing::ValuesIn(inputs()), input_name);

}  // namespace
