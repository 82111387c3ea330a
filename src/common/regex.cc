#include "common/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace ckpt {

struct Regex::Code {
  pcre2_code* code = nullptr;
  explicit Code(pcre2_code* c) : code(c) {}
  ~Code() { pcre2_code_free(code); }
  Code(const Code&) = delete;
  Code& operator=(const Code&) = delete;
};

namespace {

std::string ErrorText(int code) {
  PCRE2_UCHAR buffer[256];
  int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  if (n < 0) return "PCRE2 error " + std::to_string(code);
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(n));
}

// Owners of PCRE2's per-call objects.
struct MatchData {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  explicit MatchData(const pcre2_code* code)
      : data(pcre2_match_data_create_from_pattern(code, nullptr)), context(pcre2_match_context_create(nullptr)) {
    if (context) {
      pcre2_set_match_limit(context, Regex::kMatchLimit);
      pcre2_set_depth_limit(context, Regex::kMatchLimit);
    }
  }
  ~MatchData() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
  }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
};

// Runs the search; >0 on a match, 0 for no match, an error status otherwise.
Result<int> Run(const pcre2_code* code, MatchData& md, std::string_view subject, const std::string& pattern) {
  if (!md.data || !md.context) return ResourceExhausted("cannot allocate PCRE2 match data");
  if (subject.size() > Regex::kMaxSubject)
    return InvalidArgument("a name of " + std::to_string(subject.size()) + " bytes is longer than the " +
                           std::to_string(Regex::kMaxSubject) + " a pattern is matched against");
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0, 0, md.data,
                             md.context);
  if (rc == PCRE2_ERROR_NOMATCH) return 0;
  if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT)
    return InvalidArgument("pattern /" + pattern + "/ needs more than " + std::to_string(Regex::kMatchLimit) +
                           " steps on a name (a pathological pattern)");
  if (rc < 0) return InvalidArgument("pattern /" + pattern + "/: " + ErrorText(rc));
  return rc == 0 ? 1 : rc;  // 0: the ovector was too small (cannot happen: sized from the pattern)
}

}  // namespace

Result<Regex> Regex::Compile(const std::string& text) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, &error, &offset, nullptr);
  if (!code) {
    return InvalidArgument("bad regular expression /" + text + "/ at offset " + std::to_string(offset) + ": " +
                           ErrorText(error));
  }
  // JIT-compile where the platform allows (plans match every tensor name against every
  // rule); pcre2_match falls back to the interpreter otherwise. The match limit holds for both.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  uint32_t count = 0;
  pcre2_pattern_info(code, PCRE2_INFO_CAPTURECOUNT, &count);
  Regex r;
  r.text_ = text;
  r.groups_ = count;
  r.code_ = std::make_shared<const Code>(code);
  return r;
}

Result<std::vector<std::string>> Regex::Search(std::string_view subject) const {
  if (!code_) return InvalidArgument("empty regular expression object");
  MatchData md(code_->code);
  CKPT_ASSIGN_OR_RETURN(int rc, Run(code_->code, md, subject, text_));
  std::vector<std::string> groups;
  if (rc == 0) return groups;
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.data);
  groups.resize(groups_ + 1);
  for (size_t g = 0; g <= groups_ && g < static_cast<size_t>(rc); ++g) {
    if (ov[2 * g] == PCRE2_UNSET) continue;
    groups[g] = std::string(subject.substr(ov[2 * g], ov[2 * g + 1] - ov[2 * g]));
  }
  return groups;
}

Result<std::string> Regex::Substitute(std::string_view subject, const std::string& format) const {
  if (!code_) return InvalidArgument("empty regular expression object");
  MatchData md(code_->code);
  CKPT_ASSIGN_OR_RETURN(int rc, Run(code_->code, md, subject, text_));
  if (rc == 0) return InvalidArgument("'" + std::string(subject) + "' does not match /" + text_ + "/");
  std::string out(subject.size() + format.size() + 64, '\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    PCRE2_SIZE length = out.size();
    const int n = pcre2_substitute(
        code_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0,
        PCRE2_SUBSTITUTE_MATCHED | PCRE2_SUBSTITUTE_REPLACEMENT_ONLY | PCRE2_SUBSTITUTE_UNSET_EMPTY |
            PCRE2_SUBSTITUTE_OVERFLOW_LENGTH,
        md.data, md.context, reinterpret_cast<PCRE2_SPTR>(format.data()), format.size(),
        reinterpret_cast<PCRE2_UCHAR*>(out.data()), &length);
    if (n == PCRE2_ERROR_NOMEMORY) {
      out.assign(length + 1, '\0');
      continue;
    }
    if (n < 0) return InvalidArgument("template '" + format + "' for /" + text_ + "/: " + ErrorText(n));
    out.resize(length);
    return out;
  }
  return Internal("pcre2_substitute kept asking for more room");
}

Result<size_t> Regex::MaxGroupReferenced(const std::string& format) {
  size_t most = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '$') continue;
    if (i + 1 < format.size() && format[i + 1] == '$') {
      ++i;
      continue;
    }
    size_t j = i + 1;
    const bool braced = j < format.size() && format[j] == '{';
    if (braced) ++j;
    size_t start = j, n = 0;
    while (j < format.size() && format[j] >= '0' && format[j] <= '9' && j - start < 6) n = n * 10 + (format[j++] - '0');
    if (j == start || (braced && (j >= format.size() || format[j] != '}')))
      return InvalidArgument("template '" + format + "': '$' at " + std::to_string(i) +
                             " is neither $$ nor a group reference ($1, ${12})");
    most = std::max(most, n);
    i = braced ? j : j - 1;
  }
  return most;
}

}  // namespace ckpt
