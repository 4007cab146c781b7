// The TCP transport's pipeline against a scripted segment on loopback: answers that arrive all
// at once or a byte at a time, a rejection whose reason is longer than the rejected op's
// buffer, answers a segment should never send (a wrong length, out of order), and writes
// hashed in the lane as they are sent; pooled connections the segment closed while idle.

#include "client/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/checksum.h"
#include "proto/error_codes.h"
#include "proto/frame.h"

namespace kvpool::client {
namespace {

// A value whose bytes depend on the offset asked for, so an answer says where it came from.
std::string ValueAt(uint64_t offset, uint64_t length) {
  std::string value(length, '\0');
  for (uint64_t i = 0; i < length; ++i) value[i] = static_cast<char>((offset * 131 + i * 7) & 0xff);
  return value;
}

bool ReadFully(int fd, void* data, size_t length) {
  auto* bytes = static_cast<uint8_t*>(data);
  while (length > 0) {
    ssize_t n = read(fd, bytes, length);
    if (n <= 0) return false;
    bytes += n;
    length -= static_cast<size_t>(n);
  }
  return true;
}

void WriteFully(int fd, const std::string& bytes, bool dribble) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    size_t step = dribble ? 1 : bytes.size() - sent;
    ssize_t n = send(fd, bytes.data() + sent, step, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

std::string Header(int32_t status, uint64_t request_id, uint64_t length) {
  std::string header(wire::kResponseHeaderSize, '\0');
  wire::EncodeResponse({status, request_id, length}, reinterpret_cast<uint8_t*>(header.data()));
  return header;
}

// A loopback listener that serves each connection with `script`: given the requests it read
// (those that arrived within 200 ms of each other), it returns the bytes to answer, then
// closes the connection; with `rounds`, it reads and answers again until a round brings no
// request.
class ScriptedSegment {
 public:
  using Script =
      std::function<std::string(int connection, const std::vector<wire::RequestHeader>& requests)>;

  explicit ScriptedSegment(Script script, bool dribble = false, bool rounds = false)
      : script_(std::move(script)), dribble_(dribble), rounds_(rounds) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    socklen_t length = sizeof(address);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    listen(listen_fd_, 8);
    thread_ = std::thread([this] { Serve(); });
  }
  ~ScriptedSegment() {
    shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
    thread_.join();
  }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port_); }
  int connections() const { return connections_.load(); }
  // The payloads of the writes it read, in the order they arrived.
  std::vector<std::string> written() const {
    absl::MutexLock lock(&mu_);
    return written_;
  }

 private:
  // Serves each connection on a thread of its own.
  void Serve() {
    std::vector<std::thread> served;
    while (true) {
      int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) break;
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      // The client sends what it has in flight at once: read what arrives within a moment.
      timeval wait{0, 200 * 1000};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
      served.emplace_back([this, fd, connection = connections_++] {
        while (true) {
          std::vector<wire::RequestHeader> requests = ReadRound(fd);
          if (rounds_ && requests.empty()) break;
          WriteFully(fd, script_(connection, requests), dribble_);
          if (!rounds_) break;
        }
        close(fd);
      });
    }
    for (std::thread& thread : served) thread.join();
  }

  std::vector<wire::RequestHeader> ReadRound(int fd) {
    std::vector<wire::RequestHeader> requests;
    uint8_t header[wire::kRequestHeaderSize];
    while (ReadFully(fd, header, sizeof(header))) {
      absl::StatusOr<wire::RequestHeader> request = wire::DecodeRequest(header);
      if (!request.ok()) break;
      requests.push_back(*request);
      if (request->opcode != wire::Opcode::kWrite) continue;
      std::string payload(request->length, '\0');
      if (!ReadFully(fd, payload.data(), payload.size())) break;
      absl::MutexLock lock(&mu_);
      written_.push_back(std::move(payload));
    }
    return requests;
  }

  Script script_;
  bool dribble_;
  bool rounds_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<int> connections_{0};
  mutable absl::Mutex mu_;
  std::vector<std::string> written_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Every request answered OK: a read with its range's bytes, a write with none.
std::string AnswerAll(const std::vector<wire::RequestHeader>& requests) {
  std::string out;
  for (const wire::RequestHeader& request : requests) {
    if (request.opcode == wire::Opcode::kWrite) {
      out += Header(0, request.request_id, 0);
      continue;
    }
    out += Header(0, request.request_id, request.length);
    out += ValueAt(request.offset, request.length);
  }
  return out;
}

struct Reads {
  std::vector<std::string> buffers;
  std::vector<TransferOp> ops;
};

// `n` READs of `length` bytes from `endpoint`, at offsets 1000 * i, hashed as they arrive.
Reads MakeReads(const std::string& endpoint, int n, uint64_t length) {
  Reads reads;
  reads.buffers.assign(n, std::string(length, 'x'));
  for (int i = 0; i < n; ++i) {
    reads.ops.push_back(TransferOp{.opcode = wire::Opcode::kRead,
                                   .endpoint = endpoint,
                                   .offset = 1000u * i,
                                   .length = length,
                                   .iov = {{reads.buffers[i].data(), length}},
                                   .hash = true});
  }
  return reads;
}

TcpTransportOptions OneLane() {
  TcpTransportOptions options;
  options.connections_per_endpoint = 1;
  options.threads = 0;
  return options;
}

// Two connections per segment, driven side by side (the caller's thread and one more).
TcpTransportOptions TwoLanes() {
  TcpTransportOptions options;
  options.connections_per_endpoint = 2;
  options.threads = 1;
  return options;
}

TEST(TcpTransportTest, PipelinedAnswersLandInTheirOwnBuffersAndAreHashed) {
  ScriptedSegment segment([](int, const auto& requests) { return AnswerAll(requests); });
  Reads reads = MakeReads(segment.endpoint(), 40, 3000);
  TcpTransport(OneLane()).Execute(absl::MakeSpan(reads.ops), absl::Now() + absl::Seconds(10));
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(reads.ops[i].status.ok()) << i << ": " << reads.ops[i].status;
    EXPECT_EQ(reads.buffers[i], ValueAt(1000u * i, 3000)) << i;
    std::string& value = reads.buffers[i];
    iovec part{value.data(), value.size()};
    ASSERT_TRUE(reads.ops[i].checksum.has_value());
    EXPECT_EQ(*reads.ops[i].checksum, wire::Checksum({&part, 1}));
  }
}

TEST(TcpTransportTest, WritesAskedToBeHashedAreHashedAsTheyAreSent) {
  // Values larger than one hashed send, and small ones between them; every other one hashed.
  // The lane sends them over several rounds (a few ahead of their answers).
  ScriptedSegment segment([](int, const auto& requests) { return AnswerAll(requests); },
                          /*dribble=*/false, /*rounds=*/true);
  const std::vector<uint64_t> lengths = {300 << 10, 5, 700 << 10, 4096, 256 << 10, 1};
  std::vector<std::string> values;
  for (size_t i = 0; i < lengths.size(); ++i) values.push_back(ValueAt(7 + i, lengths[i]));
  std::vector<TransferOp> ops;
  for (size_t i = 0; i < values.size(); ++i) {
    // The second half of each value in a part of its own.
    std::string& value = values[i];
    const size_t half = value.size() / 2;
    ops.push_back(
        TransferOp{.opcode = wire::Opcode::kWrite,
                   .endpoint = segment.endpoint(),
                   .offset = 1000u * i,
                   .length = value.size(),
                   .iov = {{value.data(), half}, {value.data() + half, value.size() - half}},
                   .hash = i % 2 == 0});
  }
  TcpTransport transport(OneLane());
  EXPECT_TRUE(transport.HashesWrite(ops[0]));
  transport.Execute(absl::MakeSpan(ops), absl::Now() + absl::Seconds(10));
  EXPECT_EQ(segment.written(), values);
  for (size_t i = 0; i < ops.size(); ++i) {
    ASSERT_TRUE(ops[i].status.ok()) << i << ": " << ops[i].status;
    if (i % 2 != 0) {
      EXPECT_FALSE(ops[i].checksum.has_value()) << i;
      continue;
    }
    iovec whole{values[i].data(), values[i].size()};
    ASSERT_TRUE(ops[i].checksum.has_value()) << i;
    EXPECT_EQ(*ops[i].checksum, wire::Checksum({&whole, 1})) << i;
  }
}

TEST(TcpTransportTest, AnswersThatArriveAByteAtATimeAreReassembled) {
  ScriptedSegment segment([](int, const auto& requests) { return AnswerAll(requests); },
                          /*dribble=*/true);
  Reads reads = MakeReads(segment.endpoint(), 5, 100);
  TcpTransport(OneLane()).Execute(absl::MakeSpan(reads.ops), absl::Now() + absl::Seconds(30));
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(reads.ops[i].status.ok()) << i << ": " << reads.ops[i].status;
    EXPECT_EQ(reads.buffers[i], ValueAt(1000u * i, 100)) << i;
  }
}

TEST(TcpTransportTest, ARejectionsReasonIsWholeEvenWhereItIsLongerThanTheOpsBuffer) {
  // The first connection answers ops 0 and 1, rejects op 2 with a reason far longer than its
  // 8-byte buffer, and closes; the rest go over a second connection.
  const std::string reason(300, 'r');
  ScriptedSegment segment([&](int connection, const std::vector<wire::RequestHeader>& requests) {
    if (connection > 0) return AnswerAll(requests);
    std::vector<wire::RequestHeader> first(requests.begin(), requests.begin() + 2);
    return AnswerAll(first) +
           Header(ErrorCode::LEASE_EXPIRED, requests[2].request_id, reason.size()) + reason;
  });
  Reads reads = MakeReads(segment.endpoint(), 6, 8);
  TcpTransport(OneLane()).Execute(absl::MakeSpan(reads.ops), absl::Now() + absl::Seconds(10));
  for (int i : {0, 1, 3, 4, 5}) {
    ASSERT_TRUE(reads.ops[i].status.ok()) << i << ": " << reads.ops[i].status;
    EXPECT_EQ(reads.buffers[i], ValueAt(1000u * i, 8)) << i;
  }
  EXPECT_EQ(ToErrorCode(reads.ops[2].status), ErrorCode::LEASE_EXPIRED);
  EXPECT_TRUE(absl::StrContains(reads.ops[2].status.message(), reason))
      << reads.ops[2].status.message();
  EXPECT_EQ(segment.connections(), 2);
}

TEST(TcpTransportTest, AnAnswerOfTheWrongLengthIsNeverOk) {
  ScriptedSegment segment([](int, const std::vector<wire::RequestHeader>& requests) {
    // Op 0 right, op 1 one byte short (and its bytes run into op 2's answer).
    return Header(0, 0, 16) + ValueAt(0, 16) + Header(0, 1, 15) + ValueAt(1000, 15) +
           Header(0, 2, 16) + ValueAt(2000, 16);
  });
  Reads reads = MakeReads(segment.endpoint(), 3, 16);
  TcpTransport(OneLane()).Execute(absl::MakeSpan(reads.ops), absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(reads.ops[0].status.ok()) << reads.ops[0].status;
  EXPECT_FALSE(reads.ops[1].status.ok());
  EXPECT_FALSE(reads.ops[2].status.ok());
}

TEST(TcpTransportTest, AnAnswerOutOfOrderIsNeverOk) {
  ScriptedSegment segment([](int, const std::vector<wire::RequestHeader>& requests) {
    return Header(0, 1, 16) + ValueAt(1000, 16) + Header(0, 0, 16) + ValueAt(0, 16);
  });
  Reads reads = MakeReads(segment.endpoint(), 2, 16);
  TcpTransport(OneLane()).Execute(absl::MakeSpan(reads.ops), absl::Now() + absl::Seconds(10));
  EXPECT_FALSE(reads.ops[0].status.ok());
  EXPECT_FALSE(reads.ops[1].status.ok());
}

// Two lanes take one segment's ops as they go: the lane whose connection answers late takes
// only its first few, the other the rest, and every answer lands where it belongs.
TEST(TcpTransportTest, ALaneThatRunsFasterTakesMoreOfTheBatch) {
  absl::Mutex mu;
  std::vector<int> served(2, 0);  // requests answered, by connection
  ScriptedSegment segment(
      [&](int connection, const std::vector<wire::RequestHeader>& requests) {
        if (connection == 0) absl::SleepFor(absl::Milliseconds(1500));
        absl::MutexLock lock(&mu);
        served[connection] += static_cast<int>(requests.size());
        return AnswerAll(requests);
      },
      /*dribble=*/false, /*rounds=*/true);
  Reads reads = MakeReads(segment.endpoint(), 24, 256 << 10);
  TcpTransport(TwoLanes()).Execute(absl::MakeSpan(reads.ops), absl::Now() + absl::Seconds(20));
  for (int i = 0; i < 24; ++i) {
    ASSERT_TRUE(reads.ops[i].status.ok()) << i << ": " << reads.ops[i].status;
    EXPECT_EQ(reads.buffers[i], ValueAt(1000u * i, 256 << 10)) << i;
  }
  absl::MutexLock lock(&mu);
  EXPECT_EQ(served[0] + served[1], 24);
  // Dealt in halves, each would have served 12.
  EXPECT_LT(served[0], 12) << served[0] << " and " << served[1];
}

// A segment that answers no lane: every op fails, those no lane took among them.
TEST(TcpTransportTest, WhenEveryLaneGivesUpNoOpIsLeftWithoutAnAnswer) {
  ScriptedSegment segment([](int, const auto&) { return std::string(); });
  Reads reads = MakeReads(segment.endpoint(), 12, 256 << 10);
  TcpTransport(TwoLanes()).Execute(absl::MakeSpan(reads.ops), absl::Now() + absl::Seconds(20));
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(ToErrorCode(reads.ops[i].status), ErrorCode::TRANSFER_FAIL)
        << i << ": " << reads.ops[i].status;
  }
}

// The scripted segment closes each connection once it has gone a moment without a request, as
// a segment may cut one it served (or restart) while the client keeps it pooled: every such
// connection is dropped and the next tried, until a freshly dialed one serves the batch.
TEST(TcpTransportTest, PooledConnectionsClosedWhileIdleAreDroppedUntilAFreshOne) {
  ScriptedSegment segment([](int, const auto& requests) { return AnswerAll(requests); },
                          /*dribble=*/false, /*rounds=*/true);
  TcpTransport transport(TwoLanes());
  // Enough for both lanes: two pooled connections.
  Reads first = MakeReads(segment.endpoint(), 8, 256 << 10);
  transport.Execute(absl::MakeSpan(first.ops), absl::Now() + absl::Seconds(10));
  for (const TransferOp& op : first.ops) ASSERT_TRUE(op.status.ok()) << op.status;
  ASSERT_EQ(segment.connections(), 2);
  absl::SleepFor(absl::Milliseconds(600));              // both closed by the segment meanwhile
  Reads second = MakeReads(segment.endpoint(), 1, 64);  // one lane meets both dead ones
  transport.Execute(absl::MakeSpan(second.ops), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(second.ops[0].status.ok()) << second.ops[0].status;
  EXPECT_EQ(second.buffers[0], ValueAt(0, 64));
  EXPECT_EQ(segment.connections(), 3);
}

}  // namespace
}  // namespace kvpool::client
