// Semantics of torch.nn.GroupNorm, as norm.h says.
#include "models/vae/norm.h"

#include <torch/version.h>

namespace fluxmpi::vae {

at::Tensor group_norm(const nn::GroupNorm& norm, const at::Tensor& x) {
#if TORCH_VERSION_MAJOR < 2
  if (x.scalar_type() == at::kBFloat16 && x.device().is_cpu() && !x.is_contiguous() &&
      x.is_contiguous(at::MemoryFormat::ChannelsLast))
    return at::group_norm(x.to(at::kFloat), norm->groups, norm->weight.to(at::kFloat), norm->bias.to(at::kFloat),
                          norm->eps)
        .to(at::kBFloat16);
#endif
  return norm->forward(x);
}

}  // namespace fluxmpi::vae
