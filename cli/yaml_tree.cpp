#include "cli/yaml_tree.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/strings.h"

namespace llmtrain::cli {

std::string Diagnostic::format() const {
  std::string out = where.empty() ? "" : where + ": ";
  if (!key.empty()) out += key + ": ";
  out += message;
  if (!hint.empty()) out += "\n  hint: " + hint;
  return out;
}

const YamlValue* YamlValue::find(const std::string& key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

YamlValue* YamlValue::find(const std::string& key) {
  for (auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

std::string YamlValue::describe() const {
  switch (kind) {
    case Kind::null:
      return "nothing (null)";
    case Kind::sequence:
      return "a list";
    case Kind::map:
      return "a map";
    case Kind::scalar:
      return quoted ? fmt::format("the quoted string \"{}\"", scalar) : fmt::format("\"{}\"", scalar);
  }
  return "?";
}

namespace {

std::string mark_where(const std::string& name, const YAML::Mark& m) {
  if (m.line < 0) return name;
  return fmt::format("{}:{}:{}", name, m.line + 1, m.column + 1);
}

// Bounds on what a recipe may expand to. Real recipes nest 4 levels and hold a few hundred values;
// YAML aliases can make a small file expand exponentially (a "billion laughs"), so the values
// are counted as the tree is built, aliases expanded.
constexpr int kMaxDepth = 32;
constexpr int64_t kMaxValues = 100000;

struct Budget {
  int64_t values = 0;
  bool exhausted = false;
};

// A problem with a key or a scalar's text (control characters, bytes that are not UTF-8).
void check_text(const std::string& text, const std::string& where, const std::string& path, const char* what,
                std::vector<Diagnostic>& diags) {
  const std::string problem = text_problem(text);
  if (!problem.empty())
    diags.push_back({where, path, fmt::format("{} holds {}", what, problem),
                     "recipe values are single lines of UTF-8 text without control characters"});
}

YamlValue convert(const YAML::Node& node, const std::string& name, const std::string& origin, const std::string& path,
                  std::vector<Diagnostic>& diags, Budget& budget, int depth = 0) {
  YamlValue v;
  v.where = origin.empty() ? mark_where(name, node.Mark()) : origin;
  if (budget.exhausted) return v;
  if (++budget.values > kMaxValues || depth > kMaxDepth) {
    budget.exhausted = true;
    diags.push_back({v.where, path,
                     depth > kMaxDepth ? fmt::format("the recipe nests deeper than {} levels", kMaxDepth)
                                       : fmt::format("the recipe expands to more than {} values", kMaxValues),
                     "a recipe is a few small maps; YAML aliases (*name) that repeat anchors (&name) can expand "
                     "without bound: write the values out"});
    return v;
  }
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      v.kind = YamlValue::Kind::null;
      break;
    case YAML::NodeType::Scalar:
      v.kind = YamlValue::Kind::scalar;
      v.scalar = node.Scalar();
      v.quoted = node.Tag() == "!";  // yaml-cpp tags non-plain (quoted) scalars "!"
      check_text(v.scalar, v.where, path, "the value", diags);
      break;
    case YAML::NodeType::Sequence:
      v.kind = YamlValue::Kind::sequence;
      for (size_t i = 0; i < node.size(); ++i)
        v.items.push_back(convert(node[i], name, origin, fmt::format("{}[{}]", path, i), diags, budget, depth + 1));
      break;
    case YAML::NodeType::Map:
      v.kind = YamlValue::Kind::map;
      for (auto it = node.begin(); it != node.end(); ++it) {
        if (!it->first.IsScalar()) {
          diags.push_back({origin.empty() ? mark_where(name, it->first.Mark()) : origin, path,
                           "map keys must be plain names", "write keys as `name: value`"});
          continue;
        }
        std::string key = it->first.Scalar();
        std::string child_path = path.empty() ? key : path + "." + key;
        const std::string key_where = origin.empty() ? mark_where(name, it->first.Mark()) : origin;
        if (!text_problem(key).empty()) {
          check_text(key, key_where, path, "a key", diags);
          continue;
        }
        if (v.find(key)) {
          diags.push_back({origin.empty() ? mark_where(name, it->first.Mark()) : origin, child_path,
                           fmt::format("duplicate key (first given at {})", v.find(key)->where),
                           "remove one of the two; YAML keeps neither silently here"});
          continue;
        }
        YamlValue child = convert(it->second, name, origin, child_path, diags, budget, depth + 1);
        child.key_where = origin.empty() ? mark_where(name, it->first.Mark()) : origin;
        v.entries.push_back({key, std::move(child)});
      }
      break;
  }
  return v;
}

}  // namespace

YamlValue yaml_load_string(const std::string& text, const std::string& name, std::vector<Diagnostic>& diags) {
  try {
    YAML::Node root = YAML::Load(text);
    Budget budget;
    YamlValue tree = convert(root, name, "", "", diags, budget);
    tree.key_where = name + ":1:1";  // a missing top-level key is reported at the top of the file
    return tree;
  } catch (const YAML::ParserException& e) {
    diags.push_back({mark_where(name, e.mark), "", fmt::format("YAML syntax error: {}", e.msg),
                     "check indentation (spaces, not tabs), colons after keys and matching brackets/quotes"});
  } catch (const YAML::Exception& e) {
    diags.push_back({name, "", fmt::format("YAML error: {}", e.what()), ""});
  }
  return {};
}

YamlValue yaml_load_file(const std::string& path, std::vector<Diagnostic>& diags) {
  // A regular file of bounded size: a FIFO would block the open, /dev/zero never end.
  constexpr std::streamsize kMaxBytes = 4 << 20;
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    diags.push_back({path, "", "the recipe is not a regular file (a directory, a device or a pipe)",
                     "give the path of a .yaml file; recipes/ has examples (recipes/tiny.yaml)", /*io=*/true});
    return {};
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    diags.push_back({path, "", fmt::format("cannot read the recipe file: {}", std::strerror(errno)),
                     "check the path; recipes/ has examples (recipes/tiny.yaml)", /*io=*/true});
    return {};
  }
  std::string text(size_t(kMaxBytes) + 1, '\0');
  in.read(text.data(), kMaxBytes + 1);
  text.resize(size_t(in.gcount()));
  if (text.size() > size_t(kMaxBytes)) {
    diags.push_back({path, "", fmt::format("the recipe is larger than {} MiB", kMaxBytes >> 20),
                     "a recipe is a few kilobytes of YAML: is this the right file?", /*io=*/true});
    return {};
  }
  return yaml_load_string(text, path, diags);
}

void yaml_apply_override(YamlValue& root, const std::string& assignment, std::vector<Diagnostic>& diags) {
  std::string origin = "--set " + assignment;
  auto eq = assignment.find('=');
  const std::vector<std::string> parts = split(assignment.substr(0, std::min(eq, assignment.size())), '.');
  if (eq == std::string::npos || !std::all_of(parts.begin(), parts.end(), is_identifier)) {
    diags.push_back({origin, "", "expected key=value with a dotted key, e.g. --set train.steps=100",
                     "keys are recipe paths such as model.layers or optimizer.lr"});
    return;
  }
  std::string key = assignment.substr(0, eq);
  std::string text = assignment.substr(eq + 1);
  std::vector<Diagnostic> local;
  YamlValue value;
  try {
    Budget budget;
    value = convert(YAML::Load(text), "", origin, key, local, budget);
  } catch (const YAML::Exception& e) {
    diags.push_back({origin, key, fmt::format("cannot parse the value as YAML: {}", e.what()),
                     "quote strings with special characters, e.g. --set name='\"my run\"'"});
    return;
  }
  diags.insert(diags.end(), local.begin(), local.end());

  if (root.kind == YamlValue::Kind::null) root.kind = YamlValue::Kind::map;
  YamlValue* cur = &root;
  std::string walked;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    walked = walked.empty() ? part : walked + "." + part;
    if (cur->kind != YamlValue::Kind::map) {
      diags.push_back({origin, walked,
                       fmt::format("cannot set a key inside {} (given at {})", cur->describe(), cur->where),
                       "override a whole value, or fix the recipe so that this is a section"});
      return;
    }
    YamlValue* next = cur->find(part);
    if (dot == std::string::npos) {
      value.key_where = origin;
      if (next)
        *next = std::move(value);
      else
        cur->entries.push_back({part, std::move(value)});
      return;
    }
    if (!next) {
      YamlValue section;
      section.kind = YamlValue::Kind::map;
      section.where = origin;
      section.key_where = origin;
      cur->entries.push_back({part, std::move(section)});
      next = &cur->entries.back().second;
    }
    cur = next;
    start = dot + 1;
  }
}

}  // namespace llmtrain::cli
