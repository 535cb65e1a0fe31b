#include "job_runner.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>

#include "ckpt/checkpoint_reader.h"
#include "core/error.h"
#include "io/png.h"

extern char** environ;

namespace fluxmpi::test {
namespace fs = std::filesystem;

std::string fluxmpi_bin() { return FLUXMPI_TEST_FLUXMPI; }
std::string inspect_bin() { return FLUXMPI_TEST_INSPECT; }
std::string make_tiny_model_bin() { return FLUXMPI_TEST_MAKE_TINY_MODEL; }

namespace {

std::vector<std::string> launcher(int ranks, const std::vector<std::string>& args, const std::vector<std::string>& env) {
  std::vector<std::string> argv;
  if (ranks > 0) {
    argv = {FLUXMPI_TEST_MPIEXEC, "-np", std::to_string(ranks), "--oversubscribe", "--bind-to", "none"};
    if (::getuid() == 0) argv.push_back("--allow-run-as-root");  // CI runs as root
    for (const auto& e : env) {
      argv.push_back("-x");
      argv.push_back(e);
    }
  }
  argv.push_back(fluxmpi_bin());
  argv.push_back("--threads");
  argv.push_back("1");
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// posix_spawn with stdout+stderr to `log`; returns the pid.
pid_t spawn(const std::vector<std::string>& argv, const std::string& log, const std::vector<std::string>& env) {
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) envs.emplace_back(*e);
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<char*> cenv;
  for (auto& e : envs) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);  // own process group: killable as a whole
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  if (posix_spawnp(&pid, cargv[0], &fa, &attr, cargv.data(), cenv.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  return pid;
}

std::string read_log(const std::string& log) {
  std::ifstream in(log);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// A rank's report of a failure: "fluxmpi[rank r/P]: <Kind>Error: ..." or "... error: ...".
bool has_error_line(const std::string& output) {
  static const std::regex line(R"((^|\n)fluxmpi(\[rank [0-9]+/[0-9]+\])?: [A-Za-z]*(Error|error): )");
  return std::regex_search(output, line);
}

// Waits for the job to end by itself. No expectation of speed: the only limits are a hang guard
// from the start (`hang_guard_s`) and, once a rank has reported a failure, kEndAfterErrorSeconds
// from that report (a failing rank must end the job, not leave it hanging).
JobResult wait_for(pid_t pid, const std::string& log, int hang_guard_s) {
  using Clock = std::chrono::steady_clock;
  JobResult r;
  const auto start = Clock::now();
  std::optional<Clock::time_point> failed_at;
  int status = 0;
  for (int poll = 0;; ++poll) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    const auto now = Clock::now();
    r.seconds = std::chrono::duration<double>(now - start).count();
    if (done == pid) {
      r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (!failed_at && poll % 25 == 0 && has_error_line(read_log(log))) failed_at = now;
    const bool hung = failed_at ? now - *failed_at > std::chrono::seconds(kEndAfterErrorSeconds)
                                : r.seconds > hang_guard_s;
    if (hung) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.exit_code = -1;
      r.hang = failed_at ? str_cat("the job did not end within ", kEndAfterErrorSeconds, " s of a rank's error report")
                         : str_cat("the job did not end within the hang guard of ", hang_guard_s, " s");
      break;
    }
    usleep(20000);
  }
  r.output = read_log(log);
  if (!r.hang.empty()) r.output += "\n[job_runner: " + r.hang + "; killed]\n";
  return r;
}

std::string temp_log() {
  static int counter = 0;
  return (fs::temp_directory_path() / ("fluxmpi-job-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".log")).string();
}

}  // namespace

JobResult run_program(const std::string& program, const std::vector<std::string>& args, int hang_guard_s) {
  std::vector<std::string> argv = {program};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string log = temp_log();
  pid_t pid = spawn(argv, log, {});
  JobResult r = pid > 0 ? wait_for(pid, log, hang_guard_s) : JobResult{};
  fs::remove(log);
  return r;
}

JobResult run_fluxmpi(int ranks, const std::vector<std::string>& args, int hang_guard_s, const std::vector<std::string>& env) {
  std::string log = temp_log();
  pid_t pid = spawn(launcher(ranks, args, env), log, env);
  JobResult r = pid > 0 ? wait_for(pid, log, hang_guard_s) : JobResult{};
  fs::remove(log);
  return r;
}

int start_fluxmpi(int ranks, const std::vector<std::string>& args, const std::string& log_path,
                  const std::vector<std::string>& env) {
  return spawn(launcher(ranks, args, env), log_path, env);
}

int start_program(const std::string& program, const std::vector<std::string>& args, const std::string& log_path) {
  std::vector<std::string> argv = {program};
  argv.insert(argv.end(), args.begin(), args.end());
  return spawn(argv, log_path, {});
}

JobResult wait_for_program(int pid, const std::string& log_path, int hang_guard_s) {
  return wait_for(pid, log_path, hang_guard_s);
}

TempDir::TempDir(const std::string& tag) {
  path_ = (fs::temp_directory_path() / ("fluxmpi-" + tag + "-" + std::to_string(::getpid()))).string();
  fs::remove_all(path_);
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

at::Tensor all_latent_rows(const std::string& checkpoint) {
  ckpt::CheckpointReader r = ckpt::CheckpointReader::open(checkpoint);
  std::vector<at::Tensor> parts;
  for (int64_t i = 0; i < r.num_images(); ++i) parts.push_back(r.dataset(i, "latents/steps"));
  return at::cat(parts, 0);
}

at::Tensor png_pixels(const std::string& path) {
  io::RgbImage img = io::read_png(path);
  return at::from_blob(img.pixels.data(), {img.height, img.width, 3}, at::kByte).clone();
}

}  // namespace fluxmpi::test
