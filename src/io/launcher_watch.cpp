#include "io/launcher_watch.hpp"

#include <unistd.h>

#include <fstream>

#include "core/error.hpp"

namespace tessera {

LauncherWatch::LauncherWatch() {
  const int parent = int(getppid());
  std::ifstream in("/proc/" + std::to_string(parent) + "/comm");
  std::string name;
  std::getline(in, name);
  for (const char* launcher : {"mpirun", "mpiexec", "orterun", "orted", "prterun", "prted", "prte",
                               "slurmstepd", "hydra_pmi_proxy"})
    if (name == launcher) {
      pid_ = parent;
      name_ = name;
    }
}

bool LauncherWatch::gone() const {
  return pid_ != 0 && int(getppid()) != pid_;
}

std::string LauncherWatch::describe() const {
  return cat(name_, " (pid ", pid_, ")");
}

}  // namespace tessera
