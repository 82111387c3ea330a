#include "ctl/table.h"

#include <algorithm>
#include <cstdio>

namespace ckpt::ctl {

std::string Printable(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  auto hex = [&](const char* format, unsigned v) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), format, v);
    out += buf;
  };
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      if (c == '\\') out += "\\\\";
      else if (c == '\n') out += "\\n";
      else if (c == '\t') out += "\\t";
      else if (c == '\r') out += "\\r";
      else if (c < 0x20 || c == 0x7f) hex("\\x%02x", c);
      else out += static_cast<char>(c);
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length from the lead byte, then continuation bytes.
    size_t len = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
    if (c >= 0xf5) len = 0;
    uint32_t cp = len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    bool valid = len != 0 && i + len <= n;
    for (size_t k = 1; valid && k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) valid = false;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if (valid && ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
                  (cp >= 0xd800 && cp <= 0xdfff))) {
      valid = false;  // overlong, out of range or a surrogate
    }
    if (!valid) {
      hex("\\x%02x", c);
      ++i;
      continue;
    }
    const bool control = (cp >= 0x80 && cp <= 0x9f) || (cp >= 0x202a && cp <= 0x202e) ||
                         (cp >= 0x2066 && cp <= 0x2069) || cp == 0x2028 || cp == 0x2029;
    if (control) {
      hex("\\u%04x", cp);
    } else {
      out.append(text, i, len);
    }
    i += len;
  }
  return out;
}

std::string RenderTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows,
                        const std::vector<size_t>& right_aligned) {
  std::vector<std::vector<std::string>> safe;
  safe.reserve(rows.size());
  for (const auto& row : rows) {
    std::vector<std::string> cells;
    for (const auto& cell : row) cells.push_back(Printable(cell));
    safe.push_back(std::move(cells));
  }
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : safe) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  auto render_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < row.size() ? row[c] : "";
      const std::string pad(width[c] - cell.size(), ' ');
      bool right = std::find(right_aligned.begin(), right_aligned.end(), c) != right_aligned.end();
      line += right ? pad + cell : cell + (c + 1 < width.size() ? pad : "");
      if (c + 1 < width.size()) line += "  ";
    }
    return line + "\n";
  };
  std::string out = render_row(header);
  for (const auto& row : safe) out += render_row(row);
  return out;
}

}  // namespace ckpt::ctl
