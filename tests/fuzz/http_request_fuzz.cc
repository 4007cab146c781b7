// libFuzzer target: the HTTP request parsing of the servers' operational endpoints
// (server/common/http_server.h) on arbitrary bytes: Boost.Beast's request parser at the
// limits the server uses (its defaults: 8 KiB of headers, 1 MiB of body), then
// ParseHttpTarget on the target. Never a crash; the path is the target up to its first '?' and
// holds no '?'; every parameter name appears in the query.

#include <cstdint>
#include <cstdlib>
#include <string>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "server/common/http_server.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace http = boost::beast::http;
  http::request_parser<http::string_body> parser;
  boost::beast::error_code ec;
  parser.put(boost::asio::buffer(data, size), ec);
  if (!ec && !parser.is_done()) parser.put_eof(ec);
  // The target of a request line that parsed (the server answers only complete requests, but
  // the target is what it reads first).
  if (!parser.is_header_done()) return 0;
  boost::beast::string_view raw = parser.get().target();
  std::string target(raw.data(), raw.size());
  kvpool::HttpRequest request = kvpool::ParseHttpTarget(target);
  size_t question = target.find('?');
  if (request.path != target.substr(0, question)) std::abort();
  if (request.path.find('?') != std::string::npos) std::abort();
  if (question == std::string::npos && !request.params.empty()) std::abort();
  for (const auto& [name, value] : request.params) {
    if (target.find(name, question) == std::string::npos) std::abort();
    if (name.find('&') != std::string::npos || value.find('&') != std::string::npos) std::abort();
  }
  return 0;
}
