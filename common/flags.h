#pragma once

// Command-line parsing for kvpool's binaries: Abseil flags, written with dashes or
// underscores alike (--http-listen and --http_listen are the same flag).

#include <vector>

namespace kvpool {

// Parses the flags (exits with a message on bad ones) and returns the positional arguments,
// program name first.
std::vector<char*> ParseFlags(int argc, char** argv);

}  // namespace kvpool
