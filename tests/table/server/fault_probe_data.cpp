// gpubox_fault_probe's probes of issue #30's data items, through the real client: a SAVE racing
// a folder swapped for a link, a part file larger than its MANIFEST, row creation at the memory
// limit, and adds whose results would not be finite. Each returns "held: ..." or "failed: ...".
#include "tests/table/server/fault_probe_data.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "table/server/ps_protocol.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/sparse_row/optimizer.hpp"
#include "tests/common/folder_bytes.hpp"

namespace gpubox::table::server {
namespace {

namespace fs = std::filesystem;
using gpubox::testing::folder_tree;
using Flags = std::map<std::string, std::string>;

std::string flag(const Flags& flags, const std::string& name) {
  auto it = flags.find(name);
  return it == flags.end() ? std::string() : it->second;
}

std::string held(const std::string& d) { return "held: " + d; }
std::string failed(const std::string& d) { return "failed: " + d; }

// A client of the probed server, with what scripts/fault_check.sh starts servers with.
StatusOr<std::unique_ptr<RemoteHostTier>> client_of(const Flags& flags) {
  RemoteHostTierOptions o;
  o.endpoints = flag(flags, "endpoint");
  o.config.optimizer.kind = SparseOptimizerKind::kAdagrad;
  o.config.mf_dim = 4;
  o.auth_token = flag(flags, "token");
  o.deadline_s = 10.0;
  o.connections_per_endpoint = 1;  // one request per call: each refused or applied whole
  return RemoteHostTier::connect(o);
}

// 30.1: SAVE/LOAD of "d/m" while another thread keeps exchanging data_dir/d with a link to a
// folder outside that holds an older save and a stale staging folder.
std::string save_race(const Flags& flags) {
  const fs::path data = flag(flags, "data_dir");
  const fs::path outside = data.parent_path() / "outside_race";
  fs::create_directories(data / "d");
  fs::create_directories(outside / "m");
  fs::create_directories(outside / "m.tmp");
  std::ofstream(outside / "m" / "MANIFEST") << "an older save outside data_dir";
  std::ofstream(outside / "m.tmp" / "keep") << "a stale staging folder outside data_dir";
  std::error_code ec;
  fs::create_symlink(outside, data / "d_link", ec);
  const auto before = folder_tree(outside);
  auto client = client_of(flags);
  if (!client.ok()) return failed(client.status().to_string());
  std::vector<uint64_t> keys{1, 2, 3};
  std::vector<float> rows(keys.size() * (*client)->layout().stride());
  if (!(*client)->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr).ok()) {
    return failed("PULL refused");
  }
  std::atomic<bool> stop{false};
  std::atomic<int> swaps{0};
  std::thread swapper([&] {
    const std::string a = (data / "d").string(), b = (data / "d_link").string();
    for (int i = 0; !stop.load(); ++i) {
      if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) ++swaps;
      // d is a link after an even swap, the folder after an odd one: a save of a server of
      // 2 shards (fault_check.sh starts one for this probe) takes a few ms, so some run whole
      // in the folder state and others are cut by a swap at any step.
      std::this_thread::sleep_for(std::chrono::microseconds(i % 2 ? 20000 : 2000));
    }
  });
  int saved = 0, tries = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (; tries < 500 && std::chrono::steady_clock::now() < until; ++tries) {
    if ((*client)->save("d/m", SaveKind::kBase).ok()) ++saved;
    (void)(*client)->load("d/m");
  }
  stop.store(true);
  swapper.join();
  const std::string d = std::to_string(tries) + " SAVE+LOADs of d/m raced " +
                        std::to_string(swaps.load()) + " swaps of d with a link out (" +
                        std::to_string(saved) + " saves succeeded)";
  if (folder_tree(outside) != before) {
    return failed(d + ": something outside was written or removed");
  }
  return held(d + "; nothing outside created, replaced or removed");
}

long peak_rss_kb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

// 30.4: a save whose part-0 was grown (sparse) to 4 GiB under its MANIFEST: LOAD is refused at
// once, naming the sizes, and the server's peak memory does not grow by the file.
std::string big_part(const Flags& flags) {
  const fs::path data = flag(flags, "data_dir");
  const pid_t pid = static_cast<pid_t>(std::atol(flag(flags, "pid").c_str()));
  auto client = client_of(flags);
  if (!client.ok()) return failed(client.status().to_string());
  std::vector<uint64_t> keys{11, 12, 13};
  std::vector<float> rows(keys.size() * (*client)->layout().stride());
  if (!(*client)->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr).ok() ||
      !(*client)->save("big", SaveKind::kBase).ok()) {
    return failed("PULL or SAVE refused");
  }
  constexpr off_t kBig = off_t{4} << 30;
  if (::truncate((data / "big" / "part-0").c_str(), kBig) != 0) return failed("truncate failed");
  const long rss_before = peak_rss_kb(pid);
  const auto start = std::chrono::steady_clock::now();
  const Status st = (*client)->load("big");
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const long grown_mb = (peak_rss_kb(pid) - rss_before) / 1024;
  fs::remove_all(data / "big");
  const std::string d =
      "LOAD of a 4 GiB part-0 its MANIFEST says is small: " + st.to_string().substr(0, 90) +
      "... in " + std::to_string(took) + " s, server peak memory +" + std::to_string(grown_mb) +
      " MiB";
  if (st.ok() || st.message().find("more than the") == std::string::npos || took > 5.0 ||
      grown_mb > 256) {
    return failed(d);
  }
  return held(d);
}

// 30.5: PULLs of new keys on a server started with a small --memory_mb stop with a clear error;
// rows it holds are still served.
std::string memory_limit(const Flags& flags) {
  auto client = client_of(flags);
  if (!client.ok()) return failed(client.status().to_string());
  const std::size_t stride = (*client)->layout().stride();
  constexpr std::size_t kBatch = 4096;
  std::vector<uint64_t> keys(kBatch);
  std::vector<float> rows(kBatch * stride);
  Status st;
  uint64_t next = 1;
  int batches = 0;
  for (; batches < 2000 && st.ok(); ++batches) {
    for (auto& k : keys) k = next++;
    st = (*client)->pull(keys.data(), nullptr, kBatch, rows.data(), nullptr);
  }
  for (std::size_t i = 0; i < kBatch; ++i) keys[i] = i + 1;
  const Status old_keys = (*client)->pull(keys.data(), nullptr, kBatch, rows.data(), nullptr);
  auto stats = (*client)->stats();
  const std::string rows_held = stats.ok() ? std::to_string(stats->rows_in_memory) : "?";
  const std::string mem = stats.ok() ? std::to_string(stats->memory_bytes >> 20) : "?";
  if (st.ok() || st.message().find("server memory limit") == std::string::npos) {
    return failed(std::to_string(batches) + " batches of new keys: " + st.to_string());
  }
  if (!old_keys.ok()) return failed("rows it holds no longer served: " + old_keys.to_string());
  return held("new keys refused after " + rows_held + " rows (" + mem +
              " MiB): \"server memory limit ...\"; rows it holds still served");
}

// 30.6: a DENSE add of 3e38 + 3e38 and a second geo delta of 3e38 are refused, naming the value
// or the key and field, and change nothing.
std::string finite_results(const Flags& flags) {
  auto client = client_of(flags);
  if (!client.ok()) return failed(client.status().to_string());
  std::vector<float> dense{3e38f, 1.0f};
  if (!(*client)->dense(DenseAction::kRead, "probe_net", &dense).ok()) return failed("DENSE read");
  std::vector<float> add{3e38f, 1.0f};
  const Status dense_st = (*client)->dense(DenseAction::kAdd, "probe_net", &add);
  std::vector<float> now{0, 0};
  (void)(*client)->dense(DenseAction::kRead, "probe_net", &now);
  const RowLayout layout = (*client)->layout();
  const uint64_t key = 777;
  const int32_t slot = 1;
  std::vector<float> delta(layout.push_dim(), 0.0f);
  delta[table::optimizer::PushRecord::kShow] = 3e38f;
  const Status first = (*client)->push_updates(PsUpdateKind::kDelta, &key, &slot, 1, delta.data());
  const Status second = (*client)->push_updates(PsUpdateKind::kDelta, &key, &slot, 1, delta.data());
  std::vector<float> row(layout.stride());
  (void)(*client)->pull(&key, &slot, 1, row.data(), nullptr);
  const bool dense_held =
      !dense_st.ok() && dense_st.message().find("value 0 would become inf") != std::string::npos &&
      now[0] == 3e38f;
  const bool delta_held = first.ok() && !second.ok() &&
                          second.message().find("key 777's show") != std::string::npos &&
                          row[RowLayout::kShow] == 3e38f;
  if (!dense_held || !delta_held) {
    return failed("DENSE add: " + dense_st.to_string() +
                  "; second geo delta: " + second.to_string());
  }
  return held(
      "DENSE 3e38 + 3e38 and a second geo delta of 3e38 refused naming value 0 / "
      "key 777's show; nothing stored");
}

}  // namespace

bool run_data_probe(const std::string& probe, const Flags& flags, std::string* line) {
  const std::map<std::string, std::string (*)(const Flags&)> probes{
      {"save_race", save_race},
      {"big_part", big_part},
      {"memory_limit", memory_limit},
      {"finite_results", finite_results}};
  auto it = probes.find(probe);
  if (it == probes.end()) return false;
  *line = it->second(flags);
  return true;
}

}  // namespace gpubox::table::server
