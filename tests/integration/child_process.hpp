// A child process for the tests that drive the real binaries: started with extra environment,
// its stdout and stderr read through one pipe (so a test can wait for a line and act on it,
// kill -9 included), killed on destruction if still running. Test-only; Linux.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gpubox::testing {

class ChildProcess {
 public:
  // Starts `binary args...` in `workdir` with `env` ("NAME=value") added to this process's
  // environment ("NAME=" unsets NAME). stdin is /dev/null.
  ChildProcess(const std::string& binary, const std::vector<std::string>& args,
               const std::vector<std::string>& env = {}, const std::string& workdir = "") {
    int out[2];
    if (::pipe(out) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(out[1], STDERR_FILENO);
      ::close(out[0]);
      ::close(out[1]);
      const int null = ::open("/dev/null", O_RDONLY);
      if (null >= 0) ::dup2(null, STDIN_FILENO);
      for (const std::string& e : env) {
        const auto eq = e.find('=');
        const std::string name = e.substr(0, eq), value = e.substr(eq + 1);
        if (value.empty()) {
          ::unsetenv(name.c_str());
        } else {
          ::setenv(name.c_str(), value.c_str(), 1);
        }
      }
      if (!workdir.empty() && ::chdir(workdir.c_str()) != 0) ::_exit(126);
      std::vector<std::string> copy = args;
      std::string bin = binary;
      std::vector<char*> argv = {bin.data()};
      for (auto& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(bin.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    fd_ = out[0];
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  }
  ~ChildProcess() {
    if (pid_ > 0) {
      signal(SIGKILL);
      wait(10);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Everything it printed so far (what read() took from the pipe).
  const std::string& output() const { return output_; }

  // Reads until `text` appears in the output (true) or the pipe closes or `seconds` pass.
  bool wait_for(const std::string& text, double seconds) {
    const auto deadline = clock::now() + to_duration(seconds);
    while (output_.find(text) == std::string::npos) {
      if (clock::now() >= deadline || !read_some(20)) {
        return output_.find(text) != std::string::npos;
      }
    }
    return true;
  }

  void signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }

  // Waits for the exit, reading the output meanwhile: its exit status, 128 + signal, or -1 on
  // timeout.
  int wait(double seconds) {
    const auto deadline = clock::now() + to_duration(seconds);
    while (pid_ > 0) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        while (read_some(0)) {
        }
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (clock::now() >= deadline) return -1;
      if (!read_some(20)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return -1;
  }

 private:
  using clock = std::chrono::steady_clock;
  static clock::duration to_duration(double seconds) {
    return std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
  }
  // Reads what is there (waiting up to `ms` for it); false when the pipe is closed.
  bool read_some(int ms) {
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return true;
    char buf[4096];
    const ssize_t n = ::read(fd_, buf, sizeof(buf));
    if (n > 0) output_.append(buf, static_cast<std::size_t>(n));
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR));
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  std::string output_;
};

// How a child ended: its exit status (as ChildProcess::wait gives it) and everything it printed.
struct Finished {
  int status = -1;
  std::string output;
};

// Runs `binary args...` (as ChildProcess starts it) to its end, at most `seconds`.
inline Finished run_to_end(const std::string& binary, const std::vector<std::string>& args,
                           const std::vector<std::string>& env = {},
                           const std::string& workdir = "", double seconds = 60) {
  ChildProcess child(binary, args, env, workdir);
  Finished done;
  done.status = child.wait(seconds);
  done.output = child.output();
  return done;
}

}  // namespace gpubox::testing
