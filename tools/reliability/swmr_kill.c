// Does SIGKILL during SWMR appends leave an HDF5 file that no reader can open? The experiment
// behind docs/hdf5-format.md, "Why the file is paged".
//
// A child writes a file shaped like a fluxmpi checkpoint (two image groups, each with three
// extendable datasets that grow by one row per step and a last_step dataset, two flushes per
// step, as CheckpointWriter::append_step does) under SWMR; the parent kills it with SIGKILL 20 to
// 50 ms after it started, then opens the file as a SWMR reader (one read attempt: the writer is
// dead, a retry cannot help) and opens every dataset. A root attribute of PAD bytes moves the
// objects in the file, so that a dataset's object header may straddle a 4 KiB page boundary
// (printed with --layout).
//
// Built as build/tools/reliability/fluxmpi-swmr-kill (or: gcc -O2 -o swmr_kill swmr_kill.c
// $(pkg-config --cflags --libs hdf5)):
//   fluxmpi-swmr-kill --layout 0 2960      # where each header lies, default file space
//   fluxmpi-swmr-kill 1000 0 2960          # 1000 kills, default file space, 2960-byte attribute
//   fluxmpi-swmr-kill 1000 1 2960          # the same with paged file space (what fluxmpi writes)
//
// Each broken file is kept as /tmp/swmr_kill_broken_<kill>.h5.
#include <hdf5.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kTokens = 32, kChannels = 64, kImages = 2, kExtendable = 3 };
static const char* kPath = "/tmp/swmr_kill.h5";
static const char* kNames[4] = {"latents/steps", "latents/noise_pred", "latents/step_index", "last_step"};

static hid_t v110_fapl(void) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110);
  return fapl;
}

static void object_name(char* out, size_t n, int image, int k) {
  snprintf(out, n, "/images/%05d/%s", image, kNames[k]);
}

// Creates the file, starts SWMR writing, then appends rows until killed (or, with `layout`,
// prints where each dataset's header lies and returns).
static void write_file(int paged, int pad, int layout) {
  hid_t fapl = v110_fapl(), fcpl = H5Pcreate(H5P_FILE_CREATE);
  if (paged) {
    if (H5Pset_file_space_strategy(fcpl, H5F_FSPACE_STRATEGY_PAGE, 0, 1) < 0) _exit(5);
    if (H5Pset_file_space_page_size(fcpl, 4096) < 0) _exit(5);
  }
  hid_t f = H5Fcreate(kPath, H5F_ACC_TRUNC, fcpl, fapl);
  if (f < 0) _exit(4);
  if (pad > 0) {
    hsize_t n = (hsize_t)pad;
    hid_t space = H5Screate_simple(1, &n, NULL);
    hid_t a = H5Acreate2(f, "pad", H5T_STD_U8LE, space, H5P_DEFAULT, H5P_DEFAULT);
    unsigned char* zeros = calloc(n, 1);
    H5Awrite(a, H5T_NATIVE_UCHAR, zeros);
    free(zeros);
    H5Aclose(a);
    H5Sclose(space);
  }
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  hid_t ds[kImages][4];
  char name[128];
  for (int i = 0; i < kImages; ++i) {
    for (int k = 0; k < kExtendable; ++k) {
      hsize_t dims[3] = {0, kTokens, kChannels}, max[3] = {H5S_UNLIMITED, kTokens, kChannels};
      hsize_t chunk[3] = {1, kTokens, kChannels};
      int rank = k == 2 ? 1 : 3;
      hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
      H5Pset_chunk(dcpl, rank, chunk);
      hid_t space = H5Screate_simple(rank, dims, max);
      object_name(name, sizeof name, i, k);
      ds[i][k] = H5Dcreate2(f, name, k == 2 ? H5T_STD_I32LE : H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT);
      if (ds[i][k] < 0) _exit(6);
      H5Sclose(space);
      H5Pclose(dcpl);
    }
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
    hid_t space = H5Screate(H5S_SCALAR);
    object_name(name, sizeof name, i, 3);
    ds[i][3] = H5Dcreate2(f, name, H5T_STD_I64LE, space, lcpl, dcpl, H5P_DEFAULT);
    long long none = -1;
    H5Dwrite(ds[i][3], H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &none);
    H5Sclose(space);
    H5Pclose(dcpl);
  }
  if (H5Fstart_swmr_write(f) < 0) _exit(7);
  if (layout) {
    for (int i = 0; i < kImages; ++i)
      for (int k = 0; k < 4; ++k) {
        unsigned long long at = 0, bytes = 0;
#if H5_VERSION_GE(1, 12, 0)
        H5O_info2_t info;
        H5O_native_info_t native;
        haddr_t addr = 0;
        H5Oget_info3(ds[i][k], &info, H5O_INFO_BASIC);
        H5VLnative_token_to_addr(f, info.token, &addr);
        H5Oget_native_info(ds[i][k], &native, H5O_NATIVE_INFO_HDR);
        at = addr;
        bytes = native.hdr.space.total;
#else
        H5O_info_t info;
        H5Oget_info2(ds[i][k], &info, H5O_INFO_BASIC | H5O_INFO_HDR);
        at = info.addr;
        bytes = info.hdr.space.total;
#endif
        object_name(name, sizeof name, i, k);
        printf("%-30s header at %6llu (page offset %4llu), %llu bytes%s\n", name, at, at % 4096, bytes,
               at % 4096 + bytes > 4096 ? ", crosses a page boundary" : "");
      }
    return;
  }
  static float row[kTokens * kChannels];
  for (long step = 0;; ++step)
    for (int i = 0; i < kImages; ++i) {
      for (int k = 0; k < kExtendable; ++k) {
        hsize_t dims[3] = {(hsize_t)step + 1, kTokens, kChannels};
        H5Dset_extent(ds[i][k], dims);
        hid_t space = H5Dget_space(ds[i][k]);
        hsize_t start[3] = {(hsize_t)step, 0, 0}, count[3] = {1, kTokens, kChannels};
        int rank = k == 2 ? 1 : 3;
        H5Sselect_hyperslab(space, H5S_SELECT_SET, start, NULL, count, NULL);
        hid_t mem = H5Screate_simple(rank, count, NULL);
        for (int j = 0; j < kTokens * kChannels; ++j) row[j] = (float)(step + j);
        int step32 = (int)step;
        H5Dwrite(ds[i][k], k == 2 ? H5T_NATIVE_INT32 : H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT,
                 k == 2 ? (void*)&step32 : (void*)row);
        H5Sclose(mem);
        H5Sclose(space);
      }
      H5Fflush(f, H5F_SCOPE_GLOBAL);
      long long last = step;
      H5Dwrite(ds[i][3], H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &last);
      H5Fflush(f, H5F_SCOPE_GLOBAL);
    }
}

// 0: every dataset opens; 1: no SWMR file yet (killed before H5Fstart_swmr_write); 2: broken.
static int check_file(void) {
  hid_t fapl = v110_fapl();
  H5Pset_metadata_read_attempts(fapl, 1);
  hid_t f = H5Fopen(kPath, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl);
  H5Pclose(fapl);
  if (f < 0) return 1;
  int result = 0;
  char name[128];
  for (int i = 0; i < kImages; ++i)
    for (int k = 0; k < 4; ++k) {
      object_name(name, sizeof name, i, k);
      hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
      if (d < 0) {
        fprintf(stderr, "cannot open %s\n", name);
        result = 2;
        continue;
      }
      H5Dclose(d);
    }
  H5Fclose(f);
  return result;
}

int main(int argc, char** argv) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  if (argc == 4 && strcmp(argv[1], "--layout") == 0) {
    unlink(kPath);
    write_file(atoi(argv[2]), atoi(argv[3]), 1);
    return 0;
  }
  if (argc != 4) {
    fprintf(stderr, "usage: fluxmpi-swmr-kill KILLS PAGED(0|1) PAD_BYTES | --layout PAGED PAD_BYTES\n");
    return 2;
  }
  const int kills = atoi(argv[1]), paged = atoi(argv[2]), pad = atoi(argv[3]);
  srand((unsigned)time(NULL));
  int swmr_files = 0, broken = 0;
  for (int t = 0; t < kills; ++t) {
    unlink(kPath);
    pid_t child = fork();
    if (child == 0) {
      write_file(paged, pad, 0);
      _exit(0);
    }
    usleep(20000 + rand() % 30000);
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    if (WIFEXITED(status)) {
      fprintf(stderr, "the writer failed (exit %d)\n", WEXITSTATUS(status));
      return 1;
    }
    int r = check_file();
    if (r == 1) continue;
    ++swmr_files;
    if (r == 2) {
      ++broken;
      char keep[64];
      snprintf(keep, sizeof keep, "/tmp/swmr_kill_broken_%d.h5", t);
      rename(kPath, keep);
    }
  }
  printf("paged=%d pad=%d: %d kills, %d SWMR files, %d unreadable\n", paged, pad, kills, swmr_files, broken);
  return 0;
}
