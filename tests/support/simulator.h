#pragma once
// The schedule simulator (tools/sim) as the --predict tests run it: its folder in the source tree
// and the stdout of `python3 fluxsim.py args...`.

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace fluxmpi::test {

inline std::string sim_dir() { return (std::filesystem::path(FLUXMPI_SOURCE_DIR) / "tools" / "sim").string(); }

/// stdout of `python3 fluxsim.py args...` (no argument may need quoting); "(exit N) ..." when it fails.
inline std::string run_simulator(const std::vector<std::string>& args) {
  std::string command = "python3 " + sim_dir() + "/fluxsim.py";
  for (const std::string& a : args) command += " " + a;
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return "(popen failed)";
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  return status == 0 ? out : "(exit " + std::to_string(status) + ") " + out;
}

}  // namespace fluxmpi::test
