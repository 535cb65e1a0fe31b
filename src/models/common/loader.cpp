#include "models/common/loader.h"

#include <cstring>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "models/common/large_alloc.h"
#include "models/common/layers.h"
#include "models/common/quantized_linear.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::nn {

namespace {

// The stored key of parameter `name`: its own key or the first alias present; empty when absent.
std::string resolve_key(const std::string& key, const io::TensorStore& store, const LoadRules& rules) {
  if (store.contains(key)) return key;
  if (auto alias = rules.aliases.find(key); alias != rules.aliases.end())
    for (const auto& other : alias->second)
      if (store.contains(other)) return other;
  return {};
}

// Checks that every parameter of `module` is stored with its shape and that every owned key is
// claimed; calls `each(param, stored key, parameter key)` for each parameter once all of them are known good.
template <typename Each>
void match_parameters(const torch::nn::Module& module, const io::TensorStore& store, const LoadRules& rules,
                      Each each) {
  std::set<std::string> claimed;
  std::vector<std::tuple<at::Tensor, std::string, std::string>> matched;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const std::string key = rules.prefix + item.key();
    const std::string found = resolve_key(key, store, rules);
    const at::Tensor& param = item.value();
    if (found.empty())
      throw WeightError(str_cat(store.label(), ": tensor '", key, "' not found (expected shape ",
                                shape_string(param.sizes()), ")"));
    const std::vector<int64_t>& shape = store.get(found).entry->shape;  // header only: no data is read
    if (!std::equal(shape.begin(), shape.end(), param.sizes().begin(), param.sizes().end())) {
      const std::string stored = store.stored_as(found);
      throw WeightError(str_cat(store.label(), ": tensor '", found, "'", stored.empty() ? "" : " (stored as " + stored + ")",
                                " in '", store.file_of(found), "' has shape ", shape_string(shape), ", expected ",
                                shape_string(param.sizes())));
    }
    claimed.insert(found);
    // A tied copy stored under another name is the same weight: it is accounted for.
    if (auto alias = rules.aliases.find(key); alias != rules.aliases.end()) {
      claimed.insert(key);
      for (const auto& other : alias->second) claimed.insert(other);
    }
    matched.emplace_back(param, found, key);
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
  for (auto& [param, found, key] : matched) each(param, found, key);
}

}  // namespace

void check_module(const torch::nn::Module& module, const io::TensorStore& store, const LoadRules& rules) {
  match_parameters(module, store, rules, [](const at::Tensor&, const std::string&, const std::string&) {});
}

namespace {

// The linear layers of a module tree by their weight parameter: a weight stored in a GGUF block type
// stays quantized in its layer.
std::map<const void*, LinearImpl*> linears_by_weight(torch::nn::Module& module) {
  std::map<const void*, LinearImpl*> out;
  // Children only: the module itself may live outside a shared_ptr (modules(true) needs one).
  if (auto* l = dynamic_cast<LinearImpl*>(&module)) out[l->weight.unsafeGetTensorImpl()] = l;
  for (const auto& m : module.modules(/*include_self=*/false))
    if (auto* l = dynamic_cast<LinearImpl*>(m.get())) out[l->weight.unsafeGetTensorImpl()] = l;
  return out;
}

// The bytes of a tensor's row runs, joined: [rows, row bytes] uint8.
std::shared_ptr<QuantizedWeight> copy_quantized(const io::TensorView& view) {
  const io::TensorEntry& e = *view.entry;
  const int64_t rows = e.shape.front();
  const int64_t row = static_cast<int64_t>(e.num_bytes()) / std::max<int64_t>(rows, 1);
  auto w = std::make_shared<QuantizedWeight>();
  w->in_features = e.shape.back();
  at::Tensor bytes = empty_large({rows, row}, at::kByte);  // huge pages, as the dense weights
  uint8_t* out = bytes.data_ptr<uint8_t>();
  for (const auto& p : view.pieces) {
    std::memcpy(out, p.data(), p.num_bytes());
    out += p.num_bytes();
  }
  w->runs.push_back({e.dtype, bytes});
  return w;
}

}  // namespace

LoadStats load_module(torch::nn::Module& module, const io::TensorStore& store, const LoadRules& rules,
                      at::ScalarType dtype, at::Device device) {
  at::NoGradGuard no_grad;
  LoadStats stats;
  const std::map<const void*, LinearImpl*> linears = linears_by_weight(module);
  match_parameters(module, store, rules, [&](at::Tensor param, const std::string& key, const std::string& name) {
    io::TensorView view = store.get(key);
    auto linear = linears.find(param.unsafeGetTensorImpl());
    if (io::is_quantized(view.entry->dtype) && linear != linears.end() && view.entry->shape.size() == 2 &&
        !rules.adjust.wants(name)) {
      // Kept as stored (dequantized at compute time, models/common/quantized_linear.h); a weight a
      // LoRA changes is dequantized and merged instead, below.
      std::shared_ptr<QuantizedWeight> w = copy_quantized(view);
      view.release();
      stats.tensors += 1;
      stats.bytes += w->bytes();
      linear->second->set_quantized(std::move(w));
      return;
    }
    at::Tensor value = empty_large(param.sizes(), at::TensorOptions().dtype(dtype).device(device));
    if (rules.adjust.wants(name)) {
      // An fp32 run on the CPU merges in place; otherwise in an fp32 copy, then rounded once.
      at::Tensor merged = dtype == at::kFloat && device.is_cpu() ? value : at::empty(param.sizes(), at::kFloat);
      copy_view(view, merged);  // row runs of fused or renamed tensors, float8 decoded
      rules.adjust.apply(name, merged);
      if (!merged.is_same(value)) value.copy_(merged);
    } else {
      copy_view(view, value);
    }
    view.release();
    param.set_data(value);
    stats.tensors += 1;
    stats.bytes += value.numel() * static_cast<int64_t>(value.element_size());
  });
  return stats;
}

int64_t parameter_bytes(const torch::nn::Module& module) {
  int64_t bytes = 0;
  for (const auto& p : module.parameters(true)) bytes += p.numel() * static_cast<int64_t>(p.element_size());
  return bytes;
}

}  // namespace fluxmpi::nn
