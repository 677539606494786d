// test_util.h — small helpers shared by the test files.
#pragma once
#include <gtest/gtest.h>

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

// Expects fn to throw an sl::Error whose message contains expected_substring.
template <typename F>
void expect_error(F&& fn, const std::string& expected_substring) {
  try {
    fn();
    ADD_FAILURE() << "expected an sl::Error containing: " << expected_substring;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected_substring), std::string::npos) << "message: " << e.what();
  }
}

}  // namespace sl
