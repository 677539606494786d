// checkpoint.h — distributed checkpoints: save under one layout, resume under any other.
//
//   The idea. Every layout holds the same training state cut differently (parallel/runner/
//   state_pieces.h): each rank describes its part as pieces, a region of a global tensor (a box of
//   its shape and a flat range of the box) plus the live data. A checkpoint stores each piece once,
//   as its owner cut it, and says where it sits; a reader under another layout asks, for each of its
//   own pieces, which saved pieces share elements with it, reads just those bytes and copies the
//   shared elements. No rank ever assembles a whole tensor, and any cut reads any other.
//
//   The directory:
//
//     ROOT/                               --checkpoint-dir
//       step-00000010/                    one complete checkpoint
//         shard-00000.safetensors         rank 0's owner pieces, 1-D, keys "wte.weight@0", ...
//         shard-00001.safetensors         (PyTorch's safetensors opens each)
//         ...
//         metadata.json                   written last: format, layout, world size, run_state,
//                                         per tensor {shape, dtype, pieces: [{file, key, region}]},
//                                         per file {bytes, sha256}
//       step-00000020.partial/            a save in progress (or one that crashed): never read
//
//   Crash safety. Every file is written to NAME.tmp, fsynced, renamed, and its directory fsynced.
//   metadata.json goes last, after every rank's shard is on disk and the pieces were checked to tile
//   every tensor: a checkpoint without metadata.json does not exist. A step is saved under
//   step-N.partial and renamed to step-N when complete; old steps are deleted only after that.
//   Killed at any moment, a run leaves its previous checkpoint as it was.
//
//   A reader (Reader) trusts nothing: metadata.json is parsed with every size, offset and type
//   checked before use, the pieces must tile each tensor (no gap, overlap or out of bounds), every
//   shard's size and SHA-256 are checked against it, and a load refuses another model's shapes or
//   dtypes, naming both. Malformed input is an sl::Error, never a crash (fuzz/ hammers the parsers).
//
//   Read in this order:
//     sha256.h       SHA-256 from FIPS 180-4 (the shards' checksums)
//     file_io.h      the POSIX calls of a crash-safe write: tmp, fsync, rename, fsync the directory
//     regions.h      a region as boxes; overlaps; the tiling check
//     metadata.h     metadata.json, written and parsed as hostile input
//     shard_file.h   one rank's safetensors shard, written with its hash, read by byte ranges
//     save.h         save (collective), save_step, keep_last, newest_complete
//     reader.h       Reader: verify, load under any cut, read_tensor
//
//   Tool: build/bin/checkpoint info|verify|consolidate (tools/checkpoint.cpp)
//   Tests: tests/parallel/checkpoint/test_checkpoint_format.cpp, tests/parallel/checkpoint/test_checkpoint_fuzz.cpp; fuzzers: fuzz/ (make fuzz)
#pragma once
#include "parallel/checkpoint/metadata.h"
#include "parallel/checkpoint/reader.h"
#include "parallel/checkpoint/regions.h"
#include "parallel/checkpoint/save.h"
#include "parallel/checkpoint/sha256.h"
