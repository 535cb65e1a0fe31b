#include "models/common/loader.h"

#include <set>

#include "core/error.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::nn {

LoadStats load_module(torch::nn::Module& module, const io::TensorStore& store, const LoadRules& rules,
                      at::ScalarType dtype, at::Device device) {
  at::NoGradGuard no_grad;
  LoadStats stats;
  std::set<std::string> claimed;
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    const std::string key = rules.prefix + item.key();
    std::string found;
    if (store.contains(key)) {
      found = key;
    } else if (auto alias = rules.aliases.find(key); alias != rules.aliases.end()) {
      for (const auto& other : alias->second)
        if (store.contains(other)) {
          found = other;
          break;
        }
    }
    at::Tensor& param = item.value();
    if (found.empty())
      throw WeightError(str_cat(store.label(), ": tensor '", key, "' not found (expected shape ",
                                shape_string(param.sizes()), ")"));
    io::TensorView view = store.get(found);
    const std::vector<int64_t>& shape = view.entry->shape;
    if (!std::equal(shape.begin(), shape.end(), param.sizes().begin(), param.sizes().end()))
      throw WeightError(str_cat(store.label(), ": tensor '", found, "' in '", store.file_of(found), "' has shape ",
                                shape_string(shape), ", expected ", shape_string(param.sizes())));
    at::Tensor value = at::empty(param.sizes(), at::TensorOptions().dtype(dtype).device(device));
    value.copy_(borrow(view));
    view.file->release(*view.entry);
    param.set_data(value);
    claimed.insert(found);
    // A tied copy stored under another name is the same weight: it is accounted for.
    if (auto alias = rules.aliases.find(key); alias != rules.aliases.end()) {
      claimed.insert(key);
      for (const auto& other : alias->second) claimed.insert(other);
    }
    stats.tensors += 1;
    stats.bytes += value.numel() * static_cast<int64_t>(value.element_size());
  }
  for (const auto& key : store.keys()) {
    if (claimed.count(key)) continue;
    bool skipped = false;
    for (const auto& p : rules.skip_prefixes)
      if (key.compare(0, p.size(), p) == 0) skipped = true;
    if (skipped) continue;
    if (rules.owned ? rules.owned(key) : true)
      throw WeightError(str_cat(store.label(), ": unexpected tensor '", key, "' in '", store.file_of(key),
                                "': no parameter of the model claims it"));
  }
  return stats;
}

int64_t parameter_bytes(const torch::nn::Module& module) {
  int64_t bytes = 0;
  for (const auto& p : module.parameters(true)) bytes += p.numel() * static_cast<int64_t>(p.element_size());
  return bytes;
}

}  // namespace fluxmpi::nn
