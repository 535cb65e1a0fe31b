#pragma once
// libtorch's oneDNN switch (torch.backends.mkldnn.enabled in Python), set for a scope and restored
// however it ends. Switched off, libtorch 1.13 runs bf16 convolutions and batched matmuls with its
// own kernels, as it does on CPUs without AVX-512: the tests emulate such a CPU with it.

#include <ATen/Context.h>

namespace fluxmpi::test {

class OneDnnSwitch {
 public:
  explicit OneDnnSwitch(bool enabled) : before_(at::globalContext().userEnabledMkldnn()) {
    at::globalContext().setUserEnabledMkldnn(enabled);
  }
  ~OneDnnSwitch() { at::globalContext().setUserEnabledMkldnn(before_); }
  OneDnnSwitch(const OneDnnSwitch&) = delete;
  OneDnnSwitch& operator=(const OneDnnSwitch&) = delete;

 private:
  bool before_;
};

}  // namespace fluxmpi::test
