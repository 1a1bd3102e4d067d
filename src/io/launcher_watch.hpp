// Orphaned ranks (doc/checkpoints.md, "When the launcher dies"): when mpirun (or srun's
// slurmstepd) is killed, its ranks live on for a moment (Open MPI's about 2.5 s) before they
// notice. A rank that publishes a checkpoint then would be a second writer beside the next job
// a scheduler starts at once, so the publisher asks first whether its launcher still exists.
#pragma once

#include <string>

namespace tessera {

class LauncherWatch {
 public:
  // Records this process's parent when it is a launcher (mpirun, mpiexec, orterun, orted,
  // prterun, prted, slurmstepd, hydra_pmi_proxy); a process started otherwise (a shell, nohup)
  // is never called orphaned, since its parent may end on purpose.
  LauncherWatch();
  // True when the launcher recorded is no longer this process's parent (it died, and the
  // process was adopted).
  bool gone() const;
  // "mpirun (pid 123)" for messages.
  std::string describe() const;

 private:
  int pid_ = 0;
  std::string name_;
};

}  // namespace tessera
