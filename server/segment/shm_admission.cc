#include "server/segment/shm_admission.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "proto/error_codes.h"
#include "proto/shm_handshake.h"

namespace kvpool::segment {
namespace {

// Sends `bytes`, with `fd` attached when it is not -1.
bool SendWithFd(int socket, const std::string& bytes, int fd) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
  }
  return sendmsg(socket, &message, MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

}  // namespace

absl::Status ParseAdmittedGroup(absl::string_view text, ShmAdmissionOptions* options) {
  if (text.empty()) return absl::OkStatus();
  uint32_t gid = 0;
  if (absl::SimpleAtoi(text, &gid)) {
    options->group = gid;
    return absl::OkStatus();
  }
  std::string name(text);
  if (group* found = getgrnam(name.c_str()); found != nullptr) {
    options->group = found->gr_gid;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("no group \"", text, "\""));
}

absl::Status ParseAdmittedUids(absl::string_view text, ShmAdmissionOptions* options) {
  if (text.empty()) return absl::OkStatus();
  if (text == "any") {
    options->any_uid = true;
    return absl::OkStatus();
  }
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    uint32_t uid = 0;
    if (!absl::SimpleAtoi(part, &uid)) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", part, "\" is not a uid (want \"any\" or numbers like 1000,1001)"));
    }
    options->uids.push_back(uid);
  }
  return absl::OkStatus();
}

// An admitted client's connection: its bytes not yet handled, and its open intents by id.
struct ShmAdmission::Client {
  int fd = -1;
  pid_t pid = 0;
  std::string in;
  absl::flat_hash_map<uint64_t, std::shared_ptr<GrantTable::Write>> intents;
  uint64_t next_intent = 0;
};

ShmAdmission::ShmAdmission(const MemoryPool& pool, GrantTable& grants, ShmAdmissionOptions options)
    : pool_(pool), grants_(grants), options_(std::move(options)) {}

ShmAdmission::~ShmAdmission() { Stop(); }

absl::Status ShmAdmission::Start() {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (options_.socket_path.empty() || options_.socket_path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory socket path \"", options_.socket_path, "\" is empty or too long"));
  }
  std::memcpy(address.sun_path, options_.socket_path.data(), options_.socket_path.size());
  // A live segment still answering on the path keeps it: fail rather than steal it. A file
  // nobody answers on is what a killed segment left behind.
  if (int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0); probe >= 0) {
    bool live = connect(probe, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    close(probe);
    if (live) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.socket_path,
                                                 ": address in use (another segment answers "
                                                 "there)"));
    }
  }
  unlink(options_.socket_path.c_str());
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listen_fd_, 64) != 0) {
    int error = errno;
    if (listen_fd_ >= 0) close(listen_fd_);
    listen_fd_ = -1;
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.socket_path, ": ",
                                               std::strerror(error)));
  }
  // Only the owner (and the allowed group) may reach the socket at all; admission is then
  // decided by the peer's credentials.
  mode_t mode = options_.any_uid ? 0666 : 0600;
  if (options_.group != static_cast<gid_t>(-1)) {
    if (chown(options_.socket_path.c_str(), static_cast<uid_t>(-1), options_.group) != 0) {
      int error = errno;
      close(listen_fd_);
      listen_fd_ = -1;
      unlink(options_.socket_path.c_str());
      return absl::PermissionDeniedError(absl::StrCat("cannot give ", options_.socket_path,
                                                      " to group ", options_.group, ": ",
                                                      std::strerror(error)));
    }
    mode |= 0060;
  }
  chmod(options_.socket_path.c_str(), mode);
  fcntl(listen_fd_, F_SETFL, fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void ShmAdmission::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  ssize_t ignored = write(stop_fd_, &one, sizeof(one));
  (void)ignored;
  thread_.join();
  close(listen_fd_);
  close(stop_fd_);
  unlink(options_.socket_path.c_str());
}

bool ShmAdmission::Admits(const ucred& peer) const {
  if (options_.any_uid) return true;
  if (options_.group != static_cast<gid_t>(-1) && peer.gid == options_.group) return true;
  if (options_.uids.empty()) return peer.uid == 0 || peer.uid == getuid();
  return std::find(options_.uids.begin(), options_.uids.end(), peer.uid) != options_.uids.end();
}

void ShmAdmission::Loop() {
  // Handshakes in progress: each peer's hello so far and its deadline, oldest first.
  struct Pending {
    int fd;
    absl::Time deadline;
    uint8_t hello[wire::kShmHelloSize];
    size_t got = 0;
  };
  std::deque<Pending> pending;
  auto drop = [&](size_t i) {
    close(pending[i].fd);
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
  };
  // Admitted clients, whose intents are served here too.
  std::vector<std::unique_ptr<Client>> clients;
  while (true) {
    std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    for (const Pending& peer : pending) fds.push_back({peer.fd, POLLIN, 0});
    for (const auto& client : clients) fds.push_back({client->fd, POLLIN, 0});
    int timeout_ms = -1;
    if (!pending.empty()) {
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(pending.front().deadline - absl::Now()) + 1, 0, 1000));
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) break;
    if (fds[1].revents != 0) break;
    // Messages of admitted clients (walk backwards: closed ones leave the list).
    const size_t first_client = 2 + pending.size();
    for (size_t i = clients.size(); i-- > 0;) {
      if (fds[first_client + i].revents == 0) continue;
      if (!Receive(*clients[i])) {
        Close(*clients[i]);
        clients.erase(clients.begin() + static_cast<std::ptrdiff_t>(i));
        connections_.store(clients.size());
      }
    }
    // Hellos that arrived (walk backwards: answered peers leave the list).
    for (size_t i = pending.size(); i-- > 0;) {
      if (fds[i + 2].revents == 0) continue;
      Pending& peer = pending[i];
      ssize_t n = recv(peer.fd, peer.hello + peer.got, sizeof(peer.hello) - peer.got, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (n <= 0) {
        drop(i);
        continue;
      }
      peer.got += static_cast<size_t>(n);
      if (peer.got == sizeof(peer.hello)) {
        if (Serve(peer.fd, peer.hello, clients.size())) {
          auto client = std::make_unique<Client>();
          client->fd = peer.fd;
          ucred credentials{};
          socklen_t length = sizeof(credentials);
          if (getsockopt(peer.fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0) {
            client->pid = credentials.pid;
          }
          clients.push_back(std::move(client));
          connections_.store(clients.size());
          pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          drop(i);
        }
      }
    }
    absl::Time now = absl::Now();
    while (!pending.empty() && pending.front().deadline <= now) {
      timed_out_.fetch_add(1);
      drop(0);
    }
    if (fds[0].revents != 0) {
      while (true) {
        int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;  // EAGAIN, or EMFILE and the like: poll again (with a pause)
        if (pending.size() >= options_.max_pending) {
          timed_out_.fetch_add(1);
          drop(0);
        }
        pending.push_back(Pending{fd, now + options_.handshake_timeout});
      }
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        usleep(10000);  // out of descriptors: do not spin on the listening socket
      }
    }
  }
  for (const Pending& peer : pending) close(peer.fd);
  for (const auto& client : clients) Close(*client);
  connections_.store(0);
}

bool ShmAdmission::Serve(int fd, const uint8_t* hello, size_t clients) {
  wire::ShmAnswer answer;
  ucred peer{};
  socklen_t length = sizeof(peer);
  if (absl::Status valid = wire::DecodeShmHello(hello); !valid.ok()) {
    answer.status = v1::INVALID_PARAMS;
    answer.reason = std::string(valid.message());
  } else if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0 || !Admits(peer)) {
    answer.status = v1::PERMISSION_DENIED;
    answer.reason = absl::StrCat("uid ", peer.uid, " (gid ", peer.gid,
                                 ") is not admitted to this segment's shared memory");
  } else if (clients >= options_.max_connections) {
    answer.status = v1::TRANSFER_FAIL;
    answer.reason = absl::StrCat("this segment already has ", clients,
                                 " shared-memory clients (the most it keeps)");
  } else {
    answer.pool_size = pool_.size();
    answer.incarnation = options_.incarnation;
  }
  if (answer.status == 0) {
    if (SendWithFd(fd, wire::EncodeShmAnswer(answer), pool_.fd())) {
      admitted_.fetch_add(1);
      KVPOOL_LOG(INFO) << "admitted pid " << peer.pid << " (uid " << peer.uid << ", gid "
                       << peer.gid << ") to shared memory";
      return true;
    }
    return false;
  } else {
    refused_.fetch_add(1);
    // At most one line a second: a peer that connects in a loop costs a counter, not a log.
    uint64_t suppressed = 0;
    if (refusal_log_.Allow(&suppressed)) {
      KVPOOL_LOG(INFO) << "refused shared memory to pid " << peer.pid << ": " << answer.reason
                       << " (" << refused_.load() << " refusals so far)";
    }
    SendWithFd(fd, wire::EncodeShmAnswer(answer), -1);
  }
  return false;
}

bool ShmAdmission::Receive(Client& client) {
  constexpr size_t kLargest =
      wire::kShmMessageHeaderSize + wire::kShmMaxEntries * wire::kShmIntentEntrySize;
  // Messages come one at a time (the client waits for each answer), so at most one is
  // buffered; read what is there, then handle whole messages.
  size_t had = client.in.size();
  client.in.resize(had + kLargest);
  ssize_t n = recv(client.fd, client.in.data() + had, kLargest, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    client.in.resize(had);
    return true;
  }
  if (n <= 0) return false;  // the client closed its mapping, or its process is gone
  client.in.resize(had + static_cast<size_t>(n));
  size_t at = 0;
  while (client.in.size() - at >= wire::kShmMessageHeaderSize) {
    const uint8_t* message = reinterpret_cast<const uint8_t*>(client.in.data()) + at;
    absl::StatusOr<wire::ShmMessageHeader> header = wire::DecodeShmMessageHeader(message);
    if (!header.ok() || header->kind == wire::ShmMessageKind::kReply) {
      protocol_errors_.fetch_add(1);
      uint64_t suppressed = 0;
      if (refusal_log_.Allow(&suppressed)) {
        KVPOOL_LOG(WARNING) << "shared-memory client pid " << client.pid << " sent "
                            << (header.ok() ? "an answer" : header.status().message())
                            << "; closing its connection" << SuppressedNote(suppressed);
      }
      return false;
    }
    size_t size = wire::kShmMessageHeaderSize + header->body_size;
    if (client.in.size() - at < size) break;
    if (!Handle(client, message, size)) return false;
    at += size;
  }
  client.in.erase(0, at);
  if (client.in.size() > kLargest) return false;
  return true;
}

bool ShmAdmission::Handle(Client& client, const uint8_t* message, size_t size) {
  absl::StatusOr<wire::ShmMessageHeader> header = wire::DecodeShmMessageHeader(message);
  absl::Span<const uint8_t> body(message + wire::kShmMessageHeaderSize,
                                 size - wire::kShmMessageHeaderSize);
  std::vector<wire::ShmReply> replies;
  if (header->kind == wire::ShmMessageKind::kIntents) {
    absl::StatusOr<std::vector<wire::ShmIntent>> intents = wire::DecodeShmIntents(*header, body);
    if (!intents.ok()) return false;
    absl::Time now = absl::Now();
    for (const wire::ShmIntent& intent : *intents) {
      wire::ShmReply& reply = replies.emplace_back();
      if (!pool_.Contains(intent.offset, intent.length)) {
        reply.status = v1::INVALID_WRITE;
        continue;
      }
      if (client.intents.size() >= options_.max_intents_per_connection) {
        reply.status = v1::INVALID_PARAMS;
        continue;
      }
      wire::RequestHeader request;
      request.opcode = wire::Opcode::kWrite;
      request.offset = intent.offset;
      request.length = intent.length;
      request.token = intent.token;
      absl::StatusOr<std::shared_ptr<GrantTable::Write>> write =
          grants_.BeginWrite(request, now, GrantTable::WriteKind::kShm);
      if (write.ok()) {
        reply.intent = ++client.next_intent;
        client.intents.emplace(reply.intent, *std::move(write));
        continue;
      }
      switch (write.status().code()) {
        case absl::StatusCode::kDeadlineExceeded:
          reply.status = v1::LEASE_EXPIRED;
          break;
        case absl::StatusCode::kUnavailable:
          reply.status = v1::TRANSFER_FAIL;  // the range is busy: put again
          break;
        default:
          reply.status = v1::PERMISSION_DENIED;  // forged, other term, grant ended
      }
    }
  } else {
    absl::StatusOr<std::vector<uint64_t>> ids = wire::DecodeShmDone(*header, body);
    if (!ids.ok()) return false;
    for (uint64_t id : *ids) {
      wire::ShmReply& reply = replies.emplace_back();
      reply.intent = id;
      auto it = client.intents.find(id);
      if (it == client.intents.end()) {
        reply.status = v1::INVALID_PARAMS;
        continue;
      }
      const std::shared_ptr<GrantTable::Write>& write = it->second;
      grants_.EndWrite(write, GrantTable::Landed{.offset = write->offset(),
                                                 .length = write->length(),
                                                 .hashed = false});
      client.intents.erase(it);
    }
  }
  // The answer fits the socket's buffer unless the client sends without reading: then it is
  // cut off rather than waited for.
  std::string answer = wire::EncodeShmReplies(replies);
  return send(client.fd, answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL) ==
         static_cast<ssize_t>(answer.size());
}

void ShmAdmission::Close(Client& client) {
  // Its process closed the mapping or is gone: nothing copies into these ranges any more.
  for (auto& [id, write] : client.intents) grants_.EndWrite(write);
  client.intents.clear();
  close(client.fd);
  client.fd = -1;
}

}  // namespace kvpool::segment
