#include "app/defaults.h"

#include <ATen/Context.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/log.h"

namespace fluxmpi::app {

namespace {

bool has_word(const std::string& list, const std::string& word) {
  std::istringstream in(list);
  for (std::string w; in >> w;)
    if (w == word) return true;
  return false;
}

}  // namespace

CpuBf16 cpu_bf16_from_cpuinfo(const std::string& text) {
  CpuBf16 out;
  out.source = "/proc/cpuinfo";
  bool any = false, avx = true, amx = true;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    if (key != "flags") continue;
    const std::string flags = line.substr(colon + 1);
    any = true;
    avx = avx && has_word(flags, "avx512_bf16");
    amx = amx && has_word(flags, "amx_bf16");
  }
  out.avx512_bf16 = any && avx;
  out.amx_bf16 = any && amx;
  return out;
}

CpuBf16 detect_cpu_bf16() {
  {
    std::ifstream in("/proc/cpuinfo");
    std::stringstream text;
    text << in.rdbuf();
    if (in && text.str().find("flags") != std::string::npos) return cpu_bf16_from_cpuinfo(text.str());
  }
  return cpu_bf16_from_cpuid();
}

CpuBf16 cpu_bf16_from_cpuid() {
  CpuBf16 out;
  out.source = "cpuid";
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7 || !__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return out;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool os_avx512 = (xcr0_lo & 0xE6u) == 0xE6u;        // SSE, AVX, opmask, ZMM state
  const bool os_amx = (xcr0_lo & 0x60000u) == 0x60000u;     // tile config and tile data
  __cpuid_count(7, 0, a, b, c, d);
  const bool amx_bf16 = (d >> 22) & 1u;
  __cpuid_count(7, 1, a, b, c, d);
  const bool avx512_bf16 = (a >> 5) & 1u;
  out.avx512_bf16 = avx512_bf16 && os_avx512;
  out.amx_bf16 = amx_bf16 && os_amx;
#endif
  return out;
}

DtypeChoice choose_auto_dtype(const std::string& device, const CpuBf16& cpu, bool libtorch_has_onednn) {
  if (device == "cuda") return {"bf16", "--device cuda: GPUs run bf16 matmuls natively"};
  std::string flags;
  if (cpu.avx512_bf16) flags = "avx512_bf16";
  if (cpu.amx_bf16) flags += (flags.empty() ? "" : " and ") + std::string("amx_bf16");
  if (!cpu.native())
    return {"fp32", str_cat("the CPU has no native bf16 (neither avx512_bf16 nor amx_bf16 in ", cpu.source,
                            "), where bf16 matmuls are much slower than fp32")};
  if (!libtorch_has_onednn)
    return {"fp32", str_cat("the CPU has ", flags, " (", cpu.source,
                            ") but this libtorch is built without oneDNN, its fast bf16 CPU matmuls")};
  return {"bf16", str_cat("the CPU executes bf16 natively (", flags, " in ", cpu.source, ")")};
}

void resolve_dtype(RunConfig& config) {
  if (config.dtype != "auto") return;
  const DtypeChoice choice =
      config.device == "cuda" ? choose_auto_dtype("cuda", {}, false) : choose_auto_dtype("cpu", detect_cpu_bf16(), at::hasMKLDNN());
  log::info("--dtype auto chose ", choice.dtype, ": ", choice.reason, " (--dtype fp32|bf16 overrides)");
  config.dtype = choice.dtype;
}

}  // namespace fluxmpi::app
