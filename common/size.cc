#include "common/size.h"

#include <cctype>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvpool {
namespace {

// Multiplier for a unit suffix (lower-cased, spaces trimmed), or 0 if unknown.
uint64_t UnitMultiplier(absl::string_view unit) {
  constexpr uint64_t k = 1024;
  if (unit.empty() || unit == "b") return 1;
  if (unit == "k" || unit == "kb" || unit == "kib") return k;
  if (unit == "m" || unit == "mb" || unit == "mib") return k * k;
  if (unit == "g" || unit == "gb" || unit == "gib") return k * k * k;
  if (unit == "t" || unit == "tb" || unit == "tib") return k * k * k * k;
  return 0;
}

}  // namespace

absl::StatusOr<uint64_t> ParseSize(absl::string_view text) {
  std::string input = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (input.empty()) return absl::InvalidArgumentError("empty size");
  size_t split = 0;
  while (split < input.size() && (std::isdigit(static_cast<unsigned char>(input[split])) ||
                                  input[split] == '.')) {
    ++split;
  }
  absl::string_view number(input.data(), split);
  absl::string_view unit = absl::StripAsciiWhitespace(absl::string_view(input).substr(split));
  if (number.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("size \"", text, "\" does not start with a number"));
  }
  uint64_t multiplier = UnitMultiplier(unit);
  if (multiplier == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "size \"", text, "\" has unknown unit \"", unit, "\" (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"));
  }
  if (number.find('.') == absl::string_view::npos) {
    uint64_t value = 0;
    if (!absl::SimpleAtoi(number, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("size \"", text, "\" is out of range"));
    }
    if (value != 0 && multiplier > UINT64_MAX / value) {
      return absl::InvalidArgumentError(absl::StrCat("size \"", text, "\" is out of range"));
    }
    return value * multiplier;
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat("size \"", text, "\" is not a number"));
  }
  double bytes = value * static_cast<double>(multiplier);
  if (bytes >= 18446744073709551615.0) {
    return absl::InvalidArgumentError(absl::StrCat("size \"", text, "\" is out of range"));
  }
  if (bytes != std::floor(bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("size \"", text, "\" is not a whole number of bytes"));
  }
  return static_cast<uint64_t>(bytes);
}

std::string FormatSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error) {
  absl::StatusOr<uint64_t> parsed = ParseSize(text);
  if (!parsed.ok()) {
    *error = std::string(parsed.status().message());
    return false;
  }
  size->bytes = *parsed;
  return true;
}

std::string AbslUnparseFlag(ByteSize size) { return absl::StrCat(size.bytes); }

}  // namespace kvpool
