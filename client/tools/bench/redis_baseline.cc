#include "client/tools/bench/redis_baseline.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/tools/bench/child_process.h"
#include "client/tools/bench/io.h"
#include "common/net.h"

namespace kvpool::bench {
namespace {

constexpr uint64_t kMetaValueSize = 64;

// One RESP connection: commands out with writev, replies in through a small buffer, bulk
// values straight into the caller's memory. After any error it is out of step and refuses
// further use.
class RespConnection {
 public:
  // `fill_bytes`: how much one read may take into the buffer while looking for a reply
  // header; small for large values, so that little of a value is copied through the buffer.
  RespConnection(int fd, size_t fill_bytes) : fd_(fd), fill_bytes_(fill_bytes), buffer_(64 << 10) {}
  ~RespConnection() { close(fd_); }

  bool broken() const { return broken_; }

  absl::Status Send(absl::Span<iovec> iov) { return Check(WriteAll(fd_, iov)); }
  absl::Status Send(const std::string& text) {
    return Check(WriteAll(fd_, text.data(), text.size()));
  }

  // A reply line, without its CRLF.
  absl::StatusOr<std::string> ReadLine() {
    while (true) {
      absl::string_view available(buffer_.data() + begin_, end_ - begin_);
      size_t at = available.find("\r\n");
      if (at != absl::string_view::npos) {
        std::string line(available.substr(0, at));
        begin_ += at + 2;
        return line;
      }
      if (absl::Status filled = Fill(); !filled.ok()) return filled;
    }
  }

  // A simple reply ("+OK", ":3"): the line; an error reply ("-ERR ...") as an error.
  absl::StatusOr<std::string> ReadSimple() {
    absl::StatusOr<std::string> line = ReadLine();
    if (!line.ok()) return line;
    if (absl::StartsWith(*line, "-")) return absl::InternalError(*line);
    if (!absl::StartsWith(*line, "+") && !absl::StartsWith(*line, ":")) {
      return Check(absl::InternalError(absl::StrCat("unexpected reply ", *line)));
    }
    return line;
  }

  // A bulk reply of exactly `size` bytes, into `target`. NotFound for a nil reply.
  absl::Status ReadBulk(uint8_t* target, uint64_t size) {
    absl::StatusOr<std::string> line = ReadLine();
    if (!line.ok()) return line.status();
    if (absl::StartsWith(*line, "-")) return absl::InternalError(*line);
    int64_t length = 0;
    if (!absl::StartsWith(*line, "$") || !absl::SimpleAtoi(line->substr(1), &length)) {
      return Check(absl::InternalError(absl::StrCat("unexpected reply ", *line)));
    }
    if (length < 0) return absl::NotFoundError("GET answered nil");
    if (static_cast<uint64_t>(length) != size) {
      return Check(
          absl::InternalError(absl::StrCat("value of ", length, " bytes, expected ", size)));
    }
    uint64_t buffered = std::min<uint64_t>(size, end_ - begin_);
    std::memcpy(target, buffer_.data() + begin_, buffered);
    begin_ += buffered;
    if (buffered < size) {
      if (absl::Status read = Check(ReadAll(fd_, target + buffered, size - buffered)); !read.ok()) {
        return read;
      }
    }
    while (end_ - begin_ < 2) {
      if (absl::Status filled = Fill(); !filled.ok()) return filled;
    }
    begin_ += 2;  // CRLF
    return absl::OkStatus();
  }

 private:
  absl::Status Check(absl::Status status) {
    if (!status.ok()) broken_ = true;
    return status;
  }

  absl::Status Fill() {
    if (begin_ > 0) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    if (end_ == buffer_.size()) return Check(absl::InternalError("reply line too long"));
    size_t want = std::min(fill_bytes_, buffer_.size() - end_);
    while (true) {
      ssize_t n = recv(fd_, buffer_.data() + end_, want, 0);
      if (n > 0) {
        end_ += static_cast<size_t>(n);
        return absl::OkStatus();
      }
      if (n < 0 && errno == EINTR) continue;
      return Check(absl::UnavailableError(n == 0
                                              ? "redis closed the connection"
                                              : absl::StrCat("receive: ", std::strerror(errno))));
    }
  }

  const int fd_;
  const size_t fill_bytes_;
  std::vector<char> buffer_;
  size_t begin_ = 0;
  size_t end_ = 0;
  bool broken_ = false;
};

std::string Bulk(absl::string_view text) {
  return absl::StrCat("$", text.size(), "\r\n", text, "\r\n");
}

std::string SetHeader(absl::string_view key, uint64_t value_size) {
  return absl::StrCat("*3\r\n$3\r\nSET\r\n", Bulk(key), "$", value_size, "\r\n");
}

absl::StatusOr<std::unique_ptr<RespConnection>> Open(const std::string& host, uint16_t port,
                                                     uint64_t value_size) {
  absl::StatusOr<int> fd = ConnectBlocking(host, port, 0);
  if (!fd.ok()) return fd.status();
  return std::make_unique<RespConnection>(*fd, value_size >= (64 << 10) ? 512 : 64 << 10);
}

// Stores prefix+0 .. prefix+(count-1) with SET, pipelined.
absl::Status StoreSet(RespConnection& connection, const std::string& prefix, uint64_t count,
                      uint64_t value_size) {
  uint64_t batch = std::clamp<uint64_t>((64 << 20) / value_size, 1, 1024);
  Buffer values(batch * value_size, 0x4B);
  std::vector<std::string> headers;
  std::vector<iovec> iov;
  static const char kCrlf[] = "\r\n";
  for (uint64_t first = 0; first < count; first += batch) {
    uint64_t n = std::min(batch, count - first);
    headers.clear();
    iov.clear();
    for (uint64_t i = 0; i < n; ++i)
      headers.push_back(SetHeader(absl::StrCat(prefix, first + i), value_size));
    for (uint64_t i = 0; i < n; ++i) {
      iov.push_back(iovec{headers[i].data(), headers[i].size()});
      iov.push_back(iovec{values.data() + i * value_size, value_size});
      iov.push_back(iovec{const_cast<char*>(kCrlf), 2});
    }
    if (absl::Status sent = connection.Send(absl::MakeSpan(iov)); !sent.ok()) return sent;
    for (uint64_t i = 0; i < n; ++i) {
      if (absl::StatusOr<std::string> reply = connection.ReadSimple(); !reply.ok()) {
        return reply.status();
      }
    }
  }
  return absl::OkStatus();
}

class RedisWorker : public Worker {
 public:
  RedisWorker(std::unique_ptr<RespConnection> connection, const Workload& workload, int count,
              std::string set_prefix, std::string put_prefix, uint64_t put_slots, uint64_t seed)
      : connection_(std::move(connection)),
        kind_(workload.kind),
        read_fraction_(workload.read_fraction),
        value_size_(workload.value_size),
        keys_(workload.keys),
        count_(count),
        set_prefix_(std::move(set_prefix)),
        put_prefix_(std::move(put_prefix)),
        put_slots_(std::max<uint64_t>(1, put_slots)),
        ring_(workload.kind == WorkloadKind::kMetaExist
                  ? SlotRing(0, 1, 1, 0)
                  : SlotRing(workload.client_buffer_bytes / workload.lanes, workload.value_size,
                             count, static_cast<uint8_t>(seed))),
        random_(seed) {}

  OpResult RunOnce() override {
    OpResult result;
    absl::Status status;
    if (connection_->broken()) {
      status = absl::UnavailableError("connection out of step after an earlier error");
    } else if (kind_ == WorkloadKind::kMetaExist) {
      return Exist();
    } else if (kind_ == WorkloadKind::kGet ||
               (kind_ == WorkloadKind::kMixed && random_.Uniform() < read_fraction_)) {
      return Get();
    } else {
      return Set();
    }
    result.errors = count_;
    result.error = std::string(status.message());
    return result;
  }

 private:
  static void Tally(const absl::Status& status, uint64_t bytes, OpResult& result) {
    if (status.ok()) {
      ++result.ops;
      result.bytes += bytes;
    } else {
      ++result.errors;
      if (result.error.empty()) result.error = std::string(status.message());
    }
  }

  OpResult Get() {
    OpResult result;
    commands_.clear();
    for (int k = 0; k < count_; ++k) {
      std::string key = absl::StrCat(set_prefix_, random_.Below(keys_));
      absl::StrAppend(&commands_, "*2\r\n$3\r\nGET\r\n", Bulk(key));
    }
    size_t first = ring_.NextUnit();
    absl::Status sent = connection_->Send(commands_);
    for (int k = 0; k < count_; ++k) {
      absl::Status status =
          sent.ok() ? connection_->ReadBulk(ring_.slot(first + k), value_size_) : sent;
      Tally(status, value_size_, result);
    }
    return result;
  }

  OpResult Set() {
    static const char kCrlf[] = "\r\n";
    OpResult result;
    headers_.clear();
    iov_.clear();
    for (int k = 0; k < count_; ++k) {
      headers_.push_back(SetHeader(absl::StrCat(put_prefix_, next_put_), value_size_));
      next_put_ = (next_put_ + 1) % put_slots_;
    }
    size_t first = ring_.NextUnit();
    for (int k = 0; k < count_; ++k) {
      iov_.push_back(iovec{headers_[k].data(), headers_[k].size()});
      iov_.push_back(iovec{ring_.slot(first + k), value_size_});
      iov_.push_back(iovec{const_cast<char*>(kCrlf), 2});
    }
    absl::Status sent = connection_->Send(absl::MakeSpan(iov_));
    for (int k = 0; k < count_; ++k) {
      absl::Status status = sent.ok() ? connection_->ReadSimple().status() : sent;
      Tally(status, value_size_, result);
    }
    return result;
  }

  OpResult Exist() {
    OpResult result;
    commands_ = absl::StrCat("*", count_ + 1, "\r\n$6\r\nEXISTS\r\n");
    for (int k = 0; k < count_; ++k) {
      absl::StrAppend(&commands_, Bulk(absl::StrCat(set_prefix_, random_.Below(keys_))));
    }
    absl::Status status = connection_->Send(commands_);
    absl::StatusOr<std::string> reply =
        status.ok() ? connection_->ReadSimple() : absl::StatusOr<std::string>(status);
    int64_t found = 0;
    if (reply.ok() &&
        (!absl::StartsWith(*reply, ":") || !absl::SimpleAtoi(reply->substr(1), &found))) {
      reply = absl::InternalError(absl::StrCat("unexpected reply ", *reply));
    }
    if (!reply.ok()) {
      result.errors = count_;
      result.error = std::string(reply.status().message());
      return result;
    }
    result.ops = static_cast<uint64_t>(std::min<int64_t>(found, count_));
    if (found < count_) {
      result.errors = count_ - found;
      result.error = "EXISTS found fewer keys than were stored";
    }
    return result;
  }

  const std::unique_ptr<RespConnection> connection_;
  const WorkloadKind kind_;
  const double read_fraction_;
  const uint64_t value_size_;
  const uint64_t keys_;
  const int count_;
  const std::string set_prefix_;
  const std::string put_prefix_;
  const uint64_t put_slots_;
  SlotRing ring_;
  Random random_;
  uint64_t next_put_ = 0;
  std::string commands_;
  std::vector<std::string> headers_;
  std::vector<iovec> iov_;
};

std::string SetPrefix(const Workload& workload) {
  if (workload.kind == WorkloadKind::kMetaExist) {
    return absl::StrCat("kvb:", workload.run_id, ":meta:");
  }
  return absl::StrCat("kvb:", workload.run_id, ":v", workload.value_size, ":");
}

int Connections(const Workload& workload) {
  if (workload.kind == WorkloadKind::kMetaExist) return workload.threads;
  return workload.threads * std::min(workload.lanes, workload.batch_size);
}

}  // namespace

RedisBaseline::RedisBaseline(std::string host, uint16_t port, std::unique_ptr<ChildProcess> process)
    : host_(std::move(host)),
      port_(port),
      address_(FormatHostPort(host_, port_)),
      process_(std::move(process)) {}

RedisBaseline::~RedisBaseline() = default;

absl::StatusOr<std::unique_ptr<RedisBaseline>> RedisBaseline::Connect(const std::string& address) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(address);
  if (!parsed.ok()) return parsed.status();
  auto redis =
      std::unique_ptr<RedisBaseline>(new RedisBaseline(parsed->host, parsed->port, nullptr));
  absl::StatusOr<std::unique_ptr<RespConnection>> connection = Open(parsed->host, parsed->port, 0);
  if (!connection.ok()) return connection.status();
  if (absl::Status sent = (*connection)->Send("*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n"); !sent.ok()) {
    return sent;
  }
  absl::StatusOr<std::string> header = (*connection)->ReadLine();
  int64_t length = 0;
  if (!header.ok() || !absl::StartsWith(*header, "$") ||
      !absl::SimpleAtoi(header->substr(1), &length) || length <= 0) {
    return absl::UnavailableError(absl::StrCat("no Redis answering INFO at ", address));
  }
  // INFO is a bulk reply: read it line by line until its declared length is consumed.
  int64_t consumed = 0;
  while (consumed < length) {
    absl::StatusOr<std::string> line = (*connection)->ReadLine();
    if (!line.ok()) return line.status();
    consumed += static_cast<int64_t>(line->size()) + 2;
    if (absl::StartsWith(*line, "redis_version:")) redis->version_ = line->substr(14);
  }
  (void)(*connection)->ReadLine();  // the bulk's final CRLF
  return redis;
}

absl::StatusOr<std::unique_ptr<RedisBaseline>> RedisBaseline::Launch(const std::string& binary,
                                                                     const std::string& log_path) {
  absl::Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<uint16_t> port = FreeLoopbackPort();
    if (!port.ok()) return port.status();
    absl::StatusOr<std::unique_ptr<ChildProcess>> process = ChildProcess::Start(
        "redis-server", binary,
        {"--port", absl::StrCat(*port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--protected-mode", "no", "--daemonize", "no", "--logfile", ""},
        log_path);
    if (!process.ok()) return process.status();
    // Ready once it answers; a server that lost the race for its port exits.
    absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline && !(*process)->Exited()) {
      absl::StatusOr<std::unique_ptr<RedisBaseline>> redis =
          Connect(FormatHostPort("127.0.0.1", *port));
      if (redis.ok()) {
        (*redis)->process_ = std::move(*process);
        return redis;
      }
      last = redis.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    last = absl::UnavailableError(
        absl::StrCat("redis-server did not answer on port ", *port, ":", (*process)->LogTail()));
  }
  return last;
}

std::string RedisBaseline::Describe(const Workload& workload) const {
  std::string server = absl::StrCat("redis ", version_.empty() ? "?" : version_);
  if (workload.kind == WorkloadKind::kMetaExist) {
    return absl::StrCat(server, ", ", Connections(workload), " conn, EXISTS of the batch");
  }
  return absl::StrCat(server, ", ", Connections(workload), " conn, pipelined");
}

bool RedisBaseline::Supports(WorkloadKind kind) const {
  return kind != WorkloadKind::kMetaPut && kind != WorkloadKind::kMetaLocal;
}

absl::Status RedisBaseline::Prepare(const Workload& workload) {
  if (workload.kind == WorkloadKind::kPut) return absl::OkStatus();
  uint64_t value_size =
      workload.kind == WorkloadKind::kMetaExist ? kMetaValueSize : workload.value_size;
  std::string prefix = SetPrefix(workload);
  for (const auto& [stored, count] : stored_) {
    if (stored == prefix && count >= workload.keys) return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<RespConnection>> connection = Open(host_, port_, value_size);
  if (!connection.ok()) return connection.status();
  stored_.emplace_back(prefix, workload.keys);
  return StoreSet(**connection, prefix, workload.keys, value_size);
}

absl::StatusOr<std::vector<std::unique_ptr<Worker>>> RedisBaseline::MakeWorkers(
    const Workload& workload) {
  int lanes =
      workload.kind == WorkloadKind::kMetaExist ? 1 : std::min(workload.lanes, workload.batch_size);
  int connections = Connections(workload);
  Workload lane_workload = workload;
  lane_workload.lanes = lanes;
  uint64_t put_slots = std::max<uint64_t>(1, workload.keys / connections);
  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < connections; ++i) {
    absl::StatusOr<std::unique_ptr<RespConnection>> connection =
        Open(host_, port_, workload.value_size);
    if (!connection.ok()) return connection.status();
    int lane = i % lanes;
    int count = workload.batch_size / lanes + (lane < workload.batch_size % lanes ? 1 : 0);
    std::string put_prefix =
        absl::StrCat("kvb:", workload.run_id, ":p", workload.value_size, ":", i, ":");
    if (workload.kind == WorkloadKind::kPut || workload.kind == WorkloadKind::kMixed) {
      stored_.emplace_back(put_prefix, put_slots);
    }
    workers.push_back(std::make_unique<RedisWorker>(std::move(*connection), lane_workload, count,
                                                    SetPrefix(workload), put_prefix, put_slots,
                                                    static_cast<uint64_t>(i) * 104729 + 3));
  }
  return workers;
}

void RedisBaseline::Cleanup() {
  absl::StatusOr<std::unique_ptr<RespConnection>> connection = Open(host_, port_, 0);
  if (!connection.ok()) return;
  for (const auto& [prefix, count] : stored_) {
    for (uint64_t first = 0; first < count; first += 1000) {
      uint64_t n = std::min<uint64_t>(1000, count - first);
      std::string command = absl::StrCat("*", n + 1, "\r\n$6\r\nUNLINK\r\n");
      for (uint64_t i = first; i < first + n; ++i) {
        absl::StrAppend(&command, Bulk(absl::StrCat(prefix, i)));
      }
      if (!(*connection)->Send(command).ok() || !(*connection)->ReadSimple().ok()) return;
    }
  }
  stored_.clear();
}

}  // namespace kvpool::bench
