// train_run.cpp — see train_run.h.
#include "parallel/train/train_run.h"

#include <unistd.h>

#include <cstdio>

#include "nn/safetensors.h"
#include "tensor/ops.h"

namespace sl::parallel {

namespace {

// Greedy decoding of a batch of equal-length prompts with the model (for the addition evaluator).
std::vector<int64_t> generate_tokens(nn::GPT& model, const std::vector<std::vector<int64_t>>& prompts, int new_tokens) {
  const int64_t rows = static_cast<int64_t>(prompts.size()), length = static_cast<int64_t>(prompts[0].size());
  std::vector<double> flat;
  for (const auto& prompt : prompts) flat.insert(flat.end(), prompt.begin(), prompt.end());
  Tensor out = model.generate(from_vector(flat, {rows, length}, DType::i64), new_tokens);
  std::vector<double> all = out.narrow(1, length, new_tokens).to_vector();
  return std::vector<int64_t>(all.begin(), all.end());
}

// The training data, and the block size it asks for when none was given.
void read_data(TrainRun& r) {
  TrainOptions& o = r.o;
  if (o.task == "addition") {
    r.addition =
        std::make_unique<nn::AdditionTask>(nn::AdditionConfig{static_cast<int>(o.digits), o.seed, 0.1, true, true});
    // Lines all have one length L ("07+85=290\n": 10). With block_size = L every row of every batch
    // is exactly one line starting at position 0, because the batching rule starts row r at
    // ((s*B + r)*T) mod (N - T), a multiple of L when T and N are. The model then sees each digit at
    // a fixed position, as in the prompt at evaluation; with rows cut across lines it must first
    // learn where a line starts, and 1500 steps reach ~1% instead of ~100% held-out accuracy.
    int64_t line_length = static_cast<int64_t>(r.addition->line(0, 0).size());
    if (o.block_size == 0) o.block_size = line_length;
    // Enough lines that the stream does not repeat within the run.
    int64_t lines = std::max<int64_t>(1000, (o.steps + 1) * o.batch_size * o.block_size / line_length + 1);
    r.stream = r.addition->train_stream(lines, o.seed);
  } else {
    if (o.block_size == 0) o.block_size = 64;
    r.stream = o.task == "text" ? nn::TokenStream::from_text_file(o.data)
                                : nn::TokenStream::from_bin_file(o.data, o.vocab_size);
  }
}

}  // namespace

void prepare_run(TrainRun& r, const TrainOptions& options, bool writer) {
  r.o = options;
  r.writer = writer;
  read_data(r);
  const TrainOptions& o = r.o;
  r.precision = nn::MixedPrecision::parse(o.mixed_precision, o.grad_reduce_dtype, o.loss_scale);
  r.config = nn::GPTConfig{o.task == "bin" ? o.vocab_size : 256, o.block_size, o.n_layer, o.n_head, o.n_embd, o.dropout,
                           nn::parse_recompute(o.recompute), r.precision.param_dtype};
  r.config.moe_experts = o.moe_experts;
  r.config.moe_top_k = o.moe_top_k;
  r.config.moe_every = o.moe_every;
  r.config.moe_capacity_factor = o.moe_capacity_factor;
  r.config.moe_router = nn::parse_moe_router(o.moe_router);
  r.config.moe_aux_weight = o.moe_aux_weight;
  r.config.moe_z_weight = o.moe_z_weight;
  // Read once here; each rank copies the whole file into its replica, and a sharded layout then
  // keeps its rank's shard of it (ZeRO's flat buffer, FSDP's units).
  if (!o.init_from.empty()) r.initial = nn::load_safetensors(o.init_from);
  if (!o.resume.empty()) {  // verified, and the model checked, before any step
    r.resume = train_checkpoint::open(o, r.config);
    r.first_step = r.resume->next_step;
    std::printf("resuming from %s at step %lld (saved under %s)\n", r.resume->dir.c_str(), (long long)r.first_step,
                r.resume->layout.c_str());
  }
  // Opened (and an old log truncated) only once every input has been read.
  if (!o.log_jsonl.empty() && r.writer) r.log.open("--log-jsonl", o.log_jsonl);
  r.terminal = isatty(fileno(stdout));
}

std::unique_ptr<nn::GPT> initial_model(const TrainRun& r) {
  auto model = std::make_unique<nn::GPT>(r.config, r.o.seed);
  if (!r.initial.empty()) model->load_state_dict(r.initial);
  return model;
}

double accuracy(const TrainRun& r, nn::GPT& model) {
  SL_CHECK(r.addition != nullptr, "accuracy: the task is ", r.o.task, ", not addition");
  model.eval();
  double acc = r.addition->evaluate([&](const auto& prompts, int n) { return generate_tokens(model, prompts, n); },
                                    static_cast<int64_t>(r.addition->heldout().size()), 250);
  model.train();
  return acc;
}

}  // namespace sl::parallel
