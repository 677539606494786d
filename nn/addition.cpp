// addition.cpp — the addition task: the held-out split, the line format, training streams and
// exact-match evaluation (see addition.h).
#include "nn/addition.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "tensor/philox.h"

namespace sl::nn {

namespace {

// ---- portable randomness ------------------------------------------------------------------------
// Everything random here is Philox number `counter` of the stream `key`: a pure function, the same
// on every compiler and platform, and free to compute in any order.

uint64_t random_bits(uint64_t key, uint64_t counter) {
  std::array<uint32_t, 4> words = philox4x32(counter, key);
  return (static_cast<uint64_t>(words[1]) << 32) | words[0];
}

// Uniform in [0, bound) by Lemire's multiply-shift (bias below bound / 2^64).
uint64_t random_below(uint64_t key, uint64_t counter, uint64_t bound) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(random_bits(key, counter)) * bound) >> 64);
}

// Independent keys for independent uses of one seed (splitmix64's finaliser).
uint64_t derive_key(uint64_t seed, uint64_t purpose) {
  uint64_t z = seed + purpose * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
enum KeyPurpose : uint64_t { kSplitShuffle = 1, kHoldoutHash = 2, kHeldoutSample = 3, kTrainOrder = 4 };

// Digits 4: is pair number `index` held out? A hash below holdout_fraction, 53 bits of resolution.
bool hash_heldout(const AdditionConfig& config, int64_t index) {
  uint64_t bits = random_bits(derive_key(config.seed, kHoldoutHash), static_cast<uint64_t>(index));
  return static_cast<double>(bits >> 11) * 0x1p-53 < config.holdout_fraction;
}

std::string zero_padded(int64_t value, int width) {
  std::string text = std::to_string(value);
  if (static_cast<int>(text.size()) < width) text.insert(0, static_cast<size_t>(width) - text.size(), '0');
  return text;
}

}  // namespace

// ---- AdditionTask -------------------------------------------------------------------------------

AdditionTask::AdditionTask(const AdditionConfig& config) : config_(config) {
  SL_CHECK(config.digits >= 1 && config.digits <= 4, "AdditionTask: digits must be 1..4, got ", config.digits);
  SL_CHECK(config.holdout_fraction >= 0 && config.holdout_fraction <= 0.99,  // also rejects NaN
           "AdditionTask: holdout_fraction must be in [0, 0.99], got ", config.holdout_fraction);
  operand_limit_ = 1;
  for (int d = 0; d < config.digits; ++d) operand_limit_ *= 10;
  const int64_t count = operand_limit_ * operand_limit_;

  if (hashed()) {
    // A sample of held-out pairs: random pairs, keeping the held-out ones, once each. The candidate
    // cap bounds the time when holdout_fraction is tiny (then fewer than kHeldoutSample are found).
    const uint64_t key = derive_key(config.seed, kHeldoutSample);
    std::unordered_set<int64_t> seen;
    for (uint64_t c = 0;
         c < 100 * static_cast<uint64_t>(kHeldoutSample) && static_cast<int64_t>(heldout_.size()) < kHeldoutSample;
         ++c) {
      auto index = static_cast<int64_t>(random_below(key, c, static_cast<uint64_t>(count)));
      if (hash_heldout(config_, index) && seen.insert(index).second)
        heldout_.emplace_back(static_cast<int>(index / operand_limit_), static_cast<int>(index % operand_limit_));
    }
    return;
  }

  // Fisher–Yates over all pair indices; the first round(fraction * count) are held out.
  std::vector<int32_t> order(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  const uint64_t key = derive_key(config.seed, kSplitShuffle);
  for (int64_t i = 0; i + 1 < count; ++i)
    std::swap(order[static_cast<size_t>(i)],
              order[static_cast<size_t>(i + static_cast<int64_t>(random_below(key, i, count - i)))]);
  const auto num_heldout = static_cast<int64_t>(std::llround(config.holdout_fraction * static_cast<double>(count)));
  SL_ASSERT(num_heldout < count);  // holdout_fraction <= 0.99 and count >= 100 leave a training pair
  heldout_flag_.assign(static_cast<size_t>(count), 0);
  for (int64_t i = 0; i < count; ++i) {
    const int32_t index = order[static_cast<size_t>(i)];
    std::pair<int, int> pair{static_cast<int>(index / operand_limit_), static_cast<int>(index % operand_limit_)};
    if (i < num_heldout) {
      heldout_.push_back(pair);
      heldout_flag_[static_cast<size_t>(index)] = 1;
    } else {
      train_.push_back(pair);
    }
  }
}

void AdditionTask::check_operands(int a, int b, const char* where) const {
  SL_CHECK(a >= 0 && a < operand_limit_ && b >= 0 && b < operand_limit_, where, ": operands ", a, " and ", b,
           " must be in [0, ", operand_limit_, ") for digits = ", config_.digits);
}

bool AdditionTask::is_heldout(int a, int b) const {
  check_operands(a, b, "AdditionTask::is_heldout");
  if (hashed()) return hash_heldout(config_, pair_index(a, b));
  return heldout_flag_[static_cast<size_t>(pair_index(a, b))] != 0;
}

int64_t AdditionTask::num_train_pairs() const {
  if (hashed())
    return std::llround((1.0 - config_.holdout_fraction) * static_cast<double>(operand_limit_ * operand_limit_));
  return static_cast<int64_t>(train_.size());
}

std::string AdditionTask::prompt(int a, int b) const {
  check_operands(a, b, "AdditionTask::prompt");
  const int width = config_.pad ? config_.digits : 0;
  return zero_padded(a, width) + "+" + zero_padded(b, width) + "=";
}

std::string AdditionTask::answer(int a, int b) const {
  check_operands(a, b, "AdditionTask::answer");
  std::string sum = zero_padded(static_cast<int64_t>(a) + b, config_.pad ? config_.digits + 1 : 0);
  if (config_.reverse_answer) std::reverse(sum.begin(), sum.end());
  return sum + "\n";
}

std::string AdditionTask::line(int a, int b) const { return prompt(a, b) + answer(a, b); }

int64_t AdditionTask::parse_answer(const std::string& generated) const {
  const size_t end = generated.find('\n');
  if (end == std::string::npos || end == 0 || end > static_cast<size_t>(config_.digits) + 1) return -1;
  if (config_.pad && end != static_cast<size_t>(config_.digits) + 1) return -1;
  std::string number = generated.substr(0, end);
  if (config_.reverse_answer) std::reverse(number.begin(), number.end());
  int64_t value = 0;
  for (char c : number) {
    if (c < '0' || c > '9') return -1;
    value = value * 10 + (c - '0');
  }
  return value;
}

TokenStream AdditionTask::train_stream(int64_t num_lines, uint64_t seed) const {
  SL_CHECK(num_lines >= 1, "AdditionTask::train_stream: num_lines must be >= 1, got ", num_lines);
  TokenStream stream;
  stream.vocab_size = 256;
  const auto max_line = static_cast<size_t>(3 * config_.digits + 4);  // "99+99=891\n"
  stream.tokens.reserve(static_cast<size_t>(num_lines) * max_line);
  stream.loss_mask.reserve(static_cast<size_t>(num_lines) * max_line);
  auto append = [&](int a, int b) {
    const std::string question = prompt(a, b), reply = answer(a, b);
    for (char c : question + reply) stream.tokens.push_back(static_cast<unsigned char>(c));
    stream.loss_mask.insert(stream.loss_mask.end(), question.size(), 0);
    stream.loss_mask.insert(stream.loss_mask.end(), reply.size(), 1);
  };

  const uint64_t key = derive_key(seed, kTrainOrder);
  if (hashed()) {
    // Sample pairs by `seed`, skipping held-out ones (about 1 / (1 - holdout_fraction) draws a line).
    const auto count = static_cast<uint64_t>(operand_limit_ * operand_limit_);
    uint64_t counter = 0;
    for (int64_t l = 0; l < num_lines; ++l) {
      int64_t index;
      do index = static_cast<int64_t>(random_below(key, counter++, count));
      while (hash_heldout(config_, index));
      append(static_cast<int>(index / operand_limit_), static_cast<int>(index % operand_limit_));
    }
    return stream;
  }
  // Shuffle the training pairs by `seed`, then cycle. Forward Fisher–Yates: entry i is final after
  // step i, so only the first min(num_lines, n) steps are needed.
  std::vector<std::pair<int, int>> order = train_;
  const auto n = static_cast<int64_t>(order.size());
  for (int64_t i = 0; i + 1 < n && i < num_lines; ++i)
    std::swap(order[static_cast<size_t>(i)],
              order[static_cast<size_t>(i + static_cast<int64_t>(random_below(key, i, n - i)))]);
  for (int64_t l = 0; l < num_lines; ++l) append(order[l % n].first, order[l % n].second);
  return stream;
}

double AdditionTask::evaluate(const GenerateBatch& generate_batch, int64_t max_examples, int64_t batch_size) const {
  SL_CHECK(static_cast<bool>(generate_batch), "AdditionTask::evaluate: generate_batch is empty");
  SL_CHECK(max_examples >= 1 && batch_size >= 1, "AdditionTask::evaluate: max_examples (", max_examples,
           ") and batch_size (", batch_size, ") must be >= 1");
  SL_CHECK(!heldout_.empty(), "AdditionTask::evaluate: there are no held-out pairs (holdout_fraction ",
           config_.holdout_fraction, ")");
  std::vector<std::pair<int, int>> examples(
      heldout_.begin(), heldout_.begin() + std::min<int64_t>(max_examples, static_cast<int64_t>(heldout_.size())));
  const auto num_examples = static_cast<int64_t>(examples.size());
  // Without padding prompts differ in length: group equal lengths so each call batches cleanly.
  if (!config_.pad)
    std::stable_sort(examples.begin(), examples.end(), [&](const auto& x, const auto& y) {
      return prompt(x.first, x.second).size() < prompt(y.first, y.second).size();
    });

  const int max_new_tokens = config_.digits + 2;  // the longest answer, digits + 1, and its '\n'
  int64_t correct = 0;
  for (int64_t start = 0; start < num_examples;) {
    const size_t length = prompt(examples[start].first, examples[start].second).size();
    std::vector<std::vector<int64_t>> prompts;
    int64_t end = start;
    for (; end < num_examples && end - start < batch_size; ++end) {
      const std::string text = prompt(examples[end].first, examples[end].second);
      if (text.size() != length) break;
      prompts.emplace_back(text.begin(), text.end());
    }
    const std::vector<int64_t> generated = generate_batch(prompts, max_new_tokens);
    SL_CHECK(generated.size() == prompts.size() * static_cast<size_t>(max_new_tokens),
             "AdditionTask::evaluate: generate_batch returned ", generated.size(), " tokens for ", prompts.size(),
             " prompts x max_new_tokens ", max_new_tokens, " (expected ", prompts.size() * max_new_tokens, ")");
    for (int64_t i = start; i < end; ++i) {
      std::string text;
      for (int k = 0; k < max_new_tokens; ++k) {
        const int64_t token = generated[static_cast<size_t>((i - start) * max_new_tokens + k)];
        text.push_back(token >= 0 && token < 256 ? static_cast<char>(token) : '?');  // not a byte: malformed
      }
      correct += parse_answer(text) == static_cast<int64_t>(examples[i].first) + examples[i].second;
    }
    start = end;
  }
  return static_cast<double>(correct) / static_cast<double>(num_examples);
}

}  // namespace sl::nn
