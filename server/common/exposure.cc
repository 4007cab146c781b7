#include "server/common/exposure.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/net.h"

namespace kvpool {

bool IsLoopbackHost(const std::string& host) {
  return absl::StartsWith(host, "127.") || host == "::1" || host == "[::1]" ||
         IsLocalhostName(host);
}

absl::StatusOr<ExposureVerdict> CheckExposure(const Exposure& exposure) {
  std::vector<std::string> exposed;
  for (const auto& [flag, address] : exposure.listens) {
    absl::StatusOr<HostPort> parsed = ParseHostPort(address);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, "=", address, ": ", parsed.status().message()));
    }
    if (!IsLoopbackHost(parsed->host)) exposed.push_back(absl::StrCat(flag, "=", address));
  }
  const bool secured = exposure.tls && exposure.authenticated;
  ExposureVerdict verdict;
  if (exposed.empty()) {
    verdict.message = secured ? "TLS and authentication on; addresses: loopback only"
                              : absl::StrCat("addresses: loopback only",
                                             exposure.tls ? "" : ", without TLS",
                                             exposure.authenticated ? ""
                                                                    : ", without authentication",
                                             " (other addresses need TLS and authentication, "
                                             "or --insecure)");
    return verdict;
  }
  if (secured) {
    verdict.message = absl::StrCat("TLS and authentication on; reachable beyond this host at ",
                                   absl::StrJoin(exposed, " "));
    return verdict;
  }
  std::string missing = absl::StrCat(exposure.tls ? "" : "TLS (--tls-cert/--tls-key)",
                                     !exposure.tls && !exposure.authenticated ? " and " : "",
                                     exposure.authenticated ? "" : "authentication");
  if (!exposure.insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        absl::StrJoin(exposed, " "), " is not a loopback address, and this server has no ",
        missing,
        ": anyone who reaches it could read, overwrite or remove every object. Add them, bind "
        "127.0.0.1, or pass --insecure on a network you trust"));
  }
  verdict.warning = true;
  verdict.message = absl::StrCat("--insecure: reachable at ", absl::StrJoin(exposed, " "),
                                 " without ", missing,
                                 "; anyone who reaches it owns the pool");
  return verdict;
}

}  // namespace kvpool
