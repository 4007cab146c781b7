#include "server/master/auth_policy.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace kvpool::master {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kEngine:
      return "engine";
    case Role::kSegment:
      return "segment";
    case Role::kAdmin:
      return "admin";
    case Role::kReader:
      return "reader";
    case Role::kCount:
      break;
  }
  return "?";
}

std::optional<Role> ParseRole(absl::string_view name) {
  for (int i = 0; i < static_cast<int>(Role::kCount); ++i) {
    if (name == RoleName(static_cast<Role>(i))) return static_cast<Role>(i);
  }
  return std::nullopt;
}

const char* RefusalName(Refusal refusal) {
  switch (refusal) {
    case Refusal::kNone:
      return "none";
    case Refusal::kNoCredentials:
      return "no_credentials";
    case Refusal::kUnknownToken:
      return "unknown_token";
    case Refusal::kUnknownCertificate:
      return "unknown_certificate";
    case Refusal::kWrongRole:
      return "wrong_role";
    case Refusal::kOtherSegment:
      return "other_segment";
    case Refusal::kCount:
      break;
  }
  return "?";
}

Rule RuleFor(Rpc rpc, Role role) {
  // One row per RPC; no default, so a new Rpc without a row is a compiler warning here and a
  // failure of auth_policy_test.
  struct Row {
    Rule engine, segment, admin, reader;
  };
  constexpr Rule D = Rule::kDeny, A = Rule::kAllow, O = Rule::kOwnSegmentOnly;
  Row row{D, D, D, D};
  switch (rpc) {
    // A segment's own life: only under its own name. An admin may unmount any segment.
    case Rpc::kMountSegment:
    case Rpc::kRestoreManifest:
    case Rpc::kHeartbeat:
      row = {D, O, D, D};
      break;
    case Rpc::kUnmountSegment:
      row = {D, O, A, D};
      break;
    // Objects, within the caller's tenant.
    case Rpc::kBatchPutStart:
    case Rpc::kBatchPutEnd:
    case Rpc::kBatchPutRevoke:
    case Rpc::kBatchGetReplicaList:
    case Rpc::kBatchExist:
    case Rpc::kBatchRemove:
    case Rpc::kBatchDropReplicas:
    // Copy and move tasks: a new replica of one of the caller's objects on a named segment.
    case Rpc::kReplicaCopyStart:
    case Rpc::kReplicaCopyEnd:
      row = {A, D, A, D};
      break;
    // The whole pool.
    case Rpc::kRemoveAll:
    case Rpc::kDrainSegment:
    case Rpc::kMigrateStart:
    case Rpc::kMigrateEnd:
      row = {D, D, A, D};
      break;
    // Totals and segment list (no keys): everyone authenticated; clients use it to wait for
    // the master.
    case Rpc::kGetClusterStatus:
    // The segment list alone, for routing.
    case Rpc::kListSegments:
      row = {A, A, A, A};
      break;
    case Rpc::kCount:
      break;
  }
  switch (role) {
    case Role::kEngine:
      return row.engine;
    case Role::kSegment:
      return row.segment;
    case Role::kAdmin:
      return row.admin;
    case Role::kReader:
      return row.reader;
    case Role::kCount:
      break;
  }
  return Rule::kDeny;
}

bool SegmentNameMatches(absl::string_view identity, absl::string_view segment) {
  if (absl::ConsumeSuffix(&identity, "*")) {
    return segment.size() > identity.size() && absl::StartsWith(segment, identity);
  }
  return segment == identity;
}

absl::Status Authorize(Rpc rpc, const Identity& caller, absl::string_view segment,
                       Refusal* refusal) {
  Refusal why = Refusal::kNone;
  absl::Status status = absl::OkStatus();
  switch (RuleFor(rpc, caller.role)) {
    case Rule::kAllow:
      break;
    case Rule::kOwnSegmentOnly:
      if (!SegmentNameMatches(caller.name, segment)) {
        why = Refusal::kOtherSegment;
        status = absl::PermissionDeniedError(
            absl::StrCat(RpcName(rpc), " refused: \"", caller.name,
                         "\" (role segment) may act only under its own name, not as segment \"",
                         segment, "\""));
      }
      break;
    case Rule::kDeny:
      why = Refusal::kWrongRole;
      status = absl::PermissionDeniedError(absl::StrCat(RpcName(rpc), " refused: \"",
                                                        caller.name, "\" has role ",
                                                        RoleName(caller.role),
                                                        ", which may not call it"));
      break;
  }
  if (refusal != nullptr) *refusal = why;
  return status;
}

}  // namespace kvpool::master
