#include "io/checkpoint.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "comm/agree.hpp"
#include "config/run_config.hpp"
#include "core/error.hpp"
#include "core/fault_inject.hpp"
#include "io/checkpoint_checks.hpp"
#include "io/h5_object.hpp"

namespace fs = std::filesystem;

namespace tessera {
namespace {

constexpr const char* kFormat = "tessera-checkpoint";
constexpr int64_t kVersion = 1;

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The block a tensor's holder holds, and the elements of it ([first, second) of the block
// flattened row-major) it reads ...
Shape block_of(const CheckpointTensor& ct) {
  return ct.block.ndim ? ct.block : ct.global;
}
std::pair<int64_t, int64_t> held(const CheckpointTensor& ct) {
  const int64_t n = ct.n < 0 ? block_of(ct).numel() : ct.n;
  return {ct.begin, ct.begin + n};
}
// ... and those it writes and checks: its even share among the holders.
std::pair<int64_t, int64_t> responsible(const CheckpointTensor& ct) {
  const auto [a, b] = held(ct);
  const int64_t n = b - a;
  if (!ct.writes) return {a, a};
  return {a + n * ct.holder / ct.holders, a + n * (ct.holder + 1) / ct.holders};
}

// Adds the elements [a, b) of the block (dims count[d..] at start[d..], flattened row-major)
// to the selection, below the fixed leading coordinates `prefix` (one per dimension before
// d): whole rows as one hyperslab, partial first and last rows recursively.
struct Region {
  std::vector<hsize_t> start, count;
};
void select_range(hid_t space, const Region& r, size_t d, std::vector<hsize_t>& prefix, int64_t a,
                  int64_t b, bool& first) {
  if (a >= b) return;
  int64_t inner = 1;
  for (size_t i = d + 1; i < r.count.size(); ++i) inner *= int64_t(r.count[i]);
  const int64_t r0 = a / inner, r1 = (b - 1) / inner;  // first and last row touched
  auto add = [&](int64_t row, int64_t rows) {          // whole rows [row, row + rows)
    std::vector<hsize_t> start(prefix), count(prefix.size(), 1);
    start.push_back(r.start[d] + hsize_t(row));
    count.push_back(hsize_t(rows));
    for (size_t i = d + 1; i < r.count.size(); ++i)
      start.push_back(r.start[i]), count.push_back(r.count[i]);
    H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), nullptr,
                        count.data(), nullptr);
    first = false;
  };
  auto partial = [&](int64_t row, int64_t lo, int64_t hi) {  // elements [lo, hi) of one row
    if (lo == 0 && hi == inner) return add(row, 1);
    prefix.push_back(r.start[d] + hsize_t(row));
    select_range(space, r, d + 1, prefix, lo, hi, first);
    prefix.pop_back();
  };
  if (r0 == r1) return partial(r0, a - r0 * inner, b - r0 * inner);
  partial(r0, a - r0 * inner, inner);
  if (r1 > r0 + 1) add(r0 + 1, r1 - r0 - 1);
  partial(r1, 0, b - r1 * inner);
}

// The file dataspace of the tensor with elements [a, b) of its block selected (none when
// empty).
H5Handle selection(const CheckpointTensor& ct, int64_t a, int64_t b) {
  const int nd = ct.global.ndim;
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  Region r{std::vector<hsize_t>(size_t(nd)), std::vector<hsize_t>(size_t(nd))};
  const Shape blk = block_of(ct);
  for (int i = 0; i < nd; ++i) {
    dims[size_t(i)] = hsize_t(ct.global[i]);
    r.start[size_t(i)] = hsize_t(ct.block.ndim ? ct.start[size_t(i)] : 0);
    r.count[size_t(i)] = hsize_t(blk[i]);
  }
  H5Handle space(H5Screate_simple(nd, dims.data(), nullptr), H5Sclose);
  if (a >= b) {
    H5Sselect_none(space.id);
    return space;
  }
  std::vector<hsize_t> prefix;
  bool first = true;
  select_range(space.id, r, 0, prefix, a, b, first);
  return space;
}

// tensor_checksum of elements [a, b) of the block, each keyed by its index in the whole
// tensor (so the holders' partial sums over any blocks add up to the whole tensor's).
uint64_t block_checksum(const CheckpointTensor& ct, const float* data, int64_t a, int64_t b) {
  if (!ct.block.ndim) return tensor_checksum(data, a, b);
  const int nd = ct.global.ndim;
  uint64_t h = 0;
  for (int64_t e = a; e < b; ++e) {
    int64_t rest = e, g = 0, stride = 1;
    for (int i = nd - 1; i >= 0; --i) {  // block coordinates -> global flattened index
      g += (ct.start[size_t(i)] + rest % ct.block[i]) * stride;
      rest /= ct.block[i];
      stride *= ct.global[i];
    }
    uint32_t bits;
    std::memcpy(&bits, data + (e - a), sizeof bits);
    h += mix((uint64_t(bits) << 32) ^ mix(uint64_t(g)));
  }
  return h;
}

// A one-dimensional memory space of n elements (all selected, or none when n == 0).
H5Handle memory_space(int64_t n) {
  const hsize_t len = hsize_t(std::max<int64_t>(1, n));
  H5Handle space(H5Screate_simple(1, &len, nullptr), H5Sclose);
  if (n == 0) H5Sselect_none(space.id);
  return space;
}

void write_string_attr(hid_t obj, const char* name, const std::string& v) {
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.id, std::max<size_t>(1, v.size()));
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle a(H5Acreate2(obj, name, type.id, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  TESSERA_REQUIRE_LOCAL(a.id >= 0 && H5Awrite(a.id, type.id, v.data()) >= 0,
                        "cannot write checkpoint attribute ", name);
}

template <class T>
void write_attr(hid_t obj, const char* name, hid_t type, T v) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle a(H5Acreate2(obj, name, type, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  TESSERA_REQUIRE_LOCAL(a.id >= 0 && H5Awrite(a.id, type, &v) >= 0,
                        "cannot write checkpoint attribute ", name);
}

hid_t parallel_access(MPI_Comm comm) {
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  return fapl;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Non-finite values among n floats.
int64_t count_nonfinite(const float* data, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(data[i]);
  return bad;
}

// The names of the links in a group (a checkpoint's "params"), in the file's order.
std::vector<std::string> group_members(hid_t file, const char* group) {
  std::vector<std::string> names;
  H5Handle g(H5Gopen2(file, group, H5P_DEFAULT), H5Gclose);
  if (g.id < 0) return names;
  auto add = [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
    static_cast<std::vector<std::string>*>(out)->push_back(name);
    return 0;
  };
  H5Literate(g.id, H5_INDEX_NAME, H5_ITER_INC, nullptr, add, &names);
  return names;
}

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt-%08lld.h5", (long long)step);
  return buf;
}

}  // namespace

uint64_t tensor_checksum(const float* data, int64_t begin, int64_t end) {
  uint64_t h = 0;
  for (int64_t i = begin; i < end; ++i) {
    uint32_t bits;
    std::memcpy(&bits, data + (i - begin), sizeof bits);
    h += mix((uint64_t(bits) << 32) ^ mix(uint64_t(i)));
  }
  return h;
}

std::string checkpoint_dir(const RunConfig& run) {
  return run.checkpoint.dir.empty() ? run.output.dir + "/checkpoints" : run.checkpoint.dir;
}

const char* checkpoint_dir_key(const RunConfig& run) {
  return run.checkpoint.dir.empty() ? "output.dir" : "checkpoint.dir";
}

Checkpointer::Checkpointer(const RunConfig& run, Communicator& world)
    : run_(run),
      world_(world),
      dir_(checkpoint_dir(run)),
      every_(run.checkpoint.every),
      keep_(run.checkpoint.keep),
      at_end_(run.checkpoint.at_end),
      overwrite_(run.checkpoint.overwrite),
      resume_(run.checkpoint.resume) {
  // HDF5 errors reach the user as one line of ours, never as HDF5's error stack.
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

bool Checkpointer::due(int64_t step, int64_t last_step) const {
  return (at_end_ && step == last_step) || (every_ > 0 && step % every_ == 0);
}

std::string Checkpointer::resume_path() {
  // Rank 0 looks at the file system and decides; every rank gets its answer or its error.
  std::string path;
  collectively(world_, [&] {
    if (world_.rank() != 0) return;
    if (resume_ == "none") {
      replaced_ = foreign_checkpoints(dir_, overwrite_);
    } else if (resume_ == "latest") {
      path = latest_checkpoint(dir_);
    } else {
      std::error_code ec;
      TESSERA_REQUIRE_LOCAL(!fs::is_directory(resume_, ec), "checkpoint.resume = '",
                            printable(resume_),
                            "' is a directory; name a ckpt-*.h5 file in it, "
                            "or set checkpoint.dir to it and checkpoint.resume = latest");
      TESSERA_REQUIRE_LOCAL(fs::exists(resume_, ec), "checkpoint.resume = '", printable(resume_),
                            "': no such file (use none, latest, or the path of a ckpt-*.h5 "
                            "file)");
      path = resume_;
    }
  });
  int64_t length = int64_t(path.size());
  world_.broadcast(&length, sizeof length, 0);
  path.resize(size_t(length));
  world_.broadcast(path.data(), length, 0);
  return path;
}

void Checkpointer::require_writable(const std::vector<CheckpointTensor>& tensors) {
  double bytes = 0;
  for (const CheckpointTensor& ct : tensors) bytes += 4.0 * double(ct.global.numel());
  const std::string key = checkpoint_dir_key(run_);  // the key the user set
  collectively(world_, [&] {
    if (world_.rank() != 0) return;
    std::error_code ec;
    fs::create_directories(dir_, ec);
    TESSERA_REQUIRE_LOCAL(!ec, "cannot create the checkpoint directory '", printable(dir_), "' (",
                          key, "): ", ec.message());
    const std::string probe = dir_ + "/.write-test";
    std::FILE* f = std::fopen(probe.c_str(), "w");
    const int err = errno;
    const bool wrote = f && std::fputs("ok\n", f) >= 0;
    if (f) std::fclose(f);
    std::remove(probe.c_str());
    TESSERA_REQUIRE_LOCAL(wrote, "cannot write in the checkpoint directory '", printable(dir_),
                          "' (", key, "): ", std::strerror(err ? err : EIO), "; choose a writable ",
                          key);
    const fs::space_info space = fs::space(dir_, ec);
    TESSERA_REQUIRE_LOCAL(ec || double(space.available) >= bytes, "the checkpoint directory '",
                          printable(dir_), "' has ", double(space.available) / 1e6,
                          " MB free, but one checkpoint takes ", bytes / 1e6,
                          " MB; free space or choose another ", key);
  });
}

void Checkpointer::save(const CheckpointMeta& meta, const std::vector<CheckpointTensor>& tensors) {
  const std::string final_path = dir_ + "/" + checkpoint_name(meta.step);
  const std::string tmp_path = final_path + ".tmp";
  // A NaN or Inf never reaches a checkpoint: each rank counts them in what it would write,
  // and every rank refuses before anything is created, so the newest checkpoint stays the
  // newest finite one.
  std::vector<int64_t> bad(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    const auto [a, b] = responsible(tensors[t]);
    bad[t] = count_nonfinite(tensors[t].data + (a - held(tensors[t]).first), b - a);
  }
  if (!bad.empty()) world_.all_reduce(bad.data(), int64_t(bad.size()));
  for (size_t t = 0; t < tensors.size(); ++t)
    TESSERA_REQUIRE(bad[t] == 0, "not writing the checkpoint of step ", meta.step, ": ",
                    tensors[t].path, " holds ", bad[t],
                    " non-finite values (NaN or Inf), so "
                    "the run has diverged; the checkpoints already in '",
                    dir_, "' are kept");
  collectively(world_, [&] {
    if (world_.rank() == 0) {
      std::error_code ec;
      fs::create_directories(dir_, ec);
      TESSERA_REQUIRE_LOCAL(!ec, "cannot create checkpoint directory '", dir_, "': ", ec.message());
    }
  });
  world_.barrier();
  collectively(world_, [&] {
    H5Handle fapl(parallel_access(world_.raw()), H5Pclose);
    H5Handle file(H5Fcreate(tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id), H5Fclose);
    TESSERA_REQUIRE_LOCAL(file.id >= 0, "cannot create checkpoint file '", tmp_path, "'");
    write_string_attr(file.id, "format", kFormat);
    write_attr(file.id, "version", H5T_NATIVE_INT64, kVersion);
    write_attr(file.id, "step", H5T_NATIVE_INT64, meta.step);
    write_attr(file.id, "samples", H5T_NATIVE_INT64, meta.samples);
    write_attr(file.id, "seed", H5T_NATIVE_INT64, meta.seed);
    write_string_attr(file.id, "deck", meta.deck_json);
    write_string_attr(file.id, "layout", meta.layout_json);
    write_attr(file.id, "loss_scale", H5T_NATIVE_DOUBLE, meta.loss_scale);
    write_attr(file.id, "loss_scale_good", H5T_NATIVE_INT64, meta.loss_scale_good);
    write_string_attr(file.id, "meta_checksum", meta_checksum(meta));

    H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    H5Pset_create_intermediate_group(lcpl.id, 1);
    H5Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
    H5Pset_dxpl_mpio(dxpl.id, H5FD_MPIO_COLLECTIVE);
    for (size_t t = 0; t < tensors.size(); ++t) {
      if (write_hook_ && t == tensors.size() / 2) write_hook_();
      // Test hook: the write waits (up to 30 s) until the launcher is gone (tests/fuzz/orphan.sh).
      if (fault_injected("checkpoint-write-until-orphaned") && t == tensors.size() / 2)
        for (int i = 0; i < 300 && !launcher_.gone(); ++i) usleep(100000);
      // Test hook: checkpoint-midwrite kills the process (SIGKILL) halfway through writing a
      // checkpoint, so tests can prove the previous one survives.
      if (fault_injected("checkpoint-midwrite") && t == tensors.size() / 2) {
        H5Fflush(file.id, H5F_SCOPE_GLOBAL);
        raise(SIGKILL);
      }
      const CheckpointTensor& ct = tensors[t];
      std::vector<hsize_t> dims(ct.global.dims.begin(), ct.global.dims.begin() + ct.global.ndim);
      H5Handle fspace(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
      H5Handle set(H5Dcreate2(file.id, ct.path.c_str(), H5T_NATIVE_FLOAT, fspace.id, lcpl.id,
                              H5P_DEFAULT, H5P_DEFAULT),
                   H5Dclose);
      agree_or_throw(world_, set.id >= 0,
                     cat("cannot create dataset '", ct.path, "' in '", tmp_path, "'"));
      // This rank writes the elements it is responsible for; a failure on some ranks only is
      // agreed before the checksum's all-reduce.
      const auto [a, b] = responsible(ct);
      const float* src = ct.data + (a - held(ct).first);
      H5Handle fsel = selection(ct, a, b);
      H5Handle mspace = memory_space(b - a);
      agree_or_throw(world_,
                     H5Dwrite(set.id, H5T_NATIVE_FLOAT, mspace.id, fsel.id, dxpl.id, src) >= 0,
                     cat("cannot write dataset '", ct.path, "' to '", tmp_path, "' (rank ",
                         world_.rank(), ")"));
      int64_t sum = int64_t(block_checksum(ct, src, a, b));
      world_.all_reduce(&sum, 1);
      write_attr(set.id, "checksum", H5T_NATIVE_UINT64, uint64_t(sum));
    }
    TESSERA_REQUIRE_LOCAL(H5Fflush(file.id, H5F_SCOPE_GLOBAL) >= 0, "cannot flush '", tmp_path,
                          "'");
  });
  // Publish: the complete file under its final name, then the pointer to it.
  collectively(world_, [&] {
    if (world_.rank() != 0) return;
    if (launcher_.gone()) {  // killed with its job: a next job may already be starting here
      std::remove(tmp_path.c_str());
      TESSERA_REQUIRE_LOCAL(false, "not publishing the checkpoint of step ", meta.step,
                            ": the launcher ", launcher_.describe(),
                            " is gone, so this run is ending; the checkpoints already in '", dir_,
                            "' are kept");
    }
    fsync_path(tmp_path);
    fs::rename(tmp_path, final_path);
    const std::string latest = dir_ + "/latest";
    {
      std::ofstream out(latest + ".tmp");
      out << checkpoint_name(meta.step) << "\n";
      TESSERA_REQUIRE_LOCAL(out.good(), "cannot write '", latest, ".tmp'");
    }
    fsync_path(latest + ".tmp");
    fs::rename(latest + ".tmp", latest);
    fsync_path(dir_);
    // checkpoint.overwrite: another run's checkpoints go once this run has one of its own.
    for (const std::string& n : replaced_)
      if (n != checkpoint_name(meta.step)) fs::remove(dir_ + "/" + n);
    replaced_.clear();
    // Keep the newest keep_ checkpoints (all finite: save refuses any other).
    const std::vector<std::string> all = checkpoint_files(dir_);
    for (size_t i = 0; i + size_t(keep_) < all.size(); ++i) fs::remove(dir_ + "/" + all[i]);
  });
}

// Every failure of a read is agreed before the next collective call: a rank whose read fails
// (a hyperslab, an attribute, a checksum it computes) says so at the next agreement point
// (agree_or_throw), and every rank raises the same error there, instead of the others waiting
// in a collective it never joins. Test hook: TESSERA_FAULT_INJECT=checkpoint-read-fails-on-
// rank-R makes world rank R's read of the middle tensor fail.
CheckpointMeta Checkpointer::load(const std::string& path,
                                  const std::vector<CheckpointTensor>& tensors) {
  CheckpointMeta meta;
  const std::string r = std::to_string(world_.rank());
  const bool read_fault = fault_injected("checkpoint-read-fails-on-rank-" + r);
  const bool checksum_fault = fault_injected("checkpoint-checksum-differs-on-rank-" + r);
  collectively(world_, [&] {
    H5Handle fapl(parallel_access(world_.raw()), H5Pclose);
    // H5Fopen is collective: every rank opens, then all agree on whether each could.
    H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.id), H5Fclose);
    agree_or_throw(world_, file.id >= 0,
                   cat("cannot open checkpoint '", path, "': not an HDF5 file, or truncated"));
    // The root attributes and the model definition: local reads, agreed before any tensor.
    collectively(world_, [&] {
      const std::string where = "checkpoint '" + path + "'";
      const std::string format = read_string_attr(file.id, "format", where);
      TESSERA_REQUIRE_LOCAL(format == kFormat, "'", path, "' is not a tessera checkpoint (format '",
                            format, "')");
      const int64_t version = read_int_attr(file.id, "version", where);
      TESSERA_REQUIRE_LOCAL(version == kVersion, "checkpoint '", path, "' has version ", version,
                            "; this tessera reads version ", kVersion);
      meta.step = read_int_attr(file.id, "step", where);
      meta.samples = read_int_attr(file.id, "samples", where);
      meta.seed = read_int_attr(file.id, "seed", where);
      meta.deck_json = read_string_attr(file.id, "deck", where);
      meta.layout_json = read_string_attr(file.id, "layout", where);
      if (H5Aexists(file.id, "loss_scale") > 0) {
        meta.loss_scale = read_double_attr(file.id, "loss_scale", where);
        meta.loss_scale_good = read_int_attr(file.id, "loss_scale_good", where);
      }
      // Files written before the root checksum existed have none; every newer one is checked.
      if (H5Aexists(file.id, "meta_checksum") > 0)
        TESSERA_REQUIRE_LOCAL(
            read_string_attr(file.id, "meta_checksum", where) == meta_checksum(meta),
            "checkpoint '", path,
            "': its root attributes (step, samples, seed, "
            "deck, layout) are damaged (checksum mismatch); use an earlier "
            "checkpoint");
      TESSERA_REQUIRE_LOCAL(meta.step >= 0 && meta.samples >= 0, "checkpoint '", path,
                            "' has step ", meta.step, " and samples ", meta.samples,
                            ": damaged; use an earlier checkpoint");
      const std::vector<std::string> routing = require_same_model(path, meta.deck_json, run_.model);
      if (!routing.empty()) {
        std::string what;
        for (const std::string& r : routing) what += (what.empty() ? "" : ", ") + r;
        TESSERA_REQUIRE_LOCAL(run_.checkpoint.allow_routing_change, "checkpoint '", path,
                              "' was trained with another routing (", what,
                              "); resume it with the keys it was trained with, or set "
                              "checkpoint.allow_routing_change = true to change them");
        if (world_.rank() == 0)
          std::printf(
              "warning: checkpoint '%s' was trained with another routing (%s); "
              "continuing as checkpoint.allow_routing_change = true asks\n",
              path.c_str(), what.c_str());
      }
      // Every parameter in the file belongs to this model (a deeper model's extra blocks or an
      // untied head would otherwise be ignored).
      std::vector<std::string> expected;
      for (const CheckpointTensor& ct : tensors)
        if (ct.path.rfind("params/", 0) == 0) expected.push_back(ct.path.substr(7));
      std::sort(expected.begin(), expected.end());
      for (const std::string& name : group_members(file.id, "params"))
        TESSERA_REQUIRE_LOCAL(std::binary_search(expected.begin(), expected.end(), name),
                              "checkpoint '", path, "' holds the parameter '", printable(name),
                              "', which this model does not have: it was written for another "
                              "model definition");
    });

    const std::string where = "checkpoint '" + path + "'";
    for (size_t t = 0; t < tensors.size(); ++t) {
      const CheckpointTensor& ct = tensors[t];
      int64_t sums[2] = {0, 0};
      uint64_t expected = 0;
      // This rank's part (open, shape, read, its share of the checksum), agreed before the
      // sums are reduced.
      collectively(world_, [&] {
        TESSERA_REQUIRE_LOCAL(H5Lexists(file.id, ct.path.c_str(), H5P_DEFAULT) > 0, "checkpoint '",
                              path, "' has no dataset '", ct.path, "'");
        H5Handle set(H5Dopen2(file.id, ct.path.c_str(), H5P_DEFAULT), H5Dclose);
        H5Handle fspace(H5Dget_space(set.id), H5Sclose);
        std::vector<hsize_t> dims(size_t(std::max(0, H5Sget_simple_extent_ndims(fspace.id))));
        H5Sget_simple_extent_dims(fspace.id, dims.data(), nullptr);
        Shape found;
        for (hsize_t d : dims) found.dims[found.ndim++] = int64_t(d);
        TESSERA_REQUIRE_LOCAL(found == ct.global, "checkpoint '", path, "': dataset '", ct.path,
                              "' has shape ", found.str(), " but the model expects ",
                              ct.global.str());
        const auto [h0, h1] = held(ct);
        H5Handle fsel = selection(ct, h0, h1);
        H5Handle mspace = memory_space(h1 - h0);
        const bool read =
            !(read_fault && t == tensors.size() / 2) &&
            H5Dread(set.id, H5T_NATIVE_FLOAT, mspace.id, fsel.id, H5P_DEFAULT, ct.data) >= 0;
        TESSERA_REQUIRE_LOCAL(read, "checkpoint '", path, "': cannot read dataset '", ct.path,
                              "' on rank ", world_.rank(), " (file truncated, or an I/O error)");
        expected = read_uint_attr(set.id, "checksum", where + ", dataset '" + ct.path + "'");
        // The same split as the writer's; every rank read the elements it checks.
        const auto [c0, c1] = responsible(ct);
        sums[1] = count_nonfinite(ct.data + (c0 - h0), c1 - c0);
        if (c1 > c0) sums[0] = int64_t(block_checksum(ct, ct.data + (c0 - h0), c0, c1));
      });
      world_.all_reduce(sums, 2);
      // Each rank compares with the checksum it read: agreed, since only one may see a
      // mismatch (test hook: TESSERA_FAULT_INJECT=checkpoint-checksum-differs-on-rank-R).
      if (checksum_fault && t == tensors.size() / 2) ++expected;
      std::string bad;
      if (uint64_t(sums[0]) != expected)
        bad = cat("checkpoint '", path, "': dataset '", ct.path,
                  "' is damaged (checksum "
                  "mismatch); use an earlier checkpoint");
      else if (sums[1] != 0)
        bad = cat("checkpoint '", path, "': dataset '", ct.path, "' holds ", sums[1],
                  " non-finite values (NaN or Inf): the run that wrote it had diverged; resume "
                  "from an earlier checkpoint");
      agree_or_throw(world_, bad.empty(), bad);
    }
  });
  return meta;
}

}  // namespace tessera
