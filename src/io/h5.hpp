// A thin RAII layer over the HDF5 C API: files, whole-tensor datasets and scalar attributes.
// Dataset paths may contain dots ("/init/layers.0.attn.q.weight"); intermediate groups are
// created on demand.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

class H5File {
 public:
  static H5File create(const std::string& path);  // truncates
  static H5File open_read(const std::string& path);
  ~H5File();
  H5File(H5File&& o) noexcept;
  H5File& operator=(H5File&&) = delete;
  H5File(const H5File&) = delete;

  void write(const std::string& name, const std::vector<int64_t>& shape, const float* data);
  void write(const std::string& name, const std::vector<int64_t>& shape, const int32_t* data);
  void write(const std::string& name, const std::vector<int64_t>& shape, const double* data);
  void attr(const std::string& name, int64_t value);
  void attr(const std::string& name, double value);
  void attr(const std::string& name, const std::string& value);

  std::vector<int64_t> shape(const std::string& name) const;
  void read(const std::string& name, float* data) const;

  const std::string& path() const { return path_; }

 private:
  H5File(hid_t id, std::string path) : id_(id), path_(std::move(path)) {}
  void write_raw(const std::string& name, const std::vector<int64_t>& shape, hid_t type,
                 const void* data);
  hid_t id_ = -1;
  std::string path_;
};

}  // namespace tessera
