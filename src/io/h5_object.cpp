#include "io/h5_object.hpp"

#include "core/error.hpp"

namespace tessera {
namespace {

template <class T>
T read_scalar(hid_t obj, const std::string& name, hid_t type, const std::string& where) {
  TESSERA_REQUIRE_LOCAL(H5Aexists(obj, name.c_str()) > 0, where, " has no attribute '", name, "'");
  H5Handle a(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  T v{};
  TESSERA_REQUIRE_LOCAL(H5Aread(a.id, type, &v) >= 0, "attribute '", name, "' of ", where,
                        " is not a number");
  return v;
}

}  // namespace

int64_t read_int_attr(hid_t obj, const std::string& name, const std::string& where) {
  return read_scalar<int64_t>(obj, name, H5T_NATIVE_INT64, where);
}

uint64_t read_uint_attr(hid_t obj, const std::string& name, const std::string& where) {
  return read_scalar<uint64_t>(obj, name, H5T_NATIVE_UINT64, where);
}

double read_double_attr(hid_t obj, const std::string& name, const std::string& where) {
  return read_scalar<double>(obj, name, H5T_NATIVE_DOUBLE, where);
}

std::string read_string_attr(hid_t obj, const std::string& name, const std::string& where) {
  TESSERA_REQUIRE_LOCAL(H5Aexists(obj, name.c_str()) > 0, where, " has no attribute '", name, "'");
  H5Handle a(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  H5Handle type(H5Aget_type(a.id), H5Tclose);
  TESSERA_REQUIRE_LOCAL(H5Tget_class(type.id) == H5T_STRING, "attribute '", name, "' of ", where,
                        " is not a string");
  if (H5Tis_variable_str(type.id) > 0) {
    H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.id, H5T_VARIABLE);
    // The file's character set (h5py writes UTF-8): HDF5 converts no string between sets.
    H5Tset_cset(mem.id, H5Tget_cset(type.id));
    char* s = nullptr;
    TESSERA_REQUIRE_LOCAL(H5Aread(a.id, mem.id, &s) >= 0, "cannot read attribute '", name, "' of ",
                          where);
    std::string v = s ? s : "";
    H5free_memory(s);
    return v;
  }
  std::string v(H5Tget_size(type.id), '\0');
  TESSERA_REQUIRE_LOCAL(H5Aread(a.id, type.id, v.data()) >= 0, "cannot read attribute '", name,
                        "' of ", where);
  v.resize(v.find('\0') == std::string::npos ? v.size() : v.find('\0'));
  return v;
}

}  // namespace tessera
