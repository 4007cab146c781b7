#pragma once

// kvpool itself, through the public client (kvpool/client.h) for data, and through the
// client's master stub (client/master_client.h) for the master's raw key operations.
//
// Keys are "kvb/RUN/..." with a random RUN per bench run, so runs never see each other's
// objects in a shared pool:
//   get    reads values of a working set stored by Prepare ("kvb/RUN/vSIZE/I", soft-pinned
//          so that the bench's own puts do not evict it), `batch_size` keys chosen at random
//          per call, straight into the thread's rotating buffers;
//   put    stores new keys ("kvb/RUN/p/THREAD/SEQ") from the thread's rotating buffers (a key
//          is never stored twice: a repeated key would be deduplicated and write nothing);
//          Finish removes them again;
//   meta-put    BatchPutStart of `batch_size` new keys (size value_size) then BatchPutRevoke
//               of the same keys: the master's allocation path without any data moved;
//   meta-exist  BatchExist of `batch_size` keys of a working set of small values.
// Threads share one kvpool::Client (the header's advice: one per process) unless
// `shared_client` is false; then each has its own (and its own master channel).

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "client/tools/bench/system.h"
#include "kvpool/client.h"

namespace kvpool::bench {

struct KvpoolTargetOptions {
  std::string master;
  TransportKind transport = TransportKind::kAuto;
  // As given on the command line: "auto", "tcp", "shm", "rdma".
  std::string transport_name = "auto";
  int connections_per_segment = 2;
  bool shared_client = true;
  bool verify_checksums = true;
  bool cache_locations = true;
  bool read_by_key = true;
  // Only the TLS and token fields are used (ClientOptions::tls_*, auth_token).
  ClientOptions credentials;
};

class KvpoolTarget : public System {
 public:
  // Unavailable if the master does not answer.
  static absl::StatusOr<std::unique_ptr<KvpoolTarget>> Connect(const KvpoolTargetOptions& options);
  ~KvpoolTarget() override;

  std::string name() const override { return "kvpool"; }
  std::string Describe(const Workload& workload) const override;
  bool Supports(WorkloadKind kind) const override { return true; }
  // Stores the working set that gets read (values already there are kept: dedup).
  absl::Status Prepare(const Workload& workload) override;
  absl::StatusOr<std::vector<std::unique_ptr<Worker>>> MakeWorkers(
      const Workload& workload) override;
  // Removes the values a put or mixed run stored, after printing (stderr) where its puts
  // spent their time: the client's kvpool_client_put_phase_seconds over the run, warm-up
  // included (the shared client's only: not with --shared-client=false).
  void Finish(const Workload& workload) override;
  // Removes everything the bench stored (working sets too).
  void Cleanup();

  Client& client() { return *client_; }

 private:
  explicit KvpoolTarget(KvpoolTargetOptions options, std::shared_ptr<Client> client);
  // Stores prefix+0 .. prefix+(count-1), `value_size` bytes each, unless already stored.
  absl::Status StoreSet(const std::string& prefix, uint64_t count, uint64_t value_size);
  absl::StatusOr<std::shared_ptr<Client>> ClientForThread();

  const KvpoolTargetOptions options_;
  std::shared_ptr<Client> client_;
  std::string put_prefix_;
  // The client's metrics when the workload was prepared (for the put phases at Finish).
  std::string metrics_before_;
  // Per thread, the sequence number of the next key a put stores, and of the first not yet
  // removed; the keys are rebuilt from these, so nothing grows with the run's length.
  std::vector<std::unique_ptr<std::atomic<uint64_t>>> next_put_;
  std::vector<uint64_t> first_kept_;
  // Working sets stored so far (prefix, count), to remove at Cleanup.
  std::vector<std::pair<std::string, uint64_t>> stored_sets_;
};

}  // namespace kvpool::bench
