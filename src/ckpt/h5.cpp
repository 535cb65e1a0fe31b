#include "ckpt/h5.h"

#include <mutex>

#include "core/error.h"

namespace fluxmpi::ckpt::h5 {

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = other.id_;
    closer_ = other.closer_;
    other.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Handle::reset() {
  if (id_ >= 0 && closer_ != nullptr) {
    closer_(id_);
    H5Eclear2(H5E_DEFAULT);
  }
  id_ = H5I_INVALID_HID;
}

bool Handle::close() {
  bool ok = true;
  if (id_ >= 0 && closer_ != nullptr) ok = closer_(id_) >= 0;
  id_ = H5I_INVALID_HID;
  return ok;
}

void silence_errors() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

namespace {
herr_t collect_innermost(unsigned, const H5E_error2_t* e, void* out) {
  if (e->desc != nullptr && e->desc[0] != '\0') *static_cast<std::string*>(out) = e->desc;
  return 0;
}
}  // namespace

std::string take_error() {
  std::string innermost;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_innermost, &innermost);
  H5Eclear2(H5E_DEFAULT);
  // HDF5 messages may span lines ("time = ...\n, name = ..."): keep errors on one line.
  for (char& c : innermost)
    if (c == '\n') c = ' ';
  return innermost;
}

void raise(Fault fault, const std::string& what) {
  std::string detail = take_error();
  std::string message = detail.empty() ? what : str_cat(what, " (HDF5: ", detail, ")");
  if (fault == Fault::Io) throw IoError(message);
  throw CheckpointError(message);
}

hid_t check(hid_t id, Fault fault, const std::string& what) {
  if (id < 0) raise(fault, what);
  return id;
}

void check_status(herr_t status, Fault fault, const std::string& what) {
  if (status < 0) raise(fault, what);
}

Handle file_handle(hid_t id, Fault f, const std::string& w) { return Handle(check(id, f, w), H5Fclose); }
Handle group_handle(hid_t id, Fault f, const std::string& w) { return Handle(check(id, f, w), H5Gclose); }
Handle dataset_handle(hid_t id, Fault f, const std::string& w) { return Handle(check(id, f, w), H5Dclose); }
Handle space_handle(hid_t id, Fault f, const std::string& w) { return Handle(check(id, f, w), H5Sclose); }
Handle type_handle(hid_t id, Fault f, const std::string& w) { return Handle(check(id, f, w), H5Tclose); }
Handle attribute_handle(hid_t id, Fault f, const std::string& w) { return Handle(check(id, f, w), H5Aclose); }
Handle plist_handle(hid_t id, Fault f, const std::string& w) { return Handle(check(id, f, w), H5Pclose); }

Handle vl_string_type() {
  Handle t = type_handle(H5Tcopy(H5T_C_S1), Fault::Io, "string type");
  check_status(H5Tset_size(t.get(), H5T_VARIABLE), Fault::Io, "string type");
  check_status(H5Tset_cset(t.get(), H5T_CSET_UTF8), Fault::Io, "string type");
  return t;
}

Handle fixed_string_type(size_t bytes) {
  Handle t = type_handle(H5Tcopy(H5T_C_S1), Fault::Io, "string type");
  check_status(H5Tset_size(t.get(), bytes), Fault::Io, "string type");
  check_status(H5Tset_strpad(t.get(), H5T_STR_NULLPAD), Fault::Io, "string type");
  check_status(H5Tset_cset(t.get(), H5T_CSET_UTF8), Fault::Io, "string type");
  return t;
}

std::string type_name(hid_t type) {
  size_t size = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_FLOAT: return str_cat("float", size * 8);
    case H5T_INTEGER: return str_cat(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int", size * 8);
    case H5T_STRING: return H5Tis_variable_str(type) > 0 ? std::string("string") : str_cat("string[", size, "]");
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_VLEN: return "vlen";
    case H5T_ARRAY: return "array";
    case H5T_OPAQUE: return "opaque";
    case H5T_REFERENCE: return "reference";
    case H5T_BITFIELD: return "bitfield";
    default: return "unknown type";
  }
}

std::vector<int64_t> extent(hid_t space) {
  int rank = H5Sget_simple_extent_ndims(space);
  if (rank <= 0) return {};
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return std::vector<int64_t>(dims.begin(), dims.end());
}

std::vector<int64_t> max_extent(hid_t space) {
  int rank = H5Sget_simple_extent_ndims(space);
  if (rank <= 0) return {};
  std::vector<hsize_t> dims(rank), max(rank);
  H5Sget_simple_extent_dims(space, dims.data(), max.data());
  std::vector<int64_t> out;
  for (hsize_t m : max) out.push_back(m == H5S_UNLIMITED ? -1 : static_cast<int64_t>(m));
  return out;
}

bool path_exists(hid_t loc, const std::string& path) {
  std::string prefix = path.rfind('/', 0) == 0 ? "/" : "";
  size_t begin = prefix.size();
  while (begin < path.size()) {
    size_t end = path.find('/', begin);
    if (end == std::string::npos) end = path.size();
    prefix += path.substr(begin, end - begin);
    htri_t e = H5Lexists(loc, prefix.c_str(), H5P_DEFAULT);
    if (e <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
    prefix += "/";
    begin = end + 1;
  }
  return true;
}

namespace {

Handle scalar_space() { return space_handle(H5Screate(H5S_SCALAR), Fault::Io, "scalar dataspace"); }

void write_attribute_raw(hid_t object, const std::string& name, hid_t file_type, hid_t mem_type, const void* value,
                         const std::string& where) {
  const std::string what = str_cat(where, ": cannot write attribute '", name, "'");
  Handle space = scalar_space();
  Handle attr = attribute_handle(H5Acreate2(object, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                                 Fault::Io, what);
  check_status(H5Awrite(attr.get(), mem_type, value), Fault::Io, what);
}

// Opens a scalar attribute of the given class, or throws naming what was found instead.
Handle open_attribute(hid_t object, const std::string& name, H5T_class_t wanted, const char* wanted_name,
                      const std::string& where, Handle* type_out) {
  if (H5Aexists(object, name.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw CheckpointError(str_cat(where, ": attribute '", name, "' is missing"));
  }
  const std::string what = str_cat(where, ": attribute '", name, "' cannot be read");
  Handle attr = attribute_handle(H5Aopen(object, name.c_str(), H5P_DEFAULT), Fault::Checkpoint, what);
  Handle type = type_handle(H5Aget_type(attr.get()), Fault::Checkpoint, what);
  Handle space = space_handle(H5Aget_space(attr.get()), Fault::Checkpoint, what);
  bool scalar = H5Sget_simple_extent_type(space.get()) == H5S_SCALAR ||
                (H5Sget_simple_extent_npoints(space.get()) == 1 && extent(space.get()).size() <= 1);
  if (H5Tget_class(type.get()) != wanted || !scalar) {
    std::vector<int64_t> dims = extent(space.get());
    std::string shape;
    for (size_t i = 0; i < dims.size(); ++i) shape += (i ? ", " : "[") + std::to_string(dims[i]);
    if (!dims.empty()) shape = " " + shape + "]";
    throw CheckpointError(
        str_cat(where, ": attribute '", name, "': expected ", wanted_name, ", got ", type_name(type.get()), shape));
  }
  *type_out = std::move(type);
  return attr;
}

}  // namespace

void write_attribute(hid_t object, const std::string& name, const std::string& value, const std::string& where) {
  Handle type = vl_string_type();
  const char* p = value.c_str();
  write_attribute_raw(object, name, type.get(), type.get(), &p, where);
}

void write_attribute(hid_t object, const std::string& name, int64_t value, const std::string& where) {
  write_attribute_raw(object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value, where);
}

void write_attribute(hid_t object, const std::string& name, double value, const std::string& where) {
  write_attribute_raw(object, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value, where);
}

bool has_attribute(hid_t object, const std::string& name) {
  htri_t e = H5Aexists(object, name.c_str());
  if (e < 0) H5Eclear2(H5E_DEFAULT);
  return e > 0;
}

std::string read_string_attribute(hid_t object, const std::string& name, const std::string& where) {
  Handle type;
  Handle attr = open_attribute(object, name, H5T_STRING, "a string", where, &type);
  const std::string what = str_cat(where, ": attribute '", name, "' cannot be read");
  // The memory type keeps the stored character set: HDF5 does not convert between ASCII and UTF-8.
  Handle mem = type_handle(H5Tcopy(type.get()), Fault::Checkpoint, what);
  if (H5Tis_variable_str(type.get()) > 0) {
    char* p = nullptr;
    check_status(H5Aread(attr.get(), mem.get(), &p), Fault::Checkpoint, what);
    std::string out = p != nullptr ? std::string(p) : std::string();
    H5free_memory(p);
    return out;
  }
  size_t size = H5Tget_size(type.get());
  std::string out(size, '\0');
  check_status(H5Aread(attr.get(), mem.get(), out.data()), Fault::Checkpoint, what);
  out.resize(out.find('\0') == std::string::npos ? size : out.find('\0'));
  return out;
}

int64_t read_int_attribute(hid_t object, const std::string& name, const std::string& where) {
  Handle type;
  Handle attr = open_attribute(object, name, H5T_INTEGER, "an integer", where, &type);
  int64_t v = 0;
  check_status(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), Fault::Checkpoint,
               str_cat(where, ": attribute '", name, "' cannot be read"));
  return v;
}

double read_float_attribute(hid_t object, const std::string& name, const std::string& where) {
  Handle type;
  Handle attr = open_attribute(object, name, H5T_FLOAT, "a float", where, &type);
  double v = 0;
  check_status(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &v), Fault::Checkpoint,
               str_cat(where, ": attribute '", name, "' cannot be read"));
  return v;
}

}  // namespace fluxmpi::ckpt::h5
