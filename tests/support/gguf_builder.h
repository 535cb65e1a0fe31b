#pragma once
// GGUF files made by the tests (torch-free, header only): the header as GGUF v3 lays it out, and the
// data section either given or left as a hole (a sparse file: the hollow real-size files of the
// planner tests cost no disk). Malformed variants are made by editing the returned bytes.

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "io/gguf.h"

namespace fluxmpi::test {

class GgufBuilder {
 public:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;  // ggml order: innermost first
    uint32_t type;
    uint64_t bytes;
    uint64_t offset = 0;
  };

  void add_u32(const std::string& key, uint32_t v) {
    std::swap(out_, kv_);
    str(key);
    u32(4);
    u32(v);
    std::swap(out_, kv_);
    ++kv_count_;
  }
  void add_string(const std::string& key, const std::string& v) {
    std::swap(out_, kv_);
    str(key);
    u32(8);
    str(v);
    std::swap(out_, kv_);
    ++kv_count_;
  }
  /// A tensor of torch shape `shape` ([out, in] for a weight) stored as `type`.
  void add_tensor(const std::string& name, const std::vector<int64_t>& shape, io::GgmlType type) {
    Tensor t{name, {}, static_cast<uint32_t>(type), 0};
    for (auto it = shape.rbegin(); it != shape.rend(); ++it) t.ne.push_back(static_cast<uint64_t>(*it));
    io::DType d{};
    uint64_t elements = 1;
    for (uint64_t n : t.ne) elements *= n;
    if (io::dtype_of_ggml_type(t.type, &d)) t.bytes = elements / io::block_elements(d) * io::block_bytes(d);
    t.offset = data_size_;
    data_size_ += (t.bytes + alignment_ - 1) / alignment_ * alignment_;
    tensors_.push_back(std::move(t));
  }
  std::vector<Tensor>& tensors() { return tensors_; }
  uint64_t data_size() const { return data_size_; }

  /// The header bytes, padded to the alignment (the data section follows).
  std::vector<uint8_t> header() const {
    GgufBuilder b = *this;
    b.out_.clear();
    b.out_.insert(b.out_.end(), {'G', 'G', 'U', 'F'});
    b.u32(3);
    b.u64(tensors_.size());
    b.u64(kv_count_);
    b.out_.insert(b.out_.end(), kv_.begin(), kv_.end());
    for (const Tensor& t : tensors_) {
      b.str(t.name);
      b.u32(static_cast<uint32_t>(t.ne.size()));
      for (uint64_t n : t.ne) b.u64(n);
      b.u32(t.type);
      b.u64(t.offset);
    }
    while (b.out_.size() % alignment_ != 0) b.out_.push_back(0);
    return b.out_;
  }
  /// Header and a data section of zeros (or `data` when given).
  std::vector<uint8_t> bytes(const std::vector<uint8_t>& data = {}) const {
    std::vector<uint8_t> out = header();
    const size_t at = out.size();
    out.resize(at + data_size_, 0);
    if (!data.empty()) std::memcpy(out.data() + at, data.data(), std::min<size_t>(data.size(), data_size_));
    return out;
  }
  /// Writes the header and leaves the data section a hole of the right size.
  void write_hollow(const std::string& path) const {
    const std::vector<uint8_t> h = header();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(h.data()), static_cast<std::streamsize>(h.size()));
    if (data_size_ > 0) {
      f.seekp(static_cast<std::streamoff>(h.size() + data_size_ - 1));
      f.put('\0');
    }
  }

 private:
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void str(const std::string& s) {
    u64(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }
  std::vector<uint8_t> out_, kv_;  // kv_: the metadata pairs, written into out_ by header()
  uint64_t kv_count_ = 0;
  std::vector<Tensor> tensors_;
  uint64_t data_size_ = 0;
  uint64_t alignment_ = 32;
};

}  // namespace fluxmpi::test
