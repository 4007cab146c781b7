// libFuzzer target: the master's credentials file parser and the token check
// (server/master/credential_table.h). Input: a file's text, then after a NUL a presented token.
// Never crashes; a token the table admits maps to an identity whose rule is in the text, and
// whatever the identity, the policy's answer is one of allow / PermissionDenied.

#include <cstdint>
#include <cstdlib>
#include "absl/strings/string_view.h"

#include "server/master/auth_policy.h"
#include "server/master/credential_table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvpool::master;
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  size_t split = input.find('\0');
  absl::string_view text = input.substr(0, split);
  std::string token(split == absl::string_view::npos ? "" : input.substr(split + 1));
  absl::StatusOr<CredentialTable> table = CredentialTable::Parse(text);
  if (!table.ok()) return 0;
  Refusal refusal = Refusal::kNone;
  absl::StatusOr<Identity> identity =
      table->Identify({.token = token, .certificate_names = {token}}, &refusal);
  if (!identity.ok()) {
    if (identity.status().code() != absl::StatusCode::kUnauthenticated) std::abort();
    return 0;
  }
  if (text.find(identity->name) == absl::string_view::npos) std::abort();
  for (int rpc = 0; rpc < static_cast<int>(Rpc::kCount); ++rpc) {
    absl::Status allowed = Authorize(static_cast<Rpc>(rpc), *identity, token);
    if (!allowed.ok() && allowed.code() != absl::StatusCode::kPermissionDenied) std::abort();
  }
  return 0;
}
