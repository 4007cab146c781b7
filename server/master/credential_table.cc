#include "server/master/credential_table.h"

#include <openssl/sha.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvpool::master {
namespace {

bool ValidTenant(absl::string_view tenant) {
  if (tenant.empty() || tenant.size() > 64) return false;
  for (char c : tenant) {
    if (!(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
          c == '-')) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string TokenDigest(absl::string_view token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

absl::StatusOr<CredentialTable> CredentialTable::Parse(absl::string_view text) {
  CredentialTable table;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    auto error = [line_number](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_number, ": ", what));
    };
    const bool is_token = fields[0] == "token";
    if (!is_token && fields[0] != "cert") {
      return error(absl::StrCat("a rule starts with \"token\" or \"cert\", not \"", fields[0],
                                "\""));
    }
    const size_t role_at = is_token ? 3 : 2;
    if (fields.size() < role_at + 1 || fields.size() > role_at + 2) {
      return error(is_token ? "expected: token <secret> <identity> <role> [<tenant>]"
                            : "expected: cert <name> <role> [<tenant>]");
    }
    std::optional<Role> role = ParseRole(fields[role_at]);
    if (!role) {
      return error(absl::StrCat("unknown role \"", fields[role_at],
                                "\" (engine, segment, admin or reader)"));
    }
    Identity identity{.name = std::string(is_token ? fields[2] : fields[1]), .role = *role};
    if (absl::StrContains(identity.name, '*') &&
        (!is_token || *role != Role::kSegment || identity.name.find('*') + 1 !=
                                                     identity.name.size())) {
      return error(absl::StrCat("\"", identity.name,
                                "\": a '*' may only end the identity of a segment token rule"));
    }
    if (fields.size() == role_at + 2 && fields[role_at + 1] != "-") {
      if (!ValidTenant(fields[role_at + 1])) {
        return error(absl::StrCat("tenant \"", fields[role_at + 1],
                                  "\" is not 1-64 characters of [A-Za-z0-9._-]"));
      }
      identity.tenant = std::string(fields[role_at + 1]);
    }
    if (is_token) {
      if (fields[1].size() < kMinTokenBytes) {
        return error(absl::StrCat("the secret of \"", identity.name, "\" is shorter than ",
                                  kMinTokenBytes, " characters"));
      }
      if (!table.by_token_digest_.emplace(TokenDigest(fields[1]), identity).second) {
        return error(absl::StrCat("the secret of \"", identity.name, "\" is already in use"));
      }
    } else if (!table.by_certificate_name_.emplace(identity.name, identity).second) {
      return error(absl::StrCat("certificate name \"", identity.name, "\" has a rule already"));
    }
  }
  return table;
}

absl::StatusOr<CredentialTable> CredentialTable::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read the credentials file ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<CredentialTable> table = Parse(text.str());
  if (!table.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", table.status().message()));
  }
  return table;
}

std::optional<Identity> CredentialTable::ForToken(absl::string_view token) const {
  auto it = by_token_digest_.find(TokenDigest(token));
  if (it == by_token_digest_.end()) return std::nullopt;
  return it->second;
}

std::optional<Identity> CredentialTable::ForCertificate(
    absl::Span<const std::string> names) const {
  for (const std::string& name : names) {
    if (auto it = by_certificate_name_.find(name); it != by_certificate_name_.end()) {
      return it->second;
    }
  }
  return std::nullopt;
}

absl::StatusOr<Identity> CredentialTable::Identify(const PresentedCredentials& presented,
                                                   Refusal* refusal) const {
  auto refuse = [refusal](Refusal why, std::string message) {
    if (refusal != nullptr) *refusal = why;
    return absl::UnauthenticatedError(std::move(message));
  };
  if (refusal != nullptr) *refusal = Refusal::kNone;
  if (std::optional<Identity> identity = ForCertificate(presented.certificate_names)) {
    return *identity;
  }
  if (presented.token.has_value()) {
    if (std::optional<Identity> identity = ForToken(*presented.token)) return *identity;
    return refuse(Refusal::kUnknownToken,
                  "the bearer token is not one this master accepts (revoked, mistyped, or for "
                  "another pool)");
  }
  if (!presented.certificate_names.empty()) {
    return refuse(Refusal::kUnknownCertificate,
                  absl::StrCat("client certificate \"", presented.certificate_names[0],
                               "\" is valid but no rule of the credentials file names it"));
  }
  return refuse(Refusal::kNoCredentials,
                "this master requires authentication: send a bearer token (authorization "
                "metadata; --auth-token-file) or a client certificate (mutual TLS)");
}

}  // namespace kvpool::master
