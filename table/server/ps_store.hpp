// PsStore: what a gpubox_server keeps for the parameter-server modes (ps_protocol.hpp) besides
// its table: the locks that make a PS_PUSH's read-modify-write of a row atomic per key, and the
// dense tables. Thread-safe: every server thread may call it.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "table/host_tier.hpp"
#include "table/server/connection_limits.hpp"
#include "table/server/ps_protocol.hpp"

namespace gpubox::table::server {

// What bounds the dense tables of one server (ServerOptions: max_dense_bytes,
// dense_write_max_idle_s).
struct DenseLimits {
  // Bytes of the dense tables, of every ranged write held (counted at its announced total from
  // its first range, though only what arrived is allocated) and of the copy that commits the
  // largest held write, all together.
  std::size_t max_bytes = std::size_t{4} << 30;
  // A held write that received no range this long is dropped (its writer died mid-write, or its
  // connection is half-open: the peer vanished without closing it). A quarter of it without a
  // range, and its client's new write of the same table supersedes it (see PsStore::dense).
  std::chrono::steady_clock::duration max_idle = std::chrono::seconds(120);
  // After a quarter of max_idle, a held write must have received its bytes at this rate on
  // average since its first range (gpubox_server --min_transfer_kb_s, which every frame is held
  // to as well): one that fell behind is stalled, and at max_bytes its announced bytes go to a new
  // write, so a writer that announces a large table and drips it cannot hold the dense memory.
  double min_bytes_per_s = 1024.0 * 1024.0;
};

// Who sends a DENSE request: the client id its connection is bound to (session.hpp: proved by
// AUTH, or its first frame's), that connection (the server's session serial) and its peer's
// address (without the port). What PsStore keeps per peer (held writes, dropped-write records)
// counts by the peer's host, share_address(address), as the connection cap does: every loopback
// address is one host, an IPv6 address counts by its /64, a link-local one by its link's.
struct DenseCaller {
  uint64_t client_id = 0;
  uint64_t connection = 0;
  std::string address;
};

// InvalidArgument unless a PS_PUSH's record width `dim` is `table`'s push_dim (naming both).
Status check_push_width(const HostTier& table, uint32_t dim);

class PsStore {
 public:
  using Clock = std::chrono::steady_clock;
  explicit PsStore(DenseLimits limits = {}) : limits_(limits) {}

  // Applies a PS_PUSH to `table`: pulls the rows (creating missing ones in the request's slots),
  // applies each key's gradient (the accessor's rule, sparse_rule.hpp: apply_push) or geo delta
  // (apply_delta), checks every resulting value, and writes them back, all under the locks of
  // the key stripes the request touches, so two trainers' updates of one key never overwrite
  // each other. Refuses the whole request (nothing applied; rows it created at their initial
  // values stay, as after a PULL) when its width is not the table's push_dim, a value is not
  // finite, or a result would not be finite (naming the key and the row's field).
  Status apply(HostTier& table, const PsPushRequest& request);

  // DENSE from `caller` (ps_protocol.hpp: DenseRequest): reads the request's range of
  // table `name` (a whole-table read creates it from the request's values when absent), adds the
  // request's values to the range, or writes the table (a whole write replaces it at once; a
  // ranged write is staged and replaces it when its last range arrived); `*reply` becomes the
  // DENSE reply. Refuses (InvalidArgument, nothing applied) a total other than the table's size,
  // non-finite values, an add whose sum would not be finite (naming the value's index), a range
  // of a staged write that overlaps one received before or disagrees with its name or total; an
  // add to, or a ranged read of, a table never created (NotFound); a new table beyond
  // kMaxDenseTables, a table or a ranged write (at its first range, from its announced total)
  // that would take the dense memory over DenseLimits::max_bytes once the stalled held writes
  // gave their bytes (admit_held; dropped only when it then fits), and a new ranged write beyond
  // kMaxHeldDenseWritesPerHost held from the caller's host (share_address) or
  // kMaxHeldDenseWrites from all clients when no held write counted against that limit is abandoned
  // and received no range for a quarter of DenseLimits::max_idle and fair_share_victim finds none
  // to give its slot (ResourceExhausted, naming the client, the address and the limit); a ranged
  // write's range of no values (InvalidArgument). Beyond kMaxStagedDenseWrites held writes of one
  // client, that client's oldest abandoned one (every connection that carried it closed), else its
  // oldest, is dropped; at the host's or the server's limit, the abandoned write of that host (or
  // of any) that received no range for longest, and for that quarter at least (a writer whose
  // connection closed under it reconnects and finishes within it), is, else fair_share_victim's
  // (a client holding its writes open cannot keep a trainer of its own host out). A dropped
  // write's later ranges are refused (NotFound naming the write and why: dropped_), holding
  // nothing, so its writer writes the table again. A new ranged
  // write of a table first drops the same client's writes of that table that are abandoned or
  // received no range for a quarter of DenseLimits::max_idle: a rewrite retried after its
  // connection was lost, or half-open, needs no room for the stale one (a write that is moving is
  // never dropped for it: two threads of one client may write one table over two connections).
  //
  // What a reader can observe mid-way: each range is applied under one lock, so a read range
  // sees an add range whole or not at all; a client's add of a table over one frame is several
  // ranges, so a concurrent read may see some of its ranges added and others not yet. A staged
  // write is never seen in part.
  Status dense(const DenseCaller& caller, DenseRequest request, std::vector<uint8_t>* reply,
               Clock::time_point now = Clock::now());
  // Connection `connection` closed: the held writes it carried no longer count it (those left
  // with no open connection are abandoned, see dense()).
  void connection_closed(uint64_t connection);
  // A range of `caller`'s held write `write_id` came again on caller.connection and was answered
  // from the retry cache (its first reply was lost): that connection now carries the write too,
  // so the write is not taken for abandoned once the first one closes. Nothing when not held.
  void carried_by(const DenseCaller& caller, uint64_t write_id);
  // Drops the held writes that received no range for DenseLimits::max_idle before `now`
  // (the server's sweep calls it); returns how many.
  std::size_t expire_held_writes(Clock::time_point now);
  std::size_t held_writes() const;
  std::size_t dense_bytes() const;  // the tables' and the held writes' (announced) bytes

 private:
  // A ranged write being received: its ranges by offset (never overlapping).
  struct StagedWrite {
    uint64_t client_id = 0;
    uint64_t write_id = 0;
    std::string address;  // its first range's peer, for messages
    std::string host;     // share_address(address): whose share of the slots it takes
    std::string name;
    uint32_t total = 0;
    uint64_t started = 0;           // arrival order, for dropping the client's oldest
    Clock::time_point first_range;  // for stalled()
    Clock::time_point last_range;   // for expire_held_writes
    std::size_t received = 0;
    std::map<uint32_t, std::vector<float>> ranges;
    // The open connections that carried its ranges; none left: abandoned (its writer may still
    // reconnect and send the rest, which makes it live again).
    std::vector<uint64_t> connections;
    bool abandoned() const { return connections.empty(); }
    // Chosen to make room for a new write (doom), dropped once it is known to fit
    // (settle_doomed); meanwhile counted as gone.
    bool doomed = false;
    std::string doom_reason;  // for dropped_
    std::string doom_log;     // the warning naming both writes, when there is one
  };
  // The table `name` after a whole write (created when absent, within kMaxDenseTables).
  Status write_table(const std::string& name, std::vector<float> values) GPUBOX_REQUIRES(dense_mu_);
  // OK when `table_bytes` more of table (less `replaced_bytes`, a table it replaces) and
  // `held_bytes` more of held write keep the dense memory, with the commit copy of the largest
  // held write, within DenseLimits::max_bytes; else ResourceExhausted "`who`: ...". Checks only.
  Status admit(const std::string& who, std::size_t table_bytes, std::size_t replaced_bytes,
               std::size_t held_bytes) const GPUBOX_REQUIRES(dense_mu_);
  // admit() that, at the limit, dooms the stalled held writes (stalled()), the largest first,
  // until it fits or none is left: the caller settles them (settle_doomed).
  Status admit_held(const DenseCaller& caller, const std::string& what, std::size_t table_bytes,
                    std::size_t replaced_bytes, std::size_t held_bytes, Clock::time_point now)
      GPUBOX_REQUIRES(dense_mu_);
  // admit_held for a table (a whole write, a read creating it), its stalled writes dropped (logged)
  // only when it then fits: every path that stores dense bytes gets the stalled writes' room.
  Status admit_settled(const DenseCaller& caller, const std::string& what, std::size_t table_bytes,
                       std::size_t replaced_bytes, Clock::time_point now)
      GPUBOX_REQUIRES(dense_mu_);
  // Past the grace of stale_after() since its first range, `w` received fewer bytes than
  // DenseLimits::min_bytes_per_s allows for the time since the grace ended.
  bool stalled(const StagedWrite& w, Clock::time_point now) const GPUBOX_REQUIRES(dense_mu_);
  // The held write a ranged write's range belongs to: found, or made (after the checks of
  // dense()), in *staged.
  Status find_or_hold(const DenseCaller& caller, const DenseRequest& request,
                      const std::string& what, Clock::time_point now,
                      std::vector<StagedWrite>::iterator* staged) GPUBOX_REQUIRES(dense_mu_);
  // Makes room for a new held write of `caller` (of share address `host`) to table `name`: drops
  // that client's abandoned or stale writes of the table, then (at kMaxStagedDenseWrites) its
  // oldest abandoned or oldest write, else at the host's or the server's limit the longest idle
  // abandoned and stale write counted against it. ResourceExhausted when the limit is held by
  // live or recent writes.
  Status make_room(const DenseCaller& caller, const std::string& host, const std::string& name,
                   const std::string& what, Clock::time_point now) GPUBOX_REQUIRES(dense_mu_);
  // At `limit` held writes of `host` (a share address; every host: empty): drops the longest idle
  // abandoned and stale one of them, else fair_share_victim's; ResourceExhausted (`what` and
  // `why`) when there is neither. Logged, naming both clients and addresses.
  Status free_slot(const std::string& host, std::size_t limit, const DenseCaller& caller,
                   const std::string& what, Clock::time_point now, const std::string& why)
      GPUBOX_REQUIRES(dense_mu_);
  // The write that gives its slot to a new write of `client_id` at a full `host` (every host:
  // empty), `per_client` counting the writes held there by client: of the clients
  // holding the most, when they hold at least two more than `client_id` does, the write slowest on
  // average (average_rate); holding one more, only such a write not moving at
  // DenseLimits::min_bytes_per_s or stale; else staged_.end(). So a client (or a process taking a
  // new client id on every connection) that holds its writes open without finishing them cannot
  // keep a trainer of its own host out, nor take a trainer's moving write by dripping its own.
  std::vector<StagedWrite>::iterator fair_share_victim(
      const std::string& host, const std::map<uint64_t, std::size_t>& per_client,
      uint64_t client_id, Clock::time_point now) GPUBOX_REQUIRES(dense_mu_);
  // Bytes a second `w` received since its first range, over stale_after() at least.
  double average_rate(const StagedWrite& w, Clock::time_point now) const GPUBOX_REQUIRES(dense_mu_);
  // A quarter of DenseLimits::max_idle: a held write that received no range for that long is
  // stale (its writer's rewrite of the table supersedes it; abandoned, another client's write may
  // take its slot). Within it, a writer whose connection closed under it reconnects and finishes.
  Clock::duration stale_after() const { return limits_.max_idle / 4; }
  bool stale(const StagedWrite& w, Clock::time_point now) const {
    return now - w.last_range >= stale_after();
  }
  // Adds a ranged write's range; *committed when it completed the write (the table replaced).
  Status stage_write(const DenseCaller& caller, DenseRequest& request, Clock::time_point now,
                     bool* committed) GPUBOX_REQUIRES(dense_mu_);
  // Replaces the table with a complete held write (erased from staged_).
  Status commit(std::vector<StagedWrite>::iterator staged) GPUBOX_REQUIRES(dense_mu_);
  // Marks `w` to be dropped for a new write, `reason` for dropped_, `log` for the warning.
  void doom(StagedWrite& w, std::string reason, std::string log) GPUBOX_REQUIRES(dense_mu_);
  // Drops the doomed writes (logged) when `drop`, else spares them.
  void settle_doomed(bool drop) GPUBOX_REQUIRES(dense_mu_);
  // Removes a held write (committed or dropped); the iterator after it.
  std::vector<StagedWrite>::iterator release(std::vector<StagedWrite>::iterator staged)
      GPUBOX_REQUIRES(dense_mu_);
  // Drops an uncommitted held write and records why in dropped_, so its later ranges are refused
  // (dropped_error) instead of holding a new write that could never commit; the iterator after it.
  std::vector<StagedWrite>::iterator drop_held(std::vector<StagedWrite>::iterator staged,
                                               const std::string& reason)
      GPUBOX_REQUIRES(dense_mu_);
  // NotFound "`what`: write N was dropped: <reason>; write the table again" when `client_id`'s
  // write `write_id` is in dropped_; else OK.
  Status dropped_error(uint64_t client_id, uint64_t write_id, const std::string& what) const
      GPUBOX_REQUIRES(dense_mu_);
  // A read or an add of an existing (or, whole read, new) table's range.
  Status read_or_add(const DenseCaller& caller, DenseRequest& request, std::vector<uint8_t>* reply,
                     Clock::time_point now) GPUBOX_REQUIRES(dense_mu_);

  static constexpr std::size_t kStripes = 64;
  const DenseLimits limits_;
  std::array<Mutex, kStripes> stripes_;
  mutable Mutex dense_mu_;
  std::map<std::string, std::vector<float>> dense_ GPUBOX_GUARDED_BY(dense_mu_);
  std::vector<StagedWrite> staged_ GPUBOX_GUARDED_BY(dense_mu_);
  uint64_t staged_serial_ GPUBOX_GUARDED_BY(dense_mu_) = 0;
  std::size_t table_bytes_ GPUBOX_GUARDED_BY(dense_mu_) = 0;  // of dense_
  std::size_t held_bytes_ GPUBOX_GUARDED_BY(dense_mu_) = 0;   // of staged_, announced totals
  // The held writes dropped uncommitted, oldest first: at most kMaxDroppedRecords, of them at most
  // kMaxDroppedPerClient of one client (its oldest forgotten first). When all are taken, the one
  // forgotten is forget_dropped_fairly's: neither one client dropping its own writes in bulk nor
  // a process spread over many client ids (of one host, or a few; over 127.0.0.2, 127.0.0.3, ...
  // too: one host) pushes out the record of a client or a host holding fewer.
  struct DroppedWrite {
    uint64_t client_id = 0;
    uint64_t write_id = 0;
    std::string host;  // the write's StagedWrite::host
    std::string reason;
  };
  // Records `dropped`, first forgetting one as above at a limit.
  void remember_dropped(DroppedWrite dropped) GPUBOX_REQUIRES(dense_mu_);
  // Forgets the oldest record of the client holding the most records at the host holding the
  // most (ties: the one whose record is oldest).
  void forget_dropped_fairly() GPUBOX_REQUIRES(dense_mu_);

 public:
  static constexpr std::size_t kMaxDroppedRecords = 1024;
  static constexpr std::size_t kMaxDroppedPerClient = 16;

 private:
  std::deque<DroppedWrite> dropped_ GPUBOX_GUARDED_BY(dense_mu_);
  LogThrottle drop_log_{std::chrono::seconds(2)};  // abandoned writes dropped for another client
};

}  // namespace gpubox::table::server
