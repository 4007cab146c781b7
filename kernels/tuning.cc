#include "kernels/tuning.h"

namespace kvpool::kernels {
namespace {
KernelTuning g_tuning;
}  // namespace

void SetKernelTuning(const KernelTuning& tuning) { g_tuning = tuning; }
const KernelTuning& GetKernelTuning() { return g_tuning; }

}  // namespace kvpool::kernels
