#pragma once

// The credentials a master accepts and the identity each stands for, read from the file of
// --auth-tokens. One rule a line, '#' starts a comment:
//
//   token <secret> <identity> <role> [<tenant>]   a bearer token ("authorization: Bearer ...")
//   cert  <name>   <role> [<tenant>]              a verified client certificate whose common
//                                                 name or a subject alternative name is <name>
//                                                 (the identity is <name>)
//
// <role> is engine, segment, admin or reader; <tenant> ("-" or absent: the global namespace)
// is [A-Za-z0-9._-], at most 64 characters. A segment's identity is its segment name; a
// segment token rule's identity may end in '*' ("node-*", or "*" alone) to stand for every
// segment name with that prefix (one token shared by a DaemonSet's segments: any holder may
// then act as any of those names). A '*' anywhere else is refused. Secrets
// are at least 16 characters and kept only as SHA-256 digests. Immutable once built;
// thread-safe.

#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/master/auth_policy.h"

namespace kvpool::master {

// What a caller presented on one call.
struct PresentedCredentials {
  // The bearer token of the "authorization" metadata, if any.
  std::optional<std::string> token;
  // Names (common name, then subject alternative names) of a client certificate that the
  // TLS handshake verified against the client CA; empty without one.
  std::vector<std::string> certificate_names;
};

class CredentialTable {
 public:
  static constexpr size_t kMinTokenBytes = 16;

  // InvalidArgument naming the line for a malformed rule, a weak or repeated secret, an
  // unknown role or a bad tenant name.
  static absl::StatusOr<CredentialTable> Parse(absl::string_view text);
  // NotFound / PermissionDenied if the file cannot be read; else as Parse, with the path.
  static absl::StatusOr<CredentialTable> Load(const std::string& path);

  std::optional<Identity> ForToken(absl::string_view token) const;
  // The first name with a rule wins.
  std::optional<Identity> ForCertificate(absl::Span<const std::string> names) const;

  // The identity of a call: a certificate with a rule first, else the token.
  // Unauthenticated (with `refusal` set) when neither maps to an identity.
  absl::StatusOr<Identity> Identify(const PresentedCredentials& presented,
                                    Refusal* refusal = nullptr) const;

  size_t size() const { return by_token_digest_.size() + by_certificate_name_.size(); }

 private:
  absl::flat_hash_map<std::string, Identity> by_token_digest_;
  absl::flat_hash_map<std::string, Identity> by_certificate_name_;
};

// SHA-256 of `token`, as 32 raw bytes.
std::string TokenDigest(absl::string_view token);

}  // namespace kvpool::master
