// RemoteClient: how ckptd talks to object storage and HTTP servers (libcurl): credentials
// and endpoints resolved from the daemon's own environment and files, one request set-up
// (SigV4 signing, TLS trust, If-Match, timeouts, the standard proxy variables left on) for
// both the small fetches of planning and the bulk ranged GETs (http_reader.h), one reading
// of every response (status, Content-Range, ETag) and one rule for what is retried.
#pragma once

#include <curl/curl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/status.h"
#include "remote/remote_options.h"
#include "remote/remote_url.h"

namespace ckpt::remote {

// One object to GET: where, and how requests for it are made.
struct ObjectRef {
  std::string display;  // s3://bucket/key or the URL: for messages; never holds a credential
  std::string url;      // what is requested
  bool sign = false;    // SigV4 with the client's credentials (s3 with credentials)
};

// What the first response said about an object; every later range must agree.
struct ObjectIdentity {
  uint64_t size = 0;
  std::string etag;           // strong ETag as sent (quotes included); "" if none or weak
  std::string last_modified;  // as sent; used when there is no strong ETag
  // For ensure: "size etag-or-last-modified".
  std::string Fingerprint() const { return std::to_string(size) + " " + (etag.empty() ? last_modified : etag); }
};

// What one response carried (headers parsed as they came; body counted by the caller).
struct ResponseHead {
  long status = 0;
  bool have_range = false;
  uint64_t range_first = 0, range_last = 0, range_total = 0;  // Content-Range bytes a-b/total
  bool have_length = false;
  uint64_t content_length = 0;
  std::string etag, last_modified;
  std::string error_body;  // the first 4 KiB of a non-2xx body (an S3 error document)
  // Resets for a new attempt.
  void Clear() { *this = ResponseHead(); }
};

// What an attempt's failure means.
enum class FailureKind { kRetry, kFatal };

class RemoteClient {
 public:
  // Resolves endpoint, region and credentials from `options`, the environment and the
  // shared files (docs/remote-sources.md, "Credentials"), read now (each load reads them
  // again, so rotated files are picked up). No credentials found: unsigned requests.
  // InvalidArgument for an unreadable or malformed credentials file or endpoint.
  static Result<std::shared_ptr<const RemoteClient>> Create(const RemoteOptions& options);

  // The object `key` of `url`'s bucket (s3) or path on `url`'s host (http). For s3 the
  // key is URI-encoded as SigV4 wants it.
  ObjectRef Object(const RemoteUrl& url, const std::string& key) const;
  // The s3 ListObjectsV2 request of `prefix` in `url`'s bucket (continuation token if any).
  ObjectRef Listing(const RemoteUrl& url, const std::string& prefix, const std::string& token) const;

  // Sets up `h` for a GET of `ref` bytes [offset, offset + length) (length 0: the whole
  // object, no Range), conditional on `pinned` when given (If-Match with its ETag, else
  // If-Unmodified-Since). `*headers` receives the list the handle uses (freed by the caller
  // with curl_slist_free_all after the transfer). Header and write callbacks are the
  // caller's. Never disables the proxy variables (a cache may sit in front).
  Status Configure(CURL* h, const ObjectRef& ref, uint64_t offset, uint64_t length, const ObjectIdentity* pinned,
                   curl_slist** headers) const;

  // Classifies a finished attempt: `curl_code` from the transfer, `head` as received.
  // Fills `why` (the cause, for the error: "HTTP 503 SlowDown: ...", "connection reset").
  // Retried: connection failures, resets, timeouts, truncated bodies, 5xx, 429, SlowDown.
  static FailureKind Classify(CURLcode curl_code, const ResponseHead& head, std::string* why);
  // The error for a fatal response of `ref`: NotFound for 404 (NoSuchKey, NoSuchBucket),
  // PermissionDenied for 401/403 (InvalidAccessKeyId, SignatureDoesNotMatch, AccessDenied,
  // "no credentials"), FailedPrecondition for 412 ("changed while it was being loaded"),
  // else IoError; the message names ref.display and the cause.
  Status FatalError(const ObjectRef& ref, const std::string& why, const ResponseHead& head) const;

  // The header callback for a ResponseHead (userdata: ResponseHead*).
  static size_t HeaderCallback(char* data, size_t size, size_t n, void* userdata);

  // Checks a response to a range request [offset, offset+length) against `pinned` (or, for
  // the first response, fills *pinned): 206 with Content-Range matching the range and the
  // pinned total, a 200 only for a whole-object request, the pinned ETag or Last-Modified.
  // FailedPrecondition when the object changed (size, ETag); Corrupt when the server's
  // answer contradicts itself or the request (a range or length it did not ask for).
  Status CheckResponse(const ObjectRef& ref, uint64_t offset, uint64_t length, const ResponseHead& head,
                       ObjectIdentity* pinned, bool first) const;

  // Fetches bytes [offset, offset + max_length) of `ref` (fewer when the object ends
  // first), retrying as Classify says; the first call for an object (pinned->size == 0 and
  // no ETag yet, `first`) pins its identity. NotFound/PermissionDenied/... as FatalError.
  Result<std::string> Fetch(const ObjectRef& ref, uint64_t offset, uint64_t max_length, ObjectIdentity* pinned,
                            bool first) const;
  // Fetches a whole small object (at most `limit` bytes: ResourceExhausted beyond) without
  // pinning (side files, listings, an index). NotFound for 404.
  Result<std::string> FetchSmall(const ObjectRef& ref, uint64_t limit, ObjectIdentity* identity = nullptr) const;

  const RemoteOptions& options() const { return options_; }
  // "s3 http://127.0.0.1:9000 path-style region us-east-1, credentials from <where>": for
  // logs; never shows a credential.
  std::string Describe() const;
  // The backoff before attempt `attempt` (2, 3, ...).
  std::chrono::milliseconds Backoff(int attempt) const;

 private:
  RemoteClient() = default;
  RemoteOptions options_;
  std::string endpoint_;     // scheme://host[:port] without trailing '/'
  std::string region_;
  std::string access_key_, secret_key_, session_token_;
  std::string credentials_from_;  // "environment", "$CREDENTIALS_DIRECTORY/aws-credentials", ...
  std::string ca_file_;
};

}  // namespace ckpt::remote
