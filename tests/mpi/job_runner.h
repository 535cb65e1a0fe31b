#pragma once
// Runs the fluxmpi programs as a user does (mpirun -np P fluxmpi ...) from a test, and compares
// what they write. Used by the multi-rank job tests (ranks, pipelining, resume, faults).

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace fluxmpi::test {

struct JobResult {
  int exit_code = -1;      ///< the launcher's exit code; -1 when it did not end within the timeout
  std::string output;      ///< stdout and stderr together
  double seconds = 0;
};

/// `mpirun -np ranks --oversubscribe --bind-to none [-x VAR...] fluxmpi --threads 1 args...`
/// (ranks == 0: fluxmpi alone, without mpirun). Killed after timeout_s.
JobResult run_fluxmpi(int ranks, const std::vector<std::string>& args, int timeout_s = 300,
                      const std::vector<std::string>& env = {});
/// Starts the same in the background; returns the launcher's pid (output to `log_path`).
int start_fluxmpi(int ranks, const std::vector<std::string>& args, const std::string& log_path,
                  const std::vector<std::string>& env = {});
/// Runs any program with arguments; exit code and output.
JobResult run_program(const std::string& program, const std::vector<std::string>& args, int timeout_s = 300);

std::string fluxmpi_bin();
std::string inspect_bin();
std::string make_tiny_model_bin();

/// A fresh directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& tag);
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// Every stored row of latents/steps of every image of a checkpoint, concatenated ([rows, L, 64]
/// per image, then cat over images): two runs are bit-identical when these are.
at::Tensor all_latent_rows(const std::string& checkpoint);
/// The RGB pixels of a PNG as a [H, W, 3] uint8 tensor.
at::Tensor png_pixels(const std::string& path);

}  // namespace fluxmpi::test
