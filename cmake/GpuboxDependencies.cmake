# Third-party libraries, all from Debian's packages (scripts/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(gflags REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(Boost 1.74 REQUIRED)            # Asio (header-only) for gpubox_server and its client
find_package(RocksDB REQUIRED)
# The Python extension (python/) is a shared object, and Debian's librocksdb.a is not built
# with -fPIC: a build that may make the extension links RocksDB's shared library instead.
if(NOT GPUBOX_PYTHON STREQUAL "OFF" AND TARGET RocksDB::rocksdb-shared)
  set(GPUBOX_ROCKSDB RocksDB::rocksdb-shared)
else()
  set(GPUBOX_ROCKSDB RocksDB::rocksdb)
endif()
find_package(OpenSSL 3 REQUIRED COMPONENTS Crypto)  # HMAC-SHA256 and nonces of gpubox_server's AUTH
if(GPUBOX_BACKEND STREQUAL "cpu")
  # Gloo (libgloo-dev): the collectives between trainer processes on the cpu backend (its CMake
  # package file gives the imported target `gloo`).
  find_package(Gloo REQUIRED)
endif()
if(GPUBOX_BACKEND STREQUAL "cpu")
  # oneDNN (libdnnl-dev): the dense net's GEMMs with fused bias/ReLU and bf16 on the cpu backend.
  # Found by hand rather than through dnnl-config.cmake, which also wants OpenCL (Debian builds
  # it with the OpenCL GPU runtime; GPUBox uses the CPU engine only).
  find_path(GPUBOX_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp REQUIRED)
  find_library(GPUBOX_DNNL_LIBRARY dnnl REQUIRED)
  add_library(gpubox_dnnl INTERFACE)
  target_include_directories(gpubox_dnnl SYSTEM INTERFACE ${GPUBOX_DNNL_INCLUDE_DIR})
  target_link_libraries(gpubox_dnnl INTERFACE ${GPUBOX_DNNL_LIBRARY})
endif()
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
