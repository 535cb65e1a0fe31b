#include "pipeline/fault.h"

#include <csignal>
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

Fault Fault::from_environment() {
  const char* env = std::getenv("FLUXMPI_FAULT");
  if (env == nullptr || *env == '\0') return {};
  return parse(env);
}

void trigger(const Fault& fault, int rank, int64_t step) {
  if (!fault.fires(rank, step)) return;
  if (fault.kind == Fault::Kind::Throw)
    throw InternalError(str_cat("fault injected by FLUXMPI_FAULT at step ", step));
  if (fault.kind == Fault::Kind::Kill) {
    log::warn("FLUXMPI_FAULT: killing this rank with SIGKILL at step ", step);
    std::raise(SIGKILL);
  }
}

}  // namespace fluxmpi::pipeline
