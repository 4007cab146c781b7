#include "server/common/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "server/common/listen.h"

namespace kvpool {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

HttpRequest ParseHttpTarget(absl::string_view target) {
  HttpRequest request;
  size_t question = target.find('?');
  request.path = std::string(target.substr(0, question));
  if (question == absl::string_view::npos) return request;
  for (absl::string_view pair : absl::StrSplit(target.substr(question + 1), '&')) {
    if (pair.empty()) continue;
    std::pair<std::string, std::string> kv = absl::StrSplit(pair, absl::MaxSplits('=', 1));
    request.params[kv.first] = kv.second;
  }
  return request;
}

HttpResponse HttpRefusal(const absl::Status& status) {
  int code = status.code() == absl::StatusCode::kUnauthenticated      ? 401
             : status.code() == absl::StatusCode::kPermissionDenied ? 403
                                                                     : 500;
  return HttpResponse{code, "text/plain; charset=utf-8",
                      absl::StrCat(status.message(), "\n")};
}

namespace {

constexpr auto kConnectionDeadline = std::chrono::seconds(10);

struct GateRule {
  HttpServer::Gate gate;
  absl::flat_hash_set<std::string> open_paths;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const absl::flat_hash_map<std::string, HttpServer::Handler>& handlers,
          const GateRule& gate)
      : stream_(std::move(socket)), handlers_(handlers), gate_(gate) {}

  void Run() {
    stream_.expires_after(kConnectionDeadline);
    http::async_read(stream_, buffer_, request_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (!ec) self->Respond();
                     });
  }

 private:
  void Respond() {
    HttpResponse reply;
    HttpRequest request =
        ParseHttpTarget(absl::string_view(request_.target().data(), request_.target().size()));
    if (auto header = request_.find(http::field::authorization); header != request_.end()) {
      absl::string_view value(header->value().data(), header->value().size());
      if (absl::ConsumePrefix(&value, "Bearer ")) request.bearer_token = std::string(value);
    }
    auto it = handlers_.find(request.path);
    std::optional<HttpResponse> refused;
    if (gate_.gate && !gate_.open_paths.contains(request.path)) refused = gate_.gate(request);
    if (request_.method() != http::verb::get && request_.method() != http::verb::head) {
      reply = {405, "text/plain; charset=utf-8", "only GET is supported\n"};
    } else if (refused) {
      reply = std::move(*refused);
      if (reply.status == 401) response_.set(http::field::www_authenticate, "Bearer");
    } else if (it == handlers_.end()) {
      reply = {404, "text/plain; charset=utf-8", absl::StrCat("no handler for ", request.path, "\n")};
    } else {
      reply = it->second(request);
    }
    response_.version(request_.version());
    response_.result(static_cast<http::status>(reply.status));
    response_.set(http::field::content_type, reply.content_type);
    response_.keep_alive(false);
    response_.body() = std::move(reply.body);
    response_.prepare_payload();
    http::async_write(stream_, response_, [self = shared_from_this()](beast::error_code, size_t) {
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  http::response<http::string_body> response_;
  const absl::flat_hash_map<std::string, HttpServer::Handler>& handlers_;
  const GateRule& gate_;
};

}  // namespace

struct HttpServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  absl::flat_hash_map<std::string, Handler> handlers;
  GateRule gate;
  std::thread thread;

  void Accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) std::make_shared<Session>(std::move(socket), handlers, gate)->Run();
      Accept();
    });
  }
};

HttpServer::HttpServer() : impl_(std::make_unique<Impl>()) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Handle(const std::string& path, Handler handler) {
  impl_->handlers[path] = std::move(handler);
}

void HttpServer::SetGate(Gate gate, absl::flat_hash_set<std::string> open_paths) {
  impl_->gate = GateRule{std::move(gate), std::move(open_paths)};
}

absl::StatusOr<uint16_t> HttpServer::Start(const std::string& address) {
  absl::StatusOr<uint16_t> port = Listen(impl_->acceptor, address, "HTTP");
  if (!port.ok()) return port.status();
  impl_->Accept();
  impl_->thread = std::thread([this] { impl_->io.run(); });
  return port;
}

void HttpServer::Stop() {
  if (!impl_->thread.joinable()) return;
  impl_->io.stop();
  impl_->thread.join();
}

}  // namespace kvpool
