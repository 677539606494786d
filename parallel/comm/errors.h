// errors.h — how a distributed run fails, loudly and in bounded time.
//
//   RemoteError          another rank failed (threw, or timed out) while this one waited on it. Names
//                        the failed rank, what it threw, and the op and sequence number this rank was in.
//   TimeoutError         this rank waited longer than the group's timeout for its peers (one of them
//                        never arrived): names the op, its sequence number, the timeout and the time waited.
//   CollectiveMismatch   debug mode only: the ranks called different collectives at the same point
//                        (op, shape, dtype, root or sequence differ); names both fingerprints.
//
// All three are sl::Error, so code that catches user errors catches them too.
#pragma once
#include <exception>
#include <string>

#include "tensor/error.h"

namespace sl {

class RemoteError : public Error {
 public:
  RemoteError(const std::string& message, int failed_rank) : Error(message), failed_rank_(failed_rank) {}
  int failed_rank() const { return failed_rank_; }

 private:
  int failed_rank_;
};

class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& message) : Error(message) {}
};

class CollectiveMismatch : public Error {
 public:
  explicit CollectiveMismatch(const std::string& message) : Error(message) {}
};

// What an exception says: e.what(), or a placeholder for one that is not a std::exception (the
// message a world abort passes to the other ranks).
std::string describe_exception(const std::exception_ptr& error);

}  // namespace sl
