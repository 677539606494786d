#include "tensor/error.h"

namespace sl::detail {

void throw_internal(const char* condition, const char* file, int line) {
  throw InternalError(concat("internal error: ", condition, " failed at ", file, ":", line,
                             " (this is a bug in shardlab, please report it)"));
}

}  // namespace sl::detail
