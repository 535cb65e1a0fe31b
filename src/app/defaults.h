#pragma once
/// What `--dtype auto` means on this machine. (The model-dependent defaults are the families':
/// pipeline/flux1/defaults.h, pipeline/flux2/.)

#include <string>

#include "pipeline/run_config.h"

namespace fluxmpi::app {

using pipeline::RunConfig;

/// Whether the CPU executes bf16 natively, and where that was read.
struct CpuBf16 {
  bool avx512_bf16 = false;  ///< AVX512_BF16 (bf16 dot products in AVX-512)
  bool amx_bf16 = false;     ///< AMX-BF16 (bf16 tile matmuls)
  std::string source;        ///< "/proc/cpuinfo" or "cpuid"
  bool native() const { return avx512_bf16 || amx_bf16; }
};

/// The flags of /proc/cpuinfo text: a flag counts when every `flags` line lists it (all cores
/// must have it); text without a `flags` line (not x86) has none.
CpuBf16 cpu_bf16_from_cpuinfo(const std::string& cpuinfo_text);
/// The cpuid instruction (leaf 7, with the OS-enabled XSAVE state for AVX-512 and AMX); none on
/// CPUs other than x86.
CpuBf16 cpu_bf16_from_cpuid();
/// This CPU: /proc/cpuinfo when it is readable and has `flags` lines, else cpuid.
CpuBf16 detect_cpu_bf16();

/// What `--dtype auto` means here, and one clause saying why.
struct DtypeChoice {
  std::string dtype;   ///< "bf16" | "fp32"
  std::string reason;
};
/// cuda -> bf16; cpu -> bf16 when the CPU executes bf16 natively and this libtorch has oneDNN
/// (its bf16 CPU matmuls), else fp32 (libtorch's other bf16 CPU path is tens of times slower).
DtypeChoice choose_auto_dtype(const std::string& device, const CpuBf16& cpu, bool libtorch_has_onednn);

/// Replaces config.dtype "auto" by the dtype choose_auto_dtype() picks for this machine and logs
/// one line with the choice and the reason; any other value stays.
void resolve_dtype(RunConfig& config);

}  // namespace fluxmpi::app
