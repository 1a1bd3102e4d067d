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

  // --- Token datasets (tessera-prep and its readers) ---
  // A file in the HDF5 1.8 format, whose attributes may exceed 64 KiB (a long manifest).
  static H5File create_for_large_attributes(const std::string& path);  // truncates
  void write(const std::string& name, const std::vector<int64_t>& shape, const uint16_t* data);
  void write(const std::string& name, const std::vector<int64_t>& shape, const uint32_t* data);
  void write(const std::string& name, const std::vector<int64_t>& shape, const uint64_t* data);
  // Appends n elements to the 1-D dataset name (a root-level name), creating it chunked (chunk
  // elements a chunk) and extendible on the first call (n may be 0).
  void append(const std::string& name, const uint16_t* data, int64_t n, int64_t chunk = 1 << 20);
  void append(const std::string& name, const uint32_t* data, int64_t n, int64_t chunk = 1 << 20);
  void append(const std::string& name, const uint8_t* data, int64_t n, int64_t chunk = 1 << 20);
  // Whole-dataset reads, converting to the requested type.
  void read(const std::string& name, uint16_t* data) const;
  void read(const std::string& name, uint32_t* data) const;
  void read(const std::string& name, uint64_t* data) const;
  // Root attributes: an integer, and a string (fixed or variable length).
  int64_t attr_int(const std::string& name) const;
  bool has_attr(const std::string& name) const;
  std::string attr_string(const std::string& name) const;

 private:
  H5File(hid_t id, std::string path) : id_(id), path_(std::move(path)) {}
  void write_raw(const std::string& name, const std::vector<int64_t>& shape, hid_t type,
                 const void* data);
  void append_raw(const std::string& name, hid_t type, const void* data, int64_t n, int64_t chunk);
  void read_raw(const std::string& name, hid_t type, void* data) const;
  hid_t id_ = -1;
  std::string path_;
};

}  // namespace tessera
