// The LoRAs of a run in the checkpoint: the `loras` image attribute round-trips (JSON, in order,
// with the scales), a file without it reads as no LoRAs, and check_matches (what --resume runs)
// names the field that differs: the number of LoRAs, a LoRA's file, a LoRA's scale.

#include <gtest/gtest.h>

#include <hdf5.h>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "ckpt/format.h"
#include "core/error.h"
#include "unit/ckpt_test_job.h"

namespace fluxmpi::ckpt {
namespace {
using namespace test;
namespace fs = std::filesystem;

std::string matches_error(const Job& stored, const Job& requested) {
  try {
    check_matches("run.h5", stored.file, stored.images, requested.file, requested.images);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "matches";
}

Job with_loras(std::vector<io::LoraSpec> loras) {
  Job job = tiny_job();
  for (auto& a : job.images) a.loras = loras;
  return job;
}

TEST(CheckpointLoras, ResumeNamesTheLoraFieldThatDiffers) {
  const Job stored = with_loras({{"/l/style.safetensors", 0.5}, {"/l/char.safetensors", 1.0}});
  EXPECT_EQ(matches_error(stored, stored), "matches");
  EXPECT_EQ(matches_error(stored, with_loras({{"/l/style.safetensors", 0.5}})),
            "run.h5: /images/00000: 'number of loras' is 2 in the checkpoint, the command line asks for 1; the checkpoint "
            "belongs to another job");
  EXPECT_EQ(matches_error(stored, with_loras({{"/l/style.safetensors", 0.8}, {"/l/char.safetensors", 1.0}})),
            "run.h5: /images/00000: 'loras[0].scale' is 0.5 in the checkpoint, the command line asks for 0.8; the "
            "checkpoint belongs to another job");
  EXPECT_EQ(matches_error(stored, with_loras({{"/l/style.safetensors", 0.5}, {"/l/other.safetensors", 1.0}})),
            "run.h5: /images/00000: 'loras[1].file' is \"/l/char.safetensors\" in the checkpoint, the command line asks "
            "for \"/l/other.safetensors\"; the checkpoint belongs to another job");
  EXPECT_EQ(matches_error(tiny_job(), with_loras({{"/l/style.safetensors", 1.0}})),
            "run.h5: /images/00000: 'number of loras' is 0 in the checkpoint, the command line asks for 1; the checkpoint "
            "belongs to another job");
}

TEST(CheckpointLoras, AttributeRoundTripsAndIsOptionalInOlderFiles) {
  const fs::path dir = fs::temp_directory_path() / ("fluxmpi-ckpt-lora-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const Job job = with_loras({{"/l/a b.safetensors", -0.25}, {"/l/c.safetensors", 1.0}});
  const std::string path = (dir / "run.h5").string();
  {
    CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
    w.close();
  }
  {
    CheckpointReader r = CheckpointReader::open(path);
    for (int64_t i = 0; i < r.num_images(); ++i) EXPECT_EQ(r.attributes(i).loras, job.images[0].loras) << "image " << i;
  }
  // A file written before LoRAs existed has no `loras` attribute: no LoRAs.
  {
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    for (const char* g : {"/images/00000", "/images/00001"}) ASSERT_GE(H5Adelete_by_name(f, g, "loras", H5P_DEFAULT), 0);
    H5Fclose(f);
    CheckpointReader r = CheckpointReader::open(path);
    EXPECT_TRUE(r.attributes(0).loras.empty());
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fluxmpi::ckpt
