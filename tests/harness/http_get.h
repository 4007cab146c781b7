#pragma once

// A minimal HTTP/1.1 GET for tests: scrape /metrics, poke /readyz, call a test hook.

#include <string>

#include "absl/status/statusor.h"

namespace kvpool::testing {

struct HttpReply {
  int status = 0;
  std::string body;
};

// GET http://<address><path>, with `headers` ("Name: value\r\n" lines) added. Unavailable if
// the server cannot be reached.
absl::StatusOr<HttpReply> HttpFetch(const std::string& address, const std::string& path,
                                    const std::string& headers = "");

// The body of a 200 answer; FailedPrecondition with the status and body otherwise.
absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path);

}  // namespace kvpool::testing
