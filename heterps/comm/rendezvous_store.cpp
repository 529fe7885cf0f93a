#include "heterps/comm/rendezvous_store.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "common/error.hpp"

namespace gpubox::comm {
namespace {

constexpr std::size_t kMaxKeyLength = 200;

void check_key(const std::string& key) {
  GPUBOX_EXPECTS(!key.empty() && key.size() <= kMaxKeyLength, "rendezvous key '", key,
                 "' must hold 1 to ", kMaxKeyLength, " characters");
  GPUBOX_EXPECTS(key.front() != '.', "rendezvous key '", key, "' must not start with '.'");
  for (char ch : key) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '/' || ch == '_' || ch == '-' || ch == '.';
    GPUBOX_EXPECTS(ok, "rendezvous key '", key, "' holds a character outside [A-Za-z0-9/_.-]");
  }
}

// One file per key; "/" in a key becomes "@" so every key is one file of the folder, and the
// temporary files (".tmp...") cannot collide with a key (keys never start with ".").
std::string file_name(const std::string& key) {
  std::string name = key;
  std::replace(name.begin(), name.end(), '/', '@');
  return name;
}

class FileStore final : public RendezvousStore {
 public:
  explicit FileStore(std::filesystem::path dir) : dir_(std::move(dir)) {
    std::error_code error;
    std::filesystem::create_directories(dir_, error);
    GPUBOX_EXPECTS(!error && std::filesystem::is_directory(dir_), "rendezvous folder '",
                   dir_.string(), "' cannot be made: ", error.message());
  }

  void set(const std::string& key, const std::vector<char>& value) override {
    const std::filesystem::path tmp = write_temp(key, value);
    std::error_code error;
    std::filesystem::rename(tmp, dir_ / file_name(key), error);
    if (error) {
      std::filesystem::remove(tmp, error);
      GPUBOX_FAIL("rendezvous: cannot publish key '", key, "' in ", describe(), ": ",
                  error.message());
    }
  }

  // link(2) of the whole value to the key's name: made by one caller only, atomically.
  bool set_once(const std::string& key, const std::vector<char>& value) override {
    const std::filesystem::path tmp = write_temp(key, value);
    const int made = ::link(tmp.c_str(), (dir_ / file_name(key)).c_str());
    const int error = errno;
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    if (made == 0) return true;
    GPUBOX_EXPECTS(error == EEXIST, "rendezvous: cannot publish key '", key, "' in ", describe(),
                   ": ", std::strerror(error));
    return false;
  }

  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    const std::filesystem::path path = dir_ / file_name(key);
    std::ifstream in(path, std::ios::binary);
    GPUBOX_EXPECTS(in.good(), "rendezvous: cannot read key '", key, "' (", path.string(), ")");
    std::vector<char> value((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    GPUBOX_EXPECTS(value.size() <= kMaxValueBytes, "rendezvous value of '", key, "' has ",
                   value.size(), " bytes, more than ", kMaxValueBytes);
    return value;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    for (const auto& key : keys) check_key(key);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto sleep = std::chrono::milliseconds(1);
    for (;;) {
      std::vector<std::string> missing;
      for (const auto& key : keys) {
        if (!std::filesystem::exists(dir_ / file_name(key))) missing.push_back(key);
      }
      if (missing.empty()) return;
      if (std::chrono::steady_clock::now() >= deadline) {
        std::string names;
        for (const auto& key : missing) names += (names.empty() ? "" : ", ") + key;
        GPUBOX_FAIL("rendezvous: waited ", timeout.count(), " ms in ", describe(), " for ",
                    missing.size(), " of ", keys.size(), " keys that were never set: ", names);
      }
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::milliseconds(50));
    }
  }

  std::string describe() const override { return "file://" + dir_.string(); }

 private:
  // `value` in a temporary file of the folder, whole, for a rename or link to the key's name.
  std::filesystem::path write_temp(const std::string& key, const std::vector<char>& value) const {
    check_key(key);
    GPUBOX_EXPECTS(value.size() <= kMaxValueBytes, "rendezvous value of '", key, "' has ",
                   value.size(), " bytes, more than ", kMaxValueBytes);
    static std::atomic<uint64_t> sequence{0};
    const std::filesystem::path tmp =
        dir_ / (".tmp." + file_name(key) + "." + std::to_string(::getpid()) + "." +
                std::to_string(sequence.fetch_add(1)));
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.flush();
    GPUBOX_EXPECTS(out.good(), "rendezvous: cannot write '", tmp.string(), "'");
    return tmp;
  }

  const std::filesystem::path dir_;
};

}  // namespace

std::unique_ptr<RendezvousStore> open_rendezvous_store(const std::string& url) {
  constexpr const char* kFile = "file://";
  if (url.rfind(kFile, 0) == 0) {
    const std::string dir = url.substr(std::strlen(kFile));
    GPUBOX_EXPECTS(!dir.empty() && dir.front() == '/', "rendezvous store '", url,
                   "': a file store needs an absolute folder (file:///shared/dir)");
    return std::make_unique<FileStore>(dir);
  }
  GPUBOX_FAIL("rendezvous store '", url,
              "' is not understood: GPUBOX_RENDEZVOUS takes file:///shared/dir");
}

}  // namespace gpubox::comm
