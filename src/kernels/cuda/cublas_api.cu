#include "kernels/cuda/cublas_api.hpp"

#include <dlfcn.h>

#include <string>

#include "core/error.hpp"

namespace tessera::kernels::cuda::detail {
namespace {

template <class F>
void resolve(void* lib, const char* name, F& f, const std::string& path) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  TESSERA_REQUIRE_LOCAL(f != nullptr, "cuBLAS library '", path, "' has no symbol ", name);
}

CublasApi load() {
  const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  std::string path = soname;
  void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string first_error = lib ? "" : dlerror();
#ifdef TESSERA_CUBLAS_LIBRARY
  if (!lib) {
    path = TESSERA_CUBLAS_LIBRARY;
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
#endif
  TESSERA_REQUIRE_LOCAL(lib != nullptr, "cannot load cuBLAS (", soname, "), which a CUDA device ",
                        "needs: ", first_error, "; put CUDA's library directory on the loader's ",
                        "path (LD_LIBRARY_PATH)");
  CublasApi api{};
  resolve(lib, "cublasCreate_v2", api.create, path);
  resolve(lib, "cublasDestroy_v2", api.destroy, path);
  resolve(lib, "cublasSetStream_v2", api.set_stream, path);
  resolve(lib, "cublasSetMathMode", api.set_math_mode, path);
  resolve(lib, "cublasSetWorkspace_v2", api.set_workspace, path);
  resolve(lib, "cublasGemmEx_64", api.gemm_ex_64, path);
  resolve(lib, "cublasGetStatusName", api.status_name, path);
  resolve(lib, "cublasGetStatusString", api.status_string, path);
  return api;  // the library stays loaded for the life of the process
}

}  // namespace

const CublasApi& cublas() {
  static const CublasApi api = load();
  return api;
}

}  // namespace tessera::kernels::cuda::detail
