#pragma once

// A small HTTP/1.1 server (Boost.Beast) for the operational endpoints of the servers:
// /healthz, /readyz, /metrics. GET only; one response per connection; every connection has
// a deadline, so a stalled client cannot pin the server. Handlers run on the server's one
// thread and must be quick. Register handlers before Start().

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace kvpool {

struct HttpRequest {
  std::string path;
  // Query parameters ("?offset=12&x=y"), undecoded.
  absl::flat_hash_map<std::string, std::string> params;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  HttpServer();
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  void Handle(const std::string& path, Handler handler);

  // Listens on "host:port" (port 0: any free port) and returns the bound port.
  // InvalidArgument for a malformed address, Unavailable if it cannot bind.
  absl::StatusOr<uint16_t> Start(const std::string& address);
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool
