#pragma once

// Builds Prometheus metric families from plain numbers at scrape time, so the hot paths keep
// only relaxed atomics and LatencyHistograms and never touch a metrics library. Used by the
// servers' /metrics and by the client's optional collectable. Thread-compatible.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/latency_histogram.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace kvpool {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class MetricFamilies {
 public:
  // Each adds one sample to the family `name` (created with `help` on first use).
  MetricFamilies& Gauge(const std::string& name, const std::string& help, double value,
                        const MetricLabels& labels = {});
  MetricFamilies& Counter(const std::string& name, const std::string& help, double value,
                          const MetricLabels& labels = {});
  MetricFamilies& Histogram(const std::string& name, const std::string& help,
                            const HistogramSnapshot& snapshot, const MetricLabels& labels = {});

  std::vector<prometheus::MetricFamily> Take();

 private:
  prometheus::ClientMetric& Add(const std::string& name, const std::string& help,
                                prometheus::MetricType type, const MetricLabels& labels);

  std::vector<prometheus::MetricFamily> families_;
  std::map<std::string, size_t> index_;
};

// The Prometheus text exposition of `families`.
std::string SerializeMetrics(const std::vector<prometheus::MetricFamily>& families);

}  // namespace kvpool
