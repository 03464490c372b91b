#include "tidemark/update.h"

#include <algorithm>

namespace tidemark {

Result<Diff> checked_add_diff(Diff a, Diff b, std::string_view what) {
  Diff sum;
  if (__builtin_add_overflow(a, b, &sum)) {
    return invalid_usage("diff overflow while consolidating " + std::string(what) + ": " +
                         std::to_string(a) + " + " + std::to_string(b) + " does not fit in i64");
  }
  return sum;
}

Status consolidate(std::vector<Update>& updates) {
  std::sort(updates.begin(), updates.end(), [](const Update& a, const Update& b) {
    return compare_key_value_time(a.key, a.value, a.time, b.key, b.value, b.time) < 0;
  });
  std::size_t out = 0;
  for (std::size_t i = 0; i < updates.size();) {
    std::size_t j = i + 1;
    Diff sum = updates[i].diff;
    while (j < updates.size() && updates[j].time == updates[i].time &&
           updates[j].key == updates[i].key && updates[j].value == updates[i].value) {
      TM_ASSIGN(sum, checked_add_diff(sum, updates[j].diff, "key " + updates[i].key));
      ++j;
    }
    if (sum != 0) {
      if (out != i) updates[out] = std::move(updates[i]);
      updates[out].diff = sum;
      ++out;
    }
    i = j;
  }
  updates.resize(out);
  return {};
}

}  // namespace tidemark
