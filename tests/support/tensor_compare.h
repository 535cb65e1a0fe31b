#pragma once
// Reading reference tensors of a fixture case and comparing with them. Every failed comparison
// names the tensor, the measured error and the tolerance.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "io/tensor_store.h"
#include "support/fixtures.h"

namespace fluxmpi::test {

/// Module parity in fp32: max |diff| <= 1e-5 * max(1, max |ref|) per tensor.
inline constexpr double kTolFp32 = 1e-5;
/// Whole-pipeline latents and noise predictions in fp32: 1e-4 * max(1, max |ref|).
inline constexpr double kTolPipelineFp32 = 1e-4;
/// bf16 runs against fp32 references: a sanity bound, not a parity claim. bf16 keeps 8
/// significant bits (unit roundoff u = 2^-8); a few dozen chained roundings stay well under 8u of
/// the output scale, while a semantic error moves outputs by O(1).
inline constexpr double kTolBf16Sanity = 8 * 3.90625e-3;

/// Where the parity tests that honour it run: the CPU, or cuda:0 with FLUXMPI_TEST_DEVICE=cuda
/// (tools/gpu/check.sh; the tolerances stay those of the CPU, and TF32 is switched off so that
/// fp32 is fp32). Another value, or cuda without a GPU, throws std::runtime_error naming it.
at::Device test_device();
/// `t` on test_device() (the case files are read onto the CPU).
inline at::Tensor on_test_device(const at::Tensor& t) { return t.to(test_device()); }

/// The tensors of one case file, read in their stored dtype.
class CaseTensors {
 public:
  explicit CaseTensors(const std::string& path);
  at::Tensor get(const std::string& name) const;
  bool has(const std::string& name) const { return store_.contains(name); }

 private:
  io::TensorStore store_;
};

struct Closeness {
  double max_abs_diff = 0;
  double ref_max_abs = 0;
  double relative = 0;  ///< max_abs_diff / max(1, ref_max_abs)
};
Closeness closeness(const at::Tensor& got, const at::Tensor& ref);

/// EXPECT_TRUE(close_to("temb", got, ref, kTolFp32)).
testing::AssertionResult close_to(const std::string& name, const at::Tensor& got, const at::Tensor& ref, double tol);
/// Compares every tensor the case records, except its inputs (named in_*), with ours(name) at
/// `tol` and prints each comparison; a name ours() does not know (undefined tensor) fails.
void expect_recorded_tensors(const CaseRef& c, const CaseTensors& tensors,
                             const std::function<at::Tensor(const std::string&)>& ours, double tol);
/// Exact equality (ids, bit-identity checks); on failure reports the first differing index.
testing::AssertionResult identical(const std::string& name, const at::Tensor& got, const at::Tensor& ref);

/// EXPECT_TRUE(close_to(...)) (got on any device and dtype), printing "[ measured ] ..." when it
/// holds, so that passing runs report their numbers too.
void expect_close(const std::string& name, const at::Tensor& got, const at::Tensor& ref, double tol);
/// EXPECT_TRUE(identical(...)) (got on any device), printing "[ measured ] <name>: bit-identical".
void expect_identical(const std::string& name, const at::Tensor& got, const at::Tensor& ref);

}  // namespace fluxmpi::test
