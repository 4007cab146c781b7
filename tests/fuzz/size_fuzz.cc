// libFuzzer target: the size parser of flags and configs (common/size.h). Never crashes; a
// size that parses is the same number of bytes when written back in plain digits, and
// formats for humans without failing.

#include <cstdint>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/size.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<uint64_t> bytes = kvpool::ParseSize(text);
  if (bytes.ok()) {
    absl::StatusOr<uint64_t> again = kvpool::ParseSize(absl::StrCat(*bytes));
    if (!again.ok() || *again != *bytes) std::abort();
    if (kvpool::FormatSize(*bytes).empty()) std::abort();
  }
  return 0;
}
