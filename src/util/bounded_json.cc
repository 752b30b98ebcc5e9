#include "util/bounded_json.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace qhx {
namespace {

using Json = nlohmann::ordered_json;

// nlohmann's SAX interface, building the document itself. An open object collects its members in
// a vector and becomes an ordered map once it closes; repeated keys are found then, by sorting
// (n log n, no allocation per key), and merged as nlohmann's parser merges them.
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
    // Counted with repeats: the bound is on what the parser holds.
    if (top.members.size() >= bounds_.max_object_keys) {
      return fail("an object has more than " + std::to_string(bounds_.max_object_keys) + " keys");
    }
    top.members.emplace_back(std::move(name), nullptr);
    // The parent does not grow while this value is open, so the pointer stays valid.
    top.slot = &top.members.back().second;
    return true;
  }
  bool end_object() {
    Open& top = stack_.back();
    std::vector<Member>& members = top.members;
    // Members in key order (then position): a repeated key's entries are neighbours.
    std::vector<uint32_t> order(members.size());
    for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      const int c = members[a].first.compare(members[b].first);
      return c != 0 ? c < 0 : a < b;
    });
    std::vector<bool> dropped(members.size(), false);
    for (size_t i = 1, group = 0; i < order.size(); ++i) {
      if (members[order[i]].first != members[order[group]].first) {
        group = i;
        continue;
      }
      // The first position keeps the last value.
      members[order[group]].second = std::move(members[order[i]].second);
      dropped[order[i]] = true;
    }
    auto& items = static_cast<Json::object_t::Container&>(top.node->get_ref<Json::object_t&>());
    // The ordered map is a vector underneath: appending to it skips its linear search for keys.
    items.reserve(members.size());
    for (size_t i = 0; i < members.size(); ++i) {
      if (!dropped[i])
        items.emplace_back(std::move(members[i].first), std::move(members[i].second));
    }
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
  using Member = std::pair<std::string, Json>;
  struct Open {
    Json* node;
    std::vector<Member> members;  // objects, in order, repeats included
    Json* slot = nullptr;         // objects: where the next value goes
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
