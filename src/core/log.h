#pragma once
/// Rank-prefixed logging to stderr: `fluxmpi[rank 1/2]: warning: ...`.

#include <string>

#include "core/error.h"

namespace fluxmpi::log {

enum class Level { Error = 0, Warn = 1, Info = 2, Debug = 3 };

/// Parses "error" | "warn" | "info" | "debug"; throws UsageError otherwise.
Level parse_level(const std::string& text);

void set_level(Level level);
Level level();
/// Sets the rank shown in every line (single process: rank 0 of 1).
void set_rank(int rank, int size);
int rank();
int size();
/// The `fluxmpi[rank r/P]` prefix of this process.
std::string prefix();

void write(Level level, const std::string& message);

template <typename... Args>
void error(Args&&... args) { write(Level::Error, str_cat(std::forward<Args>(args)...)); }
template <typename... Args>
void warn(Args&&... args) { if (level() >= Level::Warn) write(Level::Warn, str_cat(std::forward<Args>(args)...)); }
template <typename... Args>
void info(Args&&... args) { if (level() >= Level::Info) write(Level::Info, str_cat(std::forward<Args>(args)...)); }
template <typename... Args>
void debug(Args&&... args) { if (level() >= Level::Debug) write(Level::Debug, str_cat(std::forward<Args>(args)...)); }

/// Prints a caught error as `fluxmpi[rank r/P]: <Kind>: <message>` (one line).
void report(const Error& e);

}  // namespace fluxmpi::log
