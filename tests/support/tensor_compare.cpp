#include "support/tensor_compare.h"

#include <ATen/Context.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "models/common/tensor_utils.h"

namespace fluxmpi::test {

at::Device test_device() {
  static const at::Device device = [] {
    const char* env = std::getenv("FLUXMPI_TEST_DEVICE");
    const std::string name = env ? env : "";
    if (name.empty() || name == "cpu") return at::Device(at::kCPU);
    if (name != "cuda") throw std::runtime_error("FLUXMPI_TEST_DEVICE must be 'cpu' or 'cuda', got '" + name + "'");
    if (!at::hasCUDA()) throw std::runtime_error("FLUXMPI_TEST_DEVICE=cuda: this libtorch has no CUDA device");
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowTF32CuDNN(false);
    return at::Device(at::kCUDA, 0);
  }();
  return device;
}

CaseTensors::CaseTensors(const std::string& path) : store_(io::TensorStore::open_file(path, path)) {}

at::Tensor CaseTensors::get(const std::string& name) const {
  io::TensorView view = store_.get(name);
  return nn::borrow(view).clone();
}

Closeness closeness(const at::Tensor& got, const at::Tensor& ref) {
  at::Tensor g = got.detach().to(at::kCPU).to(at::kDouble);
  at::Tensor r = ref.detach().to(at::kCPU).to(at::kDouble);
  Closeness c;
  c.max_abs_diff = (g - r).abs().max().item<double>();
  c.ref_max_abs = r.abs().max().item<double>();
  c.relative = c.max_abs_diff / std::max(1.0, c.ref_max_abs);
  return c;
}

testing::AssertionResult close_to(const std::string& name, const at::Tensor& got, const at::Tensor& ref, double tol) {
  if (!got.defined()) return testing::AssertionFailure() << name << ": result tensor is undefined";
  if (got.sizes() != ref.sizes())
    return testing::AssertionFailure() << name << ": shape " << nn::shape_string(got.sizes()) << " != reference "
                                       << nn::shape_string(ref.sizes());
  if (got.numel() == 0) return testing::AssertionSuccess();
  Closeness c = closeness(got, ref);
  char buf[256];
  std::snprintf(buf, sizeof buf, "max |diff| %.3e / max(1, max |ref| = %.3g) = %.3e %s tol %.1e", c.max_abs_diff,
                c.ref_max_abs, c.relative, c.relative <= tol ? "<=" : ">", tol);
  if (!(c.relative <= tol)) return testing::AssertionFailure() << name << ": " << buf;
  // FLUXMPI_PRINT_ERRORS=1 lists every measured error, for reports.
  if (const char* env = std::getenv("FLUXMPI_PRINT_ERRORS"); env && std::string(env) == "1")
    std::printf("  measured %s: %s\n", name.c_str(), buf);
  return testing::AssertionSuccess() << name << ": " << buf;
}

testing::AssertionResult identical(const std::string& name, const at::Tensor& got, const at::Tensor& ref) {
  if (got.sizes() != ref.sizes())
    return testing::AssertionFailure() << name << ": shape " << nn::shape_string(got.sizes()) << " != reference "
                                       << nn::shape_string(ref.sizes());
  at::Tensor g = got.detach().to(at::kCPU).contiguous().view(-1);
  at::Tensor r = ref.detach().to(at::kCPU).to(got.scalar_type()).contiguous().view(-1);
  at::Tensor ne = g.ne(r);
  if (g.is_floating_point()) ne = ne & ~(g.isnan() & r.isnan());
  int64_t count = ne.sum().item<int64_t>();
  if (count == 0) return testing::AssertionSuccess();
  int64_t first = ne.nonzero()[0][0].item<int64_t>();
  return testing::AssertionFailure() << name << ": " << count << " of " << g.numel() << " elements differ; first at "
                                     << first << ": " << g[first].item<double>() << " vs " << r[first].item<double>();
}

void expect_recorded_tensors(const CaseRef& c, const CaseTensors& tensors,
                             const std::function<at::Tensor(const std::string&)>& ours, double tol) {
  for (const auto& item : c.json.at("tensors").items()) {
    const std::string& name = item.key();
    if (name.rfind("in_", 0) == 0) continue;
    testing::AssertionResult r = close_to(case_label(c) + " " + name, ours(name), tensors.get(name), tol);
    EXPECT_TRUE(r);
    std::printf("  %s\n", r.message());
  }
}

void expect_close(const std::string& name, const at::Tensor& got, const at::Tensor& ref, double tol) {
  testing::AssertionResult r = close_to(name, got.to(at::kCPU, at::kFloat), ref, tol);
  EXPECT_TRUE(r);
  if (r) std::printf("[ measured ] %s\n", r.message());
}

void expect_identical(const std::string& name, const at::Tensor& got, const at::Tensor& ref) {
  testing::AssertionResult r = identical(name, got.to(at::kCPU), ref);
  EXPECT_TRUE(r);
  if (r) std::printf("[ measured ] %s: bit-identical\n", name.c_str());
}

}  // namespace fluxmpi::test
