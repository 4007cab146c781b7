#include "server/common/signals.h"

#include <pthread.h>
#include <signal.h>

namespace kvpool {
namespace {

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

void BlockShutdownSignals() {
  sigset_t set = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int WaitForShutdownSignal() {
  sigset_t set = ShutdownSignals();
  int signal_number = 0;
  sigwait(&set, &signal_number);
  return signal_number;
}

}  // namespace kvpool
