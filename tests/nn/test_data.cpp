// Training data (nn/data.h): the batching rule element by element, rank slices, token files, every
// error, and the addition task: line format, the held-out split, the loss mask, determinism, evaluate.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "nn/addition.h"
#include "nn/data.h"
#include "tensor/ops.h"

namespace sl::nn {
namespace {

using ::testing::HasSubstr;

// The message of the sl::Error that `body` throws ("" if it throws none).
template <typename Body>
std::string error_of(Body body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A file under /tmp with a name no other test process shares; removed at scope exit.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& bytes, const std::string& suffix) {
    static int counter = 0;
    path = "/tmp/shardlab_test_data_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + suffix;
    std::ofstream(path, std::ios::binary) << bytes;
  }
  ~TempFile() { std::remove(path.c_str()); }
};

// uint16 tokens as nanoGPT writes them: little-endian, no header.
std::string bin_bytes(const std::vector<int>& tokens) {
  std::string bytes;
  for (int token : tokens) bytes += {static_cast<char>(token & 0xFF), static_cast<char>(token >> 8)};
  return bytes;
}

TokenStream numbered_stream(int64_t N) {  // token i = 3*i + 1, so every position is recognisable
  TokenStream stream;
  stream.vocab_size = 1000;
  for (int64_t i = 0; i < N; ++i) stream.tokens.push_back(static_cast<int32_t>(3 * i + 1));
  return stream;
}

// ---- TokenStream --------------------------------------------------------------------------------

TEST(TokenStream, BatchWorkedByHand) {
  // N = 10, T = 3, B = 2, step 2: rows 4 and 5 overall; p = 12 mod 7 = 5 and 15 mod 7 = 1.
  TokenStream stream = numbered_stream(10);
  Batch batch = stream.get_batch(2, 2, 3);
  EXPECT_EQ(batch.inputs.dtype(), DType::i64);
  EXPECT_EQ(batch.inputs.shape(), (Shape{2, 3}));
  EXPECT_EQ(batch.targets.shape(), (Shape{2, 3}));
  EXPECT_EQ(batch.inputs.values<int64_t>(), (std::vector<int64_t>{16, 19, 22, 4, 7, 10}));
  EXPECT_EQ(batch.targets.values<int64_t>(), (std::vector<int64_t>{19, 22, 25, 7, 10, 13}));
}

TEST(TokenStream, BatchFollowsTheRuleForManySteps) {
  const int64_t N = 23, B = 3, T = 4;  // N - T = 19: rows wrap from step 2 on
  TokenStream stream = numbered_stream(N);
  for (int64_t step = 0; step < 12; ++step) {
    Batch batch = stream.get_batch(step, B, T);
    auto inputs = batch.inputs.values<int64_t>(), targets = batch.targets.values<int64_t>();
    for (int64_t r = 0; r < B; ++r) {
      int64_t p = ((step * B + r) * T) % (N - T);
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(inputs[r * T + t], stream.tokens[p + t]) << "step " << step << " row " << r << " t " << t;
        EXPECT_EQ(targets[r * T + t], stream.tokens[p + t + 1]) << "step " << step << " row " << r << " t " << t;
      }
    }
  }
}

TEST(TokenStream, HugeStepsDoNotOverflow) {
  const int64_t N = 1001, B = 16, T = 8, step = int64_t{1} << 60;  // (s*B + r)*T is about 2^67
  TokenStream stream = numbered_stream(N);
  auto inputs = stream.get_batch(step, B, T).inputs.values<int64_t>();
  for (int64_t r = 0; r < B; ++r) {
    auto p = static_cast<int64_t>(((static_cast<__int128>(step) * B + r) * T) % (N - T));
    EXPECT_EQ(inputs[r * T], stream.tokens[p]) << "row " << r;
  }
}

TEST(TokenStream, RankSliceEqualsTheSameRowsOfTheFullBatch) {
  TokenStream stream = numbered_stream(97);
  const int64_t B = 8, T = 5;
  for (int64_t step : {0, 1, 7}) {
    auto full_inputs = stream.get_batch(step, B, T).inputs.values<int64_t>();
    auto full_targets = stream.get_batch(step, B, T).targets.values<int64_t>();
    struct Slice {
      int64_t begin, end;
    };
    for (Slice slice : {Slice{0, 2}, Slice{2, 4}, Slice{6, 8}, Slice{3, 8}, Slice{7, 8}, Slice{0, 8}}) {
      Batch part = stream.get_batch(step, B, T, slice.begin, slice.end);
      ASSERT_EQ(part.inputs.shape(), (Shape{slice.end - slice.begin, T}));
      auto inputs = part.inputs.values<int64_t>(), targets = part.targets.values<int64_t>();
      for (int64_t i = 0; i < (slice.end - slice.begin) * T; ++i) {
        EXPECT_EQ(inputs[i], full_inputs[slice.begin * T + i]) << "rows " << slice.begin << ".." << slice.end;
        EXPECT_EQ(targets[i], full_targets[slice.begin * T + i]) << "rows " << slice.begin << ".." << slice.end;
      }
    }
  }
}

TEST(TokenStream, LossMaskTurnsTargetsIntoTheIgnoreIndex) {
  TokenStream stream = numbered_stream(6);  // tokens 1 4 7 10 13 16
  stream.loss_mask = {1, 1, 0, 1, 0, 1};
  Batch batch = stream.get_batch(0, 1, 5);
  EXPECT_EQ(batch.inputs.values<int64_t>(), (std::vector<int64_t>{1, 4, 7, 10, 13}));  // inputs never masked
  EXPECT_EQ(batch.targets.values<int64_t>(), (std::vector<int64_t>{4, -100, 10, -100, 16}));
  EXPECT_EQ(kDefaultIgnoreIndex, -100);
}

TEST(TokenStream, TextFileIsItsBytes) {
  const std::string text = "hi\n\xC3\xA9!";  // a UTF-8 é: bytes 195 169, tokens must not go negative
  TempFile file(text, ".txt");
  TokenStream stream = TokenStream::from_text_file(file.path);
  EXPECT_EQ(stream.vocab_size, 256);
  EXPECT_EQ(stream.tokens, (std::vector<int32_t>{'h', 'i', '\n', 195, 169, '!'}));
  EXPECT_TRUE(stream.loss_mask.empty());
}

TEST(TokenStream, BinFileIsLittleEndianUint16) {
  TempFile file(bin_bytes({0, 1, 255, 256, 50256, 65535}), ".bin");
  TokenStream stream = TokenStream::from_bin_file(file.path, 65536);
  EXPECT_EQ(stream.vocab_size, 65536);
  EXPECT_EQ(stream.tokens, (std::vector<int32_t>{0, 1, 255, 256, 50256, 65535}));
}

TEST(TokenStream, BinFileLargerThanOneChunk) {
  std::vector<int> tokens(700000);  // 1.4 MB: crosses the 1 MiB read buffer
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>((i * 7919) % 50257);
  TempFile file(bin_bytes(tokens), ".bin");
  TokenStream stream = TokenStream::from_bin_file(file.path, 50257);
  ASSERT_EQ(stream.size(), 700000);
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(stream.tokens[i], tokens[i]) << "position " << i;
}

TEST(TokenStream, FileErrors) {
  const std::string missing = "/tmp/shardlab_test_data_no_such_file_" + std::to_string(getpid());
  EXPECT_THAT(error_of([&] { TokenStream::from_text_file(missing); }), HasSubstr(missing));
  EXPECT_THAT(error_of([&] { TokenStream::from_bin_file(missing, 50257); }), HasSubstr(missing));
  EXPECT_THAT(error_of([&] { TokenStream::from_text_file("/tmp"); }), HasSubstr("not a regular file"));

  TempFile odd(bin_bytes({1, 2}) + "x", ".bin");
  std::string message = error_of([&] { TokenStream::from_bin_file(odd.path, 50257); });
  EXPECT_THAT(message, HasSubstr(odd.path));
  EXPECT_THAT(message, HasSubstr("odd number of bytes (5)"));

  TempFile big_token(bin_bytes({5, 9, 300, 2}), ".bin");
  message = error_of([&] { TokenStream::from_bin_file(big_token.path, 256); });
  EXPECT_THAT(message, HasSubstr("token 300 at position 2"));
  EXPECT_THAT(message, HasSubstr("vocab_size 256"));
  EXPECT_THAT(message, HasSubstr(big_token.path));

  TempFile one_token(bin_bytes({7}), ".bin");
  EXPECT_THAT(error_of([&] { TokenStream::from_bin_file(one_token.path, 256); }), HasSubstr("holds 1 tokens"));
  TempFile empty("", ".bin");
  EXPECT_THAT(error_of([&] { TokenStream::from_bin_file(empty.path, 256); }), HasSubstr("holds 0 tokens"));
  EXPECT_THAT(error_of([&] { TokenStream::from_text_file(empty.path); }), HasSubstr("holds 0 tokens"));
  EXPECT_THAT(error_of([&] { TokenStream::from_bin_file(empty.path, 0); }), HasSubstr("vocab_size 0"));
  EXPECT_THAT(error_of([&] { TokenStream::from_bin_file(empty.path, 70000); }), HasSubstr("vocab_size 70000"));
}

TEST(TokenStream, BatchErrors) {
  TokenStream stream = numbered_stream(8);
  EXPECT_THAT(error_of([&] { stream.get_batch(0, 2, 8); }), HasSubstr("N = 8 tokens, fewer than T + 1 = 9"));
  EXPECT_EQ(error_of([&] { stream.get_batch(0, 2, 7); }), "");  // N = T + 1: the one block there is
  EXPECT_THAT(error_of([&] { stream.get_batch(0, 4, 3, 2, 5); }), HasSubstr("rows [2, 5)"));
  EXPECT_THAT(error_of([&] { stream.get_batch(0, 4, 3, -1, 2); }), HasSubstr("rows [-1, 2)"));
  EXPECT_THAT(error_of([&] { stream.get_batch(0, 4, 3, 2, 2); }), HasSubstr("rows [2, 2)"));
  EXPECT_THAT(error_of([&] { stream.get_batch(0, 4, 3, 4); }), HasSubstr("rows [4, 4)"));
  EXPECT_THAT(error_of([&] { stream.get_batch(-1, 4, 3); }), HasSubstr("step -1"));
  EXPECT_THAT(error_of([&] { stream.get_batch(0, 0, 3); }), HasSubstr("batch_size 0"));
  EXPECT_THAT(error_of([&] { stream.get_batch(0, 4, 0); }), HasSubstr("block_size 0"));

  TokenStream bad_mask = numbered_stream(8);
  bad_mask.loss_mask = {1, 1, 1};
  EXPECT_THAT(error_of([&] { bad_mask.get_batch(0, 1, 3); }), HasSubstr("loss_mask has 3 entries for 8 tokens"));
  TokenStream bad_token = numbered_stream(8);
  bad_token.tokens[2] = 5000;
  EXPECT_THAT(error_of([&] { bad_token.get_batch(0, 1, 3); }), HasSubstr("token 5000 at position 2"));
}

// ---- AdditionTask -------------------------------------------------------------------------------

AdditionTask make_task(int digits, bool pad, bool reverse_answer, double holdout_fraction = 0.1, uint64_t seed = 1337) {
  AdditionConfig config;
  config.digits = digits;
  config.pad = pad;
  config.reverse_answer = reverse_answer;
  config.holdout_fraction = holdout_fraction;
  config.seed = seed;
  return AdditionTask(config);
}

std::string text_of(const TokenStream& stream) { return {stream.tokens.begin(), stream.tokens.end()}; }

// Splits "a+b=c\n..." into lines and checks each one's format; returns (a, b) of each line.
std::vector<std::pair<int, int>> parse_lines(const AdditionTask& task, const std::string& text) {
  std::vector<std::pair<int, int>> pairs;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    EXPECT_NE(end, std::string::npos) << "the stream must end with a newline";
    if (end == std::string::npos) break;
    std::string line = text.substr(start, end - start + 1);
    size_t plus = line.find('+'), equals = line.find('=');
    int a = std::stoi(line.substr(0, plus)), b = std::stoi(line.substr(plus + 1, equals - plus - 1));
    EXPECT_EQ(line, task.line(a, b));
    EXPECT_EQ(task.parse_answer(line.substr(equals + 1)), a + b) << line;
    pairs.emplace_back(a, b);
    start = end + 1;
  }
  return pairs;
}

// A fake model: reads each prompt, writes task.answer for it (wrong on every second prompt it sees
// when `wrong_every_other`), padded with '\n' to max_new_tokens. Checks the batching contract too.
AdditionTask::GenerateBatch fake_generator(const AdditionTask& task, bool wrong_every_other, int64_t* prompts_seen,
                                           int64_t batch_size) {
  return [&task, wrong_every_other, prompts_seen, batch_size](const std::vector<std::vector<int64_t>>& prompts,
                                                              int max_new_tokens) {
    EXPECT_EQ(max_new_tokens, task.config().digits + 2);
    EXPECT_LE(static_cast<int64_t>(prompts.size()), batch_size);
    std::vector<int64_t> out;
    for (const auto& prompt : prompts) {
      EXPECT_EQ(prompt.size(), prompts[0].size()) << "prompts in one call must have equal length";
      std::string text(prompt.begin(), prompt.end());
      size_t plus = text.find('+');
      int a = std::stoi(text.substr(0, plus)), b = std::stoi(text.substr(plus + 1));
      EXPECT_EQ(text, task.prompt(a, b));
      bool wrong = wrong_every_other && (*prompts_seen)++ % 2 == 1;
      std::string reply = task.answer(a, wrong ? (b == 0 ? 1 : b - 1) : b);  // wrong: another sum
      reply.resize(static_cast<size_t>(max_new_tokens), '\n');
      out.insert(out.end(), reply.begin(), reply.end());
    }
    return out;
  };
}

TEST(AdditionTask, LineFormats) {
  AdditionTask padded_reversed = make_task(2, true, true);
  EXPECT_EQ(padded_reversed.line(7, 85), "07+85=290\n");
  EXPECT_EQ(padded_reversed.prompt(7, 85), "07+85=");
  EXPECT_EQ(padded_reversed.answer(7, 85), "290\n");
  EXPECT_EQ(padded_reversed.line(99, 99), "99+99=891\n");
  EXPECT_EQ(padded_reversed.line(0, 0), "00+00=000\n");
  EXPECT_EQ(make_task(2, true, false).line(7, 85), "07+85=092\n");
  EXPECT_EQ(make_task(2, false, true).line(7, 85), "7+85=29\n");
  EXPECT_EQ(make_task(2, false, false).line(7, 85), "7+85=92\n");
  EXPECT_EQ(make_task(1, false, true).line(5, 5), "5+5=01\n");
  EXPECT_EQ(make_task(1, true, true).line(3, 4), "3+4=70\n");
  EXPECT_EQ(make_task(3, true, false).line(7, 85), "007+085=0092\n");
  EXPECT_EQ(make_task(4, true, true).line(7, 85), "0007+0085=29000\n");
}

TEST(AdditionTask, ParseAnswerUndoesEveryFormat) {
  for (bool pad : {true, false})
    for (bool reverse : {true, false}) {
      AdditionTask task = make_task(2, pad, reverse);
      for (int a = 0; a < 100; ++a)
        for (int b = 0; b < 100; ++b)
          ASSERT_EQ(task.parse_answer(task.answer(a, b) + "junk after the newline"), a + b)
              << "pad " << pad << " reverse " << reverse << " " << task.line(a, b);
    }
  AdditionTask task = make_task(2, true, true);
  for (const char* malformed : {"", "290", "\n", "2x0\n", "29\n", "2900\n", "-90\n", " 290\n"})
    EXPECT_EQ(task.parse_answer(malformed), -1) << "'" << malformed << "'";
  AdditionTask unpadded = make_task(2, false, false);
  EXPECT_EQ(unpadded.parse_answer("9\n"), 9);
  EXPECT_EQ(unpadded.parse_answer("1234\n"), -1);  // longer than any sum of 2-digit numbers
}

TEST(AdditionTask, SplitPartitionsAllPairs) {
  AdditionTask task = make_task(2, true, true, 0.1);
  ASSERT_EQ(task.heldout().size(), 1000u);
  EXPECT_EQ(task.num_train_pairs(), 9000);
  std::set<std::pair<int, int>> heldout(task.heldout().begin(), task.heldout().end());
  EXPECT_EQ(heldout.size(), 1000u) << "no pair is held out twice";
  int flagged = 0;
  for (int a = 0; a < 100; ++a)
    for (int b = 0; b < 100; ++b) {
      flagged += task.is_heldout(a, b);
      EXPECT_EQ(task.is_heldout(a, b), heldout.count({a, b}) == 1) << a << "+" << b;
    }
  EXPECT_EQ(flagged, 1000);
  EXPECT_EQ(make_task(2, true, true, 0.0).heldout().size(), 0u);
  EXPECT_EQ(make_task(1, true, true, 0.99).num_train_pairs(), 1);
}

TEST(AdditionTask, SplitIsDeterministicBySeed) {
  EXPECT_EQ(make_task(2, true, true, 0.1, 7).heldout(), make_task(2, false, false, 0.1, 7).heldout());
  EXPECT_NE(make_task(2, true, true, 0.1, 7).heldout(), make_task(2, true, true, 0.1, 8).heldout());
}

TEST(AdditionTask, HeldoutPairsNeverAppearInTraining) {
  for (int digits : {1, 2, 3}) {
    AdditionTask task = make_task(digits, true, true, 0.2);
    const int64_t lines = digits == 3 ? 50000 : 3 * task.num_train_pairs() + 5;  // cycles for 1 and 2 digits
    auto pairs = parse_lines(task, text_of(task.train_stream(lines, 99)));
    ASSERT_EQ(static_cast<int64_t>(pairs.size()), lines);
    for (auto [a, b] : pairs) ASSERT_FALSE(task.is_heldout(a, b)) << digits << " digits: " << a << "+" << b;
    if (digits == 3) continue;
    // The first num_train_pairs lines are every training pair once; then the cycle repeats.
    const int64_t n = task.num_train_pairs();
    std::set<std::pair<int, int>> first_cycle(pairs.begin(), pairs.begin() + n);
    EXPECT_EQ(static_cast<int64_t>(first_cycle.size()), n);
    for (int64_t i = n; i < lines; ++i) EXPECT_EQ(pairs[i], pairs[i - n]);
  }
}

TEST(AdditionTask, FourDigitsHashTheSplit) {
  AdditionTask task = make_task(4, true, true, 0.1);
  EXPECT_EQ(static_cast<int64_t>(task.heldout().size()), AdditionTask::kHeldoutSample);
  std::set<std::pair<int, int>> sample(task.heldout().begin(), task.heldout().end());
  EXPECT_EQ(sample.size(), task.heldout().size());
  for (auto [a, b] : task.heldout()) ASSERT_TRUE(task.is_heldout(a, b)) << a << "+" << b;
  int flagged = 0;
  for (int i = 0; i < 100000; ++i) flagged += task.is_heldout(i % 10000, (i * 7919) % 10000);
  EXPECT_NEAR(flagged / 100000.0, 0.1, 0.01);
  auto pairs = parse_lines(task, text_of(task.train_stream(20000, 5)));
  ASSERT_EQ(pairs.size(), 20000u);
  for (auto [a, b] : pairs) ASSERT_FALSE(task.is_heldout(a, b)) << a << "+" << b;
  EXPECT_EQ(task.train_stream(300, 5).tokens, make_task(4, true, true, 0.1).train_stream(300, 5).tokens);
  int64_t seen = 0;
  EXPECT_DOUBLE_EQ(task.evaluate(fake_generator(task, false, &seen, 64), 300), 1.0);
}

TEST(AdditionTask, LossMaskCoversExactlyTheAnswerAndNewline) {
  for (bool pad : {true, false}) {
    AdditionTask task = make_task(2, pad, true);
    TokenStream stream = task.train_stream(500, 3);
    ASSERT_EQ(stream.loss_mask.size(), stream.tokens.size());
    bool after_equals = false;  // walk each line: 0 up to and including '=', then 1 through '\n'
    for (size_t i = 0; i < stream.tokens.size(); ++i) {
      EXPECT_EQ(stream.loss_mask[i], after_equals ? 1 : 0) << "position " << i << " pad " << pad;
      if (stream.tokens[i] == '=') after_equals = true;
      if (stream.tokens[i] == '\n') after_equals = false;
    }
    // Through get_batch: a target counts exactly when the token it names is an answer character.
    Batch batch = stream.get_batch(0, 1, stream.size() - 1);
    auto targets = batch.targets.values<int64_t>();
    for (size_t t = 0; t < targets.size(); ++t)
      EXPECT_EQ(targets[t], stream.loss_mask[t + 1] ? stream.tokens[t + 1] : -100) << "position " << t;
  }
}

TEST(AdditionTask, StreamsAreDeterministic) {
  TokenStream first = make_task(2, true, true).train_stream(2000, 11);
  TokenStream again = make_task(2, true, true).train_stream(2000, 11);
  EXPECT_EQ(first.tokens, again.tokens);
  EXPECT_EQ(first.loss_mask, again.loss_mask);
  EXPECT_NE(first.tokens, make_task(2, true, true).train_stream(2000, 12).tokens);
  EXPECT_EQ(first.vocab_size, 256);
  EXPECT_EQ(first.size(), 2000 * 10);
}

TEST(AdditionTask, EvaluateWithFakeGenerators) {
  AdditionTask task = make_task(2, true, true);
  int64_t seen = 0;
  EXPECT_DOUBLE_EQ(task.evaluate(fake_generator(task, false, &seen, 64), 1000), 1.0);
  EXPECT_DOUBLE_EQ(task.evaluate(fake_generator(task, true, &seen, 64), 200), 0.5);
  EXPECT_EQ(seen, 200);
  seen = 0;
  EXPECT_DOUBLE_EQ(task.evaluate(fake_generator(task, true, &seen, 7), 30, 7), 0.5);
  AdditionTask unpadded = make_task(2, false, false);  // prompts of 4, 5 and 6 bytes: grouped by length
  EXPECT_DOUBLE_EQ(unpadded.evaluate(fake_generator(unpadded, false, &seen, 64), 1000), 1.0);
}

TEST(AdditionTask, EvaluateCountsNonBytesAsWrong) {
  AdditionTask task = make_task(1, true, true, 0.5);
  auto garbage = [](const std::vector<std::vector<int64_t>>& prompts, int max_new_tokens) {
    return std::vector<int64_t>(prompts.size() * max_new_tokens, -7);
  };
  EXPECT_DOUBLE_EQ(task.evaluate(garbage, 100), 0.0);
}

TEST(AdditionTask, Errors) {
  EXPECT_THAT(error_of([] { make_task(0, true, true); }), HasSubstr("digits must be 1..4, got 0"));
  EXPECT_THAT(error_of([] { make_task(5, true, true); }), HasSubstr("digits must be 1..4, got 5"));
  EXPECT_THAT(error_of([] { make_task(2, true, true, -0.1); }), HasSubstr("holdout_fraction"));
  EXPECT_THAT(error_of([] { make_task(2, true, true, 1.0); }), HasSubstr("got 1"));
  EXPECT_THAT(error_of([] { make_task(2, true, true, std::nan("")); }), HasSubstr("holdout_fraction"));

  AdditionTask task = make_task(2, true, true);
  EXPECT_THAT(error_of([&] { task.prompt(100, 1); }), HasSubstr("operands 100 and 1 must be in [0, 100)"));
  EXPECT_THAT(error_of([&] { task.is_heldout(1, -1); }), HasSubstr("operands 1 and -1"));
  EXPECT_THAT(error_of([&] { task.train_stream(0, 1); }), HasSubstr("num_lines must be >= 1, got 0"));

  auto short_answers = [](const std::vector<std::vector<int64_t>>& prompts, int) {
    return std::vector<int64_t>(prompts.size(), '0');
  };
  EXPECT_THAT(error_of([&] { task.evaluate(short_answers, 10); }), HasSubstr("returned 10 tokens for 10 prompts"));
  EXPECT_THAT(error_of([&] { task.evaluate(short_answers, 0); }), HasSubstr("max_examples (0)"));
  EXPECT_THAT(error_of([&] { task.evaluate(nullptr, 10); }), HasSubstr("generate_batch is empty"));
  AdditionTask nothing_held_out = make_task(2, true, true, 0.0);
  EXPECT_THAT(error_of([&] { nothing_held_out.evaluate(short_answers, 10); }), HasSubstr("no held-out pairs"));
}

}  // namespace
}  // namespace sl::nn
