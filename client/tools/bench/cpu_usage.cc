#include "client/tools/bench/cpu_usage.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvpool::bench {
namespace {

// utime + stime of one process (fields 14 and 15 of /proc/PID/stat); 0 if it is gone.
uint64_t ProcessTicks(const std::string& path) {
  std::ifstream file(path);
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
  size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return utime + stime;
}

}  // namespace

CpuSample SampleCpu(const std::vector<pid_t>& pids) {
  CpuSample sample;
  std::ifstream stat("/proc/stat");
  std::string cpu;
  uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) {
    sample.machine_busy = user + nice + system;
    sample.machine_steal = steal;
    sample.machine_total = user + nice + system + idle + iowait + irq + softirq + steal;
  }
  sample.ours = ProcessTicks("/proc/self/stat");
  for (pid_t pid : pids) sample.ours += ProcessTicks(absl::StrCat("/proc/", pid, "/stat"));
  return sample;
}

CpuShare Between(const CpuSample& before, const CpuSample& after) {
  CpuShare share;
  if (after.machine_total <= before.machine_total) return share;
  double total = static_cast<double>(after.machine_total - before.machine_total);
  double busy = static_cast<double>(after.machine_busy - before.machine_busy);
  double ours = static_cast<double>(after.ours - before.ours);
  share.ours = std::min(1.0, ours / total);
  share.others = std::clamp((busy - ours) / total, 0.0, 1.0);
  share.steal = static_cast<double>(after.machine_steal - before.machine_steal) / total;
  return share;
}

}  // namespace kvpool::bench
