#pragma once
// Runs the fluxmpi programs as a user does (mpirun -np P fluxmpi ...) from a test, and compares
// what they write. Used by the multi-rank job tests (ranks, pipelining, resume, faults).

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace fluxmpi::test {

/// Once a rank has printed its error line, the job must be over within this many seconds.
inline constexpr int kEndAfterErrorSeconds = 60;
/// Without an error line a job is given this long before it is taken for hung (a hang guard, not
/// an expectation of speed: the jobs of these tests take seconds).
inline constexpr int kHangGuardSeconds = 600;

struct JobResult {
  int exit_code = -1;      ///< the launcher's exit code; -1 when it was killed as hung
  std::string output;      ///< stdout and stderr together (and a last line saying why it was killed)
  double seconds = 0;
  std::string hang;        ///< why the job was killed as hung; empty when it ended by itself
};

/// `mpirun -np ranks --oversubscribe --bind-to none [-x VAR...] fluxmpi --threads 1 args...`
/// (ranks == 0: fluxmpi alone, without mpirun). Killed as hung after hang_guard_s, or
/// kEndAfterErrorSeconds after a rank's error line.
JobResult run_fluxmpi(int ranks, const std::vector<std::string>& args, int hang_guard_s = kHangGuardSeconds,
                      const std::vector<std::string>& env = {});
/// Starts the same in the background; returns the launcher's pid (output to `log_path`).
int start_fluxmpi(int ranks, const std::vector<std::string>& args, const std::string& log_path,
                  const std::vector<std::string>& env = {});
/// Starts any program in the background (own process group, output to `log_path`); its pid.
int start_program(const std::string& program, const std::vector<std::string>& args, const std::string& log_path);
/// Waits for a program started by start_program or start_fluxmpi, as run_fluxmpi waits.
JobResult wait_for_program(int pid, const std::string& log_path, int hang_guard_s = kHangGuardSeconds);
/// Runs any program with arguments; exit code and output.
JobResult run_program(const std::string& program, const std::vector<std::string>& args,
                      int hang_guard_s = kHangGuardSeconds);

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
