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

/// A run of rows [row_begin, row_end) along dim 0 of a tensor as stored in a mapped file.
struct TensorPiece {
  const TensorEntry* entry = nullptr;  ///< the stored tensor
  const WeightFile* file = nullptr;
  int64_t row_begin = 0;
  int64_t row_end = 0;

  uint64_t row_bytes() const;
  uint64_t num_bytes() const { return row_bytes() * static_cast<uint64_t>(row_end - row_begin); }
  /// The first byte of row `row_begin` inside the mapping.
  const uint8_t* data() const { return file->data(*entry) + row_bytes() * static_cast<uint64_t>(row_begin); }
  /// Shape of the piece: the stored shape with dim 0 = row_end - row_begin.
  std::vector<int64_t> shape() const;
};

/// One tensor of a store: how it is presented (its key, dtype and shape) and where its bytes are.
/// A tensor of a diffusers folder is one piece, stored as is; a tensor that a single-file layout
/// maps onto a diffusers key may be rows of a fused tensor (`to_k` inside `qkv`), several runs of
/// rows (norm_out's halves), or a stored tensor with another shape of the same size (the VAE's
/// 1x1 convolutions presented as linear weights).
struct TensorView {
  const TensorEntry* entry = nullptr;     ///< as presented: name (the key asked for), dtype, shape
  const WeightFile* file = nullptr;  ///< the file that holds the pieces
  std::vector<TensorPiece> pieces;        ///< concatenated along dim 0, in order, they are the tensor

  /// The view of a tensor stored as is: one piece covering all its rows.
  static TensorView whole(const TensorEntry& entry, const WeightFile& file);
  /// One piece covering a whole stored tensor of the presented shape: data() is the tensor.
  bool stored_as_is() const;
  /// The bytes of a tensor stored as is (InternalError otherwise).
  const uint8_t* data() const;
  /// Drops the mapped pages of every piece once the tensor has been copied out.
  void release() const;
};

/// A tensor a store presents under its own key, made of row runs of stored tensors of one file.
struct PresentedTensor {
  struct Rows {
    std::string stored_key;
    int64_t row_begin = 0;
    int64_t row_end = -1;  ///< -1: to the last row
  };
  std::string key;
  std::vector<Rows> rows;
  /// The shape presented; empty: the pieces' shape (rows summed, the stored trailing dims).
  std::vector<int64_t> shape;
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
  /// A store over one safetensors file that presents `tensors` (and only those) under their keys,
  /// without copying anything: single-file layouts (io/single_file.h) are mapped this way. Every
  /// run is checked here, from the header: its stored key exists, its rows lie inside the stored
  /// tensor, the runs of a tensor share dtype and trailing dims, a presented shape has their
  /// size. Throws WeightError naming the file, the stored key and its shape.
  static TensorStore open_presented(std::shared_ptr<const WeightFile> file, const std::string& label,
                                    const std::vector<PresentedTensor>& tensors);

  /// All tensor names (from the index, or from the single file's header), sorted.
  std::vector<std::string> keys() const;
  bool contains(const std::string& key) const { return key_to_file_.count(key) != 0; }
  /// The file that holds `key` (relative to the directory).
  const std::string& file_of(const std::string& key) const;
  /// Maps the shard on first use. Throws WeightError when the key is absent, or when its shard
  /// does not hold it (an index that lies).
  TensorView get(const std::string& key) const;
  const std::string& label() const { return label_; }
  /// Where a presented tensor's bytes are, for error messages: "rows [0, 3072) of 'double_blocks.0.img_attn.qkv.weight'";
  /// empty for a tensor stored under its own key.
  std::string stored_as(const std::string& key) const;
  const std::string& dir() const { return dir_; }
  /// Unmaps every shard (the views handed out become invalid).
  void close();

 private:
  std::string dir_;
  std::string label_;
  std::map<std::string, std::string> key_to_file_;
  mutable std::map<std::string, std::shared_ptr<const WeightFile>> open_;
  // Presented tensors (open_presented): their entry as presented and their resolved pieces.
  struct Presented {
    TensorEntry entry;
    std::vector<TensorPiece> pieces;
  };
  std::map<std::string, std::shared_ptr<Presented>> presented_;
  const WeightFile& shard(const std::string& file) const;
};

}  // namespace fluxmpi::io
