// parallel/train/train_options.h: TrainOptions' checks across options, without a command line
// (tests/tools/test_train_options.cpp reaches the same checks through train's flags).
#include <gtest/gtest.h>

#include <string>

#include "parallel/train/train_options.h"

namespace sl::parallel {
namespace {

// validate()'s message, or "" when the options go together.
std::string refusal(const TrainOptions& o) {
  try {
    o.validate();
  } catch (const OptionError& e) {
    return e.what();
  }
  return "";
}

TEST(TrainOptionsChecks, TheDefaultsAreASerialRun) {
  const TrainOptions o;
  EXPECT_EQ(refusal(o), "");
  EXPECT_FALSE(o.parallel());
  EXPECT_EQ(o.world(), 1);
}

TEST(TrainOptionsChecks, ResolveMakesAShardAloneFsdpAndTheWorldIsTheProduct) {
  TrainOptions o;
  o.dp_shard = 4;
  o.tp = 2;
  o.resolve();
  EXPECT_EQ(o.dp_replicate, 1);  // FSDP over 4: HSDP with one replica
  EXPECT_EQ(o.data_parallel(), 4);
  EXPECT_EQ(o.world(), 8);
  EXPECT_EQ(refusal(o), "");
}

TEST(TrainOptionsChecks, OptionsThatCannotGoTogetherAreRefusedNamingTheFlags) {
  TrainOptions sp;
  sp.sp = true;
  EXPECT_EQ(refusal(sp), "--sp shards the sequence over the tensor-parallel ranks: add --tp N");
  TrainOptions bin;
  bin.task = "bin";
  bin.data = "tokens.bin";
  EXPECT_EQ(refusal(bin), "--task bin needs --vocab-size N");
  TrainOptions precision;
  precision.loss_scale = "dynamic";  // f32 everywhere: nothing to scale
  EXPECT_EQ(refusal(precision), "--loss-scale dynamic scales 16-bit gradients: add --mixed-precision fp16 (or bf16)");
  TrainOptions batch;
  batch.dp = 3;
  batch.batch_size = 10;
  EXPECT_EQ(refusal(batch),
            "--batch-size 10 must be micro-batch rows x 1 micro-batches x dp_replicate 3 x dp_shard 1, but 10 % 3 = 1");
}

}  // namespace
}  // namespace sl::parallel
