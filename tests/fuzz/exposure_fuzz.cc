// libFuzzer target: listening addresses as the servers parse them (common/net.h ParseHostPort
// through server/common/exposure.h). Never crashes; without TLS and authentication nothing
// but loopback is ever accepted without --insecure.

#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/net.h"
#include "server/common/exposure.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string address(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kvpool::ExposureVerdict> verdict =
      kvpool::CheckExposure({.listens = {{"--listen", address}}});
  if (verdict.ok()) {
    absl::StatusOr<kvpool::HostPort> parsed = kvpool::ParseHostPort(address);
    if (!parsed.ok() || !kvpool::IsLoopbackHost(parsed->host)) std::abort();
  }
  return 0;
}
