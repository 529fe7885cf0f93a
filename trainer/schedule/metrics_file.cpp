#include "trainer/schedule/metrics_file.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace gpubox::trainer {

namespace {

std::string run_name() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[64];
  const std::size_t n = std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return std::string(text, n) + "/" + std::to_string(::getpid());
}

}  // namespace

MetricsFile::MetricsFile(const std::string& metrics_path, int trainer_id)
    : trainer_id_(trainer_id),
      path_(trainer_metrics_path(metrics_path, trainer_id)),
      run_(run_name()) {
  if (metrics_path.empty()) return;
  const std::filesystem::path path(path_);
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  // A line a killed run cut short ends without its newline: the next line starts on its own.
  bool cut = false;
  if (std::ifstream in(path, std::ios::binary); in && in.seekg(-1, std::ios::end)) {
    cut = in.get() != '\n';
  }
  out_.open(path, std::ios::app);
  GPUBOX_EXPECTS(out_.good(), "cannot open runner.metrics_path '", path.string(), "'",
                 ec ? " (" + ec.message() + ")" : std::string());
  if (cut) out_ << '\n';
  GPUBOX_LOG(INFO) << "runner.metrics_path: appending to " << path.string();
}

void MetricsFile::append(const std::string& json) {
  if (!out_.is_open()) return;
  GPUBOX_EXPECTS(!json.empty() && json.back() == '}', "a metrics line is one JSON object: ", json);
  write(line(json));
}

std::string MetricsFile::line(const std::string& json) const {
  // The formatters' objects end in '}': the run goes before it.
  return json.substr(0, json.size() - 1) + ", \"run\": \"" + run_ + "\"}";
}

void MetricsFile::write(const std::string& line) {
  errno = 0;
  out_ << line << '\n';
  out_.flush();
  if (out_.good()) return;
  const int error = errno;
  GPUBOX_FAIL("cannot write runner.metrics_path '", path_, "'",
              error != 0 ? std::string(" (") + std::strerror(error) + ")" : std::string(),
              ": its line for this pass or evaluation is lost (the line may be cut short in "
              "the file); the job stops after the pass's save, if it saves, so a resume goes on "
              "from there once the file can be written");
}

std::string MetricsFile::kept_line_path(const std::string& save_dir) const {
  return (std::filesystem::path(save_dir) /
          (std::string(kPassLineFile) +
           (trainer_id_ > 0 ? ".trainer" + std::to_string(trainer_id_) : std::string())))
      .string();
}

void MetricsFile::keep_pass_line(const std::string& save_dir, const std::string& json) const {
  if (!out_.is_open()) return;
  std::error_code ec;
  std::filesystem::create_directories(save_dir, ec);
  // At worst not kept (the save's own writes then name the folder's trouble): only a kill
  // between the save and its line would lose the line, as before.
  std::ofstream(kept_line_path(save_dir), std::ios::trunc) << line(json) << '\n';
}

void MetricsFile::restore_pass_line(const std::string& save_dir) {
  if (!out_.is_open()) return;
  std::ifstream kept(kept_line_path(save_dir));
  std::string wanted;
  if (!std::getline(kept, wanted) || wanted.empty()) return;
  std::ifstream in(path_);
  for (std::string line; std::getline(in, line);) {
    if (line == wanted) return;
  }
  GPUBOX_LOG(INFO) << "runner.metrics_path: the line of the pass this run resumes after, which the "
                      "run before saved but did not write, appended from its save ("
                   << save_dir << ")";
  write(wanted);
}

bool MetricsFile::ends_with_test_line(int64_t epoch) const {
  if (!out_.is_open()) return false;
  std::ifstream in(path_, std::ios::binary);
  // The last line is within the file's last 4 KiB (a test line is under 200 bytes).
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (!in || size <= 0) return false;
  const std::streamoff from = size > 4096 ? size - 4096 : 0;
  in.seekg(from);
  std::string tail(static_cast<std::size_t>(size - from), '\0');
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  if (!in || tail.back() != '\n') return false;  // a cut line is no line of ours
  tail.pop_back();
  const std::string last = tail.substr(tail.find_last_of('\n') + 1);
  const std::string test_line = "{\"epoch\": " + std::to_string(epoch) + ", \"test_auc\": ";
  return last.compare(0, test_line.size(), test_line) == 0;
}

}  // namespace gpubox::trainer
