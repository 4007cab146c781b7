#include "kernels/decode_plan.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <queue>

namespace kvpool::kernels {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

size_t Align256(size_t v) { return (v + 255) / 256 * 256; }

// Finish time of the last block when items of the given costs (sorted longest first) are taken
// in that order by whichever of `ctas` blocks is free first.
double ListScheduleMakespan(const std::vector<double>& costs, int ctas) {
  if (costs.empty()) return 0.0;
  if (static_cast<int64_t>(costs.size()) <= ctas) return costs.front();
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
  for (int i = 0; i < ctas; ++i) free_at.push(0.0);
  double last = 0.0;
  for (double c : costs) {
    const double t = free_at.top() + c;
    free_at.pop();
    free_at.push(t);
    last = std::max(last, t);
  }
  return last;
}

struct Candidate {
  int64_t chunk_granules = 0;
  int64_t slots = 0;
  int64_t items = 0;
  double cost = 0.0;
};

// The span plan (SplitPlanInput::spans): the batch's work in batch order (each sequence's
// granules times its units, plus each item's fixed cost) cut into `ctas` equal spans, block i
// taking the pieces of span i one after the other. Every unit of a piece goes to the same block,
// so all units of a sequence are cut alike and share its slots. A cut keeps min_chunk on both
// sides: a piece that would leave less runs a little past its span's end, or starts the next
// span early. False (plan untouched) when the plan needs more than max_slots partial results.
bool PlanSpans(const SplitPlanInput& in, const std::vector<int64_t>& granules, SplitPlan* plan) {
  const int64_t g = in.granule;
  const int64_t units = in.units_per_seq;
  const int64_t min_cg = std::max<int64_t>(1, in.min_chunk / g);
  const double fixed = in.item_us / in.granule_us;  // an item's fixed cost, in granules
  struct Piece {
    int block;
    int64_t from, to;  // granules
  };
  std::vector<std::vector<Piece>> pieces(in.batch);
  double work = 0;
  for (int64_t n : granules) work += double(n) * units;
  // Twice: the spans of the second pass include the fixed costs of the first pass's pieces.
  int64_t count = int64_t{in.batch} + in.ctas - 1;
  std::vector<double> load;
  for (int pass = 0; pass < 2; ++pass) {
    const double cap = (work + fixed * units * count) / in.ctas;
    load.assign(in.ctas, 0.0);
    int blk = 0;
    double at = 0;  // work placed so far
    count = 0;
    for (int b = 0; b < in.batch; ++b) {
      pieces[b].clear();
      const int64_t n = granules[b];
      for (int64_t pos = 0;;) {
        while (blk + 1 < in.ctas && at >= (blk + 1) * cap) ++blk;  // span spent
        const int64_t rest = n - pos;
        int64_t take = rest;
        if (blk + 1 < in.ctas) {
          const double room = ((blk + 1) * cap - at) / units - fixed;
          if (rest > room) {
            const int64_t fits = room > 0 ? static_cast<int64_t>(room) : 0;
            if (fits >= min_cg && rest - fits >= min_cg) {
              take = fits;  // cut where the span ends
            } else if (rest - fits >= min_cg && load[blk] > 0) {
              ++blk;  // the next span starts here (with this one's slack)
              continue;
            } else if (rest - fits >= min_cg) {
              take = rest - min_cg >= min_cg ? min_cg : rest;  // spans under min_chunk
            }  // else the rest runs a little past the span's end
          }
        }
        pieces[b].push_back({blk, pos, pos + take});
        load[blk] += (double(take) + fixed) * units;
        at += (double(take) + fixed) * units;
        pos += take;
        ++count;
        if (pos >= n) break;
      }
    }
  }
  int64_t slots = 0;
  int max_splits = 1;
  for (const std::vector<Piece>& p : pieces) {
    if (p.size() > 1) slots += static_cast<int64_t>(p.size());
    max_splits = std::max(max_splits, static_cast<int>(p.size()));
  }
  if (slots > in.max_slots) return false;

  // Each block's items in order; then block i's first item at index i, the rest after.
  std::vector<std::vector<DecodeWorkItem>> chains(in.ctas);
  *plan = SplitPlan{};
  int32_t slot = 0;
  int64_t longest = 0;
  for (int b = 0; b < in.batch; ++b) {
    const std::vector<Piece>& p = pieces[b];
    const int32_t n = static_cast<int32_t>(p.size());
    if (n > 1) plan->merges.push_back({b, slot, n, 0});
    for (int32_t s = 0; s < n; ++s) {
      longest = std::max(longest, p[s].to - p[s].from);
      for (int64_t u = 0; u < units; ++u) {
        DecodeWorkItem it;
        it.seq = b;
        it.unit = static_cast<int32_t>(u);
        it.start = static_cast<int32_t>(p[s].from * g);
        it.end =
            s + 1 < n ? static_cast<int32_t>(p[s].to * g) : std::numeric_limits<int32_t>::max();
        it.slot = n > 1 ? slot + s : -1;
        chains[p[s].block].push_back(it);
      }
    }
    if (n > 1) slot += n;
  }
  std::erase_if(chains, [](const std::vector<DecodeWorkItem>& c) { return c.empty(); });
  const int grid = static_cast<int>(chains.size());
  plan->items.resize(grid);
  for (int i = 0; i < grid; ++i) plan->items[i] = chains[i][0];
  for (int i = 0; i < grid; ++i) {
    int32_t prev = i;
    for (size_t k = 1; k < chains[i].size(); ++k) {
      const int32_t at = static_cast<int32_t>(plan->items.size());
      plan->items.push_back(chains[i][k]);
      plan->items[prev].next = at;
      prev = at;
    }
  }
  plan->chunk =
      static_cast<int>(std::min<int64_t>(longest * g, std::numeric_limits<int32_t>::max()));
  plan->slots = slot;
  plan->max_splits = max_splits;
  plan->spans = true;
  plan->grid = grid;
  plan->modelled_us = *std::max_element(load.begin(), load.end()) * in.granule_us;
  if (slot > 0) plan->modelled_us += in.merge_us + in.merge_split_us * max_splits;
  return true;
}

}  // namespace

int64_t MaxPlanSlots(const SplitPlanInput& in) {
  if (in.max_slots <= 0 || in.batch <= 0) return 0;
  const int64_t g = std::max(1, in.granule);
  const int64_t min_cg = std::max<int64_t>(1, in.min_chunk / g);
  const int64_t per_seq = CeilDiv(CeilDiv(std::max(in.max_seq_len, 1), g), min_cg);
  const int64_t forced =
      in.forced_chunk > 0 ? CeilDiv(std::max(in.max_seq_len, 1), in.forced_chunk) : 0;
  const int64_t bound = int64_t{in.batch} * std::max(per_seq, forced);
  return std::min<int64_t>(in.forced_chunk > 0 ? bound : in.max_slots, bound);
}

int64_t MaxPlanItems(const SplitPlanInput& in) {
  return (int64_t{std::max(in.batch, 0)} + MaxPlanSlots(in)) * std::max(in.units_per_seq, 1);
}

KernelStatus PlanSplits(const SplitPlanInput& in, SplitPlan* plan) {
  if (plan == nullptr) return KernelStatus::Refused("PlanSplits: no plan to fill");
  *plan = SplitPlan{};
  if (in.batch < 0 || in.units_per_seq <= 0 || in.max_seq_len < 0 || in.ctas <= 0 ||
      in.granule <= 0) {
    char buf[200];
    std::snprintf(buf, sizeof(buf),
                  "PlanSplits: bad input (batch %d, units %d, max_seq_len %d, ctas %d, granule %d)",
                  in.batch, in.units_per_seq, in.max_seq_len, in.ctas, in.granule);
    return KernelStatus::Refused(buf);
  }
  if (in.forced_chunk != 0 && (in.forced_chunk < 0 || in.forced_chunk % in.granule != 0)) {
    return KernelStatus::Refused("forced chunk " + std::to_string(in.forced_chunk) +
                                 " is not a positive multiple of " + std::to_string(in.granule) +
                                 " tokens");
  }
  const int64_t g = in.granule;
  std::vector<int64_t> granules(in.batch);
  int64_t gmax = 1;
  for (int b = 0; b < in.batch; ++b) {
    int64_t len = in.max_seq_len;
    if (in.seq_lens != nullptr && !in.uniform) {
      len = in.seq_lens[b];
      if (len < 0 || len > in.max_seq_len) {
        return KernelStatus::Refused(
            "seq_lens[" + std::to_string(b) + "] = " + std::to_string(len) +
            " is outside [0, max_seq_len = " + std::to_string(in.max_seq_len) + "]");
      }
    }
    granules[b] = CeilDiv(len, g);
    gmax = std::max(gmax, granules[b]);
  }
  const int64_t units = in.units_per_seq;
  const int64_t min_cg = std::max<int64_t>(1, in.min_chunk / g);

  // Evaluates cutting every sequence into equal parts of at most cg granules.
  std::vector<double> costs;
  auto evaluate = [&](int64_t cg, Candidate* c) {
    c->chunk_granules = cg;
    c->slots = 0;
    int64_t max_splits = 1;
    costs.clear();
    for (int b = 0; b < in.batch; ++b) {
      const int64_t n = std::max<int64_t>(1, CeilDiv(granules[b], cg));
      const int64_t per = n > 1 ? CeilDiv(granules[b], n) : granules[b];
      if (n > 1) c->slots += n;
      max_splits = std::max(max_splits, n);
      for (int64_t s = 0; s < n; ++s) {
        const int64_t len = s + 1 < n ? per : granules[b] - (n - 1) * per;
        const double cost = std::max<int64_t>(len, 0) * in.granule_us + in.item_us;
        for (int64_t u = 0; u < units; ++u) costs.push_back(cost);
      }
    }
    c->items = static_cast<int64_t>(costs.size());
    std::sort(costs.begin(), costs.end(), std::greater<double>());
    c->cost = ListScheduleMakespan(costs, in.ctas);
    if (c->slots > 0) c->cost += in.merge_us + in.merge_split_us * max_splits;
    if (c->items > in.ctas) c->cost += in.counter_us;
  };

  Candidate best;
  if (in.forced_chunk > 0) {
    evaluate(in.forced_chunk / g, &best);
  } else {
    evaluate(gmax, &best);  // no splits: always allowed
    const bool best_unsplit_fits = best.items <= in.ctas;
    // Cuts of the longest sequence into n parts: every n up to 64, then steps of n / 8, and the
    // n that make whole waves of items if every sequence were as long as the longest.
    std::vector<int64_t> cuts;
    for (int64_t n = 2; n <= gmax && n <= 64; ++n) cuts.push_back(n);
    for (int64_t n = 72; n <= gmax; n += n / 8) cuts.push_back(n);
    for (int64_t w = 1; w <= 8; ++w) {
      const int64_t n = w * in.ctas / (int64_t{std::max(in.batch, 1)} * units);
      if (n >= 2 && n <= gmax) cuts.push_back(n);
    }
    std::sort(cuts.begin(), cuts.end());
    int64_t last = gmax;
    for (int64_t n : cuts) {
      const int64_t cg = std::max(min_cg, CeilDiv(gmax, n));
      if (cg == last) continue;
      last = cg;
      Candidate c;
      evaluate(cg, &c);
      if (c.slots > in.max_slots) break;  // smaller chunks only need more
      if (in.one_wave && best_unsplit_fits && c.items > in.ctas) continue;
      if (c.items > int64_t{64} * in.ctas) break;
      if (c.cost < 0.98 * best.cost) best = c;
      if (cg == min_cg) break;
    }
  }
  if (best.items > std::numeric_limits<int32_t>::max() / 2) {
    return KernelStatus::Refused("too many work items (" + std::to_string(best.items) + ")");
  }

  if (in.spans && in.forced_chunk == 0 && in.batch > 0) {
    // (10%: on an H100 a span plan modelled 2% faster ran 4% slower, 32 heads 32 x 1k-16k.)
    SplitPlan spans;
    if (PlanSpans(in, granules, &spans) &&
        (in.force_spans || spans.modelled_us < 0.9 * best.cost)) {
      *plan = std::move(spans);
      return KernelStatus::Ok();
    }
  }

  // Build the chosen plan: items longest first, slots consecutive per split sequence.
  const int64_t cg = best.chunk_granules;
  plan->chunk = static_cast<int>(std::min<int64_t>(cg * g, std::numeric_limits<int32_t>::max()));
  struct Pending {
    double cost;
    DecodeWorkItem item;
  };
  std::vector<Pending> pending;
  pending.reserve(best.items);
  int32_t slot = 0;
  for (int b = 0; b < in.batch; ++b) {
    const int64_t n = std::max<int64_t>(1, CeilDiv(granules[b], cg));
    const int64_t per = n > 1 ? CeilDiv(granules[b], n) : granules[b];
    if (n > 1) {
      plan->merges.push_back({b, slot, static_cast<int32_t>(n), 0});
      plan->max_splits = std::max(plan->max_splits, static_cast<int>(n));
    }
    for (int64_t s = 0; s < n; ++s) {
      const int64_t len = s + 1 < n ? per : granules[b] - (n - 1) * per;
      const double cost = std::max<int64_t>(len, 0) * in.granule_us + in.item_us;
      for (int64_t u = 0; u < units; ++u) {
        DecodeWorkItem it;
        it.seq = b;
        it.unit = static_cast<int32_t>(u);
        it.start = static_cast<int32_t>(s * per * g);
        it.end = s + 1 < n ? static_cast<int32_t>((s + 1) * per * g)
                           : std::numeric_limits<int32_t>::max();
        it.slot = n > 1 ? slot + static_cast<int32_t>(s) : -1;
        pending.push_back({cost, it});
      }
    }
    if (n > 1) slot += static_cast<int32_t>(n);
  }
  std::stable_sort(pending.begin(), pending.end(),
                   [](const Pending& a, const Pending& b) { return a.cost > b.cost; });
  plan->items.reserve(pending.size());
  for (const Pending& p : pending) plan->items.push_back(p.item);
  plan->slots = slot;
  const int64_t items = static_cast<int64_t>(plan->items.size());
  plan->one_item = items <= in.ctas;
  plan->grid = static_cast<int>(std::min<int64_t>(items, in.ctas));
  plan->modelled_us = best.cost;
  return KernelStatus::Ok();
}

DecodeWorkspaceLayout LayoutDecodeWorkspace(int64_t items, int64_t merges, int64_t slots, int heads,
                                            int dim) {
  DecodeWorkspaceLayout l;
  l.items = 256;
  l.merges = Align256(l.items + sizeof(DecodeWorkItem) * std::max<int64_t>(items, 0));
  l.part_lse = Align256(l.merges + sizeof(DecodeMergeItem) * std::max<int64_t>(merges, 0));
  l.part_o = Align256(l.part_lse + size_t{4} * std::max<int64_t>(slots, 0) * heads);
  l.total = Align256(l.part_o + size_t{4} * std::max<int64_t>(slots, 0) * heads * dim);
  return l;
}

size_t DecodeWorkspaceBytes(const SplitPlanInput& in, int heads, int dim) {
  return LayoutDecodeWorkspace(MaxPlanItems(in), in.batch, MaxPlanSlots(in), heads, dim).total;
}

KernelStatus PlanSplitsInWorkspace(const char* who, SplitPlanInput* in, int heads, int dim,
                                   size_t workspace_bytes, SplitPlan* plan,
                                   DecodeWorkspaceLayout* layout) {
  if (DecodeWorkspaceBytes(*in, heads, dim) > workspace_bytes) {
    int lo = 0, hi = in->max_slots;  // the largest max_slots that fits
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      in->max_slots = mid;
      if (DecodeWorkspaceBytes(*in, heads, dim) <= workspace_bytes) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    in->max_slots = lo;
    const size_t unsplit = DecodeWorkspaceBytes(*in, heads, dim);
    if (unsplit > workspace_bytes && in->forced_chunk == 0) {
      return KernelStatus::Refused(
          std::string(who) + ": a workspace of " + std::to_string(workspace_bytes) +
          " bytes cannot hold even the unsplit plan (" + std::to_string(unsplit) + " bytes)");
    }
  }
  if (KernelStatus st = PlanSplits(*in, plan); !st.ok()) return st;
  *layout =
      LayoutDecodeWorkspace(static_cast<int64_t>(plan->items.size()),
                            static_cast<int64_t>(plan->merges.size()), plan->slots, heads, dim);
  if (layout->total > workspace_bytes) {
    return KernelStatus::Refused(std::string(who) + ": the plan needs " +
                                 std::to_string(layout->total) + " bytes of workspace, given " +
                                 std::to_string(workspace_bytes));
  }
  return KernelStatus::Ok();
}

std::string DescribePlan(const SplitPlan& plan) {
  const char* taken = plan.spans ? ", spans" : plan.one_item ? ", one per block" : ", counter";
  char buf[200];
  std::snprintf(buf, sizeof(buf), "chunk %d, %d split seqs (<= %d splits), %zu items%s%s",
                plan.chunk, static_cast<int>(plan.merges.size()), plan.max_splits,
                plan.items.size(), taken, plan.merges.empty() ? "" : ", merge");
  return buf;
}

}  // namespace kvpool::kernels
