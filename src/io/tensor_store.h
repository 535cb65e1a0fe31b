#pragma once
/// The weights of one model component (`transformer/`, `vae/`, ...), stored either as one
/// safetensors file or as shards listed by a `*.safetensors.index.json` weight map. Shards are
/// mapped only when a tensor they hold is first requested, so a rank that owns a slice of the
/// transformer reads only the shards that hold it.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace fluxmpi::io {

/// One tensor inside a mapped file.
struct TensorView {
  const TensorEntry* entry = nullptr;
  const SafetensorsFile* file = nullptr;
  const uint8_t* data() const { return file->data(*entry); }
};

class TensorStore {
 public:
  /// Opens the weights in directory `dir`. `label` prefixes error messages (e.g.
  /// "model dir '/m': transformer"). Looks for, in order: `<stem>.safetensors.index.json`,
  /// `<stem>.safetensors` for the stems diffusion_pytorch_model and model, then a single
  /// `*.safetensors` file. Shard names in an index must be plain file names in `dir`, and every
  /// shard must exist (checked here, before any weight is read).
  static TensorStore open_dir(const std::string& dir, const std::string& label);
  /// A store over one safetensors file.
  static TensorStore open_file(const std::string& path, const std::string& label);

  /// All tensor names (from the index, or from the single file's header), sorted.
  std::vector<std::string> keys() const;
  bool contains(const std::string& key) const { return key_to_file_.count(key) != 0; }
  /// The file that holds `key` (relative to the directory).
  const std::string& file_of(const std::string& key) const;
  /// Maps the shard on first use. Throws WeightError when the key is absent, or when its shard
  /// does not hold it (an index that lies).
  TensorView get(const std::string& key) const;
  const std::string& label() const { return label_; }
  const std::string& dir() const { return dir_; }
  /// Unmaps every shard (the views handed out become invalid).
  void close();

 private:
  std::string dir_;
  std::string label_;
  std::map<std::string, std::string> key_to_file_;
  mutable std::map<std::string, std::shared_ptr<SafetensorsFile>> open_;
  const SafetensorsFile& shard(const std::string& file) const;
};

}  // namespace fluxmpi::io
