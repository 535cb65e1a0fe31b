#pragma once
/// Byte sizes and memory readings, and when this process started.

#include <cstdint>
#include <string>

namespace fluxmpi {

/// Parses "16GiB", "512MiB", "2GB", "1.5GiB", "1000000" (bytes), units in any case, and Slurm's
/// binary "16G", "500M". Throws UsageError naming `what`.
uint64_t parse_bytes(const std::string& text, const std::string& what);
/// 1.5 GiB, 320.0 MiB, 12 B.
std::string format_bytes(uint64_t bytes);

/// Peak resident set size of this process (VmHWM), in bytes; 0 when unknown.
uint64_t peak_rss_bytes();
/// Current resident set size (VmRSS), in bytes; 0 when unknown.
uint64_t current_rss_bytes();
/// Starts a new peak: VmHWM drops to the current RSS (Linux /proc/self/clear_refs), so that
/// peak_rss_bytes() then measures one stage. Returns false where the kernel refuses.
bool reset_peak_rss();

/// When this process started, in seconds since the Unix epoch (Linux: /proc/self/stat's start time
/// after boot plus /proc/stat's boot time, to a clock tick); 0 when unknown. Start-up benchmarks
/// compare it with the launcher's clock (tools/bench/peer/peer.py --only startup).
double process_start_epoch_seconds();

}  // namespace fluxmpi
