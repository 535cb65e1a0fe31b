#pragma once
/// Read-only memory mapping of a whole regular file.

#include <cstddef>
#include <cstdint>
#include <string>

namespace fluxmpi::io {

class MappedFile {
 public:
  /// Maps `path`. Throws `ErrorType`-like WeightError naming the path when it is missing, not a
  /// regular file (directory, symlink loop) or unreadable.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  /// Tells the kernel the pages of [offset, offset+length) are no longer needed (drops them from
  /// this process's RSS after they were copied out).
  void release(size_t offset, size_t length) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fluxmpi::io
