// error.h — how shardlab reports problems.
//
//   SL_CHECK(cond, parts...)  a *user* error (bad shape, bad dim, bad index): throws sl::Error whose
//                             message is the parts streamed together, e.g.
//                             SL_CHECK(k == k2, "matmul: shapes cannot be multiplied (", a.shape(), " and ", b.shape(),
//                             ")")
//   SL_ASSERT(cond)           a broken *internal* invariant (a bug in shardlab, not in your input):
//                             throws sl::InternalError with file and line.
//
// Both throw instead of aborting, so one bad input never takes down the process (or, later, a rank).
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace sl {

// A user error: the message names the op, the shapes and the values involved.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A bug inside shardlab: an invariant that should hold whatever the input.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& message) : std::logic_error(message) {}
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
[[noreturn]] void throw_internal(const char* condition, const char* file, int line);
}  // namespace detail

}  // namespace sl

#define SL_CHECK(cond, ...)                                            \
  do {                                                                 \
    if (!(cond)) throw ::sl::Error(::sl::detail::concat(__VA_ARGS__)); \
  } while (0)

#define SL_ASSERT(cond)                                                   \
  do {                                                                    \
    if (!(cond)) ::sl::detail::throw_internal(#cond, __FILE__, __LINE__); \
  } while (0)
