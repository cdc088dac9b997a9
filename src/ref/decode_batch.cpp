// ref::check_batch (include/ratekv/ref/decode_batch.h).
#include "ratekv/ref/decode_batch.h"

#include "ratekv/common/error.h"
#include "ratekv/format/packed_format.h"

namespace ratekv::ref {

void check_batch(const DecodeBatch& batch, size_t n_pages, int n_new, const char* what) {
  const int nb = batch.batch();
  check(nb >= 1, "{}: seq_lens is empty (batch must be at least 1)", what);
  check(batch.max_pages >= 1, "{}: max_pages {} must be at least 1", what, batch.max_pages);
  check(batch.page_table.size() == static_cast<size_t>(nb) * batch.max_pages,
        "{}: page_table has {} entries, expected batch {} x max_pages {}", what, batch.page_table.size(), nb,
        batch.max_pages);
  check(n_new >= 0, "{}: {} new tokens", what, n_new);
  check(batch.window >= 0, "{}: window {} must be >= 0 (0 = no sliding window)", what, batch.window);
  for (int b = 0; b < nb; ++b) {
    const int64_t len = batch.seq_lens[b];
    check(len >= (n_new == 0 ? 1 : 0), "{}: seq_lens[{}] = {} (attention needs at least 1 cached token)", what,
          b, len);
    const int64_t lo = n_new == 0 ? 0 : len, hi = len + n_new;
    check(hi <= int64_t{batch.max_pages} * packed::kPageTokens,
          "{}: sequence {} needs tokens up to {} but max_pages {} holds {}", what, b, hi, batch.max_pages,
          int64_t{batch.max_pages} * packed::kPageTokens);
    for (int64_t i = lo / packed::kPageTokens; i * packed::kPageTokens < hi; ++i) {
      const int32_t p = batch.page(b, i);
      check(p >= 0 && static_cast<size_t>(p) < n_pages,
            "{}: page_table[{}, {}] = {} is outside the pool's {} pages", what, b, i, p, n_pages);
    }
  }
}

}  // namespace ratekv::ref
