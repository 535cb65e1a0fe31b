#include "pipeline/fault.h"

#include <chrono>
#include <csignal>
#include <thread>
#include <cstdlib>
#include <regex>

#include "core/error.h"
#include "core/log.h"

namespace fluxmpi::pipeline {

Fault Fault::parse(const std::string& text) {
  static const std::regex re(R"(^(throw|kill|header|patch)@(\d+):(\d+)$)");
  std::smatch m;
  if (!std::regex_match(text, m, re))
    throw UsageError(str_cat("FLUXMPI_FAULT must be <throw|kill|header|patch>@<rank>:<step>, got '", text, "'"));
  Fault f;
  f.kind = m[1] == "throw"  ? Kind::Throw
           : m[1] == "kill" ? Kind::Kill
           : m[1] == "header" ? Kind::Header
                              : Kind::Patch;
  f.rank = std::stoi(m[2]);
  f.step = std::stoll(m[3]);
  return f;
}

void Fault::parse_delay(const std::string& text, Fault& fault) {
  static const std::regex re(R"(^(\d+):(\d+)$)");
  std::smatch m;
  if (!std::regex_match(text, m, re) || m[1].length() > 6 || m[2].length() > 7)
    throw UsageError(str_cat("FLUXMPI_DELAY must be <rank>:<milliseconds>, got '", text, "'"));
  fault.delay_rank = std::stoi(m[1]);
  fault.delay_ms = std::stoll(m[2]);
}

Fault Fault::from_environment() {
  Fault f;
  if (const char* env = std::getenv("FLUXMPI_FAULT"); env != nullptr && *env != '\0') f = parse(env);
  if (const char* env = std::getenv("FLUXMPI_DELAY"); env != nullptr && *env != '\0') parse_delay(env, f);
  return f;
}

void trigger(const Fault& fault, int rank, int64_t step) {
  if (fault.delay_rank == rank && fault.delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(fault.delay_ms));
  if (!fault.fires(rank, step)) return;
  if (fault.kind == Fault::Kind::Throw)
    throw InternalError(str_cat("fault injected by FLUXMPI_FAULT at step ", step));
  if (fault.kind == Fault::Kind::Kill) {
    log::warn("FLUXMPI_FAULT: killing this rank with SIGKILL at step ", step);
    std::raise(SIGKILL);
  }
}

}  // namespace fluxmpi::pipeline
