#pragma once

// Throwaway certificate authorities for TLS tests, made with the openssl CLI at test time
// (no key is ever committed): a CA, and certificates it issues for servers (valid for
// 127.0.0.1 and localhost) and clients (common name = identity), including expired ones.

#include <string>

#include "absl/status/statusor.h"

namespace kvpool::testing {

struct CertFiles {
  std::string cert;  // PEM certificate
  std::string key;   // PEM private key
};

class TestCa {
 public:
  // Creates the CA's key and self-signed certificate under `dir` (created if missing),
  // named `name`. Internal if openssl fails.
  static absl::StatusOr<TestCa> Create(const std::string& dir, const std::string& name);

  const std::string& ca_file() const { return ca_.cert; }

  // A certificate for `common_name` signed by this CA, valid for `days` from now (negative:
  // expired that many days ago), with subject alternative names IP:127.0.0.1, DNS:localhost
  // and DNS:<common_name>.
  absl::StatusOr<CertFiles> Issue(const std::string& common_name, int days = 2) const;

 private:
  std::string dir_;
  std::string name_;
  CertFiles ca_;
};

}  // namespace kvpool::testing
