#include "format/json_keys.h"

#include <nlohmann/json.hpp>
#include <unordered_set>

namespace ckpt::format {
namespace {

using nlohmann::json;

class DuplicateKeyFinder final : public nlohmann::json_sax<json> {
 public:
  DuplicateKeyFinder(int depth, const std::string& under) : depth_(depth), under_(under) {}
  const std::optional<std::string>& duplicate() const { return duplicate_; }

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    ++level_;
    if (level_ == depth_ && Watched()) keys_.clear();  // a new object whose keys are counted
    return true;
  }
  bool end_object() override {
    --level_;
    return true;
  }
  bool start_array(std::size_t) override {
    ++level_;
    return true;
  }
  bool end_array() override {
    --level_;
    return true;
  }
  bool key(string_t& k) override {
    if (level_ == 1) top_key_ = k;
    if (level_ != depth_ || !Watched()) return true;
    if (!keys_.insert(k).second) {
      duplicate_ = k;
      return false;  // stop: found
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  // Whether the object at depth_ is one whose keys are counted.
  bool Watched() const { return depth_ == 1 || top_key_ == under_; }

  const int depth_;
  const std::string under_;
  int level_ = 0;
  std::string top_key_;
  std::unordered_set<std::string> keys_;
  std::optional<std::string> duplicate_;
};

}  // namespace

std::optional<std::string> FirstDuplicateKey(std::string_view json_text, int depth, const std::string& under) {
  DuplicateKeyFinder finder(depth, under);
  json::sax_parse(json_text.begin(), json_text.end(), &finder, nlohmann::detail::input_format_t::json, true);
  return finder.duplicate();
}

}  // namespace ckpt::format
