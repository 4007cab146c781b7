#include "client/tools/bench/tcp_baseline.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/tools/bench/io.h"

namespace kvpool::bench {
namespace {

enum Op : uint32_t { kGet = 1, kPut = 2, kPing = 3 };

struct Request {
  uint32_t op = 0;
  uint32_t count = 0;
  uint64_t value_size = 0;
};
static_assert(sizeof(Request) == 16);

// Largest share of a batch one connection carries in one exchange (iovec limits).
constexpr int kMaxCount = 1024;

class StreamWorker : public Worker {
 public:
  StreamWorker(int fd, const Workload& workload, int count, uint64_t seed)
      : fd_(fd),
        kind_(workload.kind),
        read_fraction_(workload.read_fraction),
        count_(count),
        value_size_(workload.value_size),
        ring_(workload.client_buffer_bytes / workload.lanes, workload.value_size, count,
              static_cast<uint8_t>(seed)),
        random_(seed),
        iov_(count + 1) {}
  ~StreamWorker() override { close(fd_); }

  OpResult RunOnce() override {
    bool get = kind_ == WorkloadKind::kGet ||
               (kind_ == WorkloadKind::kMixed && random_.Uniform() < read_fraction_);
    Request request{get ? kGet : kPut, static_cast<uint32_t>(count_), value_size_};
    size_t first = ring_.NextUnit();
    iov_[0] = iovec{&request, sizeof(request)};
    for (int k = 0; k < count_; ++k) iov_[k + 1] = iovec{ring_.slot(first + k), value_size_};
    absl::Status status;
    if (get) {
      status = WriteAll(fd_, &request, sizeof(request));
      if (status.ok()) status = ReadAll(fd_, absl::MakeSpan(iov_).subspan(1));
    } else {
      uint64_t ack = 0;
      status = WriteAll(fd_, absl::MakeSpan(iov_));
      if (status.ok()) status = ReadAll(fd_, &ack, sizeof(ack));
    }
    OpResult result;
    if (!status.ok()) {
      result.errors = count_;
      result.error = std::string(status.message());
      return result;
    }
    result.ops = count_;
    result.bytes = count_ * value_size_;
    return result;
  }

 private:
  const int fd_;
  const WorkloadKind kind_;
  const double read_fraction_;
  const int count_;
  const uint64_t value_size_;
  SlotRing ring_;
  Random random_;
  std::vector<iovec> iov_;
};

class PingWorker : public Worker {
 public:
  explicit PingWorker(int fd) : fd_(fd) {}
  ~PingWorker() override { close(fd_); }

  OpResult RunOnce() override {
    Request request{kPing, 0, 0};
    Request answer;
    absl::Status status = WriteAll(fd_, &request, sizeof(request));
    if (status.ok()) status = ReadAll(fd_, &answer, sizeof(answer));
    if (!status.ok()) return OpResult{.errors = 1, .error = std::string(status.message())};
    return OpResult{.ops = 1};
  }

 private:
  const int fd_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TcpBaseline>> TcpBaseline::Start(int socket_buffer_bytes, bool rtt) {
  uint16_t port = 0;
  absl::StatusOr<int> fd = ListenLoopback(&port);
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<TcpBaseline>(new TcpBaseline(*fd, port, socket_buffer_bytes, rtt));
}

TcpBaseline::~TcpBaseline() {
  for (std::thread& server : servers_) server.join();
  close(listen_fd_);
}

std::string TcpBaseline::Describe(const Workload& workload) const {
  if (rtt_) return "16-byte request/response, 1 connection";
  int lanes = std::min(workload.lanes, workload.batch_size);
  return absl::StrCat(workload.threads * lanes, " connection(s), thread per end");
}

bool TcpBaseline::Supports(WorkloadKind kind) const {
  if (rtt_) return kind == WorkloadKind::kGet;
  return kind == WorkloadKind::kGet || kind == WorkloadKind::kPut || kind == WorkloadKind::kMixed;
}

absl::StatusOr<std::vector<std::unique_ptr<Worker>>> TcpBaseline::MakeWorkers(
    const Workload& workload) {
  int lanes = std::min(workload.lanes, workload.batch_size);
  int connections = rtt_ ? 1 : workload.threads * lanes;
  Workload lane_workload = workload;
  lane_workload.lanes = lanes;
  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < connections; ++i) {
    absl::StatusOr<int> client = ConnectBlocking("127.0.0.1", port_, socket_buffer_bytes_);
    if (!client.ok()) return client.status();
    int server = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (server < 0) {
      close(*client);
      return absl::UnavailableError(absl::StrCat("accept: ", std::strerror(errno)));
    }
    SetSocketOptions(server, socket_buffer_bytes_);
    // The batch dealt over the lanes: the first (batch % lanes) carry one value more.
    int lane = i % lanes;
    int count = workload.batch_size / lanes + (lane < workload.batch_size % lanes ? 1 : 0);
    count = std::min(count, kMaxCount);
    // The server's memory is allocated and touched here, before anything is timed. Together
    // the connections' rings hold as much as kvpool's working set, far more than the caches,
    // as a pool does: a source that fits in the L3 cache would flatter the ceiling.
    uint64_t ring_bytes = std::max<uint64_t>(workload.client_buffer_bytes / lanes,
                                             workload.keys * workload.value_size / connections);
    auto ring = std::make_shared<SlotRing>(ring_bytes, workload.value_size, count, 0x5A);
    servers_.emplace_back([server, ring] { Serve(server, *ring); });
    if (rtt_) {
      workers.push_back(std::make_unique<PingWorker>(*client));
    } else {
      workers.push_back(std::make_unique<StreamWorker>(*client, lane_workload, count, i + 1));
    }
  }
  return workers;
}

void TcpBaseline::Finish(const Workload& workload) {
  for (std::thread& server : servers_) server.join();
  servers_.clear();
}

void TcpBaseline::Serve(int fd, SlotRing& ring) {
  std::vector<iovec> iov;
  while (true) {
    Request request;
    if (!ReadAll(fd, &request, sizeof(request)).ok()) break;
    if (request.op == kPing) {
      if (!WriteAll(fd, &request, sizeof(request)).ok()) break;
      continue;
    }
    if ((request.op != kGet && request.op != kPut) || request.count != ring.unit() ||
        request.value_size != ring.value_size()) {
      break;
    }
    size_t first = ring.NextUnit();
    iov.resize(request.count);
    for (uint32_t k = 0; k < request.count; ++k) {
      iov[k] = iovec{ring.slot(first + k), request.value_size};
    }
    if (request.op == kGet) {
      if (!WriteAll(fd, absl::MakeSpan(iov)).ok()) break;
    } else {
      uint64_t ack = request.count;
      if (!ReadAll(fd, absl::MakeSpan(iov)).ok()) break;
      if (!WriteAll(fd, &ack, sizeof(ack)).ok()) break;
    }
  }
  close(fd);
}

}  // namespace kvpool::bench
