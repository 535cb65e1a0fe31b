#include "app/predict.h"

#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/error.h"

extern char** environ;

namespace fluxmpi::app {
namespace fs = std::filesystem;

namespace {

std::string ranges_text(const std::vector<parallel::BlockRange>& ranges) {
  std::string s;
  for (size_t r = 0; r < ranges.size(); ++r)
    s += str_cat(r ? "," : "", r, ":", ranges[r].first, "-", ranges[r].last);
  return s;
}

// An argument as a shell reads it back: plain words as they are, others single-quoted.
std::string shell_word(const std::string& s) {
  const bool plain = !s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                       "0123456789-_./,:=+") == std::string::npos;
  if (plain) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct Finished {
  int status = 0;
  std::string out, err;
};

// Runs argv[0] (looked up on PATH) and collects its stdout and stderr.
Finished run_program(const std::vector<std::string>& argv) {
  int out[2], err[2];
  if (pipe(out) != 0 || pipe(err) != 0) throw UsageError(str_cat("--predict: cannot create a pipe: ", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  for (int fd : {out[0], out[1], err[0], err[1]}) posix_spawn_file_actions_addclose(&actions, fd);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    close(out[0]);
    close(err[0]);
    if (rc == ENOENT)
      throw UsageError(str_cat("--predict: ", argv[0], " was not found on PATH (the prediction runs tools/sim/fluxsim.py)"));
    throw UsageError(str_cat("--predict: cannot start ", argv[0], ": ", std::strerror(rc)));
  }
  Finished f;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&f.out, &f.err};
  for (int open = 2; open > 0;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
  for (pollfd& p : fds)
    if (p.fd >= 0) close(p.fd);
  while (waitpid(pid, &f.status, 0) < 0 && errno == EINTR) {
  }
  return f;
}

// The last non-empty line of `text`.
std::string last_line(const std::string& text) {
  size_t end = text.find_last_not_of("\n\r ");
  if (end == std::string::npos) return "";
  const size_t start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
}

}  // namespace

PredictJob predict_job(const PreparedRun& run, const parallel::StagePlan& plan, int64_t images, int passes) {
  const RunConfig& c = run.config;
  run.family_root->check_predictable(run);
  const io::TransformerConfig& tc = run.model->transformer_config();
  const io::VaeConfig& vae = run.model->vae_config();
  PredictJob j;
  j.profile = c.predict;
  j.ranks = run.world_size;
  j.stages = plan.world_size();
  for (int r = 0; r < plan.world_size(); ++r) j.partition.push_back({plan.blocks(r).first, plan.blocks(r).last});
  j.microbatch = c.microbatch;
  j.patches = c.patches;
  j.warmup_steps = c.warmup_steps;
  j.images = images;
  const std::set<std::string> distinct(c.prompts.begin(), c.prompts.end());
  j.prompts = std::max<int64_t>(1, static_cast<int64_t>(distinct.size()));
  j.steps = *c.steps;
  j.height = run.geometry.height;
  j.width = run.geometry.width;
  j.text_tokens = *c.max_sequence_length;
  j.true_cfg = passes == 2;
  j.checkpoint = !c.checkpoint_file().empty();
  j.checkpoint_every = c.checkpoint_every;
  j.vae_tiling = plan.vae_tiling();
  j.vae_slicing = c.vae_slicing;
  j.decode_ranks = static_cast<int64_t>(plan.decode_ranks().size());
  j.vae_scale = vae.scale_factor();
  j.vae_tile = vae.sample_size / vae.scale_factor();
  j.transformer = {tc.num_layers, tc.num_single_layers, tc.num_attention_heads, tc.attention_head_dim};
  return j;
}

std::vector<std::string> simulator_args(const PredictJob& j) {
  std::vector<std::string> a = {"--profile", j.profile, "--ranks", std::to_string(j.ranks)};
  if (j.stages != j.ranks) a.insert(a.end(), {"--stages", std::to_string(j.stages)});
  a.insert(a.end(), {"--partition", ranges_text(j.partition), "--microbatch", std::to_string(j.microbatch), "--patches",
                                std::to_string(j.patches), "--warmup", std::to_string(j.warmup_steps), "--images",
                                std::to_string(j.images), "--prompts", std::to_string(j.prompts), "--steps",
                                std::to_string(j.steps), "--height", std::to_string(j.height), "--width",
                     std::to_string(j.width), "--max-sequence-length", std::to_string(j.text_tokens)});
  if (j.true_cfg) a.push_back("--true-cfg");
  if (j.checkpoint) a.insert(a.end(), {"--checkpoint", "--checkpoint-every", std::to_string(j.checkpoint_every)});
  if (j.vae_tiling)
    a.insert(a.end(), {"--vae-tiling", "--decode-ranks", std::to_string(j.decode_ranks), "--vae-tile",
                       std::to_string(j.vae_tile), "--vae-scale", std::to_string(j.vae_scale)});
  if (j.vae_slicing) a.push_back("--vae-slicing");
  a.insert(a.end(), {"--expect-transformer", str_cat(j.transformer[0], ",", j.transformer[1], ",", j.transformer[2], ",",
                                                     j.transformer[3])});
  return a;
}

std::string simulator_path() {
  std::error_code ec;
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) {
    buf[n] = '\0';
    const fs::path installed = fs::path(buf).parent_path().parent_path() / "share" / "fluxmpi" / "sim" / "fluxsim.py";
    if (fs::is_regular_file(installed, ec)) return installed.lexically_normal().string();
  }
  return (fs::path(FLUXMPI_SOURCE_SIM_DIR) / "fluxsim.py").string();
}

std::string predict(const PredictJob& job) {
  const std::string sim = simulator_path();
  std::error_code ec;
  if (!fs::is_regular_file(sim, ec))
    throw UsageError(str_cat("--predict: the schedule simulator is not installed (no ", sim, ")"));
  std::vector<std::string> argv = {"python3", sim};
  const std::vector<std::string> args = simulator_args(job);
  argv.insert(argv.end(), args.begin(), args.end());
  std::string command;
  for (const std::string& a : argv) command += (command.empty() ? "" : " ") + shell_word(a);
  const Finished f = run_program(argv);
  if (!WIFEXITED(f.status) || WEXITSTATUS(f.status) != 0) {
    std::string why = last_line(f.err);
    if (why.rfind("fluxsim: ", 0) == 0) why = why.substr(9);
    if (why.empty()) why = WIFEXITED(f.status) ? str_cat("exit code ", WEXITSTATUS(f.status)) : "killed by a signal";
    throw UsageError(str_cat("--predict: ", why));
  }
  return str_cat("prediction (", command, "):\n", f.out, f.out.empty() || f.out.back() == '\n' ? "" : "\n");
}

}  // namespace fluxmpi::app
