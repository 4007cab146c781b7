#pragma once

// The segment's Prometheus metrics, read from the running segment at scrape time: pool size,
// whether it is mounted, and per transport the data-plane requests, bytes, rejections (by
// reason) and latency.

#include <vector>

#include "prometheus/metric_family.h"
#include "server/segment/segment.h"

namespace kvpool::segment {

std::vector<prometheus::MetricFamily> CollectSegmentMetrics(const Segment& segment);

}  // namespace kvpool::segment
