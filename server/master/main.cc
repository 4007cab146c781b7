// kvpool-master: the control plane. Keeps the object index and the segment registry,
// answers where values go and where they are, and (by default) runs an embedded segment, so
// that one process is a working single-node pool.

#include <linux/close_range.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>

#include "absl/flags/flag.h"
#include "common/flags.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/etcd/leader_election.h"
#include "common/log.h"
#include "common/metric_families.h"
#include "common/net.h"
#include "common/periodic_worker.h"
#include "common/size.h"
#include "grpcpp/grpcpp.h"
#include "proto/tls.h"
#include "proto/tls_flags.h"
#include "server/common/exposure.h"
#include "server/common/http_server.h"
#include "server/common/signals.h"
#include "server/master/authenticator.h"
#include "server/master/grpc_service.h"
#include "server/master/leadership.h"
#include "server/master/master.h"
#include "server/master/master_metrics.h"
#include "server/segment/segment.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC address (port 0: any free port)");
ABSL_FLAG(std::string, http_listen, "127.0.0.1:9003", "HTTP address for /healthz (port 0: any)");
ABSL_FLAG(kvpool::ByteSize, embedded_segment_size, kvpool::ByteSize{1ull << 30},
          "Pool served by a segment inside the master (0: none; then segments must mount)");
ABSL_FLAG(std::string, embedded_segment_listen, "127.0.0.1:0",
          "Data-plane address of the embedded segment (port 0: any free port)");
ABSL_FLAG(std::string, embedded_segment_shm_socket, "auto",
          "Unix socket through which clients on this host map the embedded pool: a path, auto "
          "(/tmp/kvpool-segment-PORT.sock), or none");
ABSL_FLAG(std::string, embedded_segment_shm_uids, "",
          "Who may map the embedded pool: empty (this process's uid and root), any, or uids");
ABSL_FLAG(std::string, embedded_segment_shm_group, "",
          "A group (name or gid) whose members may reach the embedded pool's socket and map it; "
          "empty: none");
ABSL_FLAG(std::string, advertise_host, "",
          "Host name clients dial for the embedded segment (default: its listen host, or this "
          "machine's name when listening on a wildcard address)");
ABSL_FLAG(bool, embedded_segment_data_tls, false,
          "Serve the embedded segment's TCP data port over TLS with --tls-cert/--tls-key (and "
          "--tls-client-ca, --tls-require-client-cert); clients need --data-tls");
ABSL_FLAG(bool, prefault, true, "Touch every page of the embedded pool at start");
ABSL_FLAG(int, data_threads, 2, "Data-plane threads of the embedded segment");
ABSL_FLAG(uint32_t, max_key_bytes, 4096, "Longest key accepted");
ABSL_FLAG(absl::Duration, put_timeout, absl::Seconds(60),
          "A reservation not committed (BatchPutEnd) within this time is reclaimed");
ABSL_FLAG(absl::Duration, lease_ttl, absl::Seconds(10),
          "A get or exist leases the object this long: not evicted, not removed unless forced");
ABSL_FLAG(bool, lease_on_put, false,
          "A put leases its new object for --lease-ttl, as a get does (what Mooncake's "
          "tests expect); false: a new object is evictable and removable at once");
ABSL_FLAG(double, eviction_high_watermark, 0.95,
          "Evict when used/capacity passes this fraction");
ABSL_FLAG(double, eviction_ratio, 0.05,
          "Fraction of the capacity each eviction round frees");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1), "Segment heartbeat interval");
ABSL_FLAG(absl::Duration, segment_ttl, absl::Seconds(10),
          "A segment silent for this long is declared dead and its replicas dropped");
ABSL_FLAG(std::string, auth_tokens, "",
          "Credentials file: every caller must authenticate with a bearer token or a client "
          "certificate of one of its rules, and acts within that rule's role and tenant (see "
          "docs/operations.md, Security). Re-read when it changes. Empty: no authentication "
          "(loopback only, unless --insecure)");
ABSL_FLAG(std::string, tenant_quotas, "",
          "Byte quotas per tenant of the credentials file, e.g. team-a=10GiB,team-b=512MiB: a "
          "put of a tenant at its quota answers NO_AVAILABLE_HANDLE (objects counted once, "
          "pending or committed). Empty: none");
// --tls-cert, --tls-key, --tls-reload-interval: proto/tls_flags.h.
ABSL_FLAG(std::string, tls_client_ca, "",
          "Mutual TLS: verify client certificates against this CA (a caller without one must "
          "send a token)");
ABSL_FLAG(bool, tls_require_client_cert, false,
          "With --tls-client-ca: refuse connections without a client certificate");
ABSL_FLAG(bool, insecure, false,
          "Allow binding a non-loopback address without TLS and authentication (logged as a "
          "warning): anyone who reaches the master then owns the pool");

ABSL_FLAG(std::string, etcd, "",
          "etcd endpoints HOST:PORT[,HOST:PORT...]: run as one of several masters, elected "
          "through etcd (docs/operations.md, \"High availability\"); empty: a single master");
ABSL_FLAG(std::string, etcd_prefix, "/kvpool/default",
          "--etcd: key prefix of this pool's election (one prefix per pool)");
ABSL_FLAG(absl::Duration, leader_lease, absl::Seconds(3),
          "--etcd: TTL of the leader's etcd lease. A dead leader is replaced after about this "
          "long; a leader that cannot renew it stops serving before it runs out");
ABSL_FLAG(std::string, advertise_address, "",
          "--etcd: gRPC address other processes dial for this master (default: the --listen "
          "host and port, or this machine's name when listening on a wildcard address)");

namespace {

// A deposed leader's index and grants are stale: it becomes a fresh standby by executing
// itself again (same pid, same ports, empty state), as if a supervisor had restarted it.
[[noreturn]] void RestartAsStandby(std::vector<std::string> args) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  // Every descriptor but stdio closes with the old image (sockets included, so the new one
  // can listen on the same ports).
  syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC);
  execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "kvpool-master: cannot restart as a standby; exiting\n");
  _exit(3);
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "kvpool-master: %s\n", std::string(status.message()).c_str());
  return 2;
}

// Starts the segment that runs inside the master process and mounts it.
// `data_tls`: TLS on its data port.
absl::StatusOr<std::unique_ptr<kvpool::segment::Segment>> StartEmbeddedSegment(
    kvpool::master::Master& master, uint64_t size,
    std::optional<kvpool::ServerTlsOptions> data_tls) {
  kvpool::segment::SegmentOptions options;
  options.size = size;
  options.prefault = absl::GetFlag(FLAGS_prefault);
  options.listen = absl::GetFlag(FLAGS_embedded_segment_listen);
  options.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  options.data.threads = absl::GetFlag(FLAGS_data_threads);
  options.data.tls = std::move(data_tls);
  std::string shm_socket = absl::GetFlag(FLAGS_embedded_segment_shm_socket);
  options.shm_socket = shm_socket == "none" ? "" : shm_socket;
  if (absl::Status uids = kvpool::segment::ParseAdmittedUids(
          absl::GetFlag(FLAGS_embedded_segment_shm_uids), &options.shm_admission);
      !uids.ok()) {
    return uids;
  }
  if (absl::Status group = kvpool::segment::ParseAdmittedGroup(
          absl::GetFlag(FLAGS_embedded_segment_shm_group), &options.shm_admission);
      !group.ok()) {
    return group;
  }
  absl::StatusOr<std::unique_ptr<kvpool::segment::Segment>> segment =
      kvpool::segment::Segment::Start(std::move(options));
  if (!segment.ok()) return segment.status();
  kvpool::master::SegmentInfo info;
  info.name = absl::StrCat("embedded@", (*segment)->endpoint());
  info.host = (*segment)->host();
  info.endpoint = (*segment)->endpoint();
  info.shm_socket = (*segment)->shm_socket();
  info.machine_id = kvpool::MachineId();
  info.size = size;
  info.incarnation = (*segment)->incarnation();
  info.token_secret = (*segment)->token_secret();
  info.embedded = true;
  kvpool::segment::Segment* embedded = segment->get();
  info.apply_record = [embedded](const kvpool::master::ManifestRecord& record) {
    embedded->ApplyRecord(record.kind == kvpool::master::ManifestRecord::Kind::kAdd, record.key,
                          record.offset, record.size, record.checksum, record.grant, record.until);
  };
  info.busy_ranges = [embedded] { return embedded->grants().BusyRanges(); };
  info.keys_read = [embedded] { return embedded->TakeKeysRead(); };
  if (absl::Status mounted = master.MountSegment(std::move(info)); !mounted.ok()) return mounted;
  return segment;
}

}  // namespace

int main(int argc, char** argv) {
  kvpool::BlockShutdownSignals();
  absl::SetProgramUsageMessage("The kvpool control plane (and, by default, a single-node pool).");
  kvpool::ParseFlags(argc, argv);
  // Debian builds Abseil without NDEBUG, which leaves Mutex deadlock detection on: a lock
  // graph kept up to date at every acquisition (6% of the master's CPU under reservations,
  // perf). The unit tests keep it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  kvpool::master::MasterOptions options;
  options.max_key_bytes = absl::GetFlag(FLAGS_max_key_bytes);
  options.put_timeout = absl::GetFlag(FLAGS_put_timeout);
  options.lease_ttl = absl::GetFlag(FLAGS_lease_ttl);
  options.lease_on_put = absl::GetFlag(FLAGS_lease_on_put);
  options.eviction_high_watermark = absl::GetFlag(FLAGS_eviction_high_watermark);
  options.eviction_ratio = absl::GetFlag(FLAGS_eviction_ratio);
  options.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  options.segment_ttl = absl::GetFlag(FLAGS_segment_ttl);
  if (options.max_key_bytes == 0) return Fail(absl::InvalidArgumentError("--max-key-bytes is 0"));
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.segment_ttl <= options.heartbeat_interval) {
    return Fail(absl::InvalidArgumentError(
        "--segment-ttl must be longer than --heartbeat-interval, which must be above 0"));
  }
  if (!(options.eviction_high_watermark > 0 && options.eviction_high_watermark <= 1) ||
      !(options.eviction_ratio > 0 && options.eviction_ratio <= 1)) {
    return Fail(absl::InvalidArgumentError(
        "--eviction-high-watermark and --eviction-ratio must be in (0, 1]"));
  }
  if (options.lease_ttl <= absl::ZeroDuration() || options.put_timeout <= absl::ZeroDuration()) {
    return Fail(absl::InvalidArgumentError("--lease-ttl and --put-timeout must be above 0"));
  }
  absl::StatusOr<absl::flat_hash_map<std::string, uint64_t>> quotas =
      kvpool::master::ParseTenantQuotas(absl::GetFlag(FLAGS_tenant_quotas));
  if (!quotas.ok()) return Fail(quotas.status());
  options.tenant_quotas = *std::move(quotas);
  kvpool::master::Master master(options);

  std::string listen = absl::GetFlag(FLAGS_listen);
  absl::StatusOr<kvpool::HostPort> grpc_address = kvpool::ParseHostPort(listen);
  if (!grpc_address.ok()) return Fail(grpc_address.status());

  // Who may call (auth_policy.h), over what (TLS), bound where (exposure.h): all checked
  // before anything listens.
  std::unique_ptr<kvpool::master::Authenticator> auth =
      std::make_unique<kvpool::master::Authenticator>();
  if (std::string path = absl::GetFlag(FLAGS_auth_tokens); !path.empty()) {
    absl::StatusOr<std::unique_ptr<kvpool::master::Authenticator>> loaded =
        kvpool::master::Authenticator::FromFile(path);
    if (!loaded.ok()) return Fail(loaded.status());
    auth = std::move(*loaded);
  }
  kvpool::TlsIdentityFlags identity = kvpool::GetTlsIdentityFlags(/*environment=*/false);
  kvpool::ServerTlsOptions tls{.cert_file = identity.cert_file,
                               .key_file = identity.key_file,
                               .client_ca_file = absl::GetFlag(FLAGS_tls_client_ca),
                               .require_client_cert = absl::GetFlag(FLAGS_tls_require_client_cert),
                               .reload_interval = identity.reload_interval};
  if (!tls.cert_file.empty() || !tls.key_file.empty() || !tls.client_ca_file.empty()) {
    if (absl::Status valid = kvpool::ValidateServerTls(tls); !valid.ok()) return Fail(valid);
  }
  if (absl::GetFlag(FLAGS_embedded_segment_data_tls) && tls.cert_file.empty()) {
    return Fail(absl::InvalidArgumentError(
        "--embedded-segment-data-tls needs --tls-cert and --tls-key (the certificate its data "
        "port presents)"));
  }
  std::string http_listen = absl::GetFlag(FLAGS_http_listen);
  {
    kvpool::Exposure exposure{.tls = !tls.cert_file.empty(),
                              .authenticated = auth->enabled(),
                              .insecure = absl::GetFlag(FLAGS_insecure)};
    exposure.listens = {{"--listen", listen}, {"--http-listen", http_listen}};
    if (absl::GetFlag(FLAGS_embedded_segment_size).bytes > 0) {
      exposure.listens.push_back(
          {"--embedded-segment-listen", absl::GetFlag(FLAGS_embedded_segment_listen)});
    }
    absl::StatusOr<kvpool::ExposureVerdict> verdict = kvpool::CheckExposure(exposure);
    if (!verdict.ok()) return Fail(verdict.status());
    if (verdict->warning) {
      KVPOOL_LOG(WARNING) << verdict->message;
    } else {
      KVPOOL_LOG(INFO) << verdict->message;
    }
  }

  const std::string etcd_endpoints = absl::GetFlag(FLAGS_etcd);
  const absl::Duration leader_lease = absl::GetFlag(FLAGS_leader_lease);
  if (!etcd_endpoints.empty() && leader_lease < absl::Seconds(2)) {
    return Fail(absl::InvalidArgumentError(
        "--leader-lease must be at least 2s (etcd grants no shorter lease)"));
  }
  std::unique_ptr<kvpool::segment::Segment> embedded;
  uint64_t embedded_size = absl::GetFlag(FLAGS_embedded_segment_size).bytes;
  if (embedded_size > 0 && !etcd_endpoints.empty()) {
    // Its objects would die with this master's process, and a standby has no pool to offer.
    KVPOOL_LOG(INFO) << "--etcd: no embedded segment (the pool is the kvpool-segment daemons')";
    embedded_size = 0;
  }
  if (embedded_size > 0) {
    absl::StatusOr<std::unique_ptr<kvpool::segment::Segment>> started =
        StartEmbeddedSegment(master, embedded_size,
                             absl::GetFlag(FLAGS_embedded_segment_data_tls)
                                 ? std::optional(tls)
                                 : std::nullopt);
    if (!started.ok()) return Fail(started.status());
    embedded = std::move(*started);
  }

  kvpool::master::MasterMetrics metrics(master);
  // With --etcd, the election and what the service asks of it; created before the server
  // starts, started once it listens (a standby answers with the leader's address).
  std::unique_ptr<kvpool::etcd::LeaderElection> election;
  std::unique_ptr<kvpool::master::Leadership> leadership;
  std::vector<std::string> restart_args(argv, argv + argc);
  kvpool::master::Leadership* leadership_ptr = nullptr;
  auto make_election = [&](const std::string& self) -> absl::Status {
    absl::StatusOr<std::unique_ptr<kvpool::etcd::EtcdClient>> client =
        kvpool::etcd::EtcdClient::Create(etcd_endpoints,
                                         std::max(leader_lease / 6, absl::Milliseconds(200)));
    if (!client.ok()) return client.status();
    kvpool::etcd::ElectionOptions election_options;
    election_options.prefix = absl::GetFlag(FLAGS_etcd_prefix);
    election_options.value = self;
    election_options.ttl = leader_lease;
    election_options.on_elected = [&leadership_ptr, &master](int64_t term) {
      leadership_ptr->Elected();
      KVPOOL_LOG(INFO) << "leading at term " << term << "; rebuilding the index from the "
                       << "segments' manifests as they mount (" << master.GetClusterSummary().segments.size()
                       << " mounted so far)";
    };
    election_options.on_deposed = [&restart_args] {
      KVPOOL_LOG(WARNING) << "deposed: restarting as a fresh standby";
      RestartAsStandby(restart_args);
    };
    election = std::make_unique<kvpool::etcd::LeaderElection>(std::move(*client),
                                                               std::move(election_options));
    leadership = std::make_unique<kvpool::master::Leadership>(election.get(), self,
                                                              2 * options.heartbeat_interval);
    leadership_ptr = leadership.get();
    return absl::OkStatus();
  };
  // The address is known before the server starts unless --listen has port 0.
  std::string advertise = absl::GetFlag(FLAGS_advertise_address);
  if (!etcd_endpoints.empty()) {
    if (advertise.empty()) {
      if (grpc_address->port == 0) {
        return Fail(absl::InvalidArgumentError(
            "--etcd needs a fixed gRPC port (--listen HOST:PORT, not port 0) or "
            "--advertise-address: standbys send callers there"));
      }
      std::string host = grpc_address->host;
      if (host == "0.0.0.0" || host == "::" || host == "[::]") host = kvpool::LocalHostName();
      advertise = kvpool::FormatHostPort(host, grpc_address->port);
    }
    if (absl::Status made = make_election(advertise); !made.ok()) return Fail(made);
    metrics.SetLeadership(leadership.get());
  }
  kvpool::master::MasterGrpcService service(master, metrics, *auth, leadership.get());
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(listen,
                           tls.cert_file.empty() ? grpc::InsecureServerCredentials()
                                                 : kvpool::MakeServerCredentials(tls),
                           &grpc_port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  // gRPC sets SO_REUSEPORT by default: a second master on a taken port would then start and
  // take half of the clients. Without it, the bind fails and so does start-up.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || grpc_port == 0) {
    return Fail(absl::UnavailableError(absl::StrCat(
        "cannot listen for gRPC on ", listen,
        " (address in use by another process, or not an address of this host)")));
  }

  kvpool::HttpServer http;
  // With authentication on and HTTP beyond loopback, every page but the probes' needs a bearer
  // token of role reader or admin (loopback stays open, like the gRPC port without flags).
  const bool http_gated =
      auth->enabled() && !kvpool::IsLoopbackHost(kvpool::ParseHostPort(http_listen)->host);
  if (http_gated) {
    http.SetGate(
        [&auth](const kvpool::HttpRequest& request) -> std::optional<kvpool::HttpResponse> {
          absl::StatusOr<kvpool::master::Identity> admitted = auth->AdmitHttp(request.bearer_token);
          if (admitted.ok()) return std::nullopt;
          return kvpool::HttpRefusal(admitted.status());
        },
        {"/healthz", "/readyz"});
  }
  http.Handle("/healthz", [](const kvpool::HttpRequest&) {
    return kvpool::HttpResponse{200, "text/plain", "ok\n"};
  });
  // Ready once the gRPC server runs (it is by now; the handler exists from here on). With
  // --etcd, only the leader is ready (for writes), and only once the segments have had time
  // to mount on it again and none is still reporting its manifest. /readyz?standby=ok also
  // passes a standby that knows the leader (a healthy member: what a pod's readiness needs,
  // so that rollouts and disruption budgets work with one leader and several standbys).
  http.Handle("/readyz", [&leadership, &master](const kvpool::HttpRequest& request) {
    if (leadership == nullptr) return kvpool::HttpResponse{200, "text/plain", "ready\n"};
    if (!leadership->IsLeader()) {
      std::string leader = leadership->leader();
      auto standby = request.params.find("standby");
      if (standby != request.params.end() && standby->second == "ok" && !leader.empty()) {
        return kvpool::HttpResponse{200, "text/plain", absl::StrCat("standby; leader ", leader,
                                                                    "\n")};
      }
      return kvpool::HttpResponse{
          503, "text/plain",
          absl::StrCat("standby; leader ", leader.empty() ? "unknown" : leader, "\n")};
    }
    for (const kvpool::master::SegmentSummary& segment : master.GetClusterSummary().segments) {
      if (segment.restoring) {
        return kvpool::HttpResponse{503, "text/plain",
                                    "leader; rebuilding the index from segment manifests\n"};
      }
    }
    if (!leadership->Settled()) {
      return kvpool::HttpResponse{503, "text/plain",
                                  "leader; waiting for segments to mount again\n"};
    }
    return kvpool::HttpResponse{
        200, "text/plain", absl::StrCat("ready; leader, term ", leadership->term(), "\n")};
  });
  // Mooncake's master endpoint that engines poll (SGLang's HiCache backend waits for a
  // non-empty answer): the names of the mounted segments, one per line.
  http.Handle("/get_all_segments", [&master](const kvpool::HttpRequest&) {
    std::string body;
    for (const kvpool::master::SegmentSummary& segment : master.GetClusterSummary().segments) {
      absl::StrAppend(&body, segment.name, "\n");
    }
    return kvpool::HttpResponse{200, "text/plain; version=0.0.4", std::move(body)};
  });
  http.Handle("/metrics", [&metrics, &auth, &master](const kvpool::HttpRequest&) {
    std::vector<prometheus::MetricFamily> families = metrics.Collect();
    for (prometheus::MetricFamily& family : auth->Collect()) families.push_back(std::move(family));
    for (prometheus::MetricFamily& family : master.tenant_usage().Collect()) {
      families.push_back(std::move(family));
    }
    return kvpool::HttpResponse{200, "text/plain; version=0.0.4",
                                kvpool::SerializeMetrics(families)};
  });
  absl::StatusOr<uint16_t> http_port = http.Start(http_listen);
  if (!http_port.ok()) return Fail(http_port.status());

  // One worker per background concern.
  kvpool::PeriodicWorker segment_monitor("segment-monitor", options.heartbeat_interval,
                                         [&master] {
                                           master.ExpireSegments();
                                           master.FinishDrains();
                                         });
  kvpool::PeriodicWorker reservation_reaper("reservation-reaper", absl::Seconds(1), [&master] {
    master.ReclaimExpiredReservations();
    master.ForgetSettledRemovals();
    master.RefreshEmbeddedBusy();
  });
  kvpool::PeriodicWorker evictor("evictor", absl::Milliseconds(200),
                                 [&master] { master.EvictIfAboveHighWatermark(); });
  kvpool::PeriodicWorker manifest_ticker("manifest-sync", absl::Milliseconds(20),
                                         [&master] { master.manifest_sync().Tick(absl::Now()); });
  // Token rotation: the credentials file is re-read when it changes.
  kvpool::PeriodicWorker credentials_watcher("credentials-watcher", absl::Seconds(1),
                                             [&auth] { auth->ReloadIfChanged().IgnoreError(); });
  for (kvpool::PeriodicWorker* worker : {&segment_monitor, &reservation_reaper, &evictor,
                                         &manifest_ticker, &credentials_watcher}) {
    worker->Start();
  }
  if (election) {
    // A restart as a standby (above) keeps the ports this process listens on now.
    restart_args.push_back("--listen=" + kvpool::FormatHostPort(grpc_address->host,
                                                                 static_cast<uint16_t>(grpc_port)));
    restart_args.push_back("--http-listen=" +
                           kvpool::FormatHostPort(kvpool::ParseHostPort(http_listen)->host,
                                                  *http_port));
    election->Start();
  }

  std::printf(
      "kvpool-master listening grpc=%s http=%s embedded_segment=%s embedded_size=%s "
      "embedded_shm=%s tls=%s auth=%s http_auth=%s role=%s\n",
      kvpool::FormatHostPort(grpc_address->host, static_cast<uint16_t>(grpc_port)).c_str(),
      kvpool::FormatHostPort(kvpool::ParseHostPort(http_listen)->host, *http_port).c_str(),
      embedded ? embedded->endpoint().c_str() : "none",
      absl::StrCat(embedded ? embedded_size : 0).c_str(),
      embedded && !embedded->shm_socket().empty() ? embedded->shm_socket().c_str() : "none",
      tls.cert_file.empty() ? "off" : tls.client_ca_file.empty() ? "on" : "mutual",
      auth->enabled() ? "on" : "off", http_gated ? "on" : "off",
      election ? "candidate" : "single");
  std::fflush(stdout);

  int signal_number = kvpool::WaitForShutdownSignal();
  KVPOOL_LOG(INFO) << "signal " << signal_number << "; stopping";
  // A leader resigns first, so that a standby takes over at once.
  if (election) election->Stop();
  // Answer the heartbeats and commits the master holds, or the server cannot stop.
  master.manifest_sync().Close();
  for (kvpool::PeriodicWorker* worker : {&segment_monitor, &reservation_reaper, &evictor,
                                         &manifest_ticker, &credentials_watcher}) {
    worker->Stop();
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  http.Stop();
  if (embedded) embedded->Stop();
  return 0;
}
