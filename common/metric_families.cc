#include "common/metric_families.h"

#include <sstream>

#include "prometheus/text_serializer.h"

namespace kvpool {

prometheus::ClientMetric& MetricFamilies::Add(const std::string& name, const std::string& help,
                                              prometheus::MetricType type,
                                              const MetricLabels& labels) {
  auto [it, inserted] = index_.try_emplace(name, families_.size());
  if (inserted) families_.push_back(prometheus::MetricFamily{name, help, type, {}});
  prometheus::MetricFamily& family = families_[it->second];
  prometheus::ClientMetric& metric = family.metric.emplace_back();
  for (const auto& [label, value] : labels) metric.label.push_back({label, value});
  return metric;
}

MetricFamilies& MetricFamilies::Gauge(const std::string& name, const std::string& help,
                                      double value, const MetricLabels& labels) {
  Add(name, help, prometheus::MetricType::Gauge, labels).gauge.value = value;
  return *this;
}

MetricFamilies& MetricFamilies::Counter(const std::string& name, const std::string& help,
                                        double value, const MetricLabels& labels) {
  Add(name, help, prometheus::MetricType::Counter, labels).counter.value = value;
  return *this;
}

MetricFamilies& MetricFamilies::Histogram(const std::string& name, const std::string& help,
                                          const HistogramSnapshot& snapshot,
                                          const MetricLabels& labels) {
  prometheus::ClientMetric::Histogram& histogram =
      Add(name, help, prometheus::MetricType::Histogram, labels).histogram;
  histogram.sample_count = snapshot.count;
  histogram.sample_sum = snapshot.sum_seconds;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < snapshot.bounds.size(); ++i) {
    cumulative += snapshot.counts[i];
    histogram.bucket.push_back({cumulative, snapshot.bounds[i]});
  }
  histogram.bucket.push_back({snapshot.count, std::numeric_limits<double>::infinity()});
  return *this;
}

std::vector<prometheus::MetricFamily> MetricFamilies::Take() {
  index_.clear();
  return std::move(families_);
}

std::string SerializeMetrics(const std::vector<prometheus::MetricFamily>& families) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

}  // namespace kvpool
