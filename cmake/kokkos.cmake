# Kokkos 4.6.01, the portable kernel layer (doc/kokkos.md). Defines the target Kokkos::kokkos.
#
#   1. An installed Kokkos is used when it is 4.6 or newer and has what this build needs: the
#      OpenMP space, and the CUDA space compiled as CMake's CUDA language when TESSERA_CUDA is
#      on. Point CMake at one with -DKokkos_ROOT=<prefix>.
#   2. Otherwise the build makes its own, once per build tree, at configure time: from
#      TESSERA_MIRROR (a directory holding kokkos-4.6.01.tar.gz, checksum verified; taken from
#      the environment variable of that name when not set on the command line), else downloaded
#      from the official release. Serial and OpenMP always, CUDA (one architecture,
#      TESSERA_CUDA_ARCH) with TESSERA_CUDA. CUDA 13 changed three runtime calls that Kokkos
#      4.6.01 uses; cmake/kokkos-4.6.01-cuda13.patch adapts them and is applied only then.
#      cmake/kokkos-4.6.01-unity.patch, always applied, compiles Kokkos core's sources as two
#      translation units (a unity build; doc/kokkos.md, "Build time").
#
# Debian's libtrilinos-kokkos-dev (Serial only, broken package files) is never used: an
# installed Kokkos older than 4.6 is ignored.
set(TESSERA_KOKKOS_VERSION 4.6.01)
set(TESSERA_KOKKOS_SHA256 b9d70e4653b87a06dbb48d63291bf248058c7c7db4bd91979676ad5609bb1a3a)
set(TESSERA_KOKKOS_URL
    https://github.com/kokkos/kokkos/releases/download/${TESSERA_KOKKOS_VERSION}/kokkos-${TESSERA_KOKKOS_VERSION}.tar.gz)
set(TESSERA_MIRROR "$ENV{TESSERA_MIRROR}" CACHE PATH
    "Directory holding source tarballs of dependencies (kokkos-${TESSERA_KOKKOS_VERSION}.tar.gz)")
# A build tree configured once without it (the download then failed) takes the environment's
# when it is set later, as the download error advises.
if(NOT TESSERA_MIRROR AND NOT "$ENV{TESSERA_MIRROR}" STREQUAL "")
  set_property(CACHE TESSERA_MIRROR PROPERTY VALUE "$ENV{TESSERA_MIRROR}")
  set(TESSERA_MIRROR "$ENV{TESSERA_MIRROR}")
endif()

# Whether an installed Kokkos (already found) fits this build.
function(tessera_kokkos_fits out)
  set(fits TRUE)
  if(NOT "OPENMP" IN_LIST Kokkos_DEVICES)
    set(fits FALSE)
  endif()
  if(TESSERA_CUDA AND NOT ("CUDA" IN_LIST Kokkos_DEVICES AND Kokkos_COMPILE_LANGUAGE STREQUAL CUDA))
    set(fits FALSE)
  endif()
  if(NOT TESSERA_CUDA AND "CUDA" IN_LIST Kokkos_DEVICES)
    set(fits FALSE)
  endif()
  set(${out} ${fits} PARENT_SCOPE)
endfunction()

function(tessera_run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "Kokkos: ${what} failed (${rc}):\n${log}")
  endif()
endfunction()

# Builds and installs Kokkos into the build tree; sets TESSERA_KOKKOS_PREFIX.
function(tessera_build_kokkos)
  set(root ${CMAKE_BINARY_DIR}/_deps/kokkos)
  set(prefix ${root}/install)
  set(key "${TESSERA_KOKKOS_VERSION};${CMAKE_CXX_COMPILER};${TESSERA_CUDA};${TESSERA_CUDA_ARCH};${CMAKE_CUDA_COMPILER};lean;unity")
  set(stamp ${prefix}/tessera-build-key)
  set(TESSERA_KOKKOS_PREFIX ${prefix} CACHE INTERNAL "Kokkos built by this build tree")
  if(EXISTS ${stamp})
    file(READ ${stamp} old)
    if(old STREQUAL key)
      return()
    endif()
  endif()
  file(REMOVE_RECURSE ${root})
  file(MAKE_DIRECTORY ${root})

  set(tarball ${TESSERA_MIRROR}/kokkos-${TESSERA_KOKKOS_VERSION}.tar.gz)
  if(TESSERA_MIRROR AND EXISTS ${tarball})
    file(SHA256 ${tarball} sum)
    if(NOT sum STREQUAL TESSERA_KOKKOS_SHA256)
      message(FATAL_ERROR "Kokkos: ${tarball} has SHA-256 ${sum}, expected "
                          "${TESSERA_KOKKOS_SHA256} (a damaged or different release)")
    endif()
    message(NOTICE "Kokkos: building ${TESSERA_KOKKOS_VERSION} from ${tarball}, once for this "
                   "build tree (a few minutes on a small machine)")
  else()
    set(tarball ${root}/kokkos-${TESSERA_KOKKOS_VERSION}.tar.gz)
    message(NOTICE "Kokkos: downloading ${TESSERA_KOKKOS_URL} and building it, once for this "
                   "build tree (a few minutes on a small machine)")
    file(DOWNLOAD ${TESSERA_KOKKOS_URL} ${tarball} STATUS st TLS_VERIFY ON)
    list(GET st 0 rc)
    if(NOT rc EQUAL 0)
      list(GET st 1 why)
      message(FATAL_ERROR
              "Kokkos ${TESSERA_KOKKOS_VERSION} is needed and could not be downloaded (${why}). "
              "Without internet access, put kokkos-${TESSERA_KOKKOS_VERSION}.tar.gz in a directory "
              "and set TESSERA_MIRROR to it (environment or -DTESSERA_MIRROR=), or install "
              "Kokkos >= 4.6 with OpenMP and pass -DKokkos_ROOT=<prefix>.")
    endif()
  endif()
  file(ARCHIVE_EXTRACT INPUT ${tarball} DESTINATION ${root})
  set(src ${root}/kokkos-${TESSERA_KOKKOS_VERSION})

  set(args -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=${prefix}
           -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER} -DCMAKE_CXX_STANDARD=17
           -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON
           -DKokkos_ENABLE_TESTS=OFF -DKokkos_ENABLE_EXAMPLES=OFF -DKokkos_ENABLE_BENCHMARKS=OFF
           # Not used by tessera, and a fifth of the build (doc/kokkos.md, "Build time"): the
           # code deprecated in Kokkos 4 (with the tasking sources) and the mdspan-based View.
           -DKokkos_ENABLE_DEPRECATED_CODE_4=OFF -DKokkos_ENABLE_DEPRECATION_WARNINGS=OFF
           -DKokkos_ENABLE_IMPL_MDSPAN=OFF)
  # Kokkos core as two unity translation units: a quarter of the CPU time of its 18 sources
  # (doc/kokkos.md, "Build time").
  tessera_run("patching for a unity build" patch -p1 -d ${src}
              -i ${CMAKE_SOURCE_DIR}/cmake/kokkos-${TESSERA_KOKKOS_VERSION}-unity.patch)
  if(TESSERA_CUDA)
    if(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 13)
      tessera_run("patching for CUDA 13" patch -p1 -d ${src}
                  -i ${CMAKE_SOURCE_DIR}/cmake/kokkos-${TESSERA_KOKKOS_VERSION}-cuda13.patch)
    endif()
    list(APPEND args -DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_COMPILE_AS_CMAKE_LANGUAGE=ON
                     -DCMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER} -DCMAKE_CUDA_STANDARD=17
                     -DKokkos_ARCH_${TESSERA_KOKKOS_ARCH}=ON)
  endif()
  cmake_host_system_information(RESULT ncpu QUERY NUMBER_OF_LOGICAL_CORES)
  string(TIMESTAMP t0 "%s")
  tessera_run("configure" ${CMAKE_COMMAND} -S ${src} -B ${root}/build -G ${CMAKE_GENERATOR} ${args})
  tessera_run("build" ${CMAKE_COMMAND} --build ${root}/build --target install --parallel ${ncpu})
  string(TIMESTAMP t1 "%s")
  math(EXPR dt "${t1} - ${t0}")
  message(NOTICE "Kokkos: built in ${dt} s")
  file(REMOVE_RECURSE ${root}/build)
  file(WRITE ${stamp} "${key}")
endfunction()

# The CUDA architecture Kokkos compiles for (one: Kokkos builds for a single GPU architecture).
if(TESSERA_CUDA)
  set(_kokkos_arch_80 AMPERE80)
  set(_kokkos_arch_86 AMPERE86)
  set(_kokkos_arch_89 ADA89)
  set(_kokkos_arch_90 HOPPER90)
  set(_kokkos_arch_100 BLACKWELL100)
  set(_kokkos_arch_120 BLACKWELL120)
  set(TESSERA_KOKKOS_ARCH ${_kokkos_arch_${TESSERA_CUDA_ARCH}})
  if(NOT TESSERA_KOKKOS_ARCH)
    message(FATAL_ERROR "TESSERA_CUDA_ARCH=${TESSERA_CUDA_ARCH}: not one of 80, 86, 89, 90, 100, 120")
  endif()
endif()

option(TESSERA_BUILD_KOKKOS "Build Kokkos ${TESSERA_KOKKOS_VERSION} even if one is installed" OFF)
if(NOT TESSERA_BUILD_KOKKOS AND NOT TESSERA_KOKKOS_PREFIX)
  find_package(Kokkos 4.6 CONFIG QUIET)
endif()
if(Kokkos_FOUND AND NOT TESSERA_KOKKOS_PREFIX)
  tessera_kokkos_fits(_fits)
  if(NOT _fits)
    message(FATAL_ERROR "Kokkos: the installed ${Kokkos_VERSION} (${Kokkos_DIR}, devices "
                        "${Kokkos_DEVICES}) lacks what this build needs (OpenMP; with CUDA, the "
                        "CUDA space compiled as CMake's CUDA language). Pass "
                        "-DTESSERA_BUILD_KOKKOS=ON to build ${TESSERA_KOKKOS_VERSION} instead.")
  endif()
  message(STATUS "Kokkos: using the installed ${Kokkos_VERSION} (${Kokkos_DIR}), devices ${Kokkos_DEVICES}")
else()
  tessera_build_kokkos()
  find_package(Kokkos ${TESSERA_KOKKOS_VERSION} CONFIG REQUIRED PATHS ${TESSERA_KOKKOS_PREFIX}
               NO_DEFAULT_PATH)
  message(STATUS "Kokkos: ${Kokkos_VERSION} from ${TESSERA_KOKKOS_PREFIX}, devices ${Kokkos_DEVICES}")
endif()

# Kokkos's CUDA space links the driver library (libcuda) for three calls; that dependency would
# stop every executable of a CUDA build from starting on a machine without the NVIDIA driver.
# tessera_cuda_driver (src/kernels/kokkos/cuda_driver.cpp) resolves them at run time instead; it
# takes the driver's place in Kokkos's link interface, so it follows Kokkos on the link line.
if(TARGET Kokkos::CUDA)
  add_library(tessera_cuda_driver STATIC ${CMAKE_SOURCE_DIR}/src/kernels/kokkos/cuda_driver.cpp)
  target_link_libraries(tessera_cuda_driver PRIVATE ${CMAKE_DL_LIBS})
  get_target_property(_kokkos_cuda_libs Kokkos::CUDA INTERFACE_LINK_LIBRARIES)
  list(TRANSFORM _kokkos_cuda_libs REPLACE "^CUDA::cuda_driver$" tessera_cuda_driver)
  set_target_properties(Kokkos::CUDA PROPERTIES INTERFACE_LINK_LIBRARIES "${_kokkos_cuda_libs}")
endif()
