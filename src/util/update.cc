#include "tidemark/update.h"

#include <algorithm>

namespace tidemark {

void consolidate(std::vector<Update>& updates) {
  std::sort(updates.begin(), updates.end(), [](const Update& a, const Update& b) {
    return compare_key_value_time(a.key, a.value, a.time, b.key, b.value, b.time) < 0;
  });
  std::size_t out = 0;
  for (std::size_t i = 0; i < updates.size();) {
    std::size_t j = i + 1;
    DiffSum sum = updates[i].diff;
    while (j < updates.size() && updates[j].time == updates[i].time &&
           updates[j].key == updates[i].key && updates[j].value == updates[i].value) {
      sum += updates[j].diff;
      ++j;
    }
    // A carry is at most j - i updates (each input's |diff| is at most
    // 2^63, each carried update's 2^63 - 1 or more but the last), so it is
    // written over the inputs it sums and never past them. updates[i] is
    // moved only into the last and only while it is not an output itself.
    while (sum != 0) {
      const Diff diff = take_carried_diff(sum);
      if (out < i && sum == 0) {
        updates[out] = std::move(updates[i]);
      } else if (out != i) {
        updates[out] = updates[i];
      }
      updates[out].diff = diff;
      ++out;
    }
    i = j;
  }
  updates.resize(out);
}

}  // namespace tidemark
