#include "client/tools/bench/system.h"

namespace kvpool::bench {

std::string WorkloadName(WorkloadKind kind) {
  switch (kind) {
    case WorkloadKind::kGet:
      return "get";
    case WorkloadKind::kPut:
      return "put";
    case WorkloadKind::kMixed:
      return "mixed";
    case WorkloadKind::kMetaPut:
      return "meta-put";
    case WorkloadKind::kMetaExist:
      return "meta-exist";
    case WorkloadKind::kMetaLocal:
      return "meta-local";
  }
  return "?";
}

bool IsMetaWorkload(WorkloadKind kind) {
  return kind == WorkloadKind::kMetaPut || kind == WorkloadKind::kMetaExist ||
         kind == WorkloadKind::kMetaLocal;
}

}  // namespace kvpool::bench
