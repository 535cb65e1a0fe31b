#include "core/log.h"

#include <cstdio>
#include <mutex>

namespace fluxmpi::log {
namespace {
Level g_level = Level::Info;
int g_rank = 0;
int g_size = 1;
std::mutex g_mutex;
}  // namespace

Level parse_level(const std::string& text) {
  if (text == "error") return Level::Error;
  if (text == "warn" || text == "warning") return Level::Warn;
  if (text == "info") return Level::Info;
  if (text == "debug") return Level::Debug;
  throw UsageError(str_cat("--log-level must be one of error, warn, info, debug, got '", text, "'"));
}

void set_level(Level level) { g_level = level; }
Level level() { return g_level; }
void set_rank(int rank, int size) { g_rank = rank; g_size = size; }
int rank() { return g_rank; }
int size() { return g_size; }

std::string prefix() { return str_cat("fluxmpi[rank ", g_rank, "/", g_size, "]"); }

void write(Level level, const std::string& message) {
  const char* tag = level == Level::Error ? "error: " : level == Level::Warn ? "warning: " : "";
  std::string line = str_cat(prefix(), ": ", tag, message, "\n");
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

void report(const Error& e) {
  std::string line = str_cat(prefix(), ": ", e.kind(), ": ", e.what(), "\n");
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace fluxmpi::log
