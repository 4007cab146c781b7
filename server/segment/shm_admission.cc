#include "server/segment/shm_admission.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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

ShmAdmission::ShmAdmission(const MemoryPool& pool, ShmAdmissionOptions options)
    : pool_(pool), options_(std::move(options)) {}

ShmAdmission::~ShmAdmission() { Stop(); }

absl::Status ShmAdmission::Start() {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (options_.socket_path.empty() || options_.socket_path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory socket path \"", options_.socket_path, "\" is empty or too long"));
  }
  std::memcpy(address.sun_path, options_.socket_path.data(), options_.socket_path.size());
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
  // Other users may need to connect; admission is decided by their credentials, not the mode.
  chmod(options_.socket_path.c_str(), 0777);
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

bool ShmAdmission::Admits(uid_t uid) const {
  if (options_.any_uid) return true;
  if (options_.uids.empty()) return uid == 0 || uid == getuid();
  return std::find(options_.uids.begin(), options_.uids.end(), uid) != options_.uids.end();
}

void ShmAdmission::Loop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Serve(fd);
    close(fd);
  }
}

void ShmAdmission::Serve(int fd) {
  timeval timeout{1, 0};  // a silent client cannot hold the admission thread for long
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  uint8_t hello[wire::kShmHelloSize];
  if (recv(fd, hello, sizeof(hello), MSG_WAITALL) != static_cast<ssize_t>(sizeof(hello))) return;
  wire::ShmAnswer answer;
  ucred peer{};
  socklen_t length = sizeof(peer);
  if (absl::Status valid = wire::DecodeShmHello(hello); !valid.ok()) {
    answer.status = v1::INVALID_PARAMS;
    answer.reason = std::string(valid.message());
  } else if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0 || !Admits(peer.uid)) {
    answer.status = v1::PERMISSION_DENIED;
    answer.reason = absl::StrCat("uid ", peer.uid, " is not admitted to this segment's shared memory");
  } else {
    answer.pool_size = pool_.size();
    answer.incarnation = options_.incarnation;
  }
  if (answer.status == 0) {
    if (SendWithFd(fd, wire::EncodeShmAnswer(answer), pool_.fd())) {
      admitted_.fetch_add(1);
      KVPOOL_LOG(DEBUG) << "admitted pid " << peer.pid << " (uid " << peer.uid
                        << ") to shared memory";
    }
  } else {
    refused_.fetch_add(1);
    KVPOOL_LOG(INFO) << "refused shared memory to pid " << peer.pid << ": " << answer.reason;
    SendWithFd(fd, wire::EncodeShmAnswer(answer), -1);
  }
}

}  // namespace kvpool::segment
