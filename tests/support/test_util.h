// tests/support/test_util.h — small helpers shared by the test files.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "autograd/gradcheck.h"
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

// Runs gradcheck and expects it to pass having compared exactly expected_count input elements: the
// count, worked out by the caller from the shapes, catches a check that silently skipped an input
// (one that lost requires_grad, or a gradcheck that stopped early). Every gradcheck in tests/ goes
// through here, except the ones that test gradcheck itself by expecting it to fail.
inline void expect_gradcheck(const TensorFn& fn, const TensorList& inputs, int64_t expected_count,
                             const GradcheckOptions& options = {}) {
  GradcheckResult result = gradcheck(fn, inputs, options);
  EXPECT_TRUE(result.ok) << result.message;
  EXPECT_EQ(result.checked, expected_count) << "gradcheck compared " << result.checked << " elements";
}

}  // namespace sl
