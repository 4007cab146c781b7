// kvpool-kernels-check: runs every GPU-versus-CPU-reference check and prints one line each.
// For GPU machines without GoogleTest; kernels_gpu_test runs the same checks under ctest.
//
//   kvpool-kernels-check [seed] [families]   (families: default copy,gqa,mla)
// Exit status 0 when every check passes (or no GPU is present: everything is skipped).

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/testing/gpu_checks.h"

int main(int argc, char** argv) {
  using namespace kvpool::kernels::testing;
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 20240601;
  const std::string families = argc > 2 ? argv[2] : "copy,gqa,mla";
  auto wanted = [&](const char* family) { return families.find(family) != std::string::npos; };
  if (CudaDeviceCount() == 0) {
    std::printf("SKIP: no CUDA device present; nothing checked\n");
    return 0;
  }
  int failed = 0, total = 0;
  auto report = [&](const std::vector<CheckResult>& results) {
    for (const CheckResult& r : results) {
      ++total;
      if (!r.ok) ++failed;
      std::printf("%-4s %-52s %s\n", r.ok ? "ok" : "FAIL", r.name.c_str(), r.detail.c_str());
      std::fflush(stdout);
    }
  };
  if (wanted("copy")) report(CheckBlockCopy(seed));
  if (wanted("gqa")) report(CheckGqaDecode(seed + 1));
  if (wanted("mla")) report(CheckMlaDecode(seed + 2));
  std::printf("%d of %d checks passed (seed %llu)\n", total - failed, total,
              static_cast<unsigned long long>(seed));
  return failed == 0 ? 0 : 1;
}
