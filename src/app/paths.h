#pragma once
/// File-system checks of the paths given to fluxmpi, made before any heavy work so that a run
/// does not fail after an hour of denoising because it cannot write its image.

#include <string>

namespace fluxmpi::app {

/// The directory that will hold `file` ("." for a bare name).
std::string parent_directory(const std::string& file);

/// Throws UsageError "<what> '<file>': directory '<dir>' does not exist" (or "is not a directory",
/// "is not writable") unless the directory of `file` exists and this process may create files in it.
void require_writable_parent(const std::string& file, const std::string& what);

/// True when both paths name the same file (after resolving symbolic links, `..` and `.`);
/// neither needs to exist.
bool same_file(const std::string& a, const std::string& b);

}  // namespace fluxmpi::app
