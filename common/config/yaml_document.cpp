#include "common/config/detail/yaml_document.hpp"

#include <yaml-cpp/eventhandler.h>

#include <sstream>

namespace gpubox::config::detail {
namespace {

// Where each document starts, and where its first node is (what an error names), from yaml-cpp's
// event parser: its documents can be counted without building them.
class DocumentMarks : public YAML::EventHandler {
 public:
  const YAML::Mark& start() const { return start_; }
  const YAML::Mark& first_node() const { return first_node_; }

  void OnDocumentStart(const YAML::Mark& mark) override {
    start_ = mark;
    first_node_ = mark;
    seen_node_ = false;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    node(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnMapEnd() override {}

 private:
  void node(const YAML::Mark& mark) {
    if (!seen_node_) first_node_ = mark;
    seen_node_ = true;
  }

  YAML::Mark start_;
  YAML::Mark first_node_;
  bool seen_node_ = false;
};

std::string line_of(const YAML::Mark& mark) {
  return mark.line >= 0 ? ":" + std::to_string(mark.line + 1) : "";
}

// How many documents the text holds (1 is all a config needs to know past the second), or an
// error naming the line where the parser stopped advancing.
StatusOr<int> count_documents(const std::string& yaml_text, const std::string& source,
                              YAML::Mark* second) {
  std::istringstream in(yaml_text);
  YAML::Parser parser(in);
  DocumentMarks marks;
  int documents = 0;
  int previous_pos = -1;
  while (parser.HandleNextDocument(marks)) {
    if (marks.start().pos == previous_pos) {
      return Status::InvalidArgument(source + line_of(marks.start()) +
                                     ": YAML syntax error: the parser cannot read past this "
                                     "line (a ',' or other flow token outside [] or {}?)");
    }
    previous_pos = marks.start().pos;
    if (++documents == 2) *second = marks.first_node();
  }
  return documents;
}

}  // namespace

StatusOr<YAML::Node> read_one_document(const std::string& yaml_text, const std::string& source) {
  try {
    YAML::Mark second;
    StatusOr<int> documents = count_documents(yaml_text, source, &second);
    if (!documents.ok()) return documents.status();
    if (*documents > 1) {
      return Status::InvalidArgument(
          source + line_of(second) + ": a second YAML document (after '---'): a config is one " +
          "document (" + std::to_string(*documents) + " found); merge them or remove the '---'");
    }
    return *documents == 0 ? YAML::Node() : YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(source + ":" + std::to_string(e.mark.line + 1) +
                                   ": YAML syntax error: " + e.msg);
  }
}

}  // namespace gpubox::config::detail
