#include "server/segment/segment_metrics.h"

#include "common/metric_families.h"

namespace kvpool::segment {

std::vector<prometheus::MetricFamily> CollectSegmentMetrics(const Segment& segment) {
  DataServer::Stats tcp = segment.stats();
  MetricFamilies families;
  families.Gauge("kvpool_segment_pool_bytes", "Size of this segment's memory pool.",
                 static_cast<double>(segment.size()));
  families.Gauge("kvpool_segment_mounted", "1 while the segment is mounted on the master.",
                 segment.mounted() ? 1 : 0);
  const char* kRequests = "Data-plane requests served, by operation and transport.";
  const char* kBytes = "Data-plane payload bytes moved, by operation and transport.";
  const char* kLatency = "From a request's header to the last byte of its answer.";
  families.Counter("kvpool_data_requests_total", kRequests, static_cast<double>(tcp.reads),
                   {{"op", "read"}, {"transport", "tcp"}});
  families.Counter("kvpool_data_requests_total", kRequests, static_cast<double>(tcp.writes),
                   {{"op", "write"}, {"transport", "tcp"}});
  families.Counter("kvpool_data_requests_total", kRequests, static_cast<double>(tcp.key_reads),
                   {{"op", "read_key"}, {"transport", "tcp"}});
  families.Counter("kvpool_data_key_reads_missed_total",
                   "READ_KEY requests answered OBJECT_NOT_FOUND or BUFFER_OVERFLOW: the key is not "
                   "here (placed elsewhere, removed), or reads by key are off while the segment is "
                   "out of touch with its master.",
                   static_cast<double>(tcp.key_reads_missed));
  families.Counter("kvpool_data_bytes_total", kBytes, static_cast<double>(tcp.bytes_read),
                   {{"op", "read"}, {"transport", "tcp"}});
  families.Counter("kvpool_data_bytes_total", kBytes, static_cast<double>(tcp.bytes_written),
                   {{"op", "write"}, {"transport", "tcp"}});
  families.Histogram("kvpool_data_request_duration_seconds", kLatency, tcp.read_latency,
                     {{"op", "read"}, {"transport", "tcp"}});
  families.Histogram("kvpool_data_request_duration_seconds", kLatency, tcp.write_latency,
                     {{"op", "write"}, {"transport", "tcp"}});
  const char* kRejected = "Data-plane requests refused, by reason.";
  for (auto [reason, count] : {std::pair{"malformed", tcp.rejected_malformed},
                               std::pair{"range", tcp.rejected_range},
                               std::pair{"token", tcp.rejected_token},
                               std::pair{"expired", tcp.rejected_expired},
                               std::pair{"grant_ended", tcp.rejected_ended},
                               std::pair{"busy", tcp.rejected_busy},
                               std::pair{"connection_cap", tcp.rejected_connection_cap},
                               std::pair{"tls_handshake", tcp.rejected_handshake},
                               std::pair{"timeout", tcp.closed_idle}}) {
    families.Counter("kvpool_data_rejected_total", kRejected, static_cast<double>(count),
                     {{"reason", reason}});
  }
  families.Counter("kvpool_data_accept_errors_total",
                   "Failed accepts on the data port (EMFILE, ...), each followed by a back-off.",
                   static_cast<double>(tcp.accept_errors));
  families.Gauge("kvpool_data_connections", "Data-plane connections open now.",
                 static_cast<double>(tcp.connections));
  families.Gauge("kvpool_segment_ended_grants",
                 "Ended grants remembered now (until their tokens expire; capped).",
                 static_cast<double>(segment.grants().ended_count()));
  families.Counter("kvpool_segment_ended_grants_overflowed_total",
                   "Ended grants forgotten early because the table was full; tokens expiring "
                   "before them are refused.",
                   static_cast<double>(segment.grants().ended_overflowed()));
  families.Counter("kvpool_data_reads_cut_total",
                   "TCP reads whose answer was cut off mid-send because their grant ended (a "
                   "forced remove, eviction) or a new term began: no byte of a range leaves it "
                   "after the segment applied its end.",
                   static_cast<double>(segment.grants().reads_cut()));
  const GrantTable& grants = segment.grants();
  families.Counter("kvpool_shm_write_intents_total",
                   "Shared-memory write intents, by result: begun (the client may copy), or "
                   "refused (expired, forged, other term, grant ended, range busy).",
                   static_cast<double>(grants.shm_writes_begun()), {{"result", "begun"}});
  families.Counter("kvpool_shm_write_intents_total",
                   "Shared-memory write intents, by result: begun (the client may copy), or "
                   "refused (expired, forged, other term, grant ended, range busy).",
                   static_cast<double>(grants.shm_writes_refused()), {{"result", "refused"}});
  families.Gauge("kvpool_shm_write_intents_open", "Shared-memory writes being copied now.",
                 static_cast<double>(grants.shm_writes_in_flight()));
  families.Gauge("kvpool_shm_busy_bytes",
                 "Bytes held busy by shared-memory writes still in flight whose grant ended "
                 "(or whose term passed): no other write may land there until they are done.",
                 static_cast<double>(grants.busy_bytes()));
  families.Counter("kvpool_segment_deferred_grant_ends_total",
                   "Grant ends (or new terms) that found a shared-memory write of the grant in "
                   "flight and left its range busy until it is done.",
                   static_cast<double>(grants.deferred_ends()));
  families.Counter("kvpool_data_busy_refused_total",
                   "Writes (TCP or shared memory) refused because their range was busy with "
                   "another grant's shared-memory write.",
                   static_cast<double>(grants.busy_refused()));
  if (const ShmAdmission* shm = segment.shm(); shm != nullptr) {
    families.Gauge("kvpool_shm_clients", "Admitted shared-memory clients connected now.",
                   static_cast<double>(shm->connections()));
  }
  if (const MasterLink* link = segment.link(); link != nullptr) {
    const char* kChecks =
        "Commits checked against their checksum (--verify-commits), by how: compared with the "
        "checksum their TCP write was hashed to as it landed, taken on the done write intent of "
        "their shared-memory writer, or the range hashed at commit (RDMA, partial writes, "
        "--hash-shm-commits).";
    families.Counter("kvpool_segment_commit_checks_total", kChecks,
                     static_cast<double>(link->commits_compared()), {{"how", "compared"}});
    families.Counter("kvpool_segment_commit_checks_total", kChecks,
                     static_cast<double>(link->commits_hashed()), {{"how", "hashed"}});
    families.Counter("kvpool_segment_commit_checks_total", kChecks,
                     static_cast<double>(link->commits_by_intent()), {{"how", "intent"}});
    families.Counter("kvpool_segment_commits_refused_total",
                     "Commits refused: the range did not hold the bytes of the checksum.",
                     static_cast<double>(link->commits_refused()));
  }
  return families.Take();
}

}  // namespace kvpool::segment
