#include "util/bounded_json.h"

#include <deque>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace qhx {
namespace {

using Json = nlohmann::ordered_json;

// nlohmann's SAX interface, building the document itself. An open object collects its members in
// a deque (stable addresses: a key's index refers to its text there) and becomes an ordered map
// once it closes, so each key is found in constant time and moved, never copied.
class Builder {
 public:
  Builder(const JsonBounds& bounds, std::string* error) : bounds_(bounds), error_(error) {
    stack_.reserve(bounds.max_depth);  // never reallocated: the open entries stay in place
  }

  Json& root() { return root_; }

  bool null() { return value(nullptr); }
  bool boolean(bool v) { return value(v); }
  bool number_integer(Json::number_integer_t v) { return value(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return value(v); }
  bool number_float(Json::number_float_t v, const std::string&) { return value(v); }
  bool string(std::string& v) { return value(std::move(v)); }
  bool binary(Json::binary_t& v) { return value(std::move(v)); }

  bool start_object(size_t) { return open(/*object=*/true); }
  bool key(std::string& name) {
    Open& top = stack_.back();
    const auto found = top.keys.find(name);
    if (found != top.keys.end()) {
      top.slot = &top.members[found->second].second;
      *top.slot = nullptr;
      return true;
    }
    if (top.members.size() >= bounds_.max_object_keys) {
      return fail("an object has more than " + std::to_string(bounds_.max_object_keys) + " keys");
    }
    top.members.emplace_back(std::move(name), nullptr);
    top.keys.emplace(top.members.back().first, top.members.size() - 1);
    top.slot = &top.members.back().second;
    return true;
  }
  bool end_object() {
    Open& top = stack_.back();
    auto& items = static_cast<Json::object_t::Container&>(top.node->get_ref<Json::object_t&>());
    // The ordered map is a vector underneath: appending to it skips its linear search for keys.
    items.reserve(top.members.size());
    for (auto& [name, v] : top.members) items.emplace_back(std::move(name), std::move(v));
    stack_.pop_back();
    return true;
  }

  bool start_array(size_t) { return open(/*object=*/false); }
  bool end_array() {
    stack_.pop_back();
    return true;
  }

  bool parse_error(size_t position, const std::string&, const nlohmann::json::exception& e) {
    if (error_->empty()) {
      std::string what = e.what();
      // "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error ..."
      if (const size_t colon = what.find(": "); colon != std::string::npos) {
        what = what.substr(colon + 2);
      }
      *error_ = "invalid JSON at byte " + std::to_string(position) + ": " + what;
    }
    return false;
  }

 private:
  struct Open {
    Json* node;
    std::deque<std::pair<std::string, Json>> members;       // objects, in order
    std::unordered_map<std::string_view, size_t> keys;      // objects: key → member
    Json* slot = nullptr;                                   // objects: where the next value goes
  };

  // Where a new value goes: the root, the end of the open array, or the open object's key.
  Json* place() {
    if (stack_.empty()) return &root_;
    Open& top = stack_.back();
    if (top.node->is_array()) {
      auto& items = top.node->get_ref<Json::array_t&>();
      if (items.size() >= bounds_.max_array_length) {
        fail("an array has more than " + std::to_string(bounds_.max_array_length) + " elements");
        return nullptr;
      }
      items.emplace_back();
      return &items.back();
    }
    return top.slot;
  }

  template <typename T>
  bool value(T&& v) {
    Json* slot = place();
    if (slot == nullptr) return false;
    *slot = Json(std::forward<T>(v));
    return true;
  }

  bool open(bool object) {
    if (stack_.size() >= bounds_.max_depth) {
      return fail("nested deeper than " + std::to_string(bounds_.max_depth) + " levels");
    }
    Json* slot = place();
    if (slot == nullptr) return false;
    *slot = object ? Json::object() : Json::array();
    stack_.emplace_back().node = slot;
    return true;
  }

  bool fail(std::string why) {
    *error_ = std::move(why);
    return false;
  }

  const JsonBounds& bounds_;
  std::string* error_;
  Json root_;
  std::vector<Open> stack_;
};

}  // namespace

std::optional<nlohmann::ordered_json> parse_bounded_json(std::string_view text,
                                                         const JsonBounds& bounds,
                                                         std::string* error) {
  std::string why;
  Builder builder(bounds, &why);
  const bool ok = Json::sax_parse(text.begin(), text.end(), &builder);
  if (!ok) {
    if (error != nullptr) *error = why.empty() ? "invalid JSON" : why;
    return std::nullopt;
  }
  return std::move(builder.root());
}

}  // namespace qhx
