// What handing work to another thread costs on this machine: from asking to running, for a
// thread started for it (std::async, what GpuBlockMover did per batch until 2026-12-05) and
// for a parked thread woken (a condition variable, what TaskPool does). run_on_gpu.sh's
// `host` step builds and runs it:  g++ -O2 -pthread thread_start.cc && ./a.out
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <mutex>
#include <thread>
#include <vector>
using Clock = std::chrono::steady_clock;
static double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }
int main() {
  std::vector<double> spawn, join, wake;
  for (int i = 0; i < 200; ++i) {
    auto t0 = Clock::now();
    Clock::time_point ran;
    auto f = std::async(std::launch::async, [&] { ran = Clock::now(); });
    f.get();
    auto t1 = Clock::now();
    spawn.push_back(us(ran - t0));
    join.push_back(us(t1 - t0));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::mutex mu;
  std::condition_variable cv;
  bool go = false, stop = false;
  Clock::time_point ran;
  std::thread worker([&] {
    std::unique_lock<std::mutex> l(mu);
    while (true) {
      cv.wait(l, [&] { return go || stop; });
      if (stop) return;
      ran = Clock::now();
      go = false;
      cv.notify_all();
    }
  });
  for (int i = 0; i < 200; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::unique_lock<std::mutex> l(mu);
    auto t0 = Clock::now();
    go = true;
    cv.notify_all();
    cv.wait(l, [&] { return !go; });
    wake.push_back(us(ran - t0));
  }
  {
    std::lock_guard<std::mutex> l(mu);
    stop = true;
    cv.notify_all();
  }
  worker.join();
  auto p = [](std::vector<double> v, const char* name) {
    std::sort(v.begin(), v.end());
    std::printf("%-28s p50 %7.1f us  p90 %7.1f us  max %7.1f us\n", name, v[v.size() / 2],
                v[v.size() * 9 / 10], v.back());
  };
  p(spawn, "std::async: call to run");
  p(join, "std::async: call to joined");
  p(wake, "parked thread: notify to run");
}
