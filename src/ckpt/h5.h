#pragma once
// Internal to src/ckpt (the only folder that includes <hdf5.h>): HDF5 identifiers behind RAII
// handles, and every HDF5 failure turned into one fluxmpi error that names the file and object
// and carries the innermost HDF5 message. The library's own error printing is switched off.

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fluxmpi::ckpt::h5 {

// Which error class a failure becomes: a bad checkpoint (reading) or an I/O failure (writing).
enum class Fault { Checkpoint, Io };

// Owns one hid_t and closes it with the matching H5?close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(Handle&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& other) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  // Closes now, ignoring failure (destructors, error paths).
  void reset();
  // Closes now and reports whether HDF5 succeeded (a file close flushes).
  bool close();

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Switches off HDF5's printing of error stacks (once per process; every entry point calls it).
void silence_errors();
// The innermost description on the current HDF5 error stack (empty if none); clears the stack.
std::string take_error();
// Throws CheckpointError or IoError "<what>: <innermost HDF5 message>".
[[noreturn]] void raise(Fault fault, const std::string& what);

// Returns `id`, or raises when it is negative.
hid_t check(hid_t id, Fault fault, const std::string& what);
void check_status(herr_t status, Fault fault, const std::string& what);

Handle file_handle(hid_t id, Fault fault, const std::string& what);
Handle group_handle(hid_t id, Fault fault, const std::string& what);
Handle dataset_handle(hid_t id, Fault fault, const std::string& what);
Handle space_handle(hid_t id, Fault fault, const std::string& what);
Handle type_handle(hid_t id, Fault fault, const std::string& what);
Handle attribute_handle(hid_t id, Fault fault, const std::string& what);
Handle plist_handle(hid_t id, Fault fault, const std::string& what);

// Variable-length UTF-8 string (attributes, written before SWMR starts).
Handle vl_string_type();
// Fixed-length, null-padded UTF-8 string of `bytes` bytes (`status`).
Handle fixed_string_type(size_t bytes);

// "float32", "float64", "int32", "int64", "uint8", "string", "string[16]", "compound", ...
std::string type_name(hid_t type);
// The current extent of a dataset or attribute dataspace (empty for a scalar).
std::vector<int64_t> extent(hid_t space);
// Maximum extent; -1 for unlimited dimensions.
std::vector<int64_t> max_extent(hid_t space);

// Whether every link along `path` ("/images/00000/text") exists, checked component by component
// so that a missing parent is not an HDF5 error.
bool path_exists(hid_t loc, const std::string& path);

// Attributes of an object, written once before SWMR starts.
void write_attribute(hid_t object, const std::string& name, const std::string& value, const std::string& where);
void write_attribute(hid_t object, const std::string& name, int64_t value, const std::string& where);
void write_attribute(hid_t object, const std::string& name, double value, const std::string& where);

// Reading attributes: each throws CheckpointError "<where>: attribute '<name>' ..." when it is
// missing, not scalar or of another class (string / integer / float).
bool has_attribute(hid_t object, const std::string& name);
std::string read_string_attribute(hid_t object, const std::string& name, const std::string& where);
int64_t read_int_attribute(hid_t object, const std::string& name, const std::string& where);
double read_float_attribute(hid_t object, const std::string& name, const std::string& where);

}  // namespace fluxmpi::ckpt::h5
