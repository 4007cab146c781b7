#include "common/flags.h"

#include <cstring>
#include <string>

#include "absl/flags/parse.h"

namespace kvpool {

std::vector<char*> ParseFlags(int argc, char** argv) {
  // Abseil spells flag names with underscores; rewrite "--foo-bar[=value]" in place.
  for (int i = 1; i < argc; ++i) {
    char* arg = argv[i];
    if (std::strcmp(arg, "--") == 0) break;
    if (arg[0] != '-') continue;
    char* name = arg + (arg[1] == '-' ? 2 : 1);
    for (char* c = name; *c != '\0' && *c != '='; ++c) {
      if (*c == '-') *c = '_';
    }
  }
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace kvpool
