#include "common/metric_families.h"

#include "gtest/gtest.h"

namespace kvpool {
namespace {

TEST(MetricFamiliesTest, SerializesGaugesCountersAndHistogramsInTextFormat) {
  LatencyHistogram latency;
  latency.Observe(absl::Microseconds(30));
  latency.Observe(absl::Milliseconds(2));
  MetricFamilies families;
  families.Gauge("kvpool_objects", "Committed objects.", 7)
      .Counter("kvpool_rpc_requests_total", "Calls.", 3, {{"method", "BatchExist"}})
      .Counter("kvpool_rpc_requests_total", "Calls.", 5, {{"method", "BatchPutStart"}})
      .Histogram("kvpool_rpc_duration_seconds", "Time.", latency.Snapshot(),
                 {{"method", "BatchExist"}});
  std::string text = SerializeMetrics(families.Take());
  EXPECT_NE(text.find("# TYPE kvpool_objects gauge\nkvpool_objects 7"), std::string::npos) << text;
  EXPECT_NE(text.find("kvpool_rpc_requests_total{method=\"BatchExist\"} 3"), std::string::npos);
  EXPECT_NE(text.find("kvpool_rpc_requests_total{method=\"BatchPutStart\"} 5"), std::string::npos);
  EXPECT_NE(text.find("kvpool_rpc_duration_seconds_bucket{method=\"BatchExist\",le=\"5e-05\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kvpool_rpc_duration_seconds_bucket{method=\"BatchExist\",le=\"+Inf\"} 2"),
            std::string::npos);
  EXPECT_NE(text.find("kvpool_rpc_duration_seconds_count{method=\"BatchExist\"} 2"),
            std::string::npos);
  // One TYPE line per family, however many samples it has.
  size_t first = text.find("# TYPE kvpool_rpc_requests_total counter");
  EXPECT_EQ(text.find("# TYPE kvpool_rpc_requests_total counter", first + 1), std::string::npos);
}

}  // namespace
}  // namespace kvpool
