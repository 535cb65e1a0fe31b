// safetensors header parser: valid files in both layouts, and every malformation rejected with
// a message naming the file and the tensor.

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "io/tensor_store.h"

namespace fluxmpi::io {
namespace {

std::vector<uint8_t> with_header(const std::string& json, size_t data_bytes) {
  std::vector<uint8_t> out(8 + json.size() + data_bytes, 0);
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, json.data(), json.size());
  return out;
}

std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    parse_safetensors_header(bytes.data(), bytes.size(), "bad.safetensors");
  } catch (const WeightError& e) {
    return e.what();
  }
  return "";
}

TEST(SafetensorsHeader, ParsesTensorsMetadataAndOffsets) {
  std::string json =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  auto bytes = with_header(json, 12);
  SafetensorsHeader h = parse_safetensors_header(bytes.data(), bytes.size(), "x");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  const TensorEntry* a = h.find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::F32);
  EXPECT_EQ(a->num_elements(), 2u);
  EXPECT_EQ(h.find("b")->begin, 8u);
  EXPECT_EQ(h.data_offset, 8 + json.size());
  EXPECT_EQ(h.find("c"), nullptr);
}

TEST(SafetensorsHeader, AcceptsScalarsAndEmptyTensors) {
  std::string json = R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"e":{"dtype":"F16","shape":[0,3],"data_offsets":[4,4]}})";
  auto bytes = with_header(json, 4);
  SafetensorsHeader h = parse_safetensors_header(bytes.data(), bytes.size(), "x");
  EXPECT_EQ(h.find("s")->num_elements(), 1u);
  EXPECT_EQ(h.find("e")->num_elements(), 0u);
}

struct Malformed {
  const char* what;
  std::vector<uint8_t> bytes;
  const char* expected;  // substring of the message
};

std::vector<Malformed> malformed_cases() {
  std::vector<Malformed> v;
  v.push_back({"shorter than 8 bytes", {1, 2, 3}, "shorter than the 8-byte header length"});
  {
    auto b = with_header("{}", 0);
    b[0] = 0xff;  // length beyond the file
    b[1] = 0x10;
    v.push_back({"length beyond file", b, "runs beyond the end of the file"});
  }
  {
    std::vector<uint8_t> b(16, 0);
    uint64_t n = 200ull * 1000 * 1000;
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(n >> (8 * i));
    v.push_back({"header over 100 MB", b, "exceeds the limit"});
  }
  v.push_back({"not JSON", with_header("{not json", 0), "not valid JSON"});
  v.push_back({"JSON array", with_header("[1, 2, 3]", 0), "not a JSON object"});
  v.push_back({"unknown dtype", with_header(R"({"t":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", 4),
               "tensor 't': unknown dtype 'F31'"});
  v.push_back({"missing dtype", with_header(R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4), "tensor 't': missing"});
  v.push_back({"negative dim", with_header(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
               "tensor 't': shape entry -1"});
  v.push_back({"offsets out of range", with_header(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4),
               "run beyond the data section"});
  v.push_back({"size mismatch", with_header(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
               "need 12 bytes"});
  v.push_back({"overflowing shape",
               with_header(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8),
               "overflows"});
  v.push_back({"overlap",
               with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
               "overlaps"});
  v.push_back({"gap",
               with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12),
               "gap in the data section"});
  v.push_back({"trailing data", with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8),
               "tensors cover 4 bytes of a data section of 8"});
  v.push_back({"duplicate name",
               with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
               "listed twice"});
  v.push_back({"metadata not strings", with_header(R"({"__metadata__":{"x":1}})", 0), "is not a string"});
  v.push_back({"offsets reversed", with_header(R"({"t":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4),
               "end before they begin"});
  v.push_back({"entry not object", with_header(R"({"t":[1,2]})", 0), "entry is not a JSON object"});
  return v;
}

TEST(SafetensorsHeader, RejectsEveryMalformation) {
  for (const auto& c : malformed_cases()) {
    std::string msg = parse_error(c.bytes);
    EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << c.what << ": message does not name the file: " << msg;
    EXPECT_NE(msg.find(c.expected), std::string::npos) << c.what << ": got '" << msg << "'";
  }
}

TEST(SafetensorsHeader, TruncatedFileIsRejectedAtEveryLength) {
  SafetensorsWriter w;
  std::vector<float> data(16, 1.0f);
  w.add("x", DType::F32, {4, 4}, data.data(), data.size() * 4);
  std::vector<uint8_t> full = w.serialize();
  EXPECT_NO_THROW(parse_safetensors_header(full.data(), full.size(), "ok"));
  for (size_t n = 0; n < full.size(); ++n) {
    EXPECT_THROW(parse_safetensors_header(full.data(), n, "cut"), WeightError) << "accepted a file cut to " << n << " bytes";
  }
}

class TempDir : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("fluxmpi-st-" + std::string(testing::UnitTest::GetInstance()->current_test_info()->name()) + "-" +
            std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write_text(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  std::filesystem::path dir_;
};

using TensorStoreTest = TempDir;

TEST_F(TensorStoreTest, HollowTensorsAreHolesThatReadAsZeros) {
  // 1 GiB of declared data between two stored tensors: the file's size says 1 GiB, its blocks
  // on disk do not, and the stored values sit at their offsets.
  std::vector<float> a = {1, 2, 3}, b = {4, 5};
  SafetensorsWriter w;
  w.add("a", DType::F32, {3}, a.data(), 12);
  w.add_hollow("big", DType::BF16, {16384, 32768});
  w.add("b", DType::F32, {2}, b.data(), 8);
  EXPECT_EQ(w.data_bytes(), 12u + (1ull << 30) + 8u);
  EXPECT_THROW(w.serialize(), Error);
  const auto path = dir_ / "hollow.safetensors";
  w.write(path.string());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_GT(static_cast<uint64_t>(st.st_size), 1ull << 30);
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, 1ull << 20) << "the hollow tensor took disk space";
  TensorStore s = TensorStore::open_file(path.string(), "hollow");
  EXPECT_EQ(s.get("big").entry->shape, (std::vector<int64_t>{16384, 32768}));
  EXPECT_EQ(reinterpret_cast<const float*>(s.get("a").data())[2], 3.0f);
  EXPECT_EQ(reinterpret_cast<const float*>(s.get("b").data())[1], 5.0f);
  EXPECT_EQ(s.get("big").data()[12345], 0);
}

TEST_F(TensorStoreTest, ReadsSingleFileAndShardedLayouts) {
  std::vector<float> a = {1, 2, 3}, b = {4, 5};
  SafetensorsWriter single;
  single.add("a", DType::F32, {3}, a.data(), 12);
  single.add("b", DType::F32, {2}, b.data(), 8);
  single.write((dir_ / "model.safetensors").string());
  TensorStore s1 = TensorStore::open_dir(dir_.string(), "one");
  EXPECT_EQ(s1.keys(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(reinterpret_cast<const float*>(s1.get("b").data())[1], 5.0f);

  std::filesystem::remove(dir_ / "model.safetensors");
  SafetensorsWriter w1, w2;
  w1.add("a", DType::F32, {3}, a.data(), 12);
  w2.add("b", DType::F32, {2}, b.data(), 8);
  w1.write((dir_ / "diffusion_pytorch_model-00001-of-00002.safetensors").string());
  w2.write((dir_ / "diffusion_pytorch_model-00002-of-00002.safetensors").string());
  write_text("diffusion_pytorch_model.safetensors.index.json",
             R"({"metadata":{},"weight_map":{"a":"diffusion_pytorch_model-00001-of-00002.safetensors",)"
             R"("b":"diffusion_pytorch_model-00002-of-00002.safetensors"}})");
  TensorStore s2 = TensorStore::open_dir(dir_.string(), "sharded");
  EXPECT_EQ(s2.file_of("b"), "diffusion_pytorch_model-00002-of-00002.safetensors");
  EXPECT_EQ(reinterpret_cast<const float*>(s2.get("a").data())[2], 3.0f);
}

TEST_F(TensorStoreTest, RejectsMissingShardAndLyingIndex) {
  std::vector<float> a = {1, 2, 3};
  SafetensorsWriter w1;
  w1.add("a", DType::F32, {3}, a.data(), 12);
  w1.add("b", DType::F32, {3}, a.data(), 12);
  w1.write((dir_ / "s1.safetensors").string());
  write_text("model.safetensors.index.json", R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  try {
    TensorStore::open_dir(dir_.string(), "m");
    FAIL() << "missing shard accepted";
  } catch (const WeightError& e) {
    EXPECT_NE(std::string(e.what()).find("shard 's2.safetensors' listed in the index is missing"), std::string::npos) << e.what();
  }
  // b is stored in s1 although the index assigns it to s2: a tensor listed twice.
  w1.write((dir_ / "s2.safetensors").string());
  TensorStore s = TensorStore::open_dir(dir_.string(), "m");
  try {
    s.get("a");
    FAIL() << "tensor stored in two shards accepted";
  } catch (const WeightError& e) {
    EXPECT_NE(std::string(e.what()).find("but the index assigns it to"), std::string::npos) << e.what();
  }
}

TEST_F(TensorStoreTest, RejectsPathsOutsideTheDirectoryAndNonFiles) {
  write_text("model.safetensors.index.json", R"({"weight_map":{"a":"../evil.safetensors"}})");
  EXPECT_THROW(TensorStore::open_dir(dir_.string(), "m"), WeightError);
  std::filesystem::remove(dir_ / "model.safetensors.index.json");
  std::filesystem::create_directories(dir_ / "model.safetensors");
  try {
    TensorStore::open_dir(dir_.string(), "m");
    FAIL() << "directory accepted as a weights file";
  } catch (const WeightError& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir_ / "model.safetensors");
  EXPECT_THROW(TensorStore::open_dir(dir_.string(), "m"), WeightError);  // nothing there
  std::filesystem::create_symlink(dir_ / "loop.safetensors", dir_ / "loop.safetensors");
  try {
    TensorStore::open_dir(dir_.string(), "m");
    FAIL() << "symlink loop accepted";
  } catch (const WeightError& e) {
    EXPECT_NE(std::string(e.what()).find("symbolic links"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fluxmpi::io
