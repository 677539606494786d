// test_util.h — small helpers shared by the test files.
#pragma once
#include <functional>
#include <string>

#include "tensor/error.h"

namespace sl {

// The message of the sl::Error that fn throws, or "(no error)": lets a test assert what an error says.
inline std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace sl
