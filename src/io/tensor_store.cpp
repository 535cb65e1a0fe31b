#include "io/tensor_store.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fluxmpi::io {
namespace fs = std::filesystem;

namespace {

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

std::string read_text_file(const fs::path& path, const std::string& label) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw WeightError(str_cat(label, ": '", path.string(), "' is a directory, expected a file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw WeightError(str_cat(label, ": cannot read '", path.string(), "'"));
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

uint64_t TensorPiece::row_bytes() const {
  if (entry->shape.empty() || entry->shape[0] == 0) return entry->num_bytes();
  return entry->num_bytes() / static_cast<uint64_t>(entry->shape[0]);
}

std::vector<int64_t> TensorPiece::shape() const {
  std::vector<int64_t> s = entry->shape;
  if (!s.empty()) s[0] = row_end - row_begin;
  return s;
}

TensorView TensorView::whole(const TensorEntry& entry, const WeightFile& file) {
  return TensorView{&entry, &file, {TensorPiece{&entry, &file, 0, entry.shape.empty() ? 1 : entry.shape[0]}}};
}

bool TensorView::stored_as_is() const {
  if (pieces.size() != 1) return false;
  const TensorPiece& p = pieces[0];
  const int64_t rows = p.entry->shape.empty() ? 1 : p.entry->shape[0];
  return p.row_begin == 0 && p.row_end == rows && p.entry->shape == entry->shape;
}

const uint8_t* TensorView::data() const {
  FLUX_CHECK(stored_as_is(), "tensor '", entry->name, "' is presented from ", pieces.size(), " row runs, not stored as is");
  return pieces[0].data();
}

void TensorView::release() const {
  for (const auto& p : pieces) p.file->release(*p.entry);
}

TensorStore TensorStore::open_presented(std::shared_ptr<const WeightFile> shared, const std::string& label,
                                        const std::vector<PresentedTensor>& tensors) {
  TensorStore store;
  const std::string& path = shared->path();
  store.dir_ = fs::path(path).parent_path().string();
  store.label_ = label;
  const std::string name = fs::path(path).filename().string();
  const WeightFile& file = *shared;
  store.open_[name] = std::move(shared);
  for (const auto& t : tensors) {
    auto p = std::make_shared<Presented>();
    p->entry.name = t.key;
    int64_t rows = 0;
    for (const auto& r : t.rows) {
      const TensorEntry* e = file.find(r.stored_key);
      if (e == nullptr) throw WeightError(str_cat(label, ": tensor '", r.stored_key, "' not found in '", path, "'"));
      if (e->shape.empty())
        throw WeightError(str_cat(label, ": tensor '", r.stored_key, "' in '", path, "' is a scalar, expected rows"));
      const int64_t end = r.row_end < 0 ? e->shape[0] : r.row_end;
      if (r.row_begin < 0 || r.row_begin > end || end > e->shape[0])
        throw WeightError(str_cat(label, ": tensor '", r.stored_key, "' in '", path, "' has shape ", shape_text(e->shape),
                                  ": its rows [", r.row_begin, ", ", end, ") for '", t.key, "' are out of range"));
      if (!p->pieces.empty()) {
        const TensorEntry* first = p->pieces.front().entry;
        if (e->dtype != first->dtype || !std::equal(e->shape.begin() + 1, e->shape.end(), first->shape.begin() + 1,
                                                    first->shape.end()))
          throw WeightError(str_cat(label, ": tensors '", first->name, "' and '", e->name, "' in '", path,
                                    "' make up '", t.key, "' but differ in dtype or trailing shape"));
      }
      p->pieces.push_back(TensorPiece{e, &file, r.row_begin, end});
      rows += end - r.row_begin;
    }
    FLUX_CHECK(!p->pieces.empty(), "presented tensor '", t.key, "' without rows");
    const TensorEntry* first = p->pieces.front().entry;
    p->entry.dtype = first->dtype;
    std::vector<int64_t> natural = first->shape;
    natural[0] = rows;
    uint64_t bytes = 0;
    for (const auto& piece : p->pieces) bytes += piece.num_bytes();
    if (!t.shape.empty()) {
      int64_t a = 1, b = 1;
      for (auto d : t.shape) a *= d;
      for (auto d : natural) b *= d;
      if (a != b)
        throw WeightError(str_cat(label, ": tensor '", first->name, "' in '", path, "' has shape ", shape_text(natural),
                                  ", which cannot be presented as '", t.key, "' of shape ", shape_text(t.shape)));
      p->entry.shape = t.shape;
    } else {
      p->entry.shape = natural;
    }
    p->entry.begin = 0;
    p->entry.end = bytes;
    store.key_to_file_[t.key] = name;
    store.presented_[t.key] = std::move(p);
  }
  return store;
}

TensorStore TensorStore::open_file(const std::string& path, const std::string& label) {
  TensorStore store;
  fs::path p(path);
  store.dir_ = p.parent_path().string();
  store.label_ = label;
  std::string name = p.filename().string();
  auto file = std::make_shared<SafetensorsFile>(path);
  for (const auto& e : file->header().tensors) store.key_to_file_[e.name] = name;
  store.open_[name] = std::move(file);
  return store;
}

TensorStore TensorStore::open_dir(const std::string& dir, const std::string& label) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw WeightError(str_cat(label, ": directory '", dir, "' not found"));
  if (!fs::is_directory(dir, ec)) throw WeightError(str_cat(label, ": '", dir, "' is not a directory"));
  for (const char* stem : {"diffusion_pytorch_model", "model"}) {
    fs::path index = fs::path(dir) / (std::string(stem) + ".safetensors.index.json");
    if (!fs::exists(index, ec)) continue;
    std::string index_label = str_cat(label, "/", index.filename().string());
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_text_file(index, label));
    } catch (const nlohmann::json::exception& e) {
      throw WeightError(str_cat(index_label, ": not valid JSON: ", e.what()));
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw WeightError(str_cat(index_label, ": missing object 'weight_map'"));
    TensorStore store;
    store.dir_ = dir;
    store.label_ = label;
    std::set<std::string> shards;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw WeightError(str_cat(index_label, ": weight_map['", it.key(), "'] is not a file name"));
      std::string file = it.value().get<std::string>();
      if (!is_plain_file_name(file))
        throw WeightError(str_cat(index_label, ": weight_map['", it.key(), "'] = '", file,
                                  "' is not a file name inside the directory"));
      store.key_to_file_[it.key()] = file;
      shards.insert(file);
    }
    for (const auto& s : shards) {
      fs::path p = fs::path(dir) / s;
      if (!fs::exists(p, ec))
        throw WeightError(str_cat(index_label, ": shard '", s, "' listed in the index is missing"));
      if (!fs::is_regular_file(p, ec))
        throw WeightError(str_cat(index_label, ": shard '", s, "' is not a regular file"));
    }
    return store;
  }
  for (const char* stem : {"diffusion_pytorch_model", "model"}) {
    fs::path single = fs::path(dir) / (std::string(stem) + ".safetensors");
    if (fs::exists(single, ec)) return open_file(single.string(), label);
  }
  std::vector<fs::path> candidates;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".safetensors") candidates.push_back(entry.path());
  if (candidates.size() == 1) return open_file(candidates[0].string(), label);
  if (candidates.empty())
    throw WeightError(str_cat(label, ": no safetensors weights in '", dir,
                              "' (expected diffusion_pytorch_model.safetensors, model.safetensors or a "
                              "*.safetensors.index.json)"));
  throw WeightError(str_cat(label, ": several *.safetensors files in '", dir, "' and no index to say which to use"));
}

std::vector<std::string> TensorStore::keys() const {
  std::vector<std::string> out;
  out.reserve(key_to_file_.size());
  for (const auto& kv : key_to_file_) out.push_back(kv.first);
  return out;
}

const std::string& TensorStore::file_of(const std::string& key) const {
  auto it = key_to_file_.find(key);
  if (it == key_to_file_.end()) throw WeightError(str_cat(label_, ": tensor '", key, "' not found"));
  return it->second;
}

const WeightFile& TensorStore::shard(const std::string& file) const {
  auto it = open_.find(file);
  if (it != open_.end()) return *it->second;
  auto opened = std::make_shared<SafetensorsFile>((fs::path(dir_) / file).string());
  // Every tensor of the shard must belong to it according to the index: a tensor stored in two
  // shards, or in a shard the index does not name for it, is ambiguous.
  for (const auto& e : opened->header().tensors) {
    auto k = key_to_file_.find(e.name);
    if (k != key_to_file_.end() && k->second != file)
      throw WeightError(str_cat(label_, ": tensor '", e.name, "' is stored in '", file, "' but the index assigns it to '",
                                k->second, "'"));
  }
  return *open_.emplace(file, std::move(opened)).first->second;
}

TensorView TensorStore::get(const std::string& key) const {
  if (auto it = presented_.find(key); it != presented_.end()) {
    const Presented& p = *it->second;
    return TensorView{&p.entry, p.pieces[0].file, p.pieces};
  }
  const std::string& file = file_of(key);
  const WeightFile& f = shard(file);
  const TensorEntry* e = f.find(key);
  if (e == nullptr)
    throw WeightError(str_cat(label_, ": tensor '", key, "' is listed in the index but missing from '", f.path(), "'"));
  return TensorView::whole(*e, f);
}

std::string TensorStore::stored_as(const std::string& key) const {
  auto it = presented_.find(key);
  if (it == presented_.end()) return "";
  std::string out;
  for (const auto& p : it->second->pieces) {
    if (!out.empty()) out += " + ";
    const int64_t rows = p.entry->shape.empty() ? 1 : p.entry->shape[0];
    if (p.row_begin == 0 && p.row_end == rows) out += str_cat("'", p.entry->name, "'");
    else out += str_cat("rows [", p.row_begin, ", ", p.row_end, ") of '", p.entry->name, "'");
  }
  if (out == str_cat("'", key, "'")) return "";
  return out;
}

void TensorStore::close() {
  open_.clear();
  // Presented tensors point into the mapping: they go with it.
  if (!presented_.empty()) {
    presented_.clear();
    key_to_file_.clear();
  }
}

}  // namespace fluxmpi::io
