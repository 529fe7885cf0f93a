// QueueDataset: one pass of training data streamed, never held whole (PaddleRec's QueueDataset
// role, runner.reader_type: QueueDataset). Reader threads (thread_num) read the files, through
// pipe_command when set, in chunks; the chunks are put back in file-list order into rounds of
// batch_size x cards instances, and a bounded queue of rounds feeds the card threads. So a pass
// needs memory for the queue, not for its instances:
//
//   queued instances <= queue_rounds x batch_size x cards              (rounds ready)
//                     + batch_size x cards                             (the round being filled)
//                     + thread_num x (kChunksPerFile + 1) x kChunkInstances   (readers' chunks)
//
// (bound_instances(); peak_queued_instances() is what a stream held at most). Card c's k-th
// next_batch() is what InMemoryDataset::fill_batch(c, cards, k) gives for the same files without
// a shuffle: the same tail policy (batch_span_of), the same instances in the same order. There is
// no global shuffle: a stream is read in file order.
//
// A pass's instance count and unique keys are known only once it was read; scan() reads it once
// for them (memory: its distinct keys), for callers that need them before the steps (the gpubox
// mode's begin_pass, the sync mode's step count); the stream for the steps then reads it again
// (pipe_command runs twice: it must give the same lines both times, which the stream checks by
// the instance count and a fingerprint of each batch, before the batch reaches a card).
//
// Thread-safety: set_*, scan(), start() and finish() from one controlling thread; next_batch()
// from one thread per card concurrently; abort() from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "dataset/batch.hpp"
#include "dataset/dataset_types.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/instance_block.hpp"

namespace gpubox::dataset {

class FormatChooser;

class QueueDataset {
 public:
  // Instances a reader hands over at a time, and the chunks a file may have waiting.
  static constexpr std::size_t kChunkInstances = 1024;
  static constexpr std::size_t kChunksPerFile = 4;
  static constexpr std::size_t kDefaultQueueRounds = 4;

  // Throws gpubox::Error if `config` does not pass validate().
  explicit QueueDataset(DatasetConfig config);
  // Stops a stream under way (its readers and pipe commands end).
  ~QueueDataset();
  QueueDataset(const QueueDataset&) = delete;
  QueueDataset& operator=(const QueueDataset&) = delete;

  void set_filelist(std::vector<std::string> files) { files_ = std::move(files); }
  void set_batch_size(int batch_size);
  // Rounds ready in the queue at most (>= 1).
  void set_queue_rounds(std::size_t rounds);
  const DatasetConfig& config() const { return config_; }

  // Reads the whole file list once, keeping no instance: counts (load_stats(), size()) and,
  // with `keys`, the distinct keys and their slots in InMemoryDataset::unique_keys_and_slots()'s
  // order and slot choice; with `visit`, each chunk of instances in file order (on the calling
  // thread; e.g. to size the pass's steps, trainer/engine/step_sizes.hpp). Errors as
  // InMemoryDataset::load_into_memory gives them.
  Status scan(UniqueKeys* keys = nullptr,
              const std::function<void(const InstanceBlock&)>& visit = {});
  // Instances of the last scan().
  std::size_t size() const { return scanned_instances_; }
  // After scan(): batches per card and their spans, as InMemoryDataset's for the same instances.
  std::size_t num_batches_per_card(int cards) const;
  BatchSpan batch_span(int card, int cards, std::size_t index) const;

  // Starts streaming the file list to `cards` card threads (a stream under way is stopped).
  void start(int cards);
  // Card `card`'s next batch (its part of the next round); waits while it is being read. False
  // at the end of the stream, after a failure or an abort (finish() says which). Every card
  // takes every round, so each must call it until it returns false (or abort()).
  bool next_batch(int card, Batch* batch);
  // Wakes every waiting next_batch() (they return false) and stops the readers.
  void abort(const std::string& why);
  // Waits for the readers and returns how the stream went: OK, the first error in file order
  // (unreadable file, failing pipe_command, strict_parse), the abort, or, after a scan(), an
  // instance count that differs from the scan's. Fills load_stats().
  Status finish();
  // Statistics of the last scan() or finished stream.
  const LoadStats& load_stats() const { return stats_; }

  std::size_t bound_instances() const;
  std::size_t peak_queued_instances() const;
  // One line for the log: the queue's bound in instances and, by the first chunk's measure, bytes.
  std::string memory_note() const;

 private:
  struct Channel;
  struct Round;
  struct Pump;
  // Runs the readers and calls sink(chunk) for every chunk in file order on the calling thread,
  // until the end, a failure or stop_. Returns the status and fills stats_.
  Status pump(const std::function<void(const InstanceBlock&)>& sink);
  // A reader thread of `pump`: the files not yet taken, one at a time, until the end or stop_.
  void read_files(Pump& pump);
  // File `f` into its channel, chunk by chunk as room allows; then its status and statistics.
  void read_file(Pump& pump, std::size_t f, FormatChooser& chooser);
  // The head file's chunks to `sink` until its reader is done or stop_ (true), or the sink
  // throws (false, *sink_error set).
  bool drain_head(Pump& pump, const std::function<void(const InstanceBlock&)>& sink,
                  std::exception_ptr* sink_error);
  void stop_stream();

  DatasetConfig config_;
  std::vector<std::string> files_;
  std::size_t queue_rounds_ = kDefaultQueueRounds;
  std::size_t scanned_instances_ = 0;
  bool scanned_ = false;
  // The scan's fingerprint of each batch_size instances in order (the last batch may be
  // shorter), which the stream's must match.
  std::vector<std::uint64_t> scanned_prints_;
  LoadStats stats_;

  // The stream (start() .. finish()). cards_ is set by the controlling thread while no stream
  // runs and only read while one does.
  int cards_ = 0;
  mutable Mutex mu_;
  CondVar changed_;                                             // any guarded field below changed
  std::deque<Round> rounds_ GPUBOX_GUARDED_BY(mu_);             // ready, oldest first
  std::size_t first_round_ GPUBOX_GUARDED_BY(mu_) = 0;          // index of rounds_.front()
  std::vector<std::size_t> next_round_ GPUBOX_GUARDED_BY(mu_);  // per card
  std::size_t queued_ GPUBOX_GUARDED_BY(mu_) = 0;  // instances in the channels and rounds_
  std::size_t peak_queued_ GPUBOX_GUARDED_BY(mu_) = 0;
  std::size_t bytes_per_instance_ GPUBOX_GUARDED_BY(mu_) = 0;  // measured on the first chunk
  bool stream_done_ GPUBOX_GUARDED_BY(mu_) = false;
  bool stop_ GPUBOX_GUARDED_BY(mu_) = false;
  std::string aborted_ GPUBOX_GUARDED_BY(mu_);
  Status stream_status_ GPUBOX_GUARDED_BY(mu_);
  std::thread assembler_;
};

}  // namespace gpubox::dataset
