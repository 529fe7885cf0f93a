// gpubox_server: the host and disk tiers as a service (ARCHITECTURE §1, §5).
//
//   gpubox_server --port 29011 [--bind 127.0.0.1] [--shard_id i --shard_num n] [--data_dir D]
//                 [--load PATH] [--auth_token_file F] [--threads T]
//                 [--config config_gpubox.yaml [-o key=value ...]] [--mf_dim 8 --optimizer adagrad]
//                 [--max_connections N --idle_timeout_s S --max_inflight_mb M ...] (limits)
//
// Prints "gpubox_server listening on <ip>:<port>" once it accepts connections (launchers wait
// for that line). Stops gracefully on SHUTDOWN, SIGTERM or SIGINT.
#include <gflags/gflags.h>
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/cli.hpp"
#include "common/cli_flags.hpp"
#include "common/config/config_document.hpp"
#include "common/logging.hpp"
#include "table/host_tier_factory.hpp"
#include "table/server/auth_token.hpp"
#include "table/server/connection_limits.hpp"
#include "table/server/memory_limit.hpp"
#include "table/server/server.hpp"
#include "table/sparse_config.hpp"

DEFINE_int32(port, 29011, "TCP port to listen on (0: an ephemeral port, printed when ready)");
DEFINE_string(bind, "127.0.0.1", "address to bind; loopback unless told otherwise");
DEFINE_int32(shard_id, 0, "this server's shard of the keys (its position in the endpoint list)");
DEFINE_int32(shard_num, 1, "number of servers sharing the keys");
DEFINE_string(data_dir, ".",
              "folder that holds every SAVE/LOAD path (relative paths resolve under it; none may "
              "leave it, and none may go through a symbolic link: data_dir is opened once at "
              "start and every file operation is resolved beneath it)");
DEFINE_string(load, "", "model folder to load before serving (resolved like SAVE paths)");
DEFINE_string(auth_token_file, "", "file holding a token every connection must present first");
DEFINE_int32(threads, 2, "network threads (table calls run on them)");
DEFINE_string(config, "",
              "the trainer's YAML config (with the trainer's -o key=value overrides): the row "
              "layout and optimizer rules come from it exactly as in the trainer "
              "(hyper_parameters.sparse_feature_dim, hyper_parameters.sparse_optimizer.*, "
              "runner.seed); without it, the key table's defaults");
DEFINE_int32(mf_dim, -1, "embedx width; overrides --config");
DEFINE_string(optimizer, "",
              "sparse optimizer: sgd | adagrad | adam | shared_adam; overrides --config");
DEFINE_int32(max_frame_mb, 64, "largest accepted frame payload, in MiB");
// The table's settings come from the config's runner.* keys (host_tier_config_from, as in the
// trainer's in-process table); each of these flags, when given, overrides its key.
DEFINE_int32(table_shards, 64,
             "lock shards of the in-memory table; overrides runner.host_table_shards");
DEFINE_string(rocksdb_dir, "",
              "disk tier folder (working storage, wiped at start); empty: none; overrides "
              "runner.rocksdb_path");
DEFINE_uint64(memory_row_budget, 0,
              "rows kept in memory at most (needs a disk tier); 0: all; overrides "
              "runner.host_memory_row_budget");
DEFINE_uint64(memory_mb, 0,
              "MiB the table's rows and index may take in memory: given (or runner.host_memory_mb) "
              "with a disk tier, the lowest-score rows beyond go to disk; otherwise requests "
              "that would create rows beyond it are refused ('server memory limit'). Default: "
              "runner.host_memory_mb, else half of the machine's memory (or of its cgroup's "
              "limit); 0: no limit");
DEFINE_int32(cold_after_days, 0,
             "shrink moves rows unseen this many days to disk; 0: never; overrides "
             "runner.cold_after_days");
DEFINE_string(save_form, "binary",
              "part file form of saves: binary | text; overrides runner.save_form");

// Limits (README "Security and durability").
DEFINE_uint64(max_connections, 0,
              "connections served at once; more are closed at accept. 0: min(1024, open files "
              "limit - 64)");
DEFINE_double(idle_timeout_s, 300.0,
              "close a connection idle this long (BARRIER waits excepted); 0: never");
DEFINE_uint64(max_connection_buffer_mb, 0,
              "request and reply bytes one connection may buffer, in MiB; 0: --max_frame_mb");
DEFINE_uint64(max_inflight_mb, 1024,
              "request and reply bytes all connections may buffer together, in MiB; requests "
              "over it are answered 'retry later'");
DEFINE_uint64(dedup_cache_mb, 64, "memory of the retry cache (replies of applied mutations)");
DEFINE_double(dedup_max_age_s, 120.0, "how long the retry cache remembers a reply, in seconds");

namespace gpubox::table::server {
namespace {

bool flag_given(const char* name) { return !gflags::GetCommandLineFlagInfoOrDie(name).is_default; }

// The table's settings: the config's (host_tier_config_from, exactly as the trainer's in-process
// table), each overridden by its flag when given. Shard i of n > 1 keeps a config's disk tier in
// <rocksdb_path>/shard-i, so servers started with one config never share a RocksDB folder.
StatusOr<HostTableConfig> table_config_from(const config::ConfigDocument& doc) {
  HostTableConfig table = host_tier_config_from(doc).table;
  if (!table.rocksdb_path.empty() && FLAGS_shard_num > 1) {
    table.rocksdb_path += "/shard-" + std::to_string(FLAGS_shard_id);
  }
  if (flag_given("table_shards")) {
    if (FLAGS_table_shards < 1) return Status::InvalidArgument("--table_shards must be >= 1");
    table.shards = static_cast<uint32_t>(FLAGS_table_shards);
  }
  if (flag_given("rocksdb_dir")) table.rocksdb_path = FLAGS_rocksdb_dir;
  if (flag_given("memory_row_budget")) table.memory_row_budget = FLAGS_memory_row_budget;
  if (flag_given("cold_after_days")) table.cold_after_days = FLAGS_cold_after_days;
  if (flag_given("save_form")) {
    auto save_form = parse_enum(kSaveFormNames, FLAGS_save_form);
    if (!save_form.ok()) return save_form.status().with_context("--save_form");
    table.save_form = *save_form;
  }
  return table;
}

// The memory limit (memory_limit.hpp): a limit given (--memory_mb, runner.host_memory_mb) on a
// table with a disk tier is the table's budget (rows beyond it go to disk); otherwise the server
// refuses to create rows beyond it. (The default is not made a disk budget: a byte budget
// reserves the table's whole planned index when it opens, half the machine's worth.)
void apply_memory_limit(HostTableConfig* table, ServerOptions* options) {
  const MemoryLimit limit =
      choose_memory_limit(flag_given("memory_mb"), FLAGS_memory_mb, table->memory_budget_bytes);
  const bool spill = !table->rocksdb_path.empty() && !limit.is_default;
  table->memory_budget_bytes = spill ? limit.bytes : 0;
  options->memory_limit_bytes = spill ? 0 : static_cast<std::size_t>(limit.bytes);
  GPUBOX_LOG(INFO) << "gpubox_server: memory limit "
                   << (limit.bytes == 0 ? std::string("none")
                                        : std::to_string(limit.bytes >> 20) + " MiB")
                   << " (" << limit.source << ")"
                   << (limit.bytes == 0 ? ""
                       : spill          ? ": rows beyond it go to the disk tier"
                               : ": requests that would create rows beyond it are refused");
}

// The limit flags into `options`; raises the open files limit first (the connection cap's
// default derives from it) and says what is in force.
Status apply_limit_flags(ServerOptions* options) {
  const OpenFilesLimit files = raise_open_files_limit();
  if (FLAGS_idle_timeout_s < 0 || FLAGS_dedup_max_age_s <= 0) {
    return Status::InvalidArgument("--idle_timeout_s must be >= 0 and --dedup_max_age_s > 0");
  }
  if (FLAGS_max_inflight_mb < 1 || FLAGS_dedup_cache_mb < 1) {
    return Status::InvalidArgument("--max_inflight_mb and --dedup_cache_mb must be at least 1");
  }
  options->max_connections = static_cast<std::size_t>(FLAGS_max_connections);
  options->idle_timeout_s = FLAGS_idle_timeout_s;
  options->max_connection_buffer_bytes = static_cast<std::size_t>(FLAGS_max_connection_buffer_mb)
                                         << 20;
  options->max_inflight_bytes = static_cast<std::size_t>(FLAGS_max_inflight_mb) << 20;
  options->dedup_max_bytes = static_cast<std::size_t>(FLAGS_dedup_cache_mb) << 20;
  options->dedup_max_age_s = FLAGS_dedup_max_age_s;
  const std::size_t max_connections =
      options->max_connections > 0 ? options->max_connections : default_max_connections(files.soft);
  GPUBOX_LOG(INFO) << "gpubox_server: open files limit " << files.soft
                   << (files.soft != files.soft_before
                           ? " (raised from " + std::to_string(files.soft_before) + ")"
                           : std::string())
                   << ", max_connections " << max_connections << ", idle_timeout_s "
                   << options->idle_timeout_s << ", max_inflight_mb " << FLAGS_max_inflight_mb;
  if (options->auth_token.empty()) {
    GPUBOX_LOG(WARNING) << "gpubox_server: no --auth_token_file: any local process can use this "
                           "server; it serves loopback only ("
                        << options->bind_address << ")";
  }
  return Status::OK();
}

Status run(const std::vector<std::string>& overrides) {
  if (FLAGS_config.empty() && !overrides.empty()) {
    return Status::InvalidArgument("-o " + overrides.front() + ": needs --config");
  }
  StatusOr<config::ConfigDocument> doc =
      FLAGS_config.empty() ? config::ConfigDocument::defaults()
                           : config::ConfigDocument::load(FLAGS_config, overrides);
  if (!doc.ok()) return doc.status();
  if (const std::string note = doc->no_effect_note(); !note.empty()) GPUBOX_LOG(INFO) << note;
  AccessorConfig optimizer = sparse_config_from(*doc);
  if (FLAGS_mf_dim >= 0) optimizer.mf_dim = FLAGS_mf_dim;
  if (!FLAGS_optimizer.empty()) {
    auto kind = parse_enum(kSparseOptimizerKindNames, FLAGS_optimizer);
    if (!kind.ok()) return kind.status().with_context("--optimizer");
    optimizer.optimizer.kind = *kind;
  }
  if (FLAGS_port < 0 || FLAGS_port > 65535) return Status::InvalidArgument("--port out of range");
  if (FLAGS_max_frame_mb < 1 || FLAGS_max_frame_mb > 2047) {
    return Status::InvalidArgument("--max_frame_mb must be in [1, 2047]");
  }
  if (FLAGS_shard_num < 1 || FLAGS_shard_id < 0) {
    return Status::InvalidArgument("--shard_id/--shard_num must be non-negative/positive");
  }

  auto table_config = table_config_from(*doc);
  if (!table_config.ok()) return table_config.status();
  ServerOptions options;
  apply_memory_limit(&*table_config, &options);
  HostTierConfig tier_config;
  tier_config.table = *table_config;  // no endpoints: the in-process table
  auto table = make_host_tier(optimizer, tier_config);
  if (!table.ok()) return table.status();

  options.bind_address = FLAGS_bind;
  options.port = static_cast<uint16_t>(FLAGS_port);
  options.threads = FLAGS_threads;
  options.shard_id = static_cast<uint32_t>(FLAGS_shard_id);
  options.shard_num = static_cast<uint32_t>(FLAGS_shard_num);
  options.data_dir = FLAGS_data_dir;
  options.max_payload_bytes = static_cast<uint32_t>(FLAGS_max_frame_mb) << 20;
  if (!FLAGS_auth_token_file.empty()) {
    auto token = read_auth_token_file(FLAGS_auth_token_file, "--auth_token_file");
    if (!token.ok()) return token.status();
    options.auth_token = *token;
  }
  GPUBOX_RETURN_IF_ERROR(apply_limit_flags(&options));
  if (!FLAGS_load.empty()) {
    auto path = load_before_start(table->get(), options, FLAGS_load);
    if (!path.ok()) return path.status().with_context("--load " + FLAGS_load);
    options.loaded_model = *path;
    auto stats = (*table)->stats();
    GPUBOX_LOG(INFO) << "gpubox_server: loaded " << FLAGS_data_dir << "/" << *path << " ("
                     << (stats.ok() ? stats->rows_in_memory + stats->rows_on_disk : 0) << " rows)";
  }

  // Signals are taken by sigtimedwait below, not by an asynchronous handler: block them before
  // the server threads start so that every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = Server::start(table->get(), options);
  if (!server.ok()) return server.status();
  std::printf("gpubox_server listening on %s (shard %d of %d, row stride %d)\n",
              (*server)->endpoint().c_str(), FLAGS_shard_id, FLAGS_shard_num,
              (*table)->layout().stride());
  std::fflush(stdout);

  const timespec tick{0, 200 * 1000 * 1000};
  while (!(*server)->stopped()) {
    const int sig = sigtimedwait(&signals, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      GPUBOX_LOG(INFO) << "gpubox_server: " << (sig == SIGINT ? "SIGINT" : "SIGTERM")
                       << ", stopping";
      (*server)->stop();
    }
  }
  (*server)->wait();
  const ServerCounters c = (*server)->counters();
  GPUBOX_LOG(INFO) << "gpubox_server: stopped after " << c.connections << " connections, "
                   << c.requests << " requests, " << c.rows_pulled << " rows pulled, "
                   << c.rows_pushed << " rows pushed, " << c.protocol_errors
                   << " bad connections closed";
  return Status::OK();
}

}  // namespace
}  // namespace gpubox::table::server

namespace {

std::string usage_text() {
  gpubox::cli::Usage u;
  u.synopsis =
      "gpubox_server --port 29011 [--bind IP] [--shard_id i --shard_num n] [--data_dir D] "
      "[--load PATH] [--auth_token_file F] [--config CONFIG.yaml [-o key=value ...]] [options]";
  u.summary =
      "Serves GPUBox's host tier (the sparse table in memory, with an optional RocksDB disk "
      "tier) to trainers over TCP. Prints \"gpubox_server listening on <ip>:<port>\" once it "
      "accepts connections; stops on SHUTDOWN, SIGTERM or SIGINT. Binds loopback unless told; "
      "limits and durability: README.md, \"Security and durability\".";
  u.options = gpubox::cli::gflags_options(__FILE__);
  u.options.push_back({"-o key=value", "", "the trainer's overrides of --config (repeatable)"});
  u.options.push_back({"--help, -h", "", "print this text and exit"});
  u.options.push_back({"--version", "", "print the version, commit and backend and exit"});
  u.examples = {"gpubox_server --port 29011 --config configs/config_gpubox.yaml",
                "gpubox_server --port 0 --data_dir /data/models --auth_token_file token.txt "
                "--bind 0.0.0.0"};
  return gpubox::cli::render_usage(u);
}

}  // namespace

int main(int argc, char** argv) {
  if (gpubox::cli::answer_help_or_version(argc, argv, "gpubox_server", usage_text)) return 0;
  gflags::SetUsageMessage("gpubox_server --port 29011 (gpubox_server --help)");
  // `-o key=value` (the trainer's overrides of --config) is taken out before gflags.
  std::vector<std::string> overrides;
  std::vector<char*> rest;
  std::string error;
  if (!gpubox::config::take_overrides(argc, argv, &overrides, &rest, &error)) {
    std::fprintf(stderr, "gpubox_server: %s\n", error.c_str());
    return 2;
  }
  int rest_argc = static_cast<int>(rest.size());
  char** rest_argv = rest.data();
  gflags::ParseCommandLineFlags(&rest_argc, &rest_argv, true);
  if (rest_argc > 1) {
    std::fprintf(stderr, "gpubox_server: unexpected argument '%s'\n", rest_argv[1]);
    return 2;
  }
  const gpubox::Status st = gpubox::table::server::run(overrides);
  if (!st.ok()) {
    std::fprintf(stderr, "gpubox_server: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}
