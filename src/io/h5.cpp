#include "io/h5.hpp"

#include "core/error.hpp"
#include "io/h5_object.hpp"

namespace tessera {
namespace {
using Handle = H5Handle;
}  // namespace

H5File H5File::create(const std::string& path) {
  const hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  TESSERA_REQUIRE_LOCAL(id >= 0, "cannot create HDF5 file '", path, "'");
  return H5File(id, path);
}

H5File H5File::open_read(const std::string& path) {
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  TESSERA_REQUIRE_LOCAL(id >= 0, "cannot open HDF5 file '", path, "'");
  return H5File(id, path);
}

H5File::~H5File() {
  if (id_ >= 0) H5Fclose(id_);
}

H5File::H5File(H5File&& o) noexcept : id_(o.id_), path_(std::move(o.path_)) { o.id_ = -1; }

void H5File::write_raw(const std::string& name, const std::vector<int64_t>& shape, hid_t type,
                       const void* data) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space{dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(int(dims.size()), dims.data(), nullptr),
               H5Sclose};
  Handle lcpl{H5Pcreate(H5P_LINK_CREATE), H5Pclose};
  H5Pset_create_intermediate_group(lcpl.id, 1);
  Handle dcpl{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
  H5Pset_obj_track_times(dcpl.id, false);
  Handle set{H5Dcreate2(id_, name.c_str(), type, space.id, lcpl.id, dcpl.id, H5P_DEFAULT),
             H5Dclose};
  TESSERA_REQUIRE_LOCAL(set.id >= 0, "cannot create dataset '", name, "' in '", path_, "'");
  TESSERA_REQUIRE_LOCAL(H5Dwrite(set.id, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0,
                        "cannot write dataset '", name, "' in '", path_, "'");
}

void H5File::write(const std::string& name, const std::vector<int64_t>& shape, const float* d) {
  write_raw(name, shape, H5T_NATIVE_FLOAT, d);
}
void H5File::write(const std::string& name, const std::vector<int64_t>& shape, const int32_t* d) {
  write_raw(name, shape, H5T_NATIVE_INT32, d);
}
void H5File::write(const std::string& name, const std::vector<int64_t>& shape, const double* d) {
  write_raw(name, shape, H5T_NATIVE_DOUBLE, d);
}

namespace {
void write_attr(hid_t file, const std::string& name, hid_t type, const void* value) {
  Handle space{H5Screate(H5S_SCALAR), H5Sclose};
  Handle a{H5Acreate2(file, name.c_str(), type, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
  TESSERA_REQUIRE_LOCAL(a.id >= 0 && H5Awrite(a.id, type, value) >= 0, "cannot write attribute ",
                        name);
}
}  // namespace

void H5File::attr(const std::string& name, int64_t v) { write_attr(id_, name, H5T_NATIVE_INT64, &v); }
void H5File::attr(const std::string& name, double v) { write_attr(id_, name, H5T_NATIVE_DOUBLE, &v); }
void H5File::attr(const std::string& name, const std::string& v) {
  Handle type{H5Tcopy(H5T_C_S1), H5Tclose};
  H5Tset_size(type.id, v.size() + 1);
  write_attr(id_, name, type.id, v.c_str());
}

std::vector<int64_t> H5File::shape(const std::string& name) const {
  Handle set{H5Dopen2(id_, name.c_str(), H5P_DEFAULT), H5Dclose};
  TESSERA_REQUIRE_LOCAL(set.id >= 0, "dataset '", name, "' missing from '", path_, "'");
  Handle space{H5Dget_space(set.id), H5Sclose};
  const int nd = H5Sget_simple_extent_ndims(space.id);
  std::vector<hsize_t> dims(size_t(nd > 0 ? nd : 0));
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  return std::vector<int64_t>(dims.begin(), dims.end());
}

void H5File::read(const std::string& name, float* data) const {
  Handle set{H5Dopen2(id_, name.c_str(), H5P_DEFAULT), H5Dclose};
  TESSERA_REQUIRE_LOCAL(set.id >= 0, "dataset '", name, "' missing from '", path_, "'");
  TESSERA_REQUIRE_LOCAL(H5Dread(set.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0,
                        "cannot read dataset '", name, "' from '", path_, "'");
}

// --- Token datasets ---------------------------------------------------------------------

H5File H5File::create_for_large_attributes(const std::string& path) {
  Handle fapl{H5Pcreate(H5P_FILE_ACCESS), H5Pclose};
  H5Pset_libver_bounds(fapl.id, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
  // No object times (the root group's here, each dataset's in write_raw and append_raw): the
  // same content gives the same bytes, whenever and however it was written (doc/data.md).
  Handle fcpl{H5Pcreate(H5P_FILE_CREATE), H5Pclose};
  H5Pset_obj_track_times(fcpl.id, false);
  const hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.id, fapl.id);
  TESSERA_REQUIRE_LOCAL(id >= 0, "cannot create HDF5 file '", path, "'");
  return H5File(id, path);
}

void H5File::write(const std::string& name, const std::vector<int64_t>& shape, const uint16_t* d) {
  write_raw(name, shape, H5T_NATIVE_UINT16, d);
}
void H5File::write(const std::string& name, const std::vector<int64_t>& shape, const uint32_t* d) {
  write_raw(name, shape, H5T_NATIVE_UINT32, d);
}
void H5File::write(const std::string& name, const std::vector<int64_t>& shape, const uint64_t* d) {
  write_raw(name, shape, H5T_NATIVE_UINT64, d);
}

void H5File::append_raw(const std::string& name, hid_t type, const void* data, int64_t n,
                        int64_t chunk) {
  const hsize_t kChunk = hsize_t(chunk);
  if (H5Lexists(id_, name.c_str(), H5P_DEFAULT) <= 0) {
    const hsize_t zero = 0, unlimited = H5S_UNLIMITED;
    Handle space{H5Screate_simple(1, &zero, &unlimited), H5Sclose};
    Handle dcpl{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
    H5Pset_chunk(dcpl.id, 1, &kChunk);
    H5Pset_obj_track_times(dcpl.id, false);
    Handle set{H5Dcreate2(id_, name.c_str(), type, space.id, H5P_DEFAULT, dcpl.id, H5P_DEFAULT),
               H5Dclose};
    TESSERA_REQUIRE_LOCAL(set.id >= 0, "cannot create dataset '", name, "' in '", path_, "'");
  }
  if (n == 0) return;
  Handle set{H5Dopen2(id_, name.c_str(), H5P_DEFAULT), H5Dclose};
  TESSERA_REQUIRE_LOCAL(set.id >= 0, "dataset '", name, "' missing from '", path_, "'");
  hsize_t size = 0;
  {
    Handle space{H5Dget_space(set.id), H5Sclose};
    H5Sget_simple_extent_dims(space.id, &size, nullptr);
  }
  const hsize_t count = hsize_t(n), grown = size + count;
  TESSERA_REQUIRE_LOCAL(H5Dset_extent(set.id, &grown) >= 0, "cannot extend dataset '", name,
                        "' in '", path_, "'");
  Handle file_space{H5Dget_space(set.id), H5Sclose};
  H5Sselect_hyperslab(file_space.id, H5S_SELECT_SET, &size, nullptr, &count, nullptr);
  Handle mem_space{H5Screate_simple(1, &count, nullptr), H5Sclose};
  TESSERA_REQUIRE_LOCAL(H5Dwrite(set.id, type, mem_space.id, file_space.id, H5P_DEFAULT, data) >= 0,
                        "cannot append to dataset '", name, "' in '", path_, "'");
}

void H5File::append(const std::string& name, const uint16_t* data, int64_t n, int64_t chunk) {
  append_raw(name, H5T_NATIVE_UINT16, data, n, chunk);
}
void H5File::append(const std::string& name, const uint32_t* data, int64_t n, int64_t chunk) {
  append_raw(name, H5T_NATIVE_UINT32, data, n, chunk);
}
void H5File::append(const std::string& name, const uint8_t* data, int64_t n, int64_t chunk) {
  append_raw(name, H5T_NATIVE_UINT8, data, n, chunk);
}

void H5File::read_raw(const std::string& name, hid_t type, void* data) const {
  Handle set{H5Dopen2(id_, name.c_str(), H5P_DEFAULT), H5Dclose};
  TESSERA_REQUIRE_LOCAL(set.id >= 0, "dataset '", name, "' missing from '", path_, "'");
  TESSERA_REQUIRE_LOCAL(H5Dread(set.id, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0,
                        "cannot read dataset '", name, "' from '", path_, "'");
}

void H5File::read(const std::string& name, uint16_t* d) const {
  read_raw(name, H5T_NATIVE_UINT16, d);
}
void H5File::read(const std::string& name, uint32_t* d) const {
  read_raw(name, H5T_NATIVE_UINT32, d);
}
void H5File::read(const std::string& name, uint64_t* d) const {
  read_raw(name, H5T_NATIVE_UINT64, d);
}

int64_t H5File::attr_int(const std::string& name) const {
  return read_int_attr(id_, name, "'" + path_ + "'");
}

bool H5File::has_attr(const std::string& name) const { return H5Aexists(id_, name.c_str()) > 0; }

std::string H5File::attr_string(const std::string& name) const {
  return read_string_attr(id_, name, "'" + path_ + "'");
}

}  // namespace tessera
