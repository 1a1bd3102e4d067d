#include "io/run_lock.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <sstream>

#include "comm/agree.hpp"
#include "core/error.hpp"
#include "io/checkpoint_checks.hpp"

namespace fs = std::filesystem;

namespace tessera {
namespace {

constexpr const char* kLockName = "tessera.lock";

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// This process as a holder: "host=H pid=P job=J restart=R started=T" (job and restart empty
// outside Slurm).
std::string holder_line() {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  char started[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return cat("host=", host, " pid=", getpid(), " job=", env("SLURM_JOB_ID"),
             " restart=", env("SLURM_RESTART_COUNT"), " started=", started, "\n");
}

std::map<std::string, std::string> parse_holder(const std::string& line) {
  std::map<std::string, std::string> h;
  std::istringstream in(line);
  std::string word;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq != std::string::npos) h[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return h;
}

// "host h, pid 12, Slurm job 77 (restart 0), started T", or the file's text when it is not a
// holder line.
std::string describe(const std::string& line) {
  auto h = parse_holder(line);
  if (h["host"].empty() || h["pid"].empty()) return cat("\"", printable(line, 60), "\"");
  std::string s = cat("host ", printable(h["host"], 60), ", pid ", printable(h["pid"], 12));
  if (!h["job"].empty())
    s += cat(", Slurm job ", printable(h["job"], 20), " (restart ",
             h["restart"].empty() ? "0" : printable(h["restart"], 8), ")");
  return s + cat(", started ", printable(h["started"], 30));
}

std::string read_fd(int fd) {
  std::string text(512, '\0');
  const ssize_t n = pread(fd, text.data(), text.size(), 0);
  text.resize(n > 0 ? size_t(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

void write_fd(int fd, const std::string& text, const std::string& file) {
  const bool ok = ftruncate(fd, 0) == 0 &&
                  pwrite(fd, text.data(), text.size(), 0) == ssize_t(text.size()) && fsync(fd) == 0;
  TESSERA_REQUIRE_LOCAL(ok, "cannot write the lock file '", printable(file),
                        "': ", std::strerror(errno));
}

bool lock(int fd) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  return fcntl(fd, F_SETLK, &fl) == 0;
}

// The file at path is still the inode fd has open (a holder that ended may have removed it
// between our open and our lock).
bool same_file(int fd, const std::string& path) {
  struct stat a = {}, b = {};
  return fstat(fd, &a) == 0 && stat(path.c_str(), &b) == 0 && a.st_ino == b.st_ino &&
         a.st_dev == b.st_dev;
}

// A requeued Slurm job (same job id, a higher restart count) may take over the lock an
// earlier run of it still holds.
bool requeue_of(const std::string& holder) {
  auto h = parse_holder(holder);
  const std::string job = env("SLURM_JOB_ID");
  return !job.empty() && h["job"] == job &&
         std::atol(env("SLURM_RESTART_COUNT").c_str()) > std::atol(h["restart"].c_str());
}

}  // namespace

RunLock::RunLock(const std::vector<LockedDir>& dirs, Communicator& world) {
  try {
    collectively(world, [&] {
      if (world.rank() != 0) return;
      for (const LockedDir& d : dirs) acquire(d);
    });
  } catch (...) {  // the destructor of a half-made lock does not run: undo what was made
    release();
    throw;
  }
}

void RunLock::acquire(const LockedDir& d) {
  Held h;
  h.dir = d.path;
  h.file = (fs::path(d.path) / kLockName).string();
  std::error_code ec;
  const bool not_dir = fs::exists(d.path, ec) && !fs::is_directory(d.path, ec);
  if (!not_dir) h.created_dir = fs::create_directories(d.path, ec);
  TESSERA_REQUIRE_LOCAL(
      !not_dir && !ec, "cannot create the ", d.what, " '", printable(d.path), "' (", d.key,
      "): ", not_dir ? std::string("it exists and is not a directory") : ec.message(),
      "; choose another ", d.key);
  // One lock per directory, however it is spelled (checkpoint.dir = output.dir): a second
  // descriptor of the same file would release this process's lock when closed.
  for (const Held& other : held_)
    if (fs::equivalent(other.dir, d.path, ec)) return;
  held_.push_back(h);  // from here on the destructor removes what this lock made
  Held& me = held_.back();
  const std::string mine = holder_line();
  for (int attempt = 0; attempt < 5; ++attempt) {
    me.fd = open(me.file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    TESSERA_REQUIRE_LOCAL(me.fd >= 0, "cannot write in the ", d.what, " '", printable(d.path),
                          "' (", d.key, "): ", std::strerror(errno), "; choose a writable ", d.key);
    if (lock(me.fd)) {
      if (!same_file(me.fd, me.file)) {  // removed by a holder that just ended: again
        close(me.fd);
        me.fd = -1;
        continue;
      }
      const std::string before = read_fd(me.fd);
      if (!before.empty() && requeue_of(before))
        std::printf(
            "warning: %s '%s' was locked by an earlier run of this Slurm job (%s), which is "
            "gone; this run is its requeue (restart %s) and takes the lock over\n",
            d.key.c_str(), printable(d.path).c_str(), describe(before).c_str(),
            env("SLURM_RESTART_COUNT").c_str());
      else if (!before.empty())
        std::printf(
            "warning: %s '%s' was locked by a run that is gone (%s) and did not remove its "
            "lock file; taking it over: check that run's checkpoints and logs\n",
            d.key.c_str(), printable(d.path).c_str(), describe(before).c_str());
      write_fd(me.fd, mine, me.file);
      return;
    }
    const int err = errno;
    const std::string holder = read_fd(me.fd);
    if (err != EACCES && err != EAGAIN) {
      // No lock support (Lustre mounted without -o flock, some NFS setups): say so and run.
      std::printf(
          "warning: the file system of %s '%s' does not support locks (%s): this run cannot "
          "stop another from using the directory at the same time\n",
          d.key.c_str(), printable(d.path).c_str(), std::strerror(err));
      write_fd(me.fd, mine, me.file);
      return;
    }
    close(me.fd);
    me.fd = -1;
    TESSERA_REQUIRE_LOCAL(requeue_of(holder), d.key, " '", printable(d.path),
                          "' is in use by another run (", describe(holder), "; lock file '",
                          printable(me.file), "'): wait for it to end, or choose another ", d.key);
    // A requeue of this job: a fresh lock file, locked, renamed over the held one.
    const std::string fresh = cat(me.file, ".", getpid());
    me.fd = open(fresh.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    TESSERA_REQUIRE_LOCAL(me.fd >= 0 && lock(me.fd), "cannot lock '", printable(fresh),
                          "': ", std::strerror(errno));
    write_fd(me.fd, mine, fresh);
    TESSERA_REQUIRE_LOCAL(std::rename(fresh.c_str(), me.file.c_str()) == 0, "cannot rename '",
                          printable(fresh), "': ", std::strerror(errno));
    std::printf(
        "warning: %s '%s' is still locked by an earlier run of this Slurm job (%s); this run "
        "is its requeue (restart %s) and takes the lock over\n",
        d.key.c_str(), printable(d.path).c_str(), describe(holder).c_str(),
        env("SLURM_RESTART_COUNT").c_str());
    return;
  }
  TESSERA_REQUIRE_LOCAL(false, "cannot lock '", printable(me.file),
                        "': it keeps being replaced by another run; is one starting there?");
}

RunLock::~RunLock() {
  release();
}

void RunLock::release() {
  for (auto it = held_.rbegin(); it != held_.rend(); ++it) {
    if (it->fd >= 0) {
      unlink(it->file.c_str());  // while locked: a run waiting on it retries with a new file
      close(it->fd);
    }
    std::error_code ec;
    if (it->created_dir && fs::is_empty(it->dir, ec)) fs::remove(it->dir, ec);
  }
  held_.clear();
}

}  // namespace tessera
