#include "tests/harness/pki.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace kvpool::testing {
namespace {

absl::Status Run(const std::string& command) {
  // openssl's chatter goes to a log file; only its failure matters.
  int rc = std::system(absl::StrCat(command, " >>/tmp/kvpool-test-openssl.log 2>&1").c_str());
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("openssl failed (", rc, "): ", command));
  }
  return absl::OkStatus();
}

constexpr char kKeyOptions[] = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

}  // namespace

absl::StatusOr<TestCa> TestCa::Create(const std::string& dir, const std::string& name) {
  mkdir(dir.c_str(), 0700);
  TestCa ca;
  ca.dir_ = dir;
  ca.name_ = name;
  ca.ca_ = {absl::StrCat(dir, "/", name, "-ca.pem"), absl::StrCat(dir, "/", name, "-ca.key")};
  if (absl::Status made = Run(absl::StrCat("openssl req -x509 ", kKeyOptions, " -keyout ",
                                           ca.ca_.key, " -out ", ca.ca_.cert,
                                           " -days 3 -subj /CN=", name, "-test-ca"));
      !made.ok()) {
    return made;
  }
  return ca;
}

absl::StatusOr<CertFiles> TestCa::Issue(const std::string& common_name, int days) const {
  std::string base = absl::StrCat(dir_, "/", name_, "-", common_name, days < 0 ? "-expired" : "");
  CertFiles files{base + ".pem", base + ".key"};
  std::string csr = base + ".csr";
  std::string ext = base + ".ext";
  {
    std::ofstream out(ext);
    out << "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:" << common_name << "\n";
  }
  if (absl::Status made = Run(absl::StrCat("openssl req ", kKeyOptions, " -keyout ", files.key,
                                           " -out ", csr, " -subj /CN=", common_name));
      !made.ok()) {
    return made;
  }
  if (absl::Status signed_ = Run(absl::StrCat(
          "openssl x509 -req -in ", csr, " -CA ", ca_.cert, " -CAkey ", ca_.key,
          " -CAcreateserial -out ", files.cert, " -days ", days, " -extfile ", ext));
      !signed_.ok()) {
    return signed_;
  }
  return files;
}

}  // namespace kvpool::testing
