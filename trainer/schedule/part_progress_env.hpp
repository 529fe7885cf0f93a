// A FileEnv that shows trainer 0's own file work in its part (a save's dense half written to its
// local disk: save_dense_half) as the part's moves (trainer_zero_work.hpp), as its servers' SAVE
// PROGRESS frames show theirs: `on_move` runs after every file operation, every step between them
// (note_progress), and every kChunkBytes appended (a longer append is passed on in chunks of that
// size), so that the other trainers waiting for a slow local write see it move, while a write that
// stopped (a hung disk, trainer 0 stuck) shows no move and they fail naming trainer 0.
//
// Thread-safety: as the inner env; `on_move` may run on any thread that calls it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "table/io/forwarding_env.hpp"

namespace gpubox::trainer {

class PartProgressEnv final : public table::io::ForwardingEnv {
 public:
  static constexpr std::size_t kChunkBytes = std::size_t{1} << 20;

  // `inner` is borrowed and must outlive this env and its files; `on_move` is called after each
  // step (RemoteHostTier::note_progress: the count trainer 0 publishes).
  PartProgressEnv(table::io::FileEnv* inner, std::function<void()> on_move);

  StatusOr<std::unique_ptr<table::io::WritableFile>> new_writable_file(
      const std::string& path) override;
  StatusOr<std::string> read_file(const std::string& path, uint64_t max_bytes) override;
  StatusOr<std::unique_ptr<table::io::SequentialFile>> open_sequential(const std::string& path,
                                                                       uint64_t max_bytes) override;
  Status create_dir(const std::string& path) override;
  Status remove_all(const std::string& path) override;
  Status rename(const std::string& from, const std::string& to) override;
  Status exchange(const std::string& a, const std::string& b) override;
  Status sync_dir(const std::string& path) override;
  bool exists(const std::string& path) override;
  StatusOr<std::vector<std::string>> list_dir(const std::string& path) override;
  void note_progress() override;

 private:
  // Passes `value` on after calling on_move_.
  template <typename T>
  T moved(T value) {
    on_move_();
    return value;
  }

  const std::function<void()> on_move_;
};

}  // namespace gpubox::trainer
