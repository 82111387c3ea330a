#include "remote/remote_client.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "common/checked_math.h"

namespace ckpt::remote {
namespace {

std::string Env(const char* name) {
  const char* v = secure_getenv(name);
  return v ? std::string(v) : std::string();
}

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// An AWS shared file (credentials or config): section -> key -> value. NotFound if it
// does not exist; InvalidArgument for a line that is neither. Never echoes a value.
using IniFile = std::map<std::string, std::map<std::string, std::string>>;
Result<IniFile> ReadIni(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    if (::access(path.c_str(), F_OK) != 0) return NotFound(path);
    return InvalidArgument("cannot read " + path);
  }
  IniFile out;
  std::string section, line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    line = Trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = Trim(line.substr(1, line.size() - 2));
      if (section.compare(0, 8, "profile ") == 0) section = Trim(section.substr(8));
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos) return InvalidArgument(path + " line " + std::to_string(number) + ": not 'key = value'");
    out[section][Lower(Trim(line.substr(0, eq)))] = Trim(line.substr(eq + 1));
  }
  return out;
}

std::string HomeFile(const char* rel) {
  const std::string home = Env("HOME");
  return home.empty() ? std::string() : home + "/" + rel;
}

// RFC 3986 unreserved characters kept; '/' kept when `keep_slash`. SigV4's URI encoding.
std::string UriEncode(const std::string& s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// The text between <tag> and </tag> in an S3 error document, or "".
std::string XmlField(const std::string& xml, const std::string& tag) {
  const size_t b = xml.find("<" + tag + ">");
  if (b == std::string::npos) return "";
  const size_t start = b + tag.size() + 2;
  const size_t e = xml.find("</" + tag + ">", start);
  if (e == std::string::npos) return "";
  return xml.substr(start, std::min<size_t>(e - start, 300));
}

bool ParseU64(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    auto m = CheckedMul(v, 10);
    if (!m) return false;
    auto a = CheckedAdd(*m, static_cast<uint64_t>(c - '0'));
    if (!a) return false;
    v = *a;
  }
  *out = v;
  return true;
}

size_t StringWrite(char* data, size_t size, size_t n, void* userdata) {
  auto* sink = static_cast<std::pair<std::string*, uint64_t>*>(userdata);
  const size_t bytes = size * n;
  if (sink->first->size() + bytes > sink->second) return 0;  // more than asked: the caller says why
  sink->first->append(data, bytes);
  return bytes;
}

}  // namespace

Result<std::shared_ptr<const RemoteClient>> RemoteClient::Create(const RemoteOptions& options) {
  static const CURLcode global = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (global != CURLE_OK) return Internal(std::string("curl_global_init: ") + curl_easy_strerror(global));
  std::shared_ptr<RemoteClient> c(new RemoteClient());
  c->options_ = options;
  const std::string profile = !options.profile.empty() ? options.profile
                              : !Env("AWS_PROFILE").empty() ? Env("AWS_PROFILE")
                                                            : std::string("default");
  // The config file: region and endpoint_url of the profile.
  std::map<std::string, std::string> config;
  {
    std::string path = !options.config_file.empty() ? options.config_file : Env("AWS_CONFIG_FILE");
    if (path.empty()) path = HomeFile(".aws/config");
    if (!path.empty()) {
      auto ini = ReadIni(path);
      if (ini.ok()) {
        config = (*ini)[profile];
      } else if (ini.status().code() != StatusCode::kNotFound) {
        return ini.status();
      }
    }
  }
  // Credentials: the environment, then systemd's credentials directory (LoadCredential=
  // aws-credentials, shared-file format), then the shared credentials file.
  if (!Env("AWS_ACCESS_KEY_ID").empty() && !Env("AWS_SECRET_ACCESS_KEY").empty()) {
    c->access_key_ = Env("AWS_ACCESS_KEY_ID");
    c->secret_key_ = Env("AWS_SECRET_ACCESS_KEY");
    c->session_token_ = Env("AWS_SESSION_TOKEN");
    c->credentials_from_ = "environment";
  } else {
    std::vector<std::string> files;
    if (!Env("CREDENTIALS_DIRECTORY").empty()) files.push_back(Env("CREDENTIALS_DIRECTORY") + "/aws-credentials");
    std::string shared = !options.credentials_file.empty() ? options.credentials_file : Env("AWS_SHARED_CREDENTIALS_FILE");
    if (shared.empty()) shared = HomeFile(".aws/credentials");
    if (!shared.empty()) files.push_back(shared);
    for (const std::string& path : files) {
      auto ini = ReadIni(path);
      if (!ini.ok()) {
        if (ini.status().code() == StatusCode::kNotFound) continue;
        return ini.status();
      }
      auto& section = (*ini)[profile];
      if (section.count("aws_access_key_id") && section.count("aws_secret_access_key")) {
        c->access_key_ = section["aws_access_key_id"];
        c->secret_key_ = section["aws_secret_access_key"];
        c->session_token_ = section.count("aws_session_token") ? section["aws_session_token"] : "";
        c->credentials_from_ = path + " [" + profile + "]";
        break;
      }
    }
  }
  if (c->access_key_.find(':') != std::string::npos) return InvalidArgument("an AWS access key id with ':' in it");
  c->region_ = !options.region.empty()                 ? options.region
               : !Env("AWS_REGION").empty()            ? Env("AWS_REGION")
               : !Env("AWS_DEFAULT_REGION").empty()    ? Env("AWS_DEFAULT_REGION")
               : config.count("region")                ? config["region"]
                                                       : std::string("us-east-1");
  for (char ch : c->region_) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-') return InvalidArgument("bad AWS region '" + c->region_ + "'");
  }
  std::string endpoint = !options.s3_endpoint.empty()         ? options.s3_endpoint
                         : !Env("AWS_ENDPOINT_URL_S3").empty() ? Env("AWS_ENDPOINT_URL_S3")
                         : !Env("AWS_ENDPOINT_URL").empty()    ? Env("AWS_ENDPOINT_URL")
                         : config.count("endpoint_url")        ? config["endpoint_url"]
                                                               : "https://s3." + c->region_ + ".amazonaws.com";
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  if (endpoint.compare(0, 7, "http://") != 0 && endpoint.compare(0, 8, "https://") != 0) {
    return InvalidArgument("S3 endpoint '" + endpoint.substr(0, 200) + "' is not an http:// or https:// URL");
  }
  if (endpoint.find('@') != std::string::npos || endpoint.find_first_of("?#") != std::string::npos) {
    return InvalidArgument("S3 endpoint with credentials, a query or a fragment");
  }
  c->endpoint_ = endpoint;
  c->ca_file_ = !options.ca_file.empty()          ? options.ca_file
                : !Env("AWS_CA_BUNDLE").empty()   ? Env("AWS_CA_BUNDLE")
                : !Env("CURL_CA_BUNDLE").empty()  ? Env("CURL_CA_BUNDLE")
                                                  : std::string();
  if (options.connections < 1 || options.threads < 1 || options.max_attempts < 1 || options.chunk_bytes < 4096) {
    return InvalidArgument("remote options: connections, threads and attempts must be at least 1, chunks 4096 bytes");
  }
  return std::shared_ptr<const RemoteClient>(std::move(c));
}

std::string RemoteClient::Describe() const {
  std::string s = "s3 endpoint " + endpoint_ + (options_.path_style ? " (path-style)" : "") + ", region " + region_ +
                  ", " + (access_key_.empty() ? std::string("no credentials (unsigned requests)")
                                              : "credentials from " + credentials_from_);
  if (!ca_file_.empty()) s += ", CA " + ca_file_;
  return s;
}

ObjectRef RemoteClient::Object(const RemoteUrl& url, const std::string& key) const {
  ObjectRef ref;
  if (url.scheme != RemoteUrl::Scheme::kS3) {
    ref.display = (url.scheme == RemoteUrl::Scheme::kHttps ? "https://" : "http://") + url.authority + key;
    ref.url = ref.display;
    return ref;
  }
  ref.display = "s3://" + url.bucket + "/" + key;
  if (options_.path_style) {
    ref.url = endpoint_ + "/" + url.bucket + "/" + UriEncode(key, true);
  } else {
    const size_t sep = endpoint_.find("://") + 3;
    ref.url = endpoint_.substr(0, sep) + url.bucket + "." + endpoint_.substr(sep) + "/" + UriEncode(key, true);
  }
  ref.sign = !access_key_.empty();
  return ref;
}

ObjectRef RemoteClient::Listing(const RemoteUrl& url, const std::string& prefix, const std::string& token) const {
  ObjectRef ref = Object(url, "");
  ref.display = "s3://" + url.bucket + "/" + prefix + " (listing)";
  // SigV4 wants the query's parameters sorted by name and URI-encoded.
  if (!token.empty()) ref.url += "?continuation-token=" + UriEncode(token, false) + "&list-type=2";
  else ref.url += "?list-type=2";
  ref.url += "&prefix=" + UriEncode(prefix, false);
  return ref;
}

Status RemoteClient::Configure(CURL* h, const ObjectRef& ref, uint64_t offset, uint64_t length,
                               const ObjectIdentity* pinned, curl_slist** headers) const {
  curl_easy_reset(h);
  curl_easy_setopt(h, CURLOPT_URL, ref.url.c_str());
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);  // a redirect would escape the allow list
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout_s * 1000));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>(options_.stall_timeout_s)));
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
  if (!ca_file_.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, ca_file_.c_str());
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &RemoteClient::HeaderCallback);
  // Proxies: libcurl reads http_proxy, https_proxy, no_proxy itself; nothing here turns it off.
  curl_slist* list = nullptr;
  if (length > 0) {
    const std::string range = "Range: bytes=" + std::to_string(offset) + "-" + std::to_string(offset + length - 1);
    list = curl_slist_append(list, range.c_str());
  }
  if (pinned) {
    if (!pinned->etag.empty()) {
      list = curl_slist_append(list, ("If-Match: " + pinned->etag).c_str());
    } else if (!pinned->last_modified.empty()) {
      list = curl_slist_append(list, ("If-Unmodified-Since: " + pinned->last_modified).c_str());
    }
  }
  list = curl_slist_append(list, "Accept-Encoding: identity");
  if (ref.sign) {
    list = curl_slist_append(list, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!session_token_.empty()) list = curl_slist_append(list, ("x-amz-security-token: " + session_token_).c_str());
    const std::string sigv4 = "aws:amz:" + region_ + ":s3";
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4.c_str());  // copied by libcurl
    curl_easy_setopt(h, CURLOPT_USERNAME, access_key_.c_str());
    curl_easy_setopt(h, CURLOPT_PASSWORD, secret_key_.c_str());
  }
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);
  *headers = list;
  return Status::Ok();
}

size_t RemoteClient::HeaderCallback(char* data, size_t size, size_t n, void* userdata) {
  auto* head = static_cast<ResponseHead*>(userdata);
  const size_t bytes = size * n;
  std::string line(data, bytes);
  if (line.compare(0, 5, "HTTP/") == 0) {  // a new response (after a 100 Continue, ...)
    head->Clear();
    const size_t sp = line.find(' ');
    if (sp != std::string::npos) head->status = std::atol(line.c_str() + sp + 1);
    return bytes;
  }
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return bytes;
  const std::string name = Lower(Trim(line.substr(0, colon)));
  const std::string value = Trim(line.substr(colon + 1));
  if (name == "etag") {
    head->etag = value;
  } else if (name == "last-modified") {
    head->last_modified = value;
  } else if (name == "content-length") {
    head->have_length = ParseU64(value, &head->content_length);
  } else if (name == "content-range") {
    // bytes a-b/total
    if (value.compare(0, 6, "bytes ") == 0) {
      const std::string spec = value.substr(6);
      const size_t dash = spec.find('-'), slash = spec.find('/');
      if (dash != std::string::npos && slash != std::string::npos && dash < slash) {
        head->have_range = ParseU64(spec.substr(0, dash), &head->range_first) &&
                           ParseU64(spec.substr(dash + 1, slash - dash - 1), &head->range_last) &&
                           ParseU64(spec.substr(slash + 1), &head->range_total);
      }
    }
  }
  return bytes;
}

FailureKind RemoteClient::Classify(CURLcode code, const ResponseHead& head, std::string* why) {
  if (code != CURLE_OK) {
    *why = curl_easy_strerror(code);
    switch (code) {
      case CURLE_COULDNT_CONNECT:
      case CURLE_COULDNT_RESOLVE_HOST:
      case CURLE_COULDNT_RESOLVE_PROXY:
      case CURLE_OPERATION_TIMEDOUT:
      case CURLE_PARTIAL_FILE:
      case CURLE_RECV_ERROR:
      case CURLE_SEND_ERROR:
      case CURLE_GOT_NOTHING:
      case CURLE_HTTP2:
      case CURLE_HTTP2_STREAM:
      case CURLE_SSL_CONNECT_ERROR:
        return FailureKind::kRetry;
      default:
        return FailureKind::kFatal;  // TLS verification, bad URL, a write refused: retrying cannot help
    }
  }
  const std::string code_text = XmlField(head.error_body, "Code");
  *why = "HTTP " + std::to_string(head.status) + (code_text.empty() ? "" : " " + code_text);
  const std::string message = XmlField(head.error_body, "Message");
  if (!message.empty()) *why += ": " + message;
  if (head.status >= 500 || head.status == 429 || code_text == "SlowDown" || code_text == "RequestTimeout") {
    return FailureKind::kRetry;
  }
  return FailureKind::kFatal;
}

Status RemoteClient::FatalError(const ObjectRef& ref, const std::string& why, const ResponseHead& head) const {
  const std::string prefix = ref.display + ": ";
  const std::string code = XmlField(head.error_body, "Code");
  if (head.status == 404) {
    if (code == "NoSuchBucket") return NotFound(prefix + "no such bucket (" + why + ")");
    return NotFound(prefix + "no such object (" + why + ")");
  }
  if (head.status == 401 || head.status == 403) {
    std::string hint = access_key_.empty() ? "; the daemon has no credentials (docs/remote-sources.md)"
                                           : "; check the daemon's credentials (from " + credentials_from_ + ")";
    return PermissionDenied(prefix + "access denied (" + why + ")" + hint);
  }
  if (head.status == 412) return FailedPrecondition(prefix + "changed while it was being loaded (" + why + ")");
  if (head.status == 416) return Corrupt(prefix + "the server refused the byte range (" + why + ")");
  return IoError(prefix + why);
}

Status RemoteClient::CheckResponse(const ObjectRef& ref, uint64_t offset, uint64_t length, const ResponseHead& head,
                                   ObjectIdentity* pinned, bool first) const {
  uint64_t total = 0;
  if (head.status == 206) {
    if (!head.have_range) return Corrupt(ref.display + ": a 206 response without a valid Content-Range");
    if (head.range_first != offset || head.range_last < head.range_first || head.range_last >= head.range_total) {
      return Corrupt(ref.display + ": the server sent bytes " + std::to_string(head.range_first) + "-" +
                     std::to_string(head.range_last) + " when bytes from " + std::to_string(offset) + " were asked for");
    }
    if (!first && head.range_last - head.range_first + 1 != length) {
      return Corrupt(ref.display + ": the server sent " + std::to_string(head.range_last - head.range_first + 1) +
                     " bytes of a range of " + std::to_string(length));
    }
    if (head.have_length && head.content_length != head.range_last - head.range_first + 1) {
      return Corrupt(ref.display + ": Content-Length " + std::to_string(head.content_length) +
                     " disagrees with Content-Range " + std::to_string(head.range_first) + "-" +
                     std::to_string(head.range_last));
    }
    total = head.range_total;
  } else if (head.status == 200) {
    if (!first && !(offset == 0 && length == pinned->size)) {
      return Corrupt(ref.display + ": the server ignored the Range header (200 instead of 206)");
    }
    if (offset != 0) return Corrupt(ref.display + ": the server ignored the Range header (200 instead of 206)");
    if (!head.have_length) return Corrupt(ref.display + ": a whole-object response without Content-Length");
    total = head.content_length;
  } else {
    return Internal(ref.display + ": CheckResponse of HTTP " + std::to_string(head.status));
  }
  const bool weak = head.etag.compare(0, 2, "W/") == 0;
  const std::string etag = weak ? "" : head.etag;
  if (first) {
    pinned->size = total;
    pinned->etag = etag;
    pinned->last_modified = head.last_modified;
    return Status::Ok();
  }
  if (total != pinned->size) {
    return FailedPrecondition(ref.display + ": changed while it was being loaded (size " + std::to_string(pinned->size) +
                              " became " + std::to_string(total) + ")");
  }
  if (!pinned->etag.empty() && etag != pinned->etag) {
    return FailedPrecondition(ref.display + ": changed while it was being loaded (ETag " + pinned->etag + " became " +
                              (etag.empty() ? std::string("none") : etag) + ")");
  }
  if (pinned->etag.empty() && !pinned->last_modified.empty() && head.last_modified != pinned->last_modified) {
    return FailedPrecondition(ref.display + ": changed while it was being loaded (Last-Modified " +
                              pinned->last_modified + " became " + head.last_modified + ")");
  }
  return Status::Ok();
}

std::chrono::milliseconds RemoteClient::Backoff(int attempt) const {
  double s = options_.retry_base_s;
  for (int i = 2; i < attempt && s < options_.retry_max_s; ++i) s *= 2;
  return std::chrono::milliseconds(static_cast<int64_t>(std::min(s, options_.retry_max_s) * 1000));
}

namespace {

struct EasyHandle {
  CURL* h = curl_easy_init();
  curl_slist* headers = nullptr;
  ~EasyHandle() {
    if (h) curl_easy_cleanup(h);
    if (headers) curl_slist_free_all(headers);
  }
};

}  // namespace

Result<std::string> RemoteClient::Fetch(const ObjectRef& ref, uint64_t offset, uint64_t max_length,
                                        ObjectIdentity* pinned, bool first) const {
  const auto start = std::chrono::steady_clock::now();
  uint64_t length = max_length;
  if (!first) {
    if (offset >= pinned->size) return std::string();
    length = std::min(max_length, pinned->size - offset);
  }
  std::string got;
  std::string why;
  for (int attempt = 1;; ++attempt) {
    EasyHandle e;
    if (!e.h) return ResourceExhausted("curl_easy_init failed");
    // A retry asks only for what is still missing.
    const uint64_t at = offset + got.size();
    const uint64_t want = length - got.size();
    CKPT_RETURN_IF_ERROR(Configure(e.h, ref, at, want, first && got.empty() ? nullptr : pinned, &e.headers));
    ResponseHead head;
    std::string body;
    // Room for an error document beyond the range (a 2xx body longer than asked is Corrupt).
    std::pair<std::string*, uint64_t> sink{&body, want + 65536};
    curl_easy_setopt(e.h, CURLOPT_HEADERDATA, &head);
    curl_easy_setopt(e.h, CURLOPT_WRITEFUNCTION, &StringWrite);
    curl_easy_setopt(e.h, CURLOPT_WRITEDATA, &sink);
    CURLcode rc = curl_easy_perform(e.h);
    curl_easy_getinfo(e.h, CURLINFO_RESPONSE_CODE, &head.status);
    FailureKind kind = FailureKind::kFatal;
    if (rc == CURLE_OK && (head.status == 200 || head.status == 206)) {
      const bool first_now = first && got.empty();
      CKPT_RETURN_IF_ERROR(CheckResponse(ref, at, want, head, pinned, first_now));
      const uint64_t expect = head.status == 206 ? head.range_last - head.range_first + 1 : head.content_length;
      if (body.size() > expect) {
        return Corrupt(ref.display + ": the server sent " + std::to_string(body.size()) + " bytes, more than the " +
                       std::to_string(expect) + " it announced");
      }
      if (body.size() < expect) {
        // Truncated (the transfer said OK): take what came, ask for the rest.
        why = "short body (" + std::to_string(body.size()) + " of " + std::to_string(expect) + " bytes)";
        kind = FailureKind::kRetry;
        if (first_now) {
          length = std::min<uint64_t>(length, expect);
        }
        got += body;
      } else {
        got += body;
        if (first_now) length = got.size();
        if (got.size() >= length) return got;
        continue;
      }
    } else if (rc == CURLE_WRITE_ERROR) {
      return Corrupt(ref.display + ": the server sent more bytes than the range asked for");
    } else {
      if (rc == CURLE_OK) head.error_body = body.substr(0, 4096);
      if (rc == CURLE_OK && head.status == 416 && first && got.empty()) {
        pinned->size = 0;  // an empty object
        return std::string();
      }
      kind = Classify(rc, head, &why);
      if (kind == FailureKind::kFatal) {
        if (rc != CURLE_OK) return IoError(ref.display + ": " + why);
        return FatalError(ref, why, head);
      }
      // A partial body before a reset still counts: those bytes are the pinned object's.
      if (rc != CURLE_OK && (head.status == 206 || head.status == 200) && !(first && got.empty())) got += body;
    }
    const auto elapsed = std::chrono::steady_clock::now() - start;
    const double secs = std::chrono::duration<double>(elapsed).count();
    if (attempt >= options_.max_attempts || secs >= options_.timeout_s) {
      return Unavailable(ref.display + ": giving up after " + std::to_string(attempt) + " attempts in " +
                         std::to_string(static_cast<int>(secs * 1000)) + " ms: " + why);
    }
    std::this_thread::sleep_for(Backoff(attempt + 1));
  }
}

Result<std::string> RemoteClient::FetchSmall(const ObjectRef& ref, uint64_t limit, ObjectIdentity* identity) const {
  const auto start = std::chrono::steady_clock::now();
  for (int attempt = 1;; ++attempt) {
    EasyHandle e;
    if (!e.h) return ResourceExhausted("curl_easy_init failed");
    CKPT_RETURN_IF_ERROR(Configure(e.h, ref, 0, 0, nullptr, &e.headers));
    ResponseHead head;
    std::string body;
    std::pair<std::string*, uint64_t> sink{&body, limit};
    curl_easy_setopt(e.h, CURLOPT_HEADERDATA, &head);
    curl_easy_setopt(e.h, CURLOPT_WRITEFUNCTION, &StringWrite);
    curl_easy_setopt(e.h, CURLOPT_WRITEDATA, &sink);
    CURLcode rc = curl_easy_perform(e.h);
    curl_easy_getinfo(e.h, CURLINFO_RESPONSE_CODE, &head.status);
    std::string why;
    if (rc == CURLE_WRITE_ERROR) {
      return ResourceExhausted(ref.display + ": larger than " + std::to_string(limit) + " bytes");
    }
    if (rc == CURLE_OK && head.status == 200) {
      if (head.have_length && head.content_length != body.size()) {
        why = "short body (" + std::to_string(body.size()) + " of " + std::to_string(head.content_length) + " bytes)";
      } else {
        if (identity) {
          identity->size = body.size();
          identity->etag = head.etag.compare(0, 2, "W/") == 0 ? "" : head.etag;
          identity->last_modified = head.last_modified;
        }
        return body;
      }
    } else {
      if (rc == CURLE_OK) head.error_body = body.substr(0, 4096);
      if (rc == CURLE_OK && head.status == 206) return Corrupt(ref.display + ": a 206 answer to a request without Range");
      if (Classify(rc, head, &why) == FailureKind::kFatal) {
        if (rc != CURLE_OK) return IoError(ref.display + ": " + why);
        return FatalError(ref, why, head);
      }
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (attempt >= options_.max_attempts || secs >= options_.timeout_s) {
      return Unavailable(ref.display + ": giving up after " + std::to_string(attempt) + " attempts in " +
                         std::to_string(static_cast<int>(secs * 1000)) + " ms: " + why);
    }
    std::this_thread::sleep_for(Backoff(attempt + 1));
  }
}

}  // namespace ckpt::remote
