#pragma once
// The bad-input table's machinery: a scratch workspace per row (a writable copy of a fixture
// pipeline to break one thing in), the real programs run as child processes under a time limit,
// and the checks every row shares (docs/reliability.md, "Guarantees"):
//   - the documented exit code (2 usage, 3 bad input data, 1 runtime), on every rank;
//   - exactly one error line, `fluxmpi[rank r/P]: <Kind>: <message>` (fluxmpi-inspect:
//     `fluxmpi-inspect: <Kind>: <message>`), of the expected kind and naming the culprit;
//   - the run ends by itself within kMaxSecondsAfterError of its error line (a bound on hangs,
//     measured from the failure, so that the speed of the machine does not matter);
//   - nothing is left behind or changed in the workspace: no PNG, no .h5, no temporary file.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace fluxmpi::reliability {

/// Once the error line is out, every process of the run must be gone this soon (it takes well
/// under a second; the bound catches a rank or launcher that hangs after the failure).
inline constexpr double kMaxSecondsAfterError = 60.0;
/// Until an error line appears there is no time bound, only this hang guard: the start-up of
/// libtorch and MPI takes 1-5 s alone, much longer on a machine busy with other work.
inline constexpr double kHangGuardSeconds = 600.0;

/// The scratch directory of one row. `work()` is the child's working directory; it holds
/// `model/` (a writable copy of the base pipeline) and `out/` (the output directory, empty).
/// Logs and rank reports live beside it, not in it. Removed afterwards, except after a failed row
/// (keep()) when FLUXMPI_KEEP_WORKSPACE=1.
class Workspace {
 public:
  explicit Workspace(const std::string& base_model);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  const std::string& work() const { return work_; }
  const std::string& model() const { return model_; }
  const std::string& private_dir() const { return private_dir_; }
  /// work()/relative and model()/relative.
  std::string path(const std::string& relative) const;
  std::string model_file(const std::string& relative) const;
  /// Replaces {work}, {model} and the names define()d in `text` by their values.
  std::string expand(const std::string& text) const;
  /// Names a value found by the row's setup (a shard path, a tensor name) for its culprit text:
  /// define("shard", p) makes "{shard}" expand to p.
  void define(const std::string& name, const std::string& value) { names_["{" + name + "}"] = value; }
  void keep() { keep_ = true; }

 private:
  std::string root_, work_, model_, private_dir_;
  std::map<std::string, std::string> names_;
  bool keep_ = false;
};

// --- Files -----------------------------------------------------------------------------------

std::string read_bytes(const std::string& path);
/// Replaces `path` by a new file (never writes through into a copied or shared file).
void write_bytes(const std::string& path, const std::string& bytes);
/// Keeps the first `size` bytes of `path`.
void truncate_file(const std::string& path, size_t size);
/// Copies a directory tree; the copy is writable by its owner (fixture files are read-only).
void copy_tree(const std::string& from, const std::string& to);
nlohmann::ordered_json read_json(const std::string& path);
void write_json(const std::string& path, const nlohmann::ordered_json& json);
/// Edits one key of a JSON config in place: `edit(json)`.
void edit_json(const std::string& path, const std::function<void(nlohmann::ordered_json&)>& edit);

/// Every file and directory under `dir` (relative path -> type, size and modification time).
std::map<std::string, std::string> snapshot(const std::string& dir);
/// "left behind: out/image.png", "changed: run.h5", "removed: x" between two snapshots.
std::vector<std::string> differences(const std::map<std::string, std::string>& before,
                                     const std::map<std::string, std::string>& after);

// --- Inputs the rows build on ------------------------------------------------------------------

/// The pipeline every row copies: the first of the manifest's pipelines that is a dev variant with
/// float32 weights and a sharded transformer (the rows break guidance, shards and the index).
/// Empty when the fixture tree has none.
std::string base_pipeline();
/// A checkpoint written by fluxmpi itself with the default options of the table (cached in the
/// build tree per fluxmpi binary; built on first use).
std::string valid_checkpoint();
/// A make-tiny-model pipeline with one transformer block (cached likewise).
std::string one_block_model();

// --- Running the programs ----------------------------------------------------------------------

enum class Program { Fluxmpi, Inspect };

struct Outcome {
  std::vector<std::string> argv;
  int exit_code = -1;   ///< -1 when killed by a signal or the time limit
  int signal = 0;
  bool timed_out = false;
  double seconds = 0;
  /// From the moment the first error line appeared (stderr or stdout) to the end of the run; -1
  /// when none appeared.
  double seconds_after_error = -1;
  std::string out, err;
  /// With ranks > 1: each rank's own exit code, reported by the rank's wrapper; absent when the
  /// rank never returned (killed).
  std::map<int, int> rank_codes;
};

/// Runs `program args` in `ws.work()` (under mpiexec with `ranks` > 1). The whole process group is
/// killed kMaxSecondsAfterError plus a margin after the first error line, or after
/// kHangGuardSeconds without one.
Outcome run_program(Program program, const std::vector<std::string>& args, int ranks, const Workspace& ws);

/// One `<prefix>: <Kind>: <message>` line of fluxmpi or fluxmpi-inspect, where Kind ends in
/// "Error" or is "error" (uncaught failures); warnings and progress lines are not errors.
struct ErrorLine {
  std::string prefix;  ///< "fluxmpi[rank 0/2]" or "fluxmpi-inspect"
  int rank = -1, size = -1;
  std::string kind, message;
};
std::vector<ErrorLine> error_lines(const std::string& text);

// --- The table -------------------------------------------------------------------------------

/// One row of the bad-input table (docs/reliability.md lists every row by name).
class BadInput {
 public:
  BadInput(std::string name, int exit_code, std::string kind, std::vector<std::string> culprit);

  /// Breaks one thing in the workspace before the run.
  BadInput& setup(std::function<void(Workspace&)> fn) { setup_ = std::move(fn); return *this; }
  /// fluxmpi: arguments after the defaults; an option named here replaces its default.
  /// fluxmpi-inspect: the whole command line.
  BadInput& args(std::vector<std::string> a) { args_ = std::move(a); return *this; }
  /// Default options to leave out (e.g. --prompt for prompts-file rows).
  BadInput& without(std::vector<std::string> options) { drop_ = std::move(options); return *this; }
  BadInput& inspect() { program_ = Program::Inspect; return *this; }
  /// Runs under mpiexec with `ranks` ranks; `reporter` is the rank that finds the fault.
  BadInput& ranks(int ranks, int reporter = 0) { ranks_ = ranks; reporter_ = reporter; return *this; }
  /// Skips the row with this reason when running as root (permission bits do not stop root).
  BadInput& not_as_root(std::string reason) { root_reason_ = std::move(reason); return *this; }

  const std::string& name() const { return name_; }
  /// Runs the row and checks every guarantee; the body of each TEST_P.
  void check() const;

 private:
  std::vector<std::string> command_line(const Workspace& ws) const;

  std::string name_;
  int exit_code_;
  std::string kind_;
  std::vector<std::string> culprit_;
  std::function<void(Workspace&)> setup_;
  std::vector<std::string> args_, drop_;
  Program program_ = Program::Fluxmpi;
  int ranks_ = 1, reporter_ = 0;
  std::string root_reason_;
};

/// The fluxmpi options every row starts from (a 32x32 image in one step, so that a bad input
/// that slips through validation still ends quickly).
const std::vector<std::pair<std::string, std::string>>& default_options();

/// gtest parameter name of a row: its name.
std::string row_name(const testing::TestParamInfo<BadInput>& info);
void PrintTo(const BadInput& row, std::ostream* os);

}  // namespace fluxmpi::reliability
