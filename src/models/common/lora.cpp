#include "models/common/lora.h"

#include <algorithm>

#include "core/error.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::nn {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string underscored(std::string s) {
  std::replace(s.begin(), s.end(), '.', '_');
  return s;
}

// The pair's tensor as a float32 tensor over (or copied from) the mapped bytes.
at::Tensor read_fp32(const io::LoraFile& file, const io::TensorEntry& entry) {
  return borrow(io::TensorView::whole(entry, file.file())).to(at::kFloat);
}

}  // namespace

WeightShapes linear_weight_shapes(const io::TensorStore& store) {
  WeightShapes out;
  const std::string suffix = ".weight";
  for (const auto& key : store.keys()) {
    if (!ends_with(key, suffix)) continue;
    const std::vector<int64_t>& shape = store.get(key).entry->shape;  // header only
    if (shape.size() == 2) out[key.substr(0, key.size() - suffix.size())] = shape;
  }
  return out;
}

KohyaResolver underscored_names(const WeightShapes& shapes) {
  auto by_name = std::make_shared<std::map<std::string, std::pair<std::string, int64_t>>>();
  for (const auto& [module, shape] : shapes) (*by_name)[underscored(module)] = {module, shape[0]};
  return [by_name](const std::string& name) -> std::vector<LoraRows> {
    auto it = by_name->find(name);
    if (it == by_name->end()) return {};
    return {LoraRows{it->second.first, 0, it->second.second, 0}};
  };
}

LoraSet::LoraSet(const std::vector<std::shared_ptr<const io::LoraFile>>& files, io::LoraTarget target,
                 const WeightShapes& shapes, const KohyaResolver& kohya)
    : num_files_(files.size()) {
  for (size_t f = 0; f < files.size(); ++f) {
    const io::LoraFile& file = *files[f];
    const bool is_kohya = file.layout() == io::LoraLayout::Kohya;
    for (size_t p = 0; p < file.pairs().size(); ++p) {
      const io::LoraPair& pair = file.pairs()[p];
      if (pair.target != target) continue;
      std::vector<LoraRows> rows;
      if (is_kohya) {
        if (kohya) rows = kohya(pair.module);
      } else if (auto it = shapes.find(pair.module); it != shapes.end()) {
        rows = {LoraRows{pair.module, 0, it->second[0], 0}};
      }
      if (rows.empty())
        throw WeightError(str_cat(file.where(pair.down->name), " names no module of the ", io::lora_target_name(target),
                                  " ('", pair.module, "' is not one of its linear layers)"));
      int64_t rows_end = 0;
      for (const LoraRows& r : rows) {
        auto it = shapes.find(r.module);
        if (it == shapes.end())
          throw WeightError(str_cat(file.where(pair.down->name), " names '", r.module, "', which is not a linear layer of the ",
                                    io::lora_target_name(target)));
        const std::vector<int64_t>& w = it->second;
        if (pair.in_features() != w[1])
          throw WeightError(str_cat(file.where(pair.down->name), " has shape [", pair.rank(), ", ", pair.in_features(),
                                    "], but '", r.module, ".weight' is ", shape_string(w), " (expected [", pair.rank(),
                                    ", ", w[1], "])"));
        if (r.target_row_begin + (r.row_end - r.row_begin) > w[0])
          throw InternalError(str_cat("LoRA rows of '", pair.stem, "' beyond '", r.module, "'"));
        rows_end = std::max(rows_end, r.row_end);
      }
      if (pair.out_features() != rows_end)
        throw WeightError(str_cat(file.where(pair.up->name), " has shape [", pair.out_features(), ", ", pair.rank(),
                                  "], but the ", rows.size() > 1 ? "modules it changes have " : "module it changes has ",
                                  rows_end, " rows (expected [", rows_end, ", ", pair.rank(), "])"));
      for (LoraRows& r : rows) updates_.push_back(LoraUpdate{files[f], f, p, std::move(r)});
    }
  }
}

std::vector<int64_t> LoraSet::count(const std::function<bool(const std::string& module)>& owned) const {
  std::vector<int64_t> out(num_files_, 0);
  for (const auto& u : updates_)
    if (!owned || owned(u.rows.module)) out[u.file_index] += 1;
  return out;
}

void LoraSet::check_alphas() const {
  for (const auto& u : updates_) u.file->alpha(u.file->pairs()[u.pair]);
}

void merge_updates(const std::vector<LoraUpdate>& updates, at::Tensor& w) {
  at::NoGradGuard no_grad;
  for (const LoraUpdate& u : updates) {
    const io::LoraPair& pair = u.file->pairs()[u.pair];
    const int64_t rows = u.rows.row_end - u.rows.row_begin;
    FLUX_CHECK(w.dim() == 2 && w.size(1) == pair.in_features() && u.rows.target_row_begin + rows <= w.size(0),
               "LoRA '", pair.stem, "' does not fit '", u.rows.module, "' ", shape_string(w.sizes()));
    at::Tensor up = read_fp32(*u.file, *pair.up).narrow(0, u.rows.row_begin, rows);
    at::Tensor down = read_fp32(*u.file, *pair.down);
    // W[rows] += factor * up @ down in one BLAS call: no temporary of the weight's size.
    at::Tensor target = w.narrow(0, u.rows.target_row_begin, rows);
    target.addmm_(up, down, /*beta=*/1, /*alpha=*/u.file->factor(pair));
    // The pair's pages are not needed any more (a fused module's other rows map them again).
    u.file->file().release(*pair.up);
    u.file->file().release(*pair.down);
  }
}

WeightAdjust LoraSet::adjust(std::shared_ptr<std::vector<int64_t>> applied) const {
  auto by_key = std::make_shared<std::map<std::string, std::vector<LoraUpdate>>>();
  for (const auto& u : updates_) (*by_key)[u.rows.module + ".weight"].push_back(u);
  if (applied) applied->assign(num_files_, 0);
  WeightAdjust a;
  a.applies = [by_key](const std::string& key) { return by_key->count(key) != 0; };
  a.apply = [by_key, applied](const std::string& key, at::Tensor& w) {
    const auto& updates = by_key->at(key);
    merge_updates(updates, w);
    if (applied)
      for (const auto& u : updates) (*applied)[u.file_index] += 1;
  };
  return a;
}

}  // namespace fluxmpi::nn
