#include "common/side_file_name.h"

#include <string>

#include "common/hex.h"

namespace ckpt {

namespace {

bool LetterOrDigit(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Status CheckSideFileName(std::string_view name) {
  const auto refuse = [&](const std::string& why) {
    return InvalidArgument("side file name '" + EscapedForMessage(name, 80) + "' " + why);
  };
  if (name.empty() || name.size() > kMaxSideFileNameBytes) {
    return refuse("must be 1 to " + std::to_string(kMaxSideFileNameBytes) + " bytes");
  }
  if (!LetterOrDigit(name[0])) return refuse("must begin with a letter or digit");
  for (char c : name) {
    if (!LetterOrDigit(c) && c != '.' && c != '_' && c != '-') {
      return refuse("may hold only letters, digits, '.', '_' and '-'");
    }
  }
  for (std::string_view suffix : {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".index.json"}) {
    if (EndsWith(name, suffix)) {
      return refuse("is a checkpoint file's name (ending in '" + std::string(suffix) +
                    "'): persist writes the tensors' own files, and a loader would take it for weights");
    }
  }
  return Status::Ok();
}

}  // namespace ckpt
