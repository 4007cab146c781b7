#pragma once

namespace kvpool {

// Blocks SIGINT and SIGTERM in the calling thread and every thread it starts afterwards.
// Call first thing in main().
void BlockShutdownSignals();

// Waits for SIGINT or SIGTERM and returns its number.
int WaitForShutdownSignal();

}  // namespace kvpool
