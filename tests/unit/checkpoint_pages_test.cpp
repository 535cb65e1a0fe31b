// The checkpoint's metadata is laid out so that a writer killed with SIGKILL cannot tear it.
//
// Linux copies a write() into the page cache one page at a time and stops between pages once the
// process has a fatal signal pending. An HDF5 metadata entry that straddles a 4 KiB page boundary
// and is rewritten at every step (the extendable datasets' object headers: H5Dset_extent) can so
// be left half old, half new by a kill; its checksum then fails for every later reader and
// --resume refuses the file (seen in CI: KilledWriter, "latents/noise_pred: is not a dataset
// (HDF5: incorrect metadata checksum after all read attempts)"). The writer creates the file with
// paged file space aggregation, which keeps every entry smaller than a page inside one page. These
// tests check the layout itself, so they fail deterministically where KilledWriter failed once in
// a few hundred kills.

#include <gtest/gtest.h>
#include <hdf5.h>

#include <string>

#include "ckpt/checkpoint_writer.h"
#include "ckpt/format.h"
#include "unit/ckpt_test_job.h"

namespace fluxmpi::ckpt {
namespace {
using namespace test;

constexpr haddr_t kPage = 4096;

// The objects whose metadata changes while the file is open for SWMR writing.
const char* const kRewritten[] = {"latents/steps", "latents/noise_pred", "latents/step_index", "last_step", "status"};

struct Header {
  haddr_t addr = 0;
  hsize_t bytes = 0;
  unsigned chunks = 0;
};

Header header_of(hid_t file, const std::string& name) {
  Header h;
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info;
  EXPECT_GE(H5Oget_info_by_name3(file, name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT), 0) << name;
  EXPECT_GE(H5VLnative_token_to_addr(file, info.token, &h.addr), 0) << name;
  H5O_native_info_t native;
  EXPECT_GE(H5Oget_native_info_by_name(file, name.c_str(), &native, H5O_NATIVE_INFO_HDR, H5P_DEFAULT), 0) << name;
  h.bytes = native.hdr.space.total;
  h.chunks = native.hdr.nchunks;
#else
  H5O_info_t info;
  EXPECT_GE(H5Oget_info_by_name2(file, name.c_str(), &info, H5O_INFO_BASIC | H5O_INFO_HDR, H5P_DEFAULT), 0) << name;
  h.addr = info.addr;
  h.bytes = info.hdr.space.total;
  h.chunks = info.hdr.nchunks;
#endif
  return h;
}

TEST(CheckpointPages, NoHeaderRewrittenWhileWritingCrossesAPage) {
  // Where the headers land depends on the job's list of datasets (images, true CFG), not on the
  // attributes' sizes: jobs of 1 to 8 images, every other one with true CFG. With HDF5's default
  // file space every one of these jobs had such headers, 27 in all (the two-image job: both
  // latents/noise_pred and image 1's status).
  int checked = 0;
  for (int64_t images = 1; images <= 8; ++images) {
    SCOPED_TRACE(str_cat("a job of ", images, " image(s)"));
    TempDir dir;
    const std::string path = dir.path("pages.h5");
    Job job = tiny_job();
    const std::vector<ImageAttributes> two = job.images;
    job.images.clear();
    for (int64_t i = 0; i < images; ++i) {
      job.images.push_back(two[static_cast<size_t>(i % 2)]);
      job.images.back().seed = 42 + i;
    }
    {
      CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
      write_job(w);
      w.close();
    }
    hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    for (int64_t i = 0; i < images; ++i)
      for (const char* name : kRewritten) {
        const std::string object = image_object(i, name);
        Header h = header_of(file, object);
        EXPECT_EQ(h.chunks, 1u) << object;
        EXPECT_LE(h.addr % kPage + h.bytes, kPage)
            << object << ": header of " << h.bytes << " bytes at " << h.addr << " crosses a page boundary";
        ++checked;
      }
    H5Fclose(file);
  }
  EXPECT_EQ(checked, 36 * 5);
}

TEST(CheckpointPages, FileSpaceIsPagedByFourKibibytes) {
  TempDir dir;
  const std::string path = dir.path("paged.h5");
  make_finished(path);
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  hid_t fcpl = H5Fget_create_plist(file);
  H5F_fspace_strategy_t strategy = H5F_FSPACE_STRATEGY_FSM_AGGR;
  hbool_t persist = true;
  hsize_t threshold = 0, page = 0;
  EXPECT_GE(H5Pget_file_space_strategy(fcpl, &strategy, &persist, &threshold), 0);
  EXPECT_GE(H5Pget_file_space_page_size(fcpl, &page), 0);
  EXPECT_EQ(strategy, H5F_FSPACE_STRATEGY_PAGE);
  EXPECT_EQ(page, kPage);
  H5Pclose(fcpl);
  H5Fclose(file);
}

}  // namespace
}  // namespace fluxmpi::ckpt
