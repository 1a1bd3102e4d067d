// Small HDF5 helpers shared by io/ (internal): an RAII handle, and attribute readers on any
// object (file or dataset). Readers raise a local Error naming `where` when the attribute is
// missing or of the wrong type; callers that need a collective error check H5Aexists first.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>

namespace tessera {

// Closes an HDF5 identifier at scope exit.
struct H5Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  H5Handle(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~H5Handle() {
    if (id >= 0) close(id);
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  H5Handle(H5Handle&& o) noexcept : id(o.id), close(o.close) { o.id = -1; }
  H5Handle& operator=(H5Handle&&) = delete;
};

// Fixed- or variable-length string attribute.
std::string read_string_attr(hid_t obj, const std::string& name, const std::string& where);
int64_t read_int_attr(hid_t obj, const std::string& name, const std::string& where);
uint64_t read_uint_attr(hid_t obj, const std::string& name, const std::string& where);
double read_double_attr(hid_t obj, const std::string& name, const std::string& where);

}  // namespace tessera
