# Third-party libraries, all from Debian's packages (scripts/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(gflags REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(Boost 1.74 REQUIRED)            # Asio (header-only) for gpubox_server and its client
find_package(RocksDB REQUIRED)
find_package(BLAS REQUIRED)                  # OpenBLAS: dense GEMMs on the cpu backend
find_path(GPUBOX_OPENBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu/openblas-pthread
          x86_64-linux-gnu/openblas64-pthread REQUIRED)
find_path(GPUBOX_XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(GPUBOX_XXHASH_LIBRARY xxhash REQUIRED)
add_library(gpubox_xxhash INTERFACE)
target_include_directories(gpubox_xxhash SYSTEM INTERFACE ${GPUBOX_XXHASH_INCLUDE_DIR})
target_link_libraries(gpubox_xxhash INTERFACE ${GPUBOX_XXHASH_LIBRARY})
if(GPUBOX_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(GPUBOX_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
  find_package(absl REQUIRED)                # the peer in gpubox_bench hashtable (flat_hash_map)
endif()
