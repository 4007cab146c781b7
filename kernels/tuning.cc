#include "kernels/tuning.h"

namespace kvpool::kernels {
namespace {
KernelTuning g_tuning;
GqaScheduleInfo g_last_gqa;
}  // namespace

void SetKernelTuning(const KernelTuning& tuning) { g_tuning = tuning; }
const KernelTuning& GetKernelTuning() { return g_tuning; }
void SetLastGqaSchedule(const GqaScheduleInfo& info) { g_last_gqa = info; }
const GqaScheduleInfo& LastGqaSchedule() { return g_last_gqa; }

}  // namespace kvpool::kernels
