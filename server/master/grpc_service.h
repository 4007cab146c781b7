#pragma once

#include <functional>

// The master's gRPC service (callback API): converts protos to core types, calls Master,
// converts back. No logic of its own (each call is admitted by the Authenticator first, and
// keys are put in the caller's tenant namespace, tenant_keys.h), and nothing here blocks: calls that wait (a segment's
// long-poll heartbeat, a commit waiting for segments to record it) park their reactor with
// ManifestSync and finish from its callback.

#include "google/protobuf/arena.h"
#include "grpcpp/support/message_allocator.h"
#include "kvpool/v1/master.grpc.pb.h"
#include "server/master/authenticator.h"
#include "server/master/leadership.h"
#include "server/master/master.h"
#include "server/master/master_metrics.h"

namespace kvpool::master {

// Puts a call's request and response on one arena, freed together when the call ends: for
// calls whose messages hold a message or string per key (BatchGetReplicaList), which would
// otherwise be allocated and freed one by one. Thread-safe.
template <typename Request, typename Response>
class ArenaMessageAllocator final : public grpc::MessageAllocator<Request, Response> {
 public:
  grpc::MessageHolder<Request, Response>* AllocateMessages() override { return new Holder(); }

 private:
  class Holder final : public grpc::MessageHolder<Request, Response> {
   public:
    Holder() {
      this->set_request(google::protobuf::Arena::CreateMessage<Request>(&arena_));
      this->set_response(google::protobuf::Arena::CreateMessage<Response>(&arena_));
    }
    void Release() override { delete this; }

   private:
    google::protobuf::Arena arena_;
  };
};

class MasterGrpcService final : public v1::MasterService::CallbackService {
 public:
  // All of them must outlive the service; `leadership` null: a single master, always serving.
  MasterGrpcService(Master& master, MasterMetrics& metrics, Authenticator& auth,
                    const Leadership* leadership = nullptr)
      : master_(master), metrics_(metrics), auth_(auth), leadership_(leadership) {
    SetMessageAllocatorFor_BatchGetReplicaList(&lookup_allocator_);
  }

  grpc::ServerUnaryReactor* MountSegment(grpc::CallbackServerContext* context,
                                         const v1::MountSegmentRequest* request,
                                         v1::MountSegmentResponse* response) override;
  grpc::ServerUnaryReactor* RestoreManifest(grpc::CallbackServerContext* context,
                                            const v1::RestoreManifestRequest* request,
                                            v1::RestoreManifestResponse* response) override;
  grpc::ServerUnaryReactor* UnmountSegment(grpc::CallbackServerContext* context,
                                           const v1::UnmountSegmentRequest* request,
                                           v1::UnmountSegmentResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* BatchPutStart(grpc::CallbackServerContext* context,
                                          const v1::BatchPutStartRequest* request,
                                          v1::BatchPutStartResponse* response) override;
  grpc::ServerUnaryReactor* BatchPutEnd(grpc::CallbackServerContext* context,
                                        const v1::BatchPutEndRequest* request,
                                        v1::BatchPutEndResponse* response) override;
  grpc::ServerUnaryReactor* BatchPutRevoke(grpc::CallbackServerContext* context,
                                           const v1::BatchPutRevokeRequest* request,
                                           v1::BatchPutRevokeResponse* response) override;
  grpc::ServerUnaryReactor* BatchGetReplicaList(grpc::CallbackServerContext* context,
                                                const v1::BatchGetReplicaListRequest* request,
                                                v1::BatchGetReplicaListResponse* response) override;
  grpc::ServerUnaryReactor* BatchExist(grpc::CallbackServerContext* context,
                                       const v1::BatchExistRequest* request,
                                       v1::BatchExistResponse* response) override;
  grpc::ServerUnaryReactor* BatchRemove(grpc::CallbackServerContext* context,
                                        const v1::BatchRemoveRequest* request,
                                        v1::BatchRemoveResponse* response) override;
  grpc::ServerUnaryReactor* RemoveAll(grpc::CallbackServerContext* context,
                                      const v1::RemoveAllRequest* request,
                                      v1::RemoveAllResponse* response) override;
  grpc::ServerUnaryReactor* DrainSegment(grpc::CallbackServerContext* context,
                                         const v1::DrainSegmentRequest* request,
                                         v1::DrainSegmentResponse* response) override;
  grpc::ServerUnaryReactor* MigrateStart(grpc::CallbackServerContext* context,
                                         const v1::MigrateStartRequest* request,
                                         v1::MigrateStartResponse* response) override;
  grpc::ServerUnaryReactor* MigrateEnd(grpc::CallbackServerContext* context,
                                       const v1::MigrateEndRequest* request,
                                       v1::MigrateEndResponse* response) override;
  grpc::ServerUnaryReactor* GetClusterStatus(grpc::CallbackServerContext* context,
                                             const v1::GetClusterStatusRequest* request,
                                             v1::GetClusterStatusResponse* response) override;
  grpc::ServerUnaryReactor* ListSegments(grpc::CallbackServerContext* context,
                                         const v1::ListSegmentsRequest* request,
                                         v1::ListSegmentsResponse* response) override;
  grpc::ServerUnaryReactor* BatchDropReplicas(grpc::CallbackServerContext* context,
                                              const v1::BatchDropReplicasRequest* request,
                                              v1::BatchDropReplicasResponse* response) override;
  grpc::ServerUnaryReactor* ReplicaCopyStart(grpc::CallbackServerContext* context,
                                             const v1::ReplicaCopyStartRequest* request,
                                             v1::ReplicaCopyStartResponse* response) override;
  grpc::ServerUnaryReactor* ReplicaCopyEnd(grpc::CallbackServerContext* context,
                                           const v1::MigrateEndRequest* request,
                                           v1::MigrateEndResponse* response) override;

 private:
  class Call;
  // Finishes the call once the ticket's records are applied (after running `durable_too`);
  // if they are not in time, `not_durable` runs first (rewriting the per-key results) and its
  // status ends the call.
  grpc::ServerUnaryReactor* FinishWhenDurable(const Call& call, ManifestSync::Ticket ticket,
                                              std::function<absl::Status()> not_durable = nullptr,
                                              std::function<void()> durable_too = nullptr);

  // A standby answers nothing but GetClusterStatus (not even ListSegments, whose list a
  // standby may not have): returns the call finished with the
  // refusal (naming the leader), or null when this master leads.
  grpc::ServerUnaryReactor* RefuseUnlessLeader(const Call& call,
                                               grpc::CallbackServerContext* context) const;

  Master& master_;
  MasterMetrics& metrics_;
  Authenticator& auth_;
  const Leadership* leadership_;
  ArenaMessageAllocator<v1::BatchGetReplicaListRequest, v1::BatchGetReplicaListResponse>
      lookup_allocator_;
};

}  // namespace kvpool::master
