// One run per directory (doc/checkpoints.md, "One run per directory"): a run holds an
// advisory fcntl lock on `tessera.lock` in its output directory and its checkpoint directory
// for its whole life. The file names the holder (host, PID, Slurm job and restart count,
// start time), so a second run, fresh or resuming, stops before any work with one line naming
// it. A lock file whose holder is gone (the lock is free but the file was not removed) is
// taken over with a warning; so is a lock still held by an earlier run of the same Slurm job
// when this one is a requeue of it (a higher SLURM_RESTART_COUNT: the node of the earlier one
// may have died with its lock still granted by a shared file system).
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace tessera {

// A directory to lock: its path, the deck key the user set it with (for messages) and what it
// is ("output directory").
struct LockedDir {
  std::string path, key, what;
};

class RunLock {
 public:
  // Creates each directory when missing and locks it; rank 0 does the file system work and
  // every rank raises its error (a collective Error). Warnings go to stdout from rank 0.
  RunLock(const std::vector<LockedDir>& dirs, Communicator& world);
  // Removes the lock files, then the directories this lock created if they are still empty
  // (a run refused before it wrote anything leaves the file system as it found it).
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  struct Held {
    std::string dir, file;
    int fd = -1;
    bool created_dir = false;
  };
  void acquire(const LockedDir& d);
  void release();
  std::vector<Held> held_;
};

}  // namespace tessera
