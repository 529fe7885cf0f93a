#include "common/temp_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>

namespace gpubox {

TempFile create_temp_beside(const std::string& target) {
  std::random_device device;
  std::mt19937_64 draw(
      (uint64_t{device()} << 32) ^ device() ^
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  TempFile file;
  for (int attempt = 0; attempt < 16; ++attempt) {
    char suffix[48];
    std::snprintf(suffix, sizeof(suffix), ".tmp.%ld.%016llx", static_cast<long>(::getpid()),
                  static_cast<unsigned long long>(draw()));
    file.path = target + suffix;
    file.fd = ::open(file.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (file.fd >= 0 || errno != EEXIST) return file;
  }
  return file;
}

}  // namespace gpubox
