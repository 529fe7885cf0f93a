// The shipped configs and the config reference document exactly THE key table: every key appears
// in each configs/*.yaml once, its line's comment is the table's (plus "(default: D)" when the
// file sets another value), and docs/config-reference.md's key list is the table rendered
// (gpubox_train --print_config_keys; scripts/gen_config_reference.sh writes the file).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "common/config/config_document.hpp"

namespace gpubox::config {
namespace {
namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<fs::path> shipped_configs() {
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(fs::path(GPUBOX_SOURCE_DIR) / "configs")) {
    if (entry.path().extension() == ".yaml") out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// One `key: value  # comment` line of a config, with its dotted key.
struct KeyLine {
  int line = 0;
  std::string comment;  // after "# ", "" when none
};

// The key lines of a config written the way the shipped ones are: two spaces per level, one
// key per line, comments after '#' (no '#' inside values).
std::map<std::string, std::vector<KeyLine>> key_lines(const fs::path& path) {
  std::map<std::string, std::vector<KeyLine>> out;
  std::ifstream in(path);
  std::string text;
  std::vector<std::string> open;  // section names by depth
  for (int number = 1; std::getline(in, text); ++number) {
    const auto first = text.find_first_not_of(' ');
    if (first == std::string::npos || text[first] == '#') continue;
    const auto colon = text.find(':', first);
    EXPECT_NE(colon, std::string::npos) << path << ":" << number;
    if (colon == std::string::npos) continue;
    EXPECT_EQ(first % 2, 0u) << path << ":" << number << ": indentation";
    const std::size_t depth = first / 2;
    open.resize(std::min(open.size(), depth));
    std::string name;
    for (const std::string& s : open) name += s + ".";
    name += text.substr(first, colon - first);
    const auto hash = text.find('#', colon);
    const std::string value =
        text.substr(colon + 1, hash == std::string::npos ? std::string::npos : hash - colon - 1);
    if (value.find_first_not_of(' ') == std::string::npos && find_key(name) == nullptr) {
      open.push_back(text.substr(first, colon - first));  // a section header
      continue;
    }
    KeyLine k;
    k.line = number;
    if (hash != std::string::npos) {
      k.comment = text.substr(hash + 1);
      if (!k.comment.empty() && k.comment[0] == ' ') k.comment.erase(0, 1);
    }
    out[name].push_back(k);
  }
  return out;
}

TEST(ConfigDocs, ShippedConfigsDocumentEveryKeyAsTheTableDoes) {
  const std::vector<fs::path> configs = shipped_configs();
  ASSERT_GE(configs.size(), 3u);
  for (const fs::path& path : configs) {
    auto doc = ConfigDocument::load(path.string());
    ASSERT_TRUE(doc.ok()) << doc.status().to_string();
    const auto lines = key_lines(path);
    for (const auto& [name, found] : lines) {
      EXPECT_NE(find_key(name), nullptr) << path << ": " << name << " is not a key";
    }
    for (const KeySpec& key : config_keys()) {
      auto it = lines.find(key.name);
      if (it == lines.end()) {
        ADD_FAILURE() << path.filename() << " does not show " << key.name;
        continue;
      }
      ASSERT_EQ(it->second.size(), 1u) << path << ": " << key.name;
      const KeyLine& line = it->second[0];
      const std::string want =
          yaml_comment(key) +
          (doc->is_default(key.name) ? "" : " (default: " + key.default_text + ")");
      EXPECT_EQ(line.comment, want) << path.filename().string() << ":" << line.line << ": "
                                    << key.name << ": the comment should be '# " << want << "'";
    }
  }
}

TEST(ConfigDocs, ConfigReferenceIsTheRenderedTable) {
  const fs::path path = fs::path(GPUBOX_SOURCE_DIR) / "docs" / "config-reference.md";
  const std::string reference = read_file(path);
  ASSERT_FALSE(reference.empty()) << path << " is missing or empty";
  const std::string begin = "<!-- config keys: begin -->\n";
  const std::string end = "<!-- config keys: end -->";
  const auto b = reference.find(begin);
  const auto e = reference.find(end);
  ASSERT_NE(b, std::string::npos) << path << " has no '" << begin << "' marker";
  ASSERT_NE(e, std::string::npos) << path << " has no '" << end << "' marker";
  ASSERT_LT(b, e);
  EXPECT_EQ(reference.substr(b + begin.size(), e - b - begin.size()), render_markdown_key_table())
      << path << " is stale: regenerate it with scripts/gen_config_reference.sh";
}

// The README no longer carries the key list: one copy, generated, so it cannot drift.
TEST(ConfigDocs, ReadmeHoldsNoCopyOfTheKeyList) {
  const std::string readme = read_file(fs::path(GPUBOX_SOURCE_DIR) / "README.md");
  ASSERT_FALSE(readme.empty());
  EXPECT_EQ(readme.find("<!-- config keys: begin -->"), std::string::npos)
      << "README.md holds a copy of the key list: link docs/config-reference.md instead";
}

}  // namespace
}  // namespace gpubox::config
