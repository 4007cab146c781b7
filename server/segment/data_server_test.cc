// The data plane against raw sockets: what a well-behaved client gets, and what happens to
// frames that are malformed, out of range, unauthorized or cut short.

#include "server/segment/data_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/capability.h"
#include "proto/checksum.h"
#include "proto/error_codes.h"
#include "proto/frame.h"
#include "proto/key_read.h"

namespace kvpool::segment {
namespace {

constexpr uint64_t kPoolSize = 1 << 20;

class DataServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_ = *MemoryPool::Create({.size = kPoolSize, .prefault = false, .name = "test"});
    secret_ = wire::NewCapabilitySecret();
    server_ = std::make_unique<DataServer>(
        *pool_, secret_,
        DataServerOptions{.socket_buffer_bytes = 64 << 10,
                          .manifest = &manifest_,
                          .key_reads_allowed = [this](absl::Time) { return in_touch_.load(); }});
    absl::StatusOr<uint16_t> port = server_->Start("127.0.0.1:0");
    ASSERT_TRUE(port.ok()) << port.status();
    port_ = *port;
  }

  int Connect() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    timeval timeout{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port_);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    return fd;
  }

  static void SendBytes(int fd, const void* data, size_t size) {
    ASSERT_EQ(send(fd, data, size, MSG_NOSIGNAL), static_cast<ssize_t>(size));
  }

  // Reads exactly `size` bytes; false on EOF or timeout.
  static bool RecvBytes(int fd, void* data, size_t size) {
    size_t got = 0;
    while (got < size) {
      ssize_t n = recv(fd, static_cast<char*>(data) + got, size - got, 0);
      if (n <= 0) return false;
      got += static_cast<size_t>(n);
    }
    return true;
  }

  wire::RequestHeader Request(wire::Opcode opcode, uint64_t offset, uint64_t length,
                              uint64_t id = 1) {
    return {.opcode = opcode,
            .request_id = id,
            .offset = offset,
            .length = length,
            .token = wire::MintToken(secret_, opcode, offset, length, absl::Now() + absl::Minutes(1))};
  }

  void SendHeader(int fd, const wire::RequestHeader& header) {
    uint8_t bytes[wire::kRequestHeaderSize];
    wire::EncodeRequest(header, bytes);
    SendBytes(fd, bytes, sizeof(bytes));
  }

  // Reads a response; for errors also the reason.
  wire::ResponseHeader Response(int fd, std::string* reason = nullptr) {
    uint8_t bytes[wire::kResponseHeaderSize];
    EXPECT_TRUE(RecvBytes(fd, bytes, sizeof(bytes)));
    wire::ResponseHeader header = *wire::DecodeResponse(bytes);
    if (header.status != 0) {
      std::string text(header.length, '\0');
      EXPECT_TRUE(RecvBytes(fd, text.data(), text.size()));
      if (reason) *reason = text;
    }
    return header;
  }

  static bool ClosedByPeer(int fd) {
    char byte;
    return recv(fd, &byte, 1, 0) == 0;
  }

  void ExpectStillServing() {
    int fd = Connect();
    SendHeader(fd, {.opcode = wire::Opcode::kPing, .request_id = 77});
    wire::ResponseHeader pong = Response(fd);
    EXPECT_EQ(pong.status, 0);
    EXPECT_EQ(pong.request_id, 77u);
    close(fd);
  }

  // A READ_KEY of `tenant`'s `key`, taking at most `most` bytes, under `credential`.
  void SendReadKey(int fd, absl::string_view tenant, absl::string_view key, uint64_t most,
                   const wire::Token& credential, uint64_t id = 1) {
    SendHeader(fd, {.opcode = wire::Opcode::kReadKey,
                    .flags = static_cast<uint16_t>(tenant.size()),
                    .request_id = id,
                    .offset = most,
                    .length = tenant.size() + key.size(),
                    .token = credential});
    std::string payload = absl::StrCat(tenant, key);
    SendBytes(fd, payload.data(), payload.size());
  }

  wire::Token Credential(absl::string_view tenant, absl::Duration ttl = absl::Minutes(1)) {
    return wire::MintKeyReadCredential(wire::TokenKey(secret_), tenant, absl::Now() + ttl);
  }

  // Commits `value` at `offset` under `stored_key` (as the master's ADD would).
  void Commit(const std::string& stored_key, uint64_t offset, const std::string& value) {
    std::memcpy(pool_->data() + offset, value.data(), value.size());
    v1::ManifestRecord add;
    add.set_kind(v1::ManifestRecord::ADD);
    add.set_key(stored_key);
    add.set_offset(offset);
    add.set_size(value.size());
    iovec part{const_cast<char*>(value.data()), value.size()};
    add.set_checksum(wire::Checksum({&part, 1}));
    add.set_grant(offset + 1);
    manifest_.Apply({add});
  }

  std::unique_ptr<MemoryPool> pool_;
  std::string secret_;
  Manifest manifest_{
      [this](uint64_t offset, uint64_t size) { server_->grants().CutKeyReads(offset, size); }};
  std::atomic<bool> in_touch_{true};
  std::unique_ptr<DataServer> server_;
  uint16_t port_ = 0;
};

TEST_F(DataServerTest, WritesLandInThePoolAndReadsComeBackPipelined) {
  int fd = Connect();
  std::string payload(100000, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 31 + 7);
  SendHeader(fd, Request(wire::Opcode::kWrite, 4096, payload.size(), 1));
  SendBytes(fd, payload.data(), payload.size());
  // Two reads in flight before the first answer is read.
  SendHeader(fd, Request(wire::Opcode::kRead, 4096, payload.size(), 2));
  SendHeader(fd, Request(wire::Opcode::kRead, 4096 + 10, 20, 3));

  wire::ResponseHeader written = Response(fd);
  EXPECT_EQ(written.status, 0);
  EXPECT_EQ(written.request_id, 1u);
  EXPECT_EQ(std::memcmp(pool_->data() + 4096, payload.data(), payload.size()), 0);

  wire::ResponseHeader read = Response(fd);
  ASSERT_EQ(read.status, 0);
  EXPECT_EQ(read.request_id, 2u);
  ASSERT_EQ(read.length, payload.size());
  std::string back(payload.size(), '\0');
  ASSERT_TRUE(RecvBytes(fd, back.data(), back.size()));
  EXPECT_EQ(back, payload);

  wire::ResponseHeader slice = Response(fd);
  ASSERT_EQ(slice.length, 20u);
  std::string part(20, '\0');
  ASSERT_TRUE(RecvBytes(fd, part.data(), part.size()));
  EXPECT_EQ(part, payload.substr(10, 20));
  close(fd);

  DataServer::Stats stats = server_->stats();
  EXPECT_EQ(stats.writes, 1u);
  EXPECT_EQ(stats.reads, 2u);
  EXPECT_EQ(stats.bytes_written, payload.size());
  EXPECT_EQ(stats.bytes_read, payload.size() + 20);
}

// The connections are dealt over the threads' event loops (here 3 loops, 7 connections, all
// open at once): each is served, in order, whatever loop it went to, and a large answer on one
// does not keep the others from theirs.
TEST_F(DataServerTest, ConnectionsDealtOverTheThreadsLoopsAreEachServedInOrder) {
  server_->Stop();
  server_ = std::make_unique<DataServer>(*pool_, secret_, DataServerOptions{.threads = 3});
  absl::StatusOr<uint16_t> port = server_->Start("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  port_ = *port;
  constexpr int kConnections = 7;
  constexpr uint64_t kSlice = kPoolSize / kConnections / 4096 * 4096;
  std::vector<int> fds;
  std::vector<std::string> payloads;
  for (int c = 0; c < kConnections; ++c) {
    fds.push_back(Connect());
    payloads.emplace_back(kSlice, static_cast<char>('a' + c));
  }
  // Every connection writes its slice, then asks for it back twice (a large answer) and for
  // a short piece of it; none has read an answer yet.
  for (int c = 0; c < kConnections; ++c) {
    SendHeader(fds[c], Request(wire::Opcode::kWrite, c * kSlice, kSlice, 1));
    SendBytes(fds[c], payloads[c].data(), kSlice);
    SendHeader(fds[c], Request(wire::Opcode::kRead, c * kSlice, kSlice, 2));
    SendHeader(fds[c], Request(wire::Opcode::kRead, c * kSlice, kSlice, 3));
    SendHeader(fds[c], Request(wire::Opcode::kRead, c * kSlice + 5, 10, 4));
  }
  // Read in the reverse order of connecting.
  for (int c = kConnections - 1; c >= 0; --c) {
    wire::ResponseHeader written = Response(fds[c]);
    EXPECT_EQ(written.status, 0);
    EXPECT_EQ(written.request_id, 1u);
    for (uint64_t id : {2, 3}) {
      wire::ResponseHeader read = Response(fds[c]);
      ASSERT_EQ(read.status, 0) << c;
      EXPECT_EQ(read.request_id, id);
      ASSERT_EQ(read.length, kSlice);
      std::string back(kSlice, '\0');
      ASSERT_TRUE(RecvBytes(fds[c], back.data(), back.size()));
      EXPECT_EQ(back, payloads[c]) << c;
    }
    wire::ResponseHeader piece = Response(fds[c]);
    ASSERT_EQ(piece.length, 10u);
    EXPECT_EQ(piece.request_id, 4u);
    std::string part(10, '\0');
    ASSERT_TRUE(RecvBytes(fds[c], part.data(), part.size()));
    EXPECT_EQ(part, payloads[c].substr(5, 10));
    close(fds[c]);
  }
  EXPECT_EQ(server_->stats().reads, 3u * kConnections);
  ExpectStillServing();
}

TEST_F(DataServerTest, RangeOutsideThePoolIsRejectedAndTheConnectionClosed) {
  for (auto [offset, length] : {std::pair<uint64_t, uint64_t>{kPoolSize - 10, 11},
                                {kPoolSize + 1, 0},
                                {1, UINT64_MAX}}) {
    int fd = Connect();
    SendHeader(fd, Request(wire::Opcode::kWrite, offset, length));
    std::string reason;
    wire::ResponseHeader response = Response(fd, &reason);
    EXPECT_EQ(response.status, v1::INVALID_WRITE);
    EXPECT_NE(reason.find("outside the pool"), std::string::npos) << reason;
    EXPECT_TRUE(ClosedByPeer(fd));
    close(fd);
  }
  std::vector<uint8_t> untouched(kPoolSize, 0);
  EXPECT_EQ(std::memcmp(pool_->data(), untouched.data(), kPoolSize), 0);
  EXPECT_EQ(server_->stats().rejected, 3u);
  ExpectStillServing();
}

TEST_F(DataServerTest, RequestsWithoutAValidTokenAreRefused) {
  wire::RequestHeader forged = Request(wire::Opcode::kRead, 0, 64);
  forged.length = 128;  // token was minted for 64 bytes
  wire::RequestHeader wrong_op = Request(wire::Opcode::kRead, 0, 64);
  wrong_op.opcode = wire::Opcode::kWrite;
  wire::RequestHeader expired = Request(wire::Opcode::kRead, 0, 64);
  expired.token = wire::MintToken(secret_, wire::Opcode::kRead, 0, 64, absl::Now() - absl::Seconds(1));
  wire::RequestHeader none = Request(wire::Opcode::kRead, 0, 64);
  none.token = {};
  for (const wire::RequestHeader& request : {forged, wrong_op, expired, none}) {
    int fd = Connect();
    SendHeader(fd, request);
    std::string reason;
    EXPECT_EQ(Response(fd, &reason).status,
              request.token == expired.token ? v1::LEASE_EXPIRED : v1::PERMISSION_DENIED);
    EXPECT_NE(reason.find("token"), std::string::npos);
    EXPECT_TRUE(ClosedByPeer(fd));
    close(fd);
  }
  ExpectStillServing();
}

TEST_F(DataServerTest, MalformedHeaderGetsAReasonAndACloseOthersKeepWorking) {
  int bystander = Connect();
  int fd = Connect();
  uint8_t garbage[wire::kRequestHeaderSize];
  std::memset(garbage, 0xAB, sizeof(garbage));
  SendBytes(fd, garbage, sizeof(garbage));
  std::string reason;
  EXPECT_EQ(Response(fd, &reason).status, v1::INVALID_PARAMS);
  EXPECT_NE(reason.find("magic"), std::string::npos) << reason;
  EXPECT_TRUE(ClosedByPeer(fd));
  close(fd);

  SendHeader(bystander, {.opcode = wire::Opcode::kPing, .request_id = 5});
  EXPECT_EQ(Response(bystander).request_id, 5u);
  close(bystander);
}

TEST_F(DataServerTest, TruncatedHeaderOrPayloadLeavesTheServerServing) {
  int fd = Connect();
  uint8_t header[wire::kRequestHeaderSize];
  wire::EncodeRequest(Request(wire::Opcode::kRead, 0, 8), header);
  SendBytes(fd, header, 20);  // then vanish
  close(fd);

  fd = Connect();
  SendHeader(fd, Request(wire::Opcode::kWrite, 0, 1000));
  SendBytes(fd, "partial", 7);  // a client that dies mid-put
  close(fd);

  ExpectStillServing();
}

// A grant the master ends while the payload of a write under it is still arriving: what
// arrives after that never lands, and later writes or reads under it are refused.
TEST_F(DataServerTest, GrantEndedMidPayloadLandsNoFurtherByte) {
  constexpr uint64_t kOffset = 8192, kLength = 256 << 10;
  constexpr uint64_t kGrant = 0xabc;
  wire::RequestHeader write = {
      .opcode = wire::Opcode::kWrite,
      .request_id = 5,
      .offset = kOffset,
      .length = kLength,
      .token = wire::MintToken(secret_, wire::Opcode::kWrite, kOffset, kLength,
                               absl::Now() + absl::Minutes(1), kGrant)};
  std::memset(pool_->data() + kOffset, 'o', kLength);
  int fd = Connect();
  SendHeader(fd, write);
  std::string first(kLength / 2, 'a'), second(kLength - kLength / 2, 'b');
  SendBytes(fd, first.data(), first.size());
  // Wait until the first half has landed, then end the grant (as a revoke's FORGET does).
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (pool_->data()[kOffset + kLength / 2 - 1] != 'a' && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  server_->grants().End(kGrant, /*writes_only=*/false, absl::Now() + absl::Minutes(1));
  send(fd, second.data(), second.size(), MSG_NOSIGNAL);  // may be cut short by the close
  std::string reason;
  wire::ResponseHeader answer = Response(fd, &reason);
  EXPECT_EQ(answer.status, v1::PERMISSION_DENIED) << reason;
  EXPECT_NE(reason.find("grant ended"), std::string::npos) << reason;
  close(fd);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(pool_->data()) + kOffset + kLength / 2,
                        kLength - kLength / 2),
            std::string(kLength - kLength / 2, 'o'))
      << "bytes landed after the grant ended";

  fd = Connect();
  write.request_id = 6;
  SendHeader(fd, write);
  answer = Response(fd, &reason);
  EXPECT_EQ(answer.status, v1::PERMISSION_DENIED) << reason;
  close(fd);
  EXPECT_EQ(server_->grants().writes_in_flight(), 0u);
  EXPECT_GE(server_->stats().rejected_ended, 2u);
  ExpectStillServing();
}

// A WRITE's payload is hashed as it lands, in however many pieces the socket delivers it:
// the commit's End gets the checksum of exactly the bytes in the range, and a write cut off
// before its end leaves none (the commit check then hashes the range itself).
TEST_F(DataServerTest, AWholeWriteLeavesTheChecksumOfItsBytesForTheCommit) {
  constexpr uint64_t kOffset = 65536, kLength = 700 << 10;
  std::string payload(kLength, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 131 + (i >> 11));
  auto write = [&](uint64_t grant, uint64_t id) {
    return wire::RequestHeader{
        .opcode = wire::Opcode::kWrite,
        .request_id = id,
        .offset = kOffset,
        .length = kLength,
        .token = wire::MintToken(secret_, wire::Opcode::kWrite, kOffset, kLength,
                                 absl::Now() + absl::Minutes(1), grant)};
  };
  int fd = Connect();
  SendHeader(fd, write(0x77, 1));
  // In pieces, with pauses, so the payload lands in several reads.
  for (size_t at = 0; at < kLength; at += 100 << 10) {
    SendBytes(fd, payload.data() + at, std::min<size_t>(100 << 10, kLength - at));
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(Response(fd).status, 0);
  close(fd);
  std::optional<GrantTable::Landed> landed =
      server_->grants().End(0x77, /*writes_only=*/true, absl::Now() + absl::Minutes(1));
  ASSERT_TRUE(landed.has_value());
  iovec iov{payload.data(), payload.size()};
  EXPECT_EQ(landed->offset, kOffset);
  EXPECT_EQ(landed->length, kLength);
  EXPECT_EQ(landed->checksum, wire::Checksum({&iov, 1}));

  // Half a payload, then the writer hangs up.
  fd = Connect();
  SendHeader(fd, write(0x78, 2));
  SendBytes(fd, payload.data(), kLength / 2);
  absl::SleepFor(absl::Milliseconds(50));
  close(fd);
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (server_->grants().writes_in_flight() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_FALSE(server_->grants().End(0x78, true, absl::Now() + absl::Minutes(1)).has_value());
  ExpectStillServing();
}

// A shared-memory write (an intent) of a grant the master has since ended still holds its
// range: a TCP write of the grant that reused the range is refused as busy (TRANSFER_FAIL,
// nothing lands) until the intent is done; writes elsewhere are served meanwhile.
TEST_F(DataServerTest, ATcpWriteIntoARangeBusyWithAnEndedGrantsShmWriteIsRefused) {
  constexpr uint64_t kOffset = 16384, kLength = 4096;
  auto header = [&](uint64_t grant, uint64_t offset, uint64_t id) {
    return wire::RequestHeader{
        .opcode = wire::Opcode::kWrite,
        .request_id = id,
        .offset = offset,
        .length = kLength,
        .token = wire::MintToken(secret_, wire::Opcode::kWrite, offset, kLength,
                                 absl::Now() + absl::Minutes(1), grant)};
  };
  absl::StatusOr<std::shared_ptr<GrantTable::Write>> intent = server_->grants().BeginWrite(
      header(0x51, kOffset, 0), absl::Now(), GrantTable::WriteKind::kShm);
  ASSERT_TRUE(intent.ok()) << intent.status();
  server_->grants().End(0x51, /*writes_only=*/false, absl::Now() + absl::Minutes(1));
  std::memset(pool_->data() + kOffset, 'o', kLength);

  const std::string payload(kLength, 'n');
  int fd = Connect();
  SendHeader(fd, header(0x52, kOffset, 7));
  send(fd, payload.data(), payload.size(), MSG_NOSIGNAL);  // may meet the close
  std::string reason;
  wire::ResponseHeader answer = Response(fd, &reason);
  EXPECT_EQ(answer.status, v1::TRANSFER_FAIL) << reason;
  EXPECT_NE(reason.find("busy"), std::string::npos) << reason;
  close(fd);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(pool_->data()) + kOffset, kLength),
            std::string(kLength, 'o'));
  EXPECT_EQ(server_->stats().rejected_busy, 1u);

  // Next to it, served.
  fd = Connect();
  SendHeader(fd, header(0x53, kOffset + kLength, 8));
  SendBytes(fd, payload.data(), payload.size());
  EXPECT_EQ(Response(fd).status, 0);
  close(fd);

  // Once the late writer is done, the range takes the new grant's write.
  server_->grants().EndWrite(*intent);
  fd = Connect();
  SendHeader(fd, header(0x52, kOffset, 9));
  SendBytes(fd, payload.data(), payload.size());
  EXPECT_EQ(Response(fd).status, 0);
  close(fd);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(pool_->data()) + kOffset, kLength), payload);
  ExpectStillServing();
}

}  // namespace
}  // namespace kvpool::segment

namespace kvpool::segment {
namespace {

// Reads by key: what a tenant's client gets, and what strangers, other tenants, forged or
// expired credentials, odd frames and removals get.
TEST_F(DataServerTest, ReadKeyAnswersTheTenantsValueWithItsChecksum) {
  std::string value(5000, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(i * 13 + 1);
  Commit(wire::TenantKey("team-a", "k"), 8192, value);
  int fd = Connect();
  SendReadKey(fd, "team-a", "k", 1 << 20, Credential("team-a"), 5);
  wire::ResponseHeader answer = Response(fd);
  ASSERT_EQ(answer.status, 0);
  EXPECT_EQ(answer.request_id, 5u);
  ASSERT_EQ(answer.length, value.size());
  iovec part{value.data(), value.size()};
  EXPECT_EQ(answer.checksum, wire::Checksum({&part, 1}));
  std::string back(value.size(), '\0');
  ASSERT_TRUE(RecvBytes(fd, back.data(), back.size()));
  EXPECT_EQ(back, value);

  // A key not here, and a value larger than asked for: answered, the connection kept.
  SendReadKey(fd, "team-a", "absent", 1 << 20, Credential("team-a"), 6);
  std::string reason;
  wire::ResponseHeader absent = Response(fd, &reason);
  EXPECT_EQ(absent.status, v1::OBJECT_NOT_FOUND) << reason;
  SendReadKey(fd, "team-a", "k", 4999, Credential("team-a"), 7);
  EXPECT_EQ(Response(fd, &reason).status, v1::BUFFER_OVERFLOW) << reason;
  SendReadKey(fd, "team-a", "k", 5000, Credential("team-a"), 8);
  ASSERT_EQ(Response(fd).status, 0);
  ASSERT_TRUE(RecvBytes(fd, back.data(), back.size()));
  EXPECT_EQ(server_->stats().key_reads, 2u);
  EXPECT_EQ(server_->stats().key_reads_missed, 2u);
  close(fd);
}

TEST_F(DataServerTest, ReadKeyKeepsTenantsApartAndRefusesStrangers) {
  Commit(wire::TenantKey("team-a", "k"), 0, "secret of a");
  Commit("global-k", 4096, "global value");
  struct Case {
    const char* what;
    std::string tenant;
    std::string key;
    wire::Token credential;
    int32_t status;
  };
  wire::Token forged = Credential("team-b");
  forged[20] ^= 1;
  std::vector<Case> cases = {
      // team-b's credential names team-b's namespace: team-a's "k" is not in it.
      {"another tenant's key", "team-b", "k", Credential("team-b"), v1::OBJECT_NOT_FOUND},
      {"a credential of another tenant", "team-a", "k", Credential("team-b"),
       v1::PERMISSION_DENIED},
      {"a forged credential", "team-b", "k", forged, v1::PERMISSION_DENIED},
      {"no credential", "team-a", "k", wire::Token{}, v1::PERMISSION_DENIED},
      {"another segment's credential", "team-a", "k",
       wire::MintKeyReadCredential(wire::TokenKey(wire::NewCapabilitySecret()), "team-a",
                                   absl::Now() + absl::Minutes(1)),
       v1::PERMISSION_DENIED},
      {"an expired credential", "team-a", "k", Credential("team-a", -absl::Seconds(1)),
       v1::LEASE_EXPIRED},
      // The global namespace cannot reach into a tenant's by spelling its stored key.
      {"a stored key from the global namespace", "", wire::TenantKey("team-a", "k"), Credential(""),
       v1::PERMISSION_DENIED},
  };
  for (const Case& c : cases) {
    int fd = Connect();
    SendReadKey(fd, c.tenant, c.key, 1 << 20, c.credential);
    std::string reason;
    wire::ResponseHeader answer = Response(fd, &reason);
    EXPECT_EQ(answer.status, c.status) << c.what << ": " << reason;
    if (c.status != v1::OBJECT_NOT_FOUND) EXPECT_TRUE(ClosedByPeer(fd)) << c.what;
    close(fd);
  }
  // The global namespace reads its own keys.
  int fd = Connect();
  SendReadKey(fd, "", "global-k", 1 << 20, Credential(""));
  wire::ResponseHeader answer = Response(fd);
  ASSERT_EQ(answer.status, 0);
  std::string back(answer.length, '\0');
  ASSERT_TRUE(RecvBytes(fd, back.data(), back.size()));
  EXPECT_EQ(back, "global value");
  close(fd);
  ExpectStillServing();
}

TEST_F(DataServerTest, ReadKeyFramesOutOfBoundsAreRejected) {
  struct Case {
    const char* what;
    uint16_t tenant_length;
    uint64_t length;
  };
  for (Case c : {Case{"an empty key", 3, 3}, Case{"a tenant longer than the frame", 9, 4},
                 Case{"a tenant of 256 bytes", 256, 300},
                 Case{"a key of 4097 bytes", 0, wire::kMaxKeyReadKey + 1},
                 Case{"a length of 2^64 - 1", 0, ~uint64_t{0}}}) {
    int fd = Connect();
    SendHeader(fd, {.opcode = wire::Opcode::kReadKey,
                    .flags = c.tenant_length,
                    .request_id = 1,
                    .offset = 1 << 20,
                    .length = c.length,
                    .token = Credential("")});
    std::string reason;
    EXPECT_EQ(Response(fd, &reason).status, v1::INVALID_PARAMS) << c.what;
    EXPECT_TRUE(ClosedByPeer(fd)) << c.what;
    close(fd);
  }
  ExpectStillServing();
}

TEST_F(DataServerTest, ReadKeyFindsNothingOnceRemovedOrOutOfTouch) {
  Commit("k", 0, "value");
  int fd = Connect();
  in_touch_ = false;  // cut off from the master: it may have removed k meanwhile
  SendReadKey(fd, "", "k", 100, Credential(""), 1);
  std::string reason;
  EXPECT_EQ(Response(fd, &reason).status, v1::OBJECT_NOT_FOUND);
  EXPECT_NE(reason.find("no reads by key"), std::string::npos) << reason;
  in_touch_ = true;
  SendReadKey(fd, "", "k", 100, Credential(""), 2);
  ASSERT_EQ(Response(fd).status, 0);
  std::string back(5, '\0');
  ASSERT_TRUE(RecvBytes(fd, back.data(), back.size()));
  EXPECT_EQ(back, "value");
  v1::ManifestRecord forget;
  forget.set_kind(v1::ManifestRecord::FORGET);
  forget.set_key("k");
  forget.set_offset(0);
  manifest_.Apply({forget});
  SendReadKey(fd, "", "k", 100, Credential(""), 3);
  EXPECT_EQ(Response(fd, &reason).status, v1::OBJECT_NOT_FOUND) << reason;
  close(fd);
}

// A client may hold a whole answer before the server's send of it has ended; a FORGET of its
// entry or the end of its grant then cuts nothing (the bytes have left the pool) and the
// connection goes on serving: a client that pooled it does not find it dead on its next use.
TEST_F(DataServerTest, AnAnswerThatHasLeftThePoolIsNotCut) {
  const std::string value(64 << 10, 'v');
  int fd = Connect();
  int one = 1;  // READ_KEY's header and key go in two sends
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  uint64_t id = 0;
  for (int i = 0; i < 200; ++i) {
    const uint64_t offset = (i % 8) * value.size();
    // By key, then the entry goes at once.
    Commit("k", offset, value);
    SendReadKey(fd, "", "k", value.size(), Credential(""), ++id);
    ASSERT_EQ(Response(fd).status, 0) << i;
    std::string back(value.size(), '\0');
    ASSERT_TRUE(RecvBytes(fd, back.data(), back.size())) << i;
    ASSERT_EQ(back, value) << i;
    manifest_.DropOverlapping(offset, value.size());
    // By token, then its grant ends at once.
    const uint64_t grant = 1000 + i;
    SendHeader(fd, {.opcode = wire::Opcode::kRead,
                    .request_id = ++id,
                    .offset = offset,
                    .length = value.size(),
                    .token = wire::MintToken(secret_, wire::Opcode::kRead, offset, value.size(),
                                             absl::Now() + absl::Minutes(1), grant)});
    ASSERT_EQ(Response(fd).status, 0) << i;
    ASSERT_TRUE(RecvBytes(fd, back.data(), back.size())) << i;
    ASSERT_EQ(back, value) << i;
    server_->grants().End(grant, /*writes_only=*/false, absl::Now() + absl::Minutes(1));
  }
  SendHeader(fd, {.opcode = wire::Opcode::kPing, .request_id = ++id});
  wire::ResponseHeader pong = Response(fd);
  EXPECT_EQ(pong.status, 0);
  EXPECT_EQ(pong.request_id, id);
  EXPECT_EQ(server_->grants().reads_cut(), 0u);
  close(fd);
}

// An entry that leaves the manifest while its value is being sent cuts the send: the reader
// gets a prefix and the end of the stream, never the bytes written there later.
TEST_F(DataServerTest, ReadKeyOfAnEntryDroppedMidSendIsCut) {
  std::string value(kPoolSize * 3 / 4, 'v');
  Commit("big", 0, value);
  int fd = Connect();
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  SendReadKey(fd, "", "big", kPoolSize, Credential(""));
  uint8_t header[wire::kResponseHeaderSize];
  ASSERT_TRUE(RecvBytes(fd, header, sizeof(header)));
  ASSERT_EQ(wire::DecodeResponse(header)->status, 0);
  // The answer is stuck in the socket buffers; the entry goes and the range is reused.
  for (int i = 0; i < 100 && server_->grants().reads_in_flight() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(server_->grants().reads_in_flight(), 1u);
  manifest_.DropOverlapping(100, 1);
  EXPECT_EQ(server_->grants().reads_in_flight(), 0u);
  EXPECT_EQ(server_->grants().reads_cut(), 1u);
  std::memset(pool_->data(), 'X', value.size());
  std::string got;
  char buffer[65536];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) got.append(buffer, n);
  EXPECT_LT(got.size(), value.size());
  EXPECT_EQ(got.find('X'), std::string::npos) << "bytes written after the drop were sent";
  close(fd);
}

}  // namespace
}  // namespace kvpool::segment
