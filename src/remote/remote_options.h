// The daemon's settings for remote sources (ckptd --remote-*; docs/remote-sources.md).
// Nothing secret: credentials are read by RemoteContext::Create from the daemon's
// environment and files, never from here, never from a client.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt::remote {

struct RemoteOptions {
  // Sources a load may name (RemoteAllowed); empty: remote loads are refused.
  std::vector<std::string> allow;
  // S3: the endpoint ("http://127.0.0.1:9000"); empty: $AWS_ENDPOINT_URL_S3, then
  // $AWS_ENDPOINT_URL, then the profile's endpoint_url, then https://s3.<region>.amazonaws.com.
  std::string s3_endpoint;
  std::string region;       // empty: $AWS_REGION, $AWS_DEFAULT_REGION, the profile's, else us-east-1
  bool path_style = false;  // endpoint/bucket/key instead of bucket.endpoint/key (S3-compatible servers)
  // Where the shared credentials and config files are; empty: $AWS_SHARED_CREDENTIALS_FILE
  // / $AWS_CONFIG_FILE, else ~/.aws/credentials and ~/.aws/config.
  std::string credentials_file;
  std::string config_file;
  std::string profile;      // empty: $AWS_PROFILE, else "default"
  // CA bundle for TLS; empty: $AWS_CA_BUNDLE, $CURL_CA_BUNDLE, else the system trust store.
  std::string ca_file;
  int connections = 16;                // ranged GETs in flight per load, over all threads
  int threads = 4;                     // threads driving them (checksums run on these too)
  uint64_t chunk_bytes = 8ull << 20;   // longest ranged GET
  int max_attempts = 8;                // tries of one range (the first included)
  double retry_base_s = 0.1;           // backoff before the 2nd try; doubles up to retry_max_s
  double retry_max_s = 5;
  double timeout_s = 600;              // no retry starts once a load has been fetching this long
  double connect_timeout_s = 10;
  double stall_timeout_s = 30;         // a transfer slower than 1 KiB/s this long is cut and retried
};

}  // namespace ckpt::remote
