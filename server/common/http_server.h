#pragma once

// A small HTTP/1.1 server (Boost.Beast) for the operational endpoints of the servers:
// /healthz, /readyz, /metrics. GET only; one response per connection; every connection has
// a deadline, so a stalled client cannot pin the server. Handlers run on the server's one
// thread and must be quick. Register handlers before Start().

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvpool {

struct HttpRequest {
  std::string path;
  // Query parameters ("?offset=12&x=y"), undecoded.
  absl::flat_hash_map<std::string, std::string> params;
  // The token of an "Authorization: Bearer <token>" header, if the request has one.
  std::optional<std::string> bearer_token;
};

// The path and query parameters of a request target ("/metrics?x=1&y"): the path is what
// precedes the first '?'; parameters are split at '&' and their first '=', empty pairs
// skipped, a repeated name keeps its last value. Never fails. (The server parses the request
// line and headers with Boost.Beast's request parser at its default limits, then this.)
HttpRequest ParseHttpTarget(absl::string_view target);

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// 401 (with "WWW-Authenticate: Bearer") for Unauthenticated, 403 for PermissionDenied, 500
// otherwise; the status's message is the body.
HttpResponse HttpRefusal(const absl::Status& status);

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;
  // Decides whether a request reaches its handler: nullopt lets it through; a response (see
  // HttpRefusal) is answered instead.
  using Gate = std::function<std::optional<HttpResponse>(const HttpRequest&)>;

  HttpServer();
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  void Handle(const std::string& path, Handler handler);
  // Every request for a path not in `open_paths` (e.g. the probes' /healthz and /readyz) passes
  // `gate` first. Before Start().
  void SetGate(Gate gate, absl::flat_hash_set<std::string> open_paths);

  // Listens on "host:port" (port 0: any free port) and returns the bound port.
  // InvalidArgument for a malformed address, Unavailable if it cannot bind.
  absl::StatusOr<uint16_t> Start(const std::string& address);
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool
