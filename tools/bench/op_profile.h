#pragma once
/// Time per operator name over the libtorch operators called from outside any other operator (top
/// level; nested ones count in their caller), on the thread that calls start(). Used by the
/// benchmarks' --profile tables (fluxmpi-bench-matmul, fluxmpi-bench-vae).

#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fluxmpi::bench {

class OpProfile {
 public:
  /// Clears the table and starts counting on this thread.
  void start() {
    seconds.clear();
    calls.clear();
    active() = this;
    handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&OpProfile::enter, &OpProfile::leave));
  }
  void stop() {
    at::removeCallback(handle_);
    active() = nullptr;
  }
  std::map<std::string, double> seconds;  ///< wall seconds per operator name
  std::map<std::string, int64_t> calls;   ///< top-level calls per operator name

  /// Seconds spent inside top-level operators.
  double counted() const {
    double c = 0;
    for (const auto& [name, s] : seconds) c += s;
    return c;
  }
  /// A markdown table, slowest operator first, with each one's share of `total` seconds and a
  /// last row for the time outside operators.
  void print_table(double total) const {
    std::vector<std::pair<double, std::string>> rows;
    for (const auto& [name, s] : seconds) rows.push_back({s, name});
    std::sort(rows.rbegin(), rows.rend());
    std::printf("| operator | calls | ms | share |\n|---|---|---|---|\n");
    for (const auto& [s, name] : rows)
      std::printf("| %s | %lld | %.2f | %.1f %% |\n", name.c_str(), static_cast<long long>(calls.at(name)), s * 1e3,
                  100.0 * s / total);
    const double outside = total - counted();
    std::printf("| (outside operators) | | %.2f | %.1f %% |\n", outside * 1e3, 100.0 * outside / total);
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Context : at::ObserverContext {
    Clock::time_point t0;
  };
  static OpProfile*& active() {
    thread_local OpProfile* p = nullptr;
    return p;
  }
  static int& depth() {
    thread_local int d = 0;
    return d;
  }
  static std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction&) {
    ++depth();
    auto ctx = std::make_unique<Context>();
    ctx->t0 = Clock::now();
    return ctx;
  }
  static void leave(const at::RecordFunction& fn, at::ObserverContext* c) {
    const int d = depth()--;
    OpProfile* p = active();
    if (p == nullptr || d != 1) return;
    p->seconds[fn.name()] += std::chrono::duration<double>(Clock::now() - static_cast<Context*>(c)->t0).count();
    p->calls[fn.name()] += 1;
  }
  at::CallbackHandle handle_ = 0;
};

}  // namespace fluxmpi::bench
