#include "table/unseen_along.hpp"

#include <utility>

namespace gpubox::table {
UnseenAlong::UnseenAlong(const io::ManifestFile& entry, SaveForm form, std::string file)
    : entry_(entry), form_(form), file_(std::move(file)) {
  shape_.fixed = 1;
}

Status UnseenAlong::open(io::FileEnv* fs, const std::string& path, std::size_t chunk_bytes) {
  auto reader = io::VerifiedChunkReader::open(fs, path, entry_, chunk_bytes);
  if (!reader.ok()) return reader.status();
  reader_ = std::move(reader).value();
  return Status::OK();
}

Status UnseenAlong::take(const std::vector<uint64_t>& keys, std::vector<float>* days) {
  while (keys_.size() - front_ < keys.size()) {
    keys_.erase(keys_.begin(), keys_.begin() + front_);
    days_.erase(days_.begin(), days_.begin() + front_);
    front_ = 0;
    auto more = reader_->next(consumer());
    if (!more.ok()) return more.status();
    if (!*more) {
      GPUBOX_RETURN_IF_ERROR(reader_->finish());
      return Status::Corruption(file_ + ": fewer records than its part file");
    }
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (keys_[front_ + i] != keys[i]) {
      return Status::Corruption(file_ + ": key " + std::to_string(keys_[front_ + i]) +
                                " where its part file has " + std::to_string(keys[i]));
    }
  }
  days->assign(days_.begin() + front_, days_.begin() + front_ + keys.size());
  front_ += keys.size();
  return Status::OK();
}

Status UnseenAlong::finish() {
  for (;;) {
    auto more = reader_->next(consumer());
    if (!more.ok()) return more.status();
    if (!*more) break;
  }
  GPUBOX_RETURN_IF_ERROR(reader_->finish());
  if (keys_.size() > front_ || records_ != entry_.records) {
    return Status::Corruption(file_ + ": " + std::to_string(records_) +
                              " records, its part file and MANIFEST say " +
                              std::to_string(entry_.records));
  }
  return Status::OK();
}

io::ChunkConsumer UnseenAlong::consumer() {
  return [this](const char* data, std::size_t n, bool last) -> StatusOr<std::size_t> {
    at_.last = last;
    const std::size_t had = keys_.size();
    auto took = parse_record_chunk(form_, data, n, shape_, file_, at_, &keys_, &days_);
    if (!took.ok()) return took.status();
    at_.byte += took->bytes;
    at_.line += took->lines;
    records_ += keys_.size() - had;
    return took->bytes;
  };
}

}  // namespace gpubox::table
