#include "dataset/queue_dataset.hpp"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "common/error.hpp"
#include "dataset/format_detect.hpp"
#include "dataset/input_reader.hpp"
#include "dataset/line_reader.hpp"
#include "dataset/pipe_command.hpp"

namespace gpubox::dataset {
namespace {

// Fingerprints of consecutive batches of instances (label, dense values, keys by slot), chained
// instance by instance: the stream compares its batches' with the scan's, so that a second read
// with other lines, or the same lines in another order, stops before its batch reaches a card
// (the pass's keys and step plan come from the scan).
class BatchPrints {
 public:
  explicit BatchPrints(std::size_t batch) : batch_(std::max<std::size_t>(batch, 1)) {}
  // Adds instance i of `block`; true when it completed a batch, whose print take() gives.
  bool add(const InstanceBlock& block, std::size_t i) {
    const std::size_t slots = static_cast<std::size_t>(block.num_slots);
    const std::size_t dense = static_cast<std::size_t>(block.dense_dim);
    print_ = XXH3_64bits_withSeed(&block.labels[i], sizeof(float), print_);
    print_ = XXH3_64bits_withSeed(block.dense.data() + i * dense, dense * sizeof(float), print_);
    print_ = XXH3_64bits_withSeed(block.slot_sizes.data() + i * slots,
                                  slots * sizeof(std::uint32_t), print_);
    const std::uint64_t begin = block.key_begin[i];
    print_ = XXH3_64bits_withSeed(block.keys.data() + begin,
                                  (block.key_begin[i + 1] - begin) * sizeof(std::uint64_t), print_);
    return ++in_batch_ == batch_;
  }
  bool partial() const { return in_batch_ > 0; }
  std::uint64_t take() {
    const std::uint64_t out = print_;
    print_ = 0;
    in_batch_ = 0;
    return out;
  }

 private:
  std::size_t batch_;
  std::size_t in_batch_ = 0;
  std::uint64_t print_ = 0;
};

// The stream's batches checked against the scan's prints, in order (no scan: nothing to check).
class ScanMatch {
 public:
  ScanMatch(std::size_t batch, const std::vector<std::uint64_t>* scanned)
      : batch_(std::max<std::size_t>(batch, 1)), prints_(batch), scanned_(scanned) {}
  // Adds instance i of `block`; false when it completed a batch unlike the scan's.
  bool add(const InstanceBlock& block, std::size_t i) {
    return !prints_.add(block, i) || same_as_scan();
  }
  // The short last batch; false when unlike the scan's.
  bool finish() { return !prints_.partial() || same_as_scan(); }
  bool differs() const { return differs_; }
  // The stream's error for the first batch unlike the scan's (`streamed` instances read).
  Status error(const DatasetConfig& config, std::size_t streamed) const {
    return Status::Corruption(
        "runner.reader_type QueueDataset: the second read of the pass differs from the first in "
        "its instances " +
        std::to_string((batches_ - 1) * batch_) + ".." +
        std::to_string(std::min(batches_ * batch_, streamed) - 1) +
        " (other lines, or the same in another order): " +
        (config.pipe_command.empty()
             ? std::string("a data file changed while the pass was read")
             : "pipe_command '" + config.pipe_command +
                   "' must give the same lines, in the same order, each time it reads a file"));
  }

 private:
  bool same_as_scan() {
    const std::uint64_t print = prints_.take();
    differs_ =
        scanned_ != nullptr && (batches_ >= scanned_->size() || (*scanned_)[batches_] != print);
    ++batches_;
    return !differs_;
  }

  std::size_t batch_;
  BatchPrints prints_;
  const std::vector<std::uint64_t>* scanned_;
  std::size_t batches_ = 0;
  bool differs_ = false;
};

}  // namespace

// One file's chunks on their way from its reader to the assembler, in order. Every field is
// guarded by the dataset's mu_ (which the analysis cannot name from here).
struct QueueDataset::Channel {
  std::deque<InstanceBlock> chunks;
  bool done = false;  // the reader finished (status and stats are final)
  Status status;
  bool strict_failure = false;
  LoadStats stats;
};

// batch_size x cards instances (fewer in the last round) and how many cards took theirs.
struct QueueDataset::Round {
  InstanceBlock block;
  int taken = 0;
};

QueueDataset::QueueDataset(DatasetConfig config) : config_(std::move(config)) {
  throw_if_error(validate(config_));
}

QueueDataset::~QueueDataset() { stop_stream(); }

void QueueDataset::set_batch_size(int batch_size) {
  GPUBOX_EXPECTS(batch_size >= 1, "batch_size must be >= 1, got ", batch_size);
  config_.batch_size = batch_size;
}

void QueueDataset::set_queue_rounds(std::size_t rounds) {
  GPUBOX_EXPECTS(rounds >= 1, "queue rounds must be >= 1, got ", rounds);
  queue_rounds_ = rounds;
}

std::size_t QueueDataset::num_batches_per_card(int cards) const {
  GPUBOX_EXPECTS(scanned_, "QueueDataset: num_batches_per_card before scan()");
  return batches_per_card(scanned_instances_, static_cast<std::size_t>(config_.batch_size), cards);
}

BatchSpan QueueDataset::batch_span(int card, int cards, std::size_t index) const {
  GPUBOX_EXPECTS(scanned_, "QueueDataset: batch_span before scan()");
  return batch_span_of(scanned_instances_, static_cast<std::size_t>(config_.batch_size), card,
                       cards, index);
}

std::size_t QueueDataset::bound_instances() const {
  const std::size_t round =
      static_cast<std::size_t>(config_.batch_size) * static_cast<std::size_t>(std::max(1, cards_));
  const std::size_t readers = static_cast<std::size_t>(config_.thread_num);
  return (queue_rounds_ + 1) * round + ((readers + 1) * kChunksPerFile + 1) * kChunkInstances;
}

std::size_t QueueDataset::peak_queued_instances() const {
  MutexLock lock(mu_);
  return peak_queued_;
}

std::string QueueDataset::memory_note() const {
  MutexLock lock(mu_);
  std::ostringstream out;
  out << "runner.reader_type QueueDataset: the pass is streamed in file order (no global "
         "shuffle), at most "
      << bound_instances() << " instances queued (" << queue_rounds_ << " rounds of "
      << config_.batch_size << " x " << std::max(1, cards_) << " cards, and " << config_.thread_num
      << " reader threads' chunks of " << kChunkInstances << ")";
  if (bytes_per_instance_ > 0) {
    out << ", about " << (bound_instances() * bytes_per_instance_ >> 20) << " MiB";
  }
  return out.str();
}

// One pump's shared state. The channels vector is fixed before the readers start (they index it
// unlocked); the channels' contents, head and waiting_chunks are guarded by the dataset's mu_.
struct QueueDataset::Pump {
  std::string pipe_command;
  std::shared_ptr<const SlotIndex> slots;
  std::vector<std::unique_ptr<Channel>> channels;  // one per file
  // The file the assembler drains: its reader may always add up to kChunksPerFile chunks; the
  // readers of later files share shared_chunks (thread_num x kChunksPerFile), so the head file is
  // never stuck behind them.
  std::size_t head = 0;
  std::size_t waiting_chunks = 0;  // in every channel
  std::size_t shared_chunks = 0;
  std::atomic<std::size_t> next_file{0};
};

void QueueDataset::read_file(Pump& pump, std::size_t f, FormatChooser& chooser) {
  const int num_slots = static_cast<int>(config_.slots.size());
  Channel& channel = *pump.channels[f];
  LoadStats stats;
  stats.files = 1;
  Status status;
  bool strict_failure = false;
  InstanceBlock block(num_slots, config_.dense_dim);
  StatusOr<std::unique_ptr<LineReader>> opened =
      LineReader::open(files_[f], pump.pipe_command, config_.max_line_bytes);
  if (!opened.ok()) {
    status = opened.status();
  } else {
    InputHooks hooks;
    hooks.chunk_instances = kChunkInstances;
    hooks.keep_going = [&] {
      MutexLock lock(mu_);
      return !stop_;
    };
    hooks.on_chunk = [&](InstanceBlock* chunk) -> Status {
      if (chunk->size() == 0) return Status::OK();
      MutexLock lock(mu_);
      while (!stop_ && !(f == pump.head ? channel.chunks.size() < kChunksPerFile
                                        : pump.waiting_chunks < pump.shared_chunks)) {
        changed_.wait(lock);
      }
      if (stop_) return Status::Aborted("the stream was stopped");
      queued_ += chunk->size();
      peak_queued_ = std::max(peak_queued_, queued_);
      ++pump.waiting_chunks;
      channel.chunks.push_back(std::move(*chunk));
      *chunk = InstanceBlock(num_slots, config_.dense_dim);
      changed_.notify_all();
      return Status::OK();
    };
    const InputOutcome outcome =
        read_input(**opened, chooser, config_, files_[f], &block, &stats, hooks);
    status =
        pump.pipe_command.empty() ? outcome.status : explain_pipe_failure(outcome.status, config_);
    strict_failure = outcome.strict_failure;
  }
  MutexLock lock(mu_);
  channel.done = true;
  channel.status = std::move(status);
  channel.strict_failure = strict_failure;
  channel.stats = std::move(stats);
  changed_.notify_all();
}

void QueueDataset::read_files(Pump& pump) {
  FormatChooser chooser(config_, pump.slots);
  const std::size_t files = pump.channels.size();
  for (std::size_t f = pump.next_file.fetch_add(1); f < files; f = pump.next_file.fetch_add(1)) {
    read_file(pump, f, chooser);
    MutexLock lock(mu_);
    if (stop_) return;
  }
}

bool QueueDataset::drain_head(Pump& pump, const std::function<void(const InstanceBlock&)>& sink,
                              std::exception_ptr* sink_error) {
  Channel& channel = *pump.channels[pump.head];
  for (;;) {
    MutexLock lock(mu_);
    while (!stop_ && channel.chunks.empty() && !channel.done) changed_.wait(lock);
    if (stop_ || channel.chunks.empty()) return true;  // stopped, or done
    InstanceBlock chunk = std::move(channel.chunks.front());
    channel.chunks.pop_front();
    --pump.waiting_chunks;
    if (bytes_per_instance_ == 0) {
      bytes_per_instance_ = std::max<std::size_t>(1, chunk.memory_bytes() / chunk.size());
    }
    changed_.notify_all();
    lock.unlock();
    try {
      sink(chunk);  // the sink moves the instances on and counts them out of queued_
    } catch (...) {
      *sink_error = std::current_exception();
      return false;
    }
  }
}

Status QueueDataset::pump(const std::function<void(const InstanceBlock&)>& sink) {
  Pump pump;
  pump.pipe_command = pipe_command_line(config_);
  pump.slots = std::make_shared<const SlotIndex>(config_.slots);
  const std::size_t files = files_.size();
  for (std::size_t f = 0; f < files; ++f) pump.channels.push_back(std::make_unique<Channel>());
  pump.shared_chunks = static_cast<std::size_t>(config_.thread_num) * kChunksPerFile;
  const int readers =
      static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(config_.thread_num), files));
  std::vector<std::thread> threads;
  for (int r = 0; r < readers; ++r) threads.emplace_back([&] { read_files(pump); });

  // Chunks in file order to the sink; the statistics merged in file order.
  LoadStats merged;
  Status failure;
  // A sink that throws stops the readers and is rethrown once they are joined (a joinable
  // thread left behind by the unwinding would end the process).
  std::exception_ptr sink_error;
  while (pump.head < files) {
    if (!drain_head(pump, sink, &sink_error)) break;
    const Channel& channel = *pump.channels[pump.head];
    MutexLock lock(mu_);
    if (stop_) {
      failure = Status::Aborted(aborted_.empty() ? "the stream was stopped" : aborted_);
      break;
    }
    if (!channel.status.ok()) failure = channel.status;
    if (failure.ok() && channel.strict_failure) {
      failure = Status::Corruption(channel.stats.errors.back().to_string() + " (" +
                                   config_.strict_parse_reason + ")");
    }
    merged.merge(channel.stats, config_.max_reported_errors);
    if (!failure.ok()) break;
    ++pump.head;  // under mu_: the readers' room depends on it
    changed_.notify_all();
  }
  {
    MutexLock lock(mu_);
    if (!failure.ok() || sink_error) stop_ = true;  // readers still at work stop
    changed_.notify_all();
  }
  for (std::thread& t : threads) t.join();
  if (sink_error) std::rethrow_exception(sink_error);
  stats_ = std::move(merged);
  return failure;
}

Status QueueDataset::scan(UniqueKeys* keys,
                          const std::function<void(const InstanceBlock&)>& visit) {
  stop_stream();
  {
    MutexLock lock(mu_);
    stop_ = false;
    aborted_.clear();
    queued_ = 0;
    cards_ = 1;
  }
  std::size_t instances = 0;
  // Each distinct key with the slot position of its first occurrence in file order.
  std::unordered_map<std::uint64_t, std::int32_t> first_slot;
  scanned_prints_.clear();
  BatchPrints prints(static_cast<std::size_t>(config_.batch_size));
  const Status status = pump([&](const InstanceBlock& chunk) {
    instances += chunk.size();
    for (std::size_t i = 0; i < chunk.size(); ++i) {
      if (prints.add(chunk, i)) scanned_prints_.push_back(prints.take());
    }
    if (visit) visit(chunk);
    if (keys != nullptr) {
      for (std::size_t i = 0; i < chunk.size(); ++i) {
        const std::uint64_t* key = chunk.keys.data() + chunk.key_begin[i];
        const std::uint32_t* sizes = chunk.slot_sizes.data() + i * chunk.num_slots;
        for (int s = 0; s < chunk.num_slots; ++s) {
          for (std::uint32_t k = 0; k < sizes[s]; ++k, ++key) {
            if (*key != 0) first_slot.emplace(*key, s);
          }
        }
      }
    }
    MutexLock lock(mu_);
    queued_ -= chunk.size();
  });
  if (prints.partial()) scanned_prints_.push_back(prints.take());
  scanned_ = status.ok();
  scanned_instances_ = status.ok() ? instances : 0;
  if (!status.ok() || keys == nullptr) return status;
  // InMemoryDataset::unique_keys' order: ascending (keys are distinct: by key alone).
  std::vector<std::pair<std::uint64_t, std::int32_t>> sorted(first_slot.begin(), first_slot.end());
  std::sort(sorted.begin(), sorted.end());
  keys->keys.resize(sorted.size());
  keys->slots.resize(sorted.size());
  for (std::size_t k = 0; k < sorted.size(); ++k) {
    keys->keys[k] = sorted[k].first;
    keys->slots[k] = slot_id(config_.slots, static_cast<std::size_t>(sorted[k].second));
  }
  return status;
}

void QueueDataset::start(int cards) {
  GPUBOX_EXPECTS(cards >= 1, "cards must be >= 1, got ", cards);
  stop_stream();
  {
    MutexLock lock(mu_);
    cards_ = cards;
    rounds_.clear();
    first_round_ = 0;
    next_round_.assign(static_cast<std::size_t>(cards), 0);
    queued_ = 0;
    peak_queued_ = 0;
    stream_done_ = false;
    stop_ = false;
    aborted_.clear();
    stream_status_ = Status::OK();
  }
  assembler_ = std::thread([this] {
    const int num_slots = static_cast<int>(config_.slots.size());
    const std::size_t round_size =
        static_cast<std::size_t>(config_.batch_size) * static_cast<std::size_t>(cards_);
    Round filling{InstanceBlock(num_slots, config_.dense_dim), 0};
    std::size_t streamed = 0;
    // Hands a round to the queue, waiting for room; false once stopped.
    auto push = [&]() -> bool {
      MutexLock lock(mu_);
      while (!stop_ && rounds_.size() >= queue_rounds_) changed_.wait(lock);
      if (stop_) return false;
      rounds_.push_back(std::move(filling));
      changed_.notify_all();
      filling = Round{InstanceBlock(num_slots, config_.dense_dim), 0};
      return true;
    };
    // After a scan, the card threads take the scanned count's batches and no more: more
    // instances than that stop the stream at once rather than wait for room forever.
    bool too_many = false;
    // A batch (batch_size divides a round) unlike the scan's stops the stream before it is
    // pushed.
    ScanMatch match(static_cast<std::size_t>(config_.batch_size),
                    scanned_ ? &scanned_prints_ : nullptr);
    const auto stop = [&] {
      MutexLock lock(mu_);
      stop_ = true;
      changed_.notify_all();
    };
    Status status = pump([&](const InstanceBlock& chunk) {
      for (std::size_t i = 0; i < chunk.size(); ++i) {
        if (scanned_ && streamed == scanned_instances_) {
          too_many = true;
          stop();
          return;
        }
        filling.block.append(chunk.instance(i));
        ++streamed;
        if (!match.add(chunk, i)) {
          stop();
          return;
        }
        if (filling.block.size() == round_size && !push()) return;
      }
    });
    // A short last batch: compared when the counts agree (else the count says more).
    if (status.ok() && streamed == scanned_instances_ && !match.finish()) stop();
    if (status.ok() && !match.differs() && filling.block.size() > 0) push();
    if (match.differs()) {
      status = match.error(config_, streamed);
    } else if ((status.ok() || too_many) && scanned_ &&
               (too_many || streamed != scanned_instances_)) {
      status =
          Status::Corruption("runner.reader_type QueueDataset: the second read of the pass gave " +
                             std::string(too_many ? "more than " : "") + std::to_string(streamed) +
                             " instances, the first " + std::to_string(scanned_instances_) +
                             ": pipe_command must give the same lines each time it reads a file");
    }
    MutexLock lock(mu_);
    stream_done_ = true;
    if (stream_status_.ok()) stream_status_ = status;
    changed_.notify_all();
  });
}

bool QueueDataset::next_batch(int card, Batch* batch) {
  GPUBOX_EXPECTS(card >= 0 && card < cards_, "card ", card, " of ", cards_);
  const auto c = static_cast<std::size_t>(card);
  MutexLock lock(mu_);
  while (aborted_.empty() && next_round_[c] >= first_round_ + rounds_.size() && !stream_done_) {
    changed_.wait(lock);
  }
  if (!aborted_.empty() || !stream_status_.ok()) return false;
  if (next_round_[c] >= first_round_ + rounds_.size()) return false;  // the end
  Round& round = rounds_[next_round_[c] - first_round_];
  // A round is dropped only once every card took its part: `round` stays put while unlocked.
  lock.unlock();
  const std::size_t n = round.block.size();
  const BatchSpan span =
      batch_span_of(n, static_cast<std::size_t>(config_.batch_size), card, cards_, 0);
  std::vector<InstanceRef> refs(span.size());
  for (std::size_t i = 0; i < refs.size(); ++i) refs[i] = round.block.instance(span.begin + i);
  assemble_batch(refs.data(), refs.size(), static_cast<int>(config_.slots.size()),
                 config_.dense_dim, batch);
  lock.lock();
  ++next_round_[c];
  ++round.taken;
  while (!rounds_.empty() && rounds_.front().taken == cards_) {
    queued_ -= rounds_.front().block.size();
    rounds_.pop_front();
    ++first_round_;
  }
  changed_.notify_all();
  return true;
}

void QueueDataset::abort(const std::string& why) {
  MutexLock lock(mu_);
  if (aborted_.empty()) aborted_ = why.empty() ? "aborted" : why;
  stop_ = true;
  changed_.notify_all();
}

Status QueueDataset::finish() {
  if (assembler_.joinable()) assembler_.join();
  MutexLock lock(mu_);
  // The stream's own failure first: an abort often follows it (a card thread that stopped).
  if (!stream_status_.ok() && stream_status_.code() != Status::Code::kAborted) {
    return stream_status_;
  }
  if (!aborted_.empty()) return Status::Aborted("runner.reader_type QueueDataset: " + aborted_);
  return stream_status_;
}

void QueueDataset::stop_stream() {
  if (!assembler_.joinable()) return;
  {
    MutexLock lock(mu_);
    stop_ = true;
    changed_.notify_all();
  }
  assembler_.join();
}

}  // namespace gpubox::dataset
