#include "harness.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "support/fixtures.h"

extern char** environ;

namespace fluxmpi::reliability {
namespace fs = std::filesystem;

namespace {

// Beyond kMaxSecondsAfterError the row has failed already; the margin lets the child's own output
// say why.
constexpr double kKillSecondsAfterError = kMaxSecondsAfterError + 10.0;

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// The child's environment: ours, with Open MPI allowed to run as root (CI containers), one
// OpenMP thread per rank (the ranks share two cores), and no injected fault.
std::vector<std::string> child_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string v(*e);
    if (v.rfind("FLUXMPI_FAULT=", 0) == 0 || v.rfind("OMP_NUM_THREADS=", 0) == 0) continue;
    env.push_back(v);
  }
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT=1");
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
  env.push_back("OMP_NUM_THREADS=1");
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Runs argv[0] (an absolute path) in `cwd` with stdout/stderr captured in `log_dir`, in a process
// group of its own, so that the time limit ends mpiexec and every rank it started.
Outcome spawn(std::vector<std::string> argv, const std::string& cwd, const std::string& log_dir) {
  Outcome o;
  o.argv = argv;
  const std::string out_path = log_dir + "/stdout", err_path = log_dir + "/stderr";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);

  std::vector<std::string> env = child_environment();
  std::vector<char*> c_argv = c_strings(argv), c_env = c_strings(env);
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, c_argv[0], &actions, &attributes, c_argv.data(), c_env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (rc != 0) throw std::runtime_error("cannot start '" + argv[0] + "': " + std::strerror(rc));

  // Time counts from the failure: the first error line the run prints (fluxmpi prints it the
  // moment it finds the bad input, then every rank ends). Before it, only the hang guard.
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> failed_at;
  int status = 0;
  for (int poll = 0;; ++poll) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    const auto now = Clock::now();
    if (!failed_at && (done == pid || poll % 5 == 0) &&
        !error_lines(read_bytes(err_path) + "\n" + read_bytes(out_path)).empty())
      failed_at = now;
    if (done == pid) break;
    if (done < 0 && errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
    const double limit = failed_at ? kKillSecondsAfterError : kHangGuardSeconds;
    if (std::chrono::duration<double>(now - failed_at.value_or(start)).count() > limit) {
      o.timed_out = true;
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto end = Clock::now();
  o.seconds = std::chrono::duration<double>(end - start).count();
  if (failed_at) o.seconds_after_error = std::chrono::duration<double>(end - *failed_at).count();
  // Whatever the leader left running in its group (a rank mpiexec failed to end) goes too.
  ::kill(-pid, SIGKILL);
  if (WIFEXITED(status) && !o.timed_out) o.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) o.signal = WTERMSIG(status);
  o.out = read_bytes(out_path);
  o.err = read_bytes(err_path);
  return o;
}

std::string file_stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw std::runtime_error("cannot stat '" + path + "'");
  std::ostringstream os;
  os << std::hex << st.st_size << "-" << st.st_mtim.tv_sec << "-" << st.st_mtim.tv_nsec;
  return os.str();
}

// Builds `name` in the cache once per stamp: under an exclusive lock (ctest may run the test
// executables in parallel), into a temporary folder that is renamed when complete.
std::string cached(const std::string& name, const std::string& stamp,
                   const std::function<void(const std::string& dir)>& build) {
  const fs::path cache = fs::path(FLUXMPI_RELIABILITY_CACHE);
  fs::create_directories(cache);
  const fs::path done = cache / (name + "-" + stamp);
  const std::string lock_path = (cache / (name + ".lock")).string();
  const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT, 0644);
  if (lock < 0) throw std::runtime_error("cannot open '" + lock_path + "'");
  ::flock(lock, LOCK_EX);
  try {
    if (!fs::exists(done)) {
      for (const auto& old : fs::directory_iterator(cache))  // earlier builds' copies
        if (old.path().filename().string().rfind(name + "-", 0) == 0) fs::remove_all(old.path());
      const fs::path partial = cache / (name + ".partial");
      fs::create_directories(partial);
      build(partial.string());
      fs::rename(partial, done);
    }
  } catch (...) {
    ::close(lock);
    throw;
  }
  ::close(lock);
  return done.string();
}

const std::string kDocs = std::string(FLUXMPI_SOURCE_DIR) + "/docs/reliability.md";

std::string docs_text() {
  static const std::string text = fs::exists(kDocs) ? read_bytes(kDocs) : std::string();
  return text;
}

std::string tail(const std::string& text, size_t max_chars = 6000) {
  return text.size() <= max_chars ? text : "[...]\n" + text.substr(text.size() - max_chars);
}

}  // namespace

// --- Workspace -------------------------------------------------------------------------------

Workspace::Workspace(const std::string& base_model) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/fluxmpi-reliability-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
  root_ = pattern;
  work_ = root_ + "/work";
  model_ = work_ + "/model";
  private_dir_ = root_ + "/harness";
  fs::create_directories(work_ + "/out");
  fs::create_directories(private_dir_);
  copy_tree(base_model, model_);
}

Workspace::~Workspace() {
  if (keep_) {
    const char* keep = std::getenv("FLUXMPI_KEEP_WORKSPACE");
    if (keep != nullptr && *keep != '\0' && std::string(keep) != "0") {
      std::fprintf(stderr, "workspace kept for inspection: %s\n", root_.c_str());
      return;
    }
    std::fprintf(stderr, "(set FLUXMPI_KEEP_WORKSPACE=1 to keep the workspace of a failed row)\n");
  }
  std::error_code ec;
  fs::permissions(work_ + "/out", fs::perms::owner_all, fs::perm_options::add, ec);
  fs::remove_all(root_, ec);
}

std::string Workspace::path(const std::string& relative) const { return work_ + "/" + relative; }
std::string Workspace::model_file(const std::string& relative) const { return model_ + "/" + relative; }

std::string Workspace::expand(const std::string& text) const {
  std::string out = text;
  for (const auto& [name, value] : names_) out = replace_all(out, name, value);
  return replace_all(replace_all(out, "{work}", work_), "{model}", model_);
}

// --- Files -----------------------------------------------------------------------------------

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read '" + path + "'");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::error_code ec;
  fs::remove(path, ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw std::runtime_error("cannot write '" + path + "'");
}

void truncate_file(const std::string& path, size_t size) {
  const std::string bytes = read_bytes(path);
  if (size >= bytes.size()) throw std::runtime_error("truncate_file: '" + path + "' is not longer than " + std::to_string(size));
  write_bytes(path, bytes.substr(0, size));
}

void copy_tree(const std::string& from, const std::string& to) {
  fs::copy(from, to, fs::copy_options::recursive);
  fs::permissions(to, fs::perms::owner_all, fs::perm_options::add);
  for (const auto& e : fs::recursive_directory_iterator(to))
    fs::permissions(e.path(), e.is_directory() ? fs::perms::owner_all : fs::perms::owner_read | fs::perms::owner_write,
                    fs::perm_options::add);
}

nlohmann::ordered_json read_json(const std::string& path) { return nlohmann::ordered_json::parse(read_bytes(path)); }

void write_json(const std::string& path, const nlohmann::ordered_json& json) { write_bytes(path, json.dump(2) + "\n"); }

void edit_json(const std::string& path, const std::function<void(nlohmann::ordered_json&)>& edit) {
  nlohmann::ordered_json j = read_json(path);
  edit(j);
  write_json(path, j);
}

std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).string();
    struct stat st {};
    ::lstat(e.path().c_str(), &st);
    // Directories by kind only: a temporary file made and removed again leaves nothing behind.
    if (S_ISDIR(st.st_mode)) {
      out[rel] = "directory";
      continue;
    }
    std::ostringstream os;
    os << (S_ISREG(st.st_mode) ? "file" : "other") << " " << st.st_size << " bytes, mtime " << st.st_mtim.tv_sec << "."
       << st.st_mtim.tv_nsec;
    out[rel] = os.str();
  }
  return out;
}

std::vector<std::string> differences(const std::map<std::string, std::string>& before,
                                     const std::map<std::string, std::string>& after) {
  std::vector<std::string> out;
  for (const auto& [path, stamp] : after) {
    auto it = before.find(path);
    if (it == before.end()) out.push_back("left behind: " + path + " (" + stamp + ")");
    else if (it->second != stamp) out.push_back("changed: " + path + " (" + it->second + " -> " + stamp + ")");
  }
  for (const auto& [path, stamp] : before)
    if (after.count(path) == 0) out.push_back("removed: " + path);
  return out;
}

// --- Inputs the rows build on ------------------------------------------------------------------

std::string base_pipeline() {
  static const std::string path = [] {
    for (const auto& [name, p] : test::manifest()["pipelines"].items()) {
      const bool dev = p.value("variant", "") == "dev";
      const bool fp32 = p.value("weights_dtype", "") == "float32";
      const auto shards = p.value("transformer_shards", nlohmann::json());
      const bool sharded = (shards.is_number() && shards.get<int>() > 1) ||
                           (shards.is_string() && std::atoi(shards.get<std::string>().c_str()) > 1);
      if (dev && fp32 && sharded) return (fs::path(test::fixture_root()) / p["path"].get<std::string>()).string();
    }
    return std::string();
  }();
  return path;
}

std::string valid_checkpoint() {
  const std::string dir = cached("checkpoint", file_stamp(FLUXMPI_EXE), [](const std::string& into) {
    std::vector<std::string> argv = {FLUXMPI_EXE};
    for (const auto& [name, value] : default_options()) {
      argv.push_back(name);
      if (name == "--output") argv.push_back(into + "/image.png");
      else if (!value.empty()) argv.push_back(replace_all(value, "{model}", base_pipeline()));
    }
    argv.push_back("--checkpoint");
    argv.push_back(into + "/run.h5");
    Outcome o = spawn(argv, into, into);
    if (o.exit_code != 0) throw std::runtime_error("making the reference checkpoint failed:\n" + o.err);
  });
  return dir + "/run.h5";
}

std::string one_block_model() {
  return cached("one-block-model", file_stamp(FLUXMPI_MAKE_TINY_MODEL_EXE), [](const std::string& into) {
    Outcome o = spawn({FLUXMPI_MAKE_TINY_MODEL_EXE, "--out", into + "/model", "--double", "1", "--single", "0"}, into,
                      into);
    if (o.exit_code != 0) throw std::runtime_error("make-tiny-model failed:\n" + o.err);
  }) + "/model";
}

// --- Running the programs ----------------------------------------------------------------------

Outcome run_program(Program program, const std::vector<std::string>& args, int ranks, const Workspace& ws) {
  std::vector<std::string> argv;
  const std::string exe = program == Program::Fluxmpi ? FLUXMPI_EXE : FLUXMPI_INSPECT_EXE;
  if (ranks > 1) {
    // Each rank reports its own exit code through a wrapper (mpiexec only passes on one) and the
    // wrapper itself exits 0, so mpiexec never starts its abort sequence: every rank has to end
    // by itself, which is what the rows test (a rank left waiting is a hang: the time limit
    // kills the group and the rank's report is missing). Open MPI 4's abort sequence would also
    // cost its whole SIGTERM-to-SIGKILL delay twice, even after every rank has exited.
    argv = {FLUXMPI_MPIEXEC, FLUXMPI_MPIEXEC_NUMPROC_FLAG, std::to_string(ranks)};
    for (const auto& f : split_words(FLUXMPI_MPIEXEC_FLAGS)) argv.push_back(f);
    argv.insert(argv.end(), {"/bin/sh", "-c",
                             "dir=$1; shift; \"$@\"; code=$?; "
                             "echo \"$code\" > \"$dir/rank-${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-unknown}}\"; exit 0",
                             "fluxmpi-rank", ws.private_dir()});
  }
  argv.push_back(exe);
  argv.insert(argv.end(), args.begin(), args.end());
  Outcome o = spawn(argv, ws.work(), ws.private_dir());
  for (int r = 0; r < ranks && ranks > 1; ++r) {
    const std::string f = ws.private_dir() + "/rank-" + std::to_string(r);
    if (fs::exists(f)) o.rank_codes[r] = std::atoi(read_bytes(f).c_str());
  }
  // The job's code, as mpiexec reports it to a user: the first rank's non-zero code (the rows
  // check every rank's own code as well). mpiexec's own failure (its code without every report)
  // stays as it is.
  if (ranks > 1 && o.exit_code == 0 && static_cast<int>(o.rank_codes.size()) == ranks) {
    for (const auto& [rank, code] : o.rank_codes) {
      if (code != 0) {
        o.exit_code = code;
        break;
      }
    }
  }
  return o;
}

std::vector<ErrorLine> error_lines(const std::string& text) {
  static const std::regex re(R"(^(fluxmpi\[rank (\d+)/(\d+)\]|fluxmpi-inspect): ([A-Za-z]*Error|error): (.*)$)");
  std::vector<ErrorLine> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, re)) continue;
    ErrorLine e;
    e.prefix = m[1];
    if (m[2].matched) {
      e.rank = std::stoi(m[2]);
      e.size = std::stoi(m[3]);
    }
    e.kind = m[4];
    e.message = m[5];
    out.push_back(std::move(e));
  }
  return out;
}

// --- The table -------------------------------------------------------------------------------

const std::vector<std::pair<std::string, std::string>>& default_options() {
  static const std::vector<std::pair<std::string, std::string>> options = {
      {"--model", "{model}"}, {"--prompt", "a photo of a cat"}, {"--seed", "7"},       {"--steps", "1"},
      {"--height", "32"},     {"--width", "32"},                {"--threads", "1"},    {"--no-progress", ""},
      {"--output", "{work}/out/image.png"},
  };
  return options;
}

BadInput::BadInput(std::string name, int exit_code, std::string kind, std::vector<std::string> culprit)
    : name_(std::move(name)), exit_code_(exit_code), kind_(std::move(kind)), culprit_(std::move(culprit)) {}

std::vector<std::string> BadInput::command_line(const Workspace& ws) const {
  std::vector<std::string> out;
  if (program_ == Program::Fluxmpi) {
    std::set<std::string> replaced(drop_.begin(), drop_.end());
    for (const auto& a : args_)
      if (a.rfind("--", 0) == 0) replaced.insert(a.substr(0, a.find('=')));
    for (const auto& [name, value] : default_options()) {
      if (replaced.count(name)) continue;
      out.push_back(name);
      if (!value.empty()) out.push_back(ws.expand(value));
    }
  }
  for (const auto& a : args_) out.push_back(ws.expand(a));
  return out;
}

void BadInput::check() const {
  if (!root_reason_.empty() && ::geteuid() == 0) GTEST_SKIP() << "running as root: " << root_reason_;
  FLUXMPI_REQUIRE_FIXTURES();
  const std::string base = base_pipeline();
  ASSERT_FALSE(base.empty()) << "the manifest in " << test::fixture_root()
                             << " has no dev pipeline with float32 weights and a sharded transformer";
  EXPECT_NE(docs_text().find("`" + name_ + "`"), std::string::npos)
      << "row '" << name_ << "' is not listed in " << kDocs;

  Workspace ws(base);
  if (setup_) setup_(ws);
  if (testing::Test::HasFatalFailure()) return;  // an ASSERT in the setup
  const auto before = snapshot(ws.work());
  const Outcome o = run_program(program_, command_line(ws), ranks_, ws);
  const auto after = snapshot(ws.work());

  std::string command;
  for (const auto& a : o.argv) command += (command.empty() ? "" : " ") + (a.find(' ') == std::string::npos ? a : "'" + a + "'");
  SCOPED_TRACE("row " + name_ + "\ncommand: " + command + "\nexit code " + std::to_string(o.exit_code) +
               (o.signal ? ", signal " + std::to_string(o.signal) : "") + " after " + std::to_string(o.seconds) +
               " s (" + std::to_string(o.seconds_after_error) + " s after the error line)\n--- stderr ---\n" + tail(o.err) + "--- stdout ---\n" + tail(o.out));

  EXPECT_FALSE(o.timed_out) << "the run did not end by itself (killed "
                            << (o.seconds_after_error >= 0 ? std::to_string(kKillSecondsAfterError) + " s after its error line"
                                                           : std::to_string(kHangGuardSeconds) + " s after the start, no error line")
                            << ")";
  if (o.seconds_after_error >= 0) {
    EXPECT_LT(o.seconds_after_error, kMaxSecondsAfterError)
        << "a bad input must end the run within " << kMaxSecondsAfterError << " s of its error line";
  }
  EXPECT_EQ(o.exit_code, exit_code_) << "exit code";
  for (int r = 0; r < ranks_ && ranks_ > 1; ++r) {
    auto it = o.rank_codes.find(r);
    if (it == o.rank_codes.end()) ADD_FAILURE() << "rank " << r << " never returned (killed, or it hung)";
    else EXPECT_EQ(it->second, exit_code_) << "exit code of rank " << r;
  }

  const std::vector<ErrorLine> lines = error_lines(o.err + "\n" + o.out);
  EXPECT_EQ(lines.size(), 1u) << "expected exactly one error line";
  if (!lines.empty()) {
    const ErrorLine& e = lines.front();
    EXPECT_EQ(e.kind, kind_) << "error kind";
    if (program_ == Program::Fluxmpi) {
      EXPECT_EQ(e.rank, reporter_) << "reporting rank";
      EXPECT_EQ(e.size, ranks_) << "world size in the prefix";
    } else {
      EXPECT_EQ(e.prefix, "fluxmpi-inspect");
    }
    for (const auto& c : culprit_)
      EXPECT_NE(e.message.find(ws.expand(c)), std::string::npos) << "the message does not name '" << ws.expand(c) << "'";
  }

  const std::vector<std::string> diffs = differences(before, after);
  std::string listed;
  for (const auto& d : diffs) listed += "\n  " + d;
  EXPECT_TRUE(diffs.empty()) << "the run left files behind or changed them:" << listed;
  if (testing::Test::HasFailure()) ws.keep();
}

std::string row_name(const testing::TestParamInfo<BadInput>& info) { return info.param.name(); }

void PrintTo(const BadInput& row, std::ostream* os) { *os << row.name(); }

}  // namespace fluxmpi::reliability
