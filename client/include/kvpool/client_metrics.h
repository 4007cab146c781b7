#pragma once

// Opt-in: a Client's metrics as a prometheus-cpp Collectable, for engines that already serve
// a Prometheus endpoint (prometheus::Exposer::RegisterCollectable). The only public header of
// kvpool that exposes a third-party type; client.h stays free of it.
//
//   kvpool_client_put_duration_seconds   histogram of BatchPut/Put calls
//   kvpool_client_get_duration_seconds   histogram of BatchGet/Get calls
//   kvpool_client_bytes_total{op}        bytes stored (op="put") and read (op="get")

#include <vector>

#include "kvpool/client.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace kvpool {

class ClientMetrics : public prometheus::Collectable {
 public:
  // `client` must outlive this object. Thread-safe.
  explicit ClientMetrics(const Client& client) : client_(client) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const Client& client_;
};

}  // namespace kvpool
