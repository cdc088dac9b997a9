// Internal to src/ref (packed_pages.h).
#include "packed_pages.h"

#include <limits>

#include "ratekv/common/error.h"

namespace ratekv::ref::detail {

size_t pool_pages(size_t bytes, size_t page_bytes, const char* what, const char* field) {
  if (page_bytes == 0) return std::numeric_limits<size_t>::max();  // nothing stored: any page id reads nothing
  check(bytes % page_bytes == 0, "{}: {} has {} bytes, not a whole number of {}-byte pages", what, field, bytes,
        page_bytes);
  return bytes / page_bytes;
}

}  // namespace ratekv::ref::detail
