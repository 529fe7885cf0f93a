// gpubox_server: the host and disk tiers as a service (ARCHITECTURE §1, §5).
//
//   gpubox_server --port 29011 [--bind 127.0.0.1] [--shard_id i --shard_num n] [--data_dir D]
//                 [--load PATH] [--auth_token_file F] [--threads T]
//                 [--config config_gpubox.yaml [-o key=value ...]] [--mf_dim 8 --optimizer adagrad]
//                 [--max_connections N --idle_timeout_s S --max_inflight_mb M ...] (limits)
//                 [--frame_deadline_s S --min_transfer_kb_s K --auth_timeout_s A ...] (deadlines)
//
// Prints "gpubox_server listening on <ip>:<port>" once it accepts connections (launchers wait
// for that line). Stops gracefully on SHUTDOWN, SIGTERM or SIGINT.
#include <gflags/gflags.h>
#include <signal.h>

#include <boost/asio/ip/address.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "common/cli.hpp"
#include "common/cli_flags.hpp"
#include "common/config/config_document.hpp"
#include "common/config/slot_dims.hpp"
#include "common/logging.hpp"
#include "common/malloc_reuse.hpp"
#include "table/io/rooted_env.hpp"
#include "table/server/auth_token.hpp"
#include "table/server/connection_limits.hpp"
#include "table/server/host_tier_factory.hpp"
#include "table/server/memory_limit.hpp"
#include "table/server/server.hpp"
#include "table/sparse_config.hpp"

// Every numeric flag's range is declared next to it (GPUBOX_FLAG_RANGE), or is the range of the
// config key it stands for (GPUBOX_FLAG_KEY); the front end (common/cli_flags.hpp) checks them.
DEFINE_int32(port, 29011, "TCP port to listen on (0: an ephemeral port, printed when ready)");
GPUBOX_FLAG_RANGE(port, 0, 65535);
DEFINE_string(bind, "127.0.0.1", "address to bind; loopback unless told otherwise");
DEFINE_int32(shard_id, 0,
             "this server's shard of the keys (its position in the endpoint list; < --shard_num)");
GPUBOX_FLAG_RANGE(shard_id, 0, 65535);
DEFINE_int32(shard_num, 1, "number of servers sharing the keys");
GPUBOX_FLAG_RANGE(shard_num, 1, 65536);
DEFINE_string(data_dir, ".",
              "folder that holds every SAVE/LOAD path (relative paths resolve under it; none may "
              "leave it, and none may go through a symbolic link: data_dir is opened once at "
              "start and every file operation is resolved beneath it)");
DEFINE_string(load, "", "model folder to load before serving (resolved like SAVE paths)");
DEFINE_string(auth_token_file, "", "file holding a token every connection must present first");
DEFINE_int32(threads, 2, "network threads (table calls run on them)");
GPUBOX_FLAG_RANGE(threads, 1, 1024);
DEFINE_string(config, "",
              "the trainer's YAML config (with the trainer's -o key=value overrides): the row "
              "layout and optimizer rules come from it exactly as in the trainer "
              "(hyper_parameters.sparse_feature_dim, hyper_parameters.sparse_optimizer.*, "
              "runner.seed); without it, the key table's defaults");
DEFINE_int32(mf_dim, -1,
             "embedx width; when given, overrides the width --config gives "
             "(hyper_parameters.sparse_feature_dim - 1; ffm: times its fields)");
// At most hyper_parameters.sparse_feature_dim's largest value (1024) less the wide weight.
GPUBOX_FLAG_RANGE(mf_dim, 0, 1023);
DEFINE_string(optimizer, "",
              "sparse optimizer: sgd | adagrad | adam | shared_adam; overrides --config");
GPUBOX_FLAG_KEY(optimizer, "hyper_parameters.sparse_optimizer.class");
DEFINE_int32(max_frame_mb, 64, "largest accepted frame payload, in MiB");
// Frame lengths are 32-bit: 2047 MiB is the largest payload a frame header can announce.
GPUBOX_FLAG_RANGE(max_frame_mb, 1, 2047);
// The table's settings come from the config's runner.* keys (host_tier_config_from, as in the
// trainer's in-process table); each of these flags, when given, overrides its key.
DEFINE_int32(table_shards, 64,
             "lock shards of the in-memory table; overrides runner.host_table_shards");
GPUBOX_FLAG_KEY(table_shards, "runner.host_table_shards");
DEFINE_string(rocksdb_dir, "",
              "disk tier folder (working storage, wiped at start); empty: none; overrides "
              "runner.rocksdb_path");
DEFINE_uint64(memory_row_budget, 0,
              "rows kept in memory at most (needs a disk tier); 0: all; overrides "
              "runner.host_memory_row_budget");
GPUBOX_FLAG_KEY(memory_row_budget, "runner.host_memory_row_budget");
DEFINE_uint64(memory_mb, 0,
              "MiB the table's rows and index may take in memory: given (or runner.host_memory_mb) "
              "with a disk tier, the lowest-score rows beyond go to disk; otherwise requests "
              "that would create rows beyond it are refused ('server memory limit'). Default: "
              "runner.host_memory_mb, else half of the machine's memory (or of its cgroup's "
              "limit); 0: no limit");
GPUBOX_FLAG_KEY(memory_mb, "runner.host_memory_mb");
DEFINE_int32(cold_after_days, 0,
             "shrink moves rows unseen this many days to disk; 0: never; overrides "
             "runner.cold_after_days");
GPUBOX_FLAG_KEY(cold_after_days, "runner.cold_after_days");
DEFINE_string(save_form, "binary",
              "part file form of saves: binary | text; overrides runner.save_form");
GPUBOX_FLAG_KEY(save_form, "runner.save_form");

// Limits (docs/operations.md, "Security and durability").
// Sizes in MiB stop at 2^20 MiB (1 TiB): far above any machine's memory for one server, and
// far below where shifting them into bytes would overflow.
constexpr int64_t kMaxMiB = int64_t{1} << 20;
DEFINE_uint64(max_connections, 0,
              "connections served at once; more are closed at accept. 0: min(1024, open files "
              "limit - 64)");
GPUBOX_FLAG_RANGE(max_connections, 0, 1 << 20);
DEFINE_double(idle_timeout_s, 300.0,
              "close a connection whose client sent no new frame for this long; 0: never");
GPUBOX_FLAG_RANGE(idle_timeout_s, 0.0, 1e6);
DEFINE_double(max_io_stall_s, 600.0,
              "a SAVE or LOAD whose file operation has been under way this long without "
              "finishing (a hung mount) stops reporting progress, so its client gives up on it");
GPUBOX_FLAG_RANGE(max_io_stall_s, 0.01, 1e6);
// Deadlines and shares against slow and hostile peers (ServerOptions, session.hpp).
DEFINE_double(frame_deadline_s, 10.0,
              "every frame (request or reply) gets this long from its first byte, then its "
              "bytes must keep up with --min_transfer_kb_s, or the connection is closed");
GPUBOX_FLAG_RANGE(frame_deadline_s, 0.01, 1e6);
DEFINE_double(min_transfer_kb_s, 1024.0,
              "floor rate of a frame's bytes after --frame_deadline_s, in KiB/s (a frame of B "
              "bytes has frame_deadline_s + B / rate seconds in all); a held ranged DENSE write "
              "slower than it on average is stalled, and gives its bytes at --max_dense_mb");
GPUBOX_FLAG_RANGE(min_transfer_kb_s, 1.0, 1e9);
DEFINE_double(auth_timeout_s, 10.0,
              "with a token: a connection must authenticate this long after connecting; with or "
              "without one, a connection waiting beyond --max_connections must bind to its "
              "client (AUTH, or its first frame) this long after connecting");
GPUBOX_FLAG_RANGE(auth_timeout_s, 0.01, 1e6);
DEFINE_uint64(max_unauthenticated, 0,
              "with a token: slots connections that have not authenticated may hold (a new one "
              "beyond evicts the oldest); 0: half of max_connections");
GPUBOX_FLAG_RANGE(max_unauthenticated, 0, 1 << 20);
DEFINE_uint64(max_barrier_waiters, 0,
              "BARRIER waiters at once, all barriers together; 0: half of max_connections");
GPUBOX_FLAG_RANGE(max_barrier_waiters, 0, 1 << 20);
DEFINE_double(barrier_timeout_s, 3600.0,
              "longest BARRIER wait; then the waiter is answered DeadlineExceeded");
GPUBOX_FLAG_RANGE(barrier_timeout_s, 0.001, 1e6);
DEFINE_bool(exit_when_job_ends, false,
            "exit once every trainer of the job ended it well (the launchers' TRAINING_ROLE="
            "PSERVER servers); default: serve until SIGINT/SIGTERM");
DEFINE_uint64(max_connection_buffer_mb, 0,
              "request and reply bytes one connection may buffer, in MiB; 0: --max_frame_mb");
GPUBOX_FLAG_RANGE(max_connection_buffer_mb, 0, kMaxMiB);
DEFINE_uint64(max_inflight_mb, 1024,
              "request and reply bytes all connections may buffer together, in MiB; requests "
              "over it are answered 'retry later'");
GPUBOX_FLAG_RANGE(max_inflight_mb, 1, kMaxMiB);
DEFINE_uint64(max_dense_mb, 4096,
              "MiB the PS modes' dense tables may take: the tables, every ranged write held (at "
              "its announced size) and the copy that commits the largest one; a DENSE write or a "
              "ranged write's first range over it is refused, once the stalled held writes "
              "(slower than --min_transfer_kb_s) gave their bytes");
GPUBOX_FLAG_RANGE(max_dense_mb, 1, kMaxMiB);
DEFINE_double(dense_write_max_idle_s, 120.0,
              "a ranged DENSE write (a dense table over one frame) that received no range for "
              "this many seconds is dropped, its memory freed (its writer died mid-write); one "
              "idle for a quarter of it whose connections closed may give its slot to another "
              "client's at the held-write limits (as may the slowest one of a client holding two "
              "more of them than the new write's, or one more when it is slower than "
              "--min_transfer_kb_s)");
GPUBOX_FLAG_RANGE(dense_write_max_idle_s, 1e-3, 1e6);
DEFINE_uint64(max_step_mb, 4096,
              "MiB the sync mode's held sparse step (a job of several trainers: each step's "
              "gradient parts, held until all arrived) may take; a part over it is refused");
GPUBOX_FLAG_RANGE(max_step_mb, 1, kMaxMiB);
DEFINE_double(step_max_wait_s, 300.0,
              "a held sync step whose parts did not all arrive within this many seconds of its "
              "first is dropped unapplied (a trainer died mid-step), its memory freed");
GPUBOX_FLAG_RANGE(step_max_wait_s, 1e-3, 1e6);
DEFINE_uint64(dedup_cache_mb, 64, "memory of the retry cache (replies of applied mutations)");
GPUBOX_FLAG_RANGE(dedup_cache_mb, 1, kMaxMiB);
DEFINE_uint64(dedup_client_cache_mb, 0,
              "MiB of the retry cache one client's replies may take (beyond it, that client's "
              "own oldest are forgotten first, never another client's); at most --dedup_cache_mb; "
              "0: an eighth of --dedup_cache_mb");
GPUBOX_FLAG_RANGE(dedup_client_cache_mb, 0, kMaxMiB);
DEFINE_double(dedup_max_age_s, 120.0, "how long the retry cache remembers a reply, in seconds");
GPUBOX_FLAG_RANGE(dedup_max_age_s, 1e-3, 1e6);

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
  // Each flag's range was checked by the front end (the key table's, GPUBOX_FLAG_KEY above).
  if (flag_given("table_shards")) table.shards = static_cast<uint32_t>(FLAGS_table_shards);
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

// The row layout and optimizer rules: the config's (sparse_config_from, as in the trainer), with
// --mf_dim and --optimizer over them when given.
StatusOr<AccessorConfig> optimizer_config_from(const config::ConfigDocument& doc) {
  StatusOr<AccessorConfig> rows = sparse_config_from(doc);
  if (!rows.ok()) return rows.status();
  AccessorConfig optimizer = std::move(rows).value();
  if (flag_given("mf_dim")) optimizer.mf_dim = FLAGS_mf_dim;
  // ffm multiplies the width by its fields: refused here as by the trainer's loader.
  if (optimizer.mf_dim > config::kMaxSlotDim) {
    return Status::InvalidArgument(
        doc.source() + ": rows of " + std::to_string(optimizer.mf_dim) +
        " embedding values (ffm, fat_deepffm: a factor of hyper_parameters.sparse_feature_dim - 1 "
        "per field, "
        "the sparse slots and hyper_parameters.dense_input_dim; or --mf_dim), over the " +
        std::to_string(config::kMaxSlotDim) + " a row may hold");
  }
  if (!FLAGS_optimizer.empty()) {
    auto kind = parse_enum(kSparseOptimizerKindNames, FLAGS_optimizer);
    if (!kind.ok()) return kind.status().with_context("--optimizer");
    optimizer.optimizer.kind = *kind;
  }
  return optimizer;
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
  options->max_connections = static_cast<std::size_t>(FLAGS_max_connections);
  options->idle_timeout_s = FLAGS_idle_timeout_s;
  options->max_connection_buffer_bytes = static_cast<std::size_t>(FLAGS_max_connection_buffer_mb)
                                         << 20;
  options->max_inflight_bytes = static_cast<std::size_t>(FLAGS_max_inflight_mb) << 20;
  options->dedup_max_bytes = static_cast<std::size_t>(FLAGS_dedup_cache_mb) << 20;
  options->dedup_max_age_s = FLAGS_dedup_max_age_s;
  options->dedup_max_client_bytes = static_cast<std::size_t>(FLAGS_dedup_client_cache_mb) << 20;
  options->max_dense_bytes = static_cast<std::size_t>(FLAGS_max_dense_mb) << 20;
  options->dense_write_max_idle_s = FLAGS_dense_write_max_idle_s;
  options->max_step_bytes = static_cast<std::size_t>(FLAGS_max_step_mb) << 20;
  options->step_max_wait_s = FLAGS_step_max_wait_s;
  const std::size_t max_connections =
      options->max_connections > 0 ? options->max_connections : default_max_connections(files.soft);
  GPUBOX_LOG(INFO) << "gpubox_server: open files limit " << files.soft
                   << (files.soft != files.soft_before
                           ? " (raised from " + std::to_string(files.soft_before) + ")"
                           : std::string())
                   << ", max_connections " << max_connections << ", idle_timeout_s "
                   << options->idle_timeout_s << ", max_inflight_mb " << FLAGS_max_inflight_mb;
  // Said of a loopback address only: another is refused at start without a token (the warning
  // said "it serves loopback only (0.0.0.0)" before that refusal).
  boost::system::error_code bad_address;
  const auto address = boost::asio::ip::make_address(options->bind_address, bad_address);
  if (options->auth_token.empty() && !bad_address && address.is_loopback()) {
    GPUBOX_LOG(WARNING) << "gpubox_server: no --auth_token_file: any local process can use this "
                           "server; it serves loopback only ("
                        << options->bind_address << ")";
  }
  return Status::OK();
}

// The deadline flags into `options` (Server::start checks their ranges again).
Status apply_deadline_flags(ServerOptions* options) {
  // Their ranges are checked with every flag's, by the command-line front end.
  options->frame_deadline_s = FLAGS_frame_deadline_s;
  options->max_io_stall_s = FLAGS_max_io_stall_s;
  options->min_transfer_bytes_per_s = FLAGS_min_transfer_kb_s * 1024.0;
  options->auth_timeout_s = FLAGS_auth_timeout_s;
  options->max_unauthenticated = static_cast<std::size_t>(FLAGS_max_unauthenticated);
  options->max_barrier_waiters = static_cast<std::size_t>(FLAGS_max_barrier_waiters);
  options->barrier_timeout_s = FLAGS_barrier_timeout_s;
  GPUBOX_LOG(INFO) << "gpubox_server: frame_deadline_s " << FLAGS_frame_deadline_s
                   << " then min_transfer_kb_s " << FLAGS_min_transfer_kb_s << ", auth_timeout_s "
                   << FLAGS_auth_timeout_s << ", barrier_timeout_s " << FLAGS_barrier_timeout_s;
  return Status::OK();
}

// A data_dir the server cannot open (a file, no permission) would fail every SAVE and LOAD of
// the job later; the binary refuses to start instead (an in-process server only warns).
Status check_data_dir_flag() {
  if (FLAGS_data_dir.empty()) return Status::OK();
  // A missing folder is made, but only its last part: a mistyped parent (/srv/gpubox/datta/s0)
  // would otherwise become a tree of folders that the next run, spelled right, never reads.
  const std::filesystem::path dir(FLAGS_data_dir);
  std::error_code ec;
  auto normal = dir.lexically_normal();
  if (!normal.has_filename()) normal = normal.parent_path();  // "saves/": the folder saves
  const auto parent = normal.parent_path();
  const bool parent_there = parent.empty() || std::filesystem::exists(parent, ec);
  if (ec) {
    return Status::InvalidArgument("--data_dir '" + FLAGS_data_dir + "': cannot look at its " +
                                   "parent folder '" + parent.string() + "': " + ec.message());
  }
  if (!parent_there) {
    return Status::InvalidArgument("--data_dir '" + FLAGS_data_dir + "': its parent folder '" +
                                   parent.string() +
                                   "' does not exist (a mistyped path? make it first, e.g. "
                                   "mkdir -p, if this is the folder you mean)");
  }
  std::filesystem::create_directory(dir, ec);
  auto env = io::RootedEnv::open(FLAGS_data_dir);
  if (!env.ok()) {
    return Status::InvalidArgument("--data_dir '" + FLAGS_data_dir +
                                   "': " + env.status().message() +
                                   " (SAVE and LOAD would fail: give a folder the server can "
                                   "write)");
  }
  return Status::OK();
}

// The listening, identity and limit flags into `options`.
Status apply_server_flags(ServerOptions* options) {
  options->bind_address = FLAGS_bind;
  options->port = static_cast<uint16_t>(FLAGS_port);
  options->threads = FLAGS_threads;
  options->shard_id = static_cast<uint32_t>(FLAGS_shard_id);
  options->shard_num = static_cast<uint32_t>(FLAGS_shard_num);
  options->data_dir = FLAGS_data_dir;
  GPUBOX_RETURN_IF_ERROR(check_data_dir_flag());
  options->max_payload_bytes = static_cast<uint32_t>(FLAGS_max_frame_mb) << 20;
  options->exit_when_job_ends = FLAGS_exit_when_job_ends;
  if (!FLAGS_auth_token_file.empty()) {
    auto token = read_auth_token_file(FLAGS_auth_token_file, "--auth_token_file");
    if (!token.ok()) return token.status();
    options->auth_token = *token;
  }
  GPUBOX_RETURN_IF_ERROR(apply_limit_flags(options));
  return apply_deadline_flags(options);
}

// SIGINT and SIGTERM are taken by sigtimedwait (serve_until_stopped), not by an asynchronous
// handler: blocked before the server threads start, so that every thread inherits the mask.
sigset_t block_stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// Serves until the server stops itself (the job ended) or a signal stops it; logs its counts.
void serve_until_stopped(Server* server, const sigset_t& signals) {
  const timespec tick{0, 200 * 1000 * 1000};
  while (!server->stopped()) {
    const int sig = sigtimedwait(&signals, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      GPUBOX_LOG(INFO) << "gpubox_server: " << (sig == SIGINT ? "SIGINT" : "SIGTERM")
                       << ", stopping";
      server->stop();
    }
  }
  server->wait();
  const ServerCounters c = server->counters();
  GPUBOX_LOG(INFO) << "gpubox_server: stopped after " << c.connections << " connections, "
                   << c.requests << " requests, " << c.rows_pulled << " rows pulled, "
                   << c.rows_pushed << " rows pushed, " << c.protocol_errors
                   << " bad connections closed";
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
  auto optimizer = optimizer_config_from(*doc);
  if (!optimizer.ok()) return optimizer.status();
  if (const std::string note = paddlerec_rows_rule_note(*doc, *optimizer);
      !note.empty() && FLAGS_optimizer.empty()) {
    GPUBOX_LOG(INFO) << "gpubox_server: " << note;
  }
  if (FLAGS_shard_id >= FLAGS_shard_num) {
    return Status::InvalidArgument("--shard_id " + std::to_string(FLAGS_shard_id) +
                                   " must be less than --shard_num " +
                                   std::to_string(FLAGS_shard_num));
  }

  auto table_config = table_config_from(*doc);
  if (!table_config.ok()) return table_config.status();
  ServerOptions options;
  apply_memory_limit(&*table_config, &options);
  HostTierConfig tier_config;
  tier_config.table = *table_config;  // no endpoints: the in-process table
  auto table = make_host_tier(*optimizer, tier_config);
  if (!table.ok()) return table.status();

  GPUBOX_RETURN_IF_ERROR(apply_server_flags(&options));
  if (!FLAGS_load.empty()) {
    auto path = load_before_start(table->get(), options, FLAGS_load);
    if (!path.ok()) return path.status().with_context("--load " + FLAGS_load);
    options.loaded_model = *path;
    auto stats = (*table)->stats();
    GPUBOX_LOG(INFO) << "gpubox_server: loaded " << FLAGS_data_dir << "/" << *path << " ("
                     << (stats.ok() ? stats->rows_in_memory + stats->rows_on_disk : 0) << " rows)";
  }

  const sigset_t signals = block_stop_signals();
  auto server = Server::start(table->get(), options);
  if (!server.ok()) return server.status();
  std::printf("gpubox_server listening on %s (shard %d of %d, row stride %d)\n",
              (*server)->endpoint().c_str(), FLAGS_shard_id, FLAGS_shard_num,
              (*table)->layout().stride());
  std::fflush(stdout);
  serve_until_stopped(server->get(), signals);
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
      "limits and durability: docs/operations.md, \"Security and durability\".";
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
  // The one front end (common/cli_args.hpp): flags, -o key=value, --help, --version, ranges.
  gpubox::cli::CommandSpec spec;
  spec.tool = "gpubox_server";
  spec.flags = gpubox::cli::gflags_flag_specs(__FILE__);
  spec.takes_overrides = true;  // the trainer's overrides of --config
  spec.usage = usage_text;
  const gpubox::cli::CommandLine line = gpubox::cli::parse_gflags_command_line(spec, argc, argv);
  if (line.exit_code) return *line.exit_code;
  // Every frame's buffers reused, not mapped and faulted in again, in at most an arena per
  // network thread and two more (common/malloc_reuse.hpp); before the server's threads start.
  const gpubox::MallocTuning tuning = gpubox::keep_freed_memory_for_reuse(FLAGS_threads + 2);
  if (!tuning.applied) {
    GPUBOX_LOG(INFO) << "gpubox_server: malloc thresholds and arena cap not set ("
                     << tuning.skipped_because << "): glibc's own settings apply";
  }
  const gpubox::Status st = gpubox::table::server::run(line.args.overrides);
  if (!st.ok()) {
    std::fprintf(stderr, "gpubox_server: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}
