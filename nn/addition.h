// addition.h — the addition task: "a+b=c" lines to train on, and held-out pairs to measure on.
//
// AdditionTask writes lines "a+b=c\n" for a, b < 10^digits, holds some pairs out of training, and
// measures exact-match accuracy on them: a task where "the model learned" is a number, not a feeling.
//
//   pad:            operands zero-padded to `digits`, the answer to digits+1:   "07+85=092\n".
//                   Every prompt then has the same length (batches without padding tokens) and
//                   digit k always sits at the same position, which makes the task easier to learn.
//   reverse_answer: the answer is written least-significant digit first:       "07+85=290\n".
//                   A left-to-right model must emit the first answer digit first; in the usual
//                   order that digit depends on every carry, reversed it depends on the units only,
//                   and each later digit on one more column plus the carry it has already written.
//
// The train / held-out split is a pure function of config.seed, portable across compilers (Philox,
// never std::shuffle or std:: distributions, whose output is implementation-defined):
//   digits 1..3: all 10^(2*digits) pairs are shuffled; the first round(holdout_fraction * count)
//                are held out, the rest are training pairs.
//   digits 4:    10^8 pairs are too many to list: a pair is held out when a hash of (seed, pair)
//                falls below holdout_fraction; training lines are sampled pairs that are not held
//                out, and heldout() lists a sample of at most kHeldoutSample held-out pairs.
// Either way no held-out pair ever appears in a training stream.
//
//   Tests: tests/nn/test_data.cpp
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "nn/data.h"

namespace sl::nn {

struct AdditionConfig {
  int digits = 2;                 // operands in [0, 10^digits); 1..4
  uint64_t seed = 1337;           // decides the train / held-out split
  double holdout_fraction = 0.1;  // in [0, 0.99]
  bool reverse_answer = true;
  bool pad = true;
};

class AdditionTask {
 public:
  // Digit-4 tasks list at most this many held-out pairs (they hold ~holdout_fraction * 10^8).
  static constexpr int64_t kHeldoutSample = 10000;

  explicit AdditionTask(const AdditionConfig& config = {});
  const AdditionConfig& config() const { return config_; }

  // num_lines training lines concatenated (vocab 256). The order is a function of `seed` alone:
  // digits 1..3 cycle through the training pairs shuffled by `seed`; digits 4 samples by `seed`.
  // loss_mask is 1 exactly on the answer characters and the final '\n': the model is trained to
  // produce the answer, never to predict the operands it is given.
  TokenStream train_stream(int64_t num_lines, uint64_t seed) const;

  std::string line(int a, int b) const;    // "07+85=290\n"
  std::string prompt(int a, int b) const;  // "07+85="
  std::string answer(int a, int b) const;  // "290\n": what the model should generate after the prompt
  // The number in generated text: reads up to the first '\n' and undoes reversal and padding.
  // -1 when malformed: no '\n', no digits, a non-digit, or (with pad) not digits+1 digits.
  int64_t parse_answer(const std::string& generated) const;

  bool is_heldout(int a, int b) const;
  const std::vector<std::pair<int, int>>& heldout() const { return heldout_; }
  int64_t num_train_pairs() const;  // digits 4: the expected count, (1 - holdout_fraction) * 10^8

  // A model-independent decoder: given prompts (token ids, all of equal length) and a number of
  // tokens to generate, returns the generated tokens flattened [num_prompts * max_new_tokens].
  using GenerateBatch =
      std::function<std::vector<int64_t>(const std::vector<std::vector<int64_t>>& prompts, int max_new_tokens)>;

  // Exact-match accuracy in [0, 1] on the first min(max_examples, heldout().size()) held-out pairs.
  // Each call of generate_batch gets at most batch_size prompts of equal length (always, with pad;
  // without pad, prompts are grouped by length) and max_new_tokens = digits + 2 (answer and '\n').
  double evaluate(const GenerateBatch& generate_batch, int64_t max_examples, int64_t batch_size = 64) const;

 private:
  bool hashed() const { return config_.digits >= 4; }
  int64_t pair_index(int a, int b) const { return static_cast<int64_t>(a) * operand_limit_ + b; }
  void check_operands(int a, int b, const char* where) const;

  AdditionConfig config_;
  int64_t operand_limit_ = 0;                 // 10^digits
  std::vector<std::pair<int, int>> train_;    // digits 1..3: the training pairs, shuffled
  std::vector<std::pair<int, int>> heldout_;  // digits 1..3: all held-out pairs; 4: a sample
  std::vector<uint8_t> heldout_flag_;         // digits 1..3: [10^(2*digits)], 1 = held out
};

}  // namespace sl::nn
