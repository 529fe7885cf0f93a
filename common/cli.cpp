#include "common/cli.hpp"

#include <cstdio>
#include <cstring>
#include <sstream>

namespace gpubox {
namespace detail {
extern const char* const kBuildCommit;  // generated at build time (cmake/GpuboxVersion.cmake)
}  // namespace detail

namespace cli {
namespace {

bool any_of(int argc, char** argv, int first, std::initializer_list<const char*> names) {
  for (int i = first; i < argc; ++i) {
    // The value of -o is a key=value, never a request.
    if (std::strcmp(argv[i], "-o") == 0 || std::strcmp(argv[i], "--o") == 0) {
      ++i;
      continue;
    }
    for (const char* name : names) {
      if (std::strcmp(argv[i], name) == 0) return true;
    }
  }
  return false;
}

// `text` as lines of at most `width` columns (words kept whole), each after `indent`.
void wrap(std::ostringstream& out, const std::string& text, std::size_t indent, std::size_t width) {
  std::istringstream words(text);
  std::string word;
  std::size_t column = 0;
  while (words >> word) {
    if (column > 0 && column + 1 + word.size() > width) {
      out << '\n';
      column = 0;
    }
    if (column == 0) {
      out << std::string(indent, ' ') << word;
      column = indent + word.size();
    } else {
      out << ' ' << word;
      column += 1 + word.size();
    }
  }
  if (column > 0) out << '\n';
}

}  // namespace

std::string version_text(const std::string& tool) {
  return tool + " " GPUBOX_VERSION " (commit " + detail::kBuildCommit +
         ", backend " GPUBOX_BACKEND_NAME ")";
}

bool asks_for_help(int argc, char** argv, int first) {
  return any_of(argc, argv, first, {"--help", "-h", "-help", "--helpfull", "-helpfull"});
}

bool asks_for_version(int argc, char** argv, int first) {
  return any_of(argc, argv, first, {"--version", "-version"});
}

bool answer_help_or_version(int argc, char** argv, const std::string& tool,
                            const std::function<std::string()>& usage) {
  if (asks_for_version(argc, argv)) {
    std::printf("%s\n", version_text(tool).c_str());
    return true;
  }
  if (asks_for_help(argc, argv)) {
    std::fputs(usage().c_str(), stdout);
    return true;
  }
  return false;
}

std::string render_usage(const Usage& usage) {
  constexpr std::size_t kWidth = 100;
  std::ostringstream out;
  out << "usage: " << usage.synopsis << "\n\n";
  wrap(out, usage.summary, 0, kWidth);
  if (!usage.options.empty()) {
    out << "\noptions:\n";
    for (const Option& o : usage.options) {
      out << "  " << o.name;
      if (!o.default_text.empty()) out << " (default: " << o.default_text << ")";
      out << '\n';
      wrap(out, o.meaning, 6, kWidth);
    }
  }
  if (!usage.examples.empty()) {
    out << (usage.examples.size() == 1 ? "\nexample:\n" : "\nexamples:\n");
    for (const std::string& e : usage.examples) out << "  " << e << '\n';
  }
  if (!usage.notes.empty()) out << '\n' << usage.notes << (usage.notes.back() == '\n' ? "" : "\n");
  return out.str();
}

}  // namespace cli
}  // namespace gpubox
