#!/usr/bin/env python3
"""make_corpus.py — writes the fuzzers' seed corpus: one file per corruption class.

  fuzz/corpus/safetensors/NN_name.bin    shards (safetensors files) for fuzz_safetensors
  fuzz/corpus/metadata/NN_name.json      metadata.json documents for fuzz_metadata

Each seed starts from a valid file and breaks one rule the readers check, so the fuzzers begin at
every check's edge. Run from the repository root: python3 fuzz/make_corpus.py (it rewrites both)."""
import hashlib, json, os, struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def shard(header, data=b"", length=None):
    """A safetensors file: 8-byte little-endian length, the header text, then data."""
    text = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


VALID = {"__metadata__": {"format": "pt"}, "w@0": entry("F32", [4], 0, 16), "b@0": entry("BF16", [2], 16, 20)}
DATA = bytes(range(20))


def safetensors_seeds():
    def with_entry(name, value):
        header = dict(VALID)
        header[name] = value
        return shard(header, DATA)
    deep = b'{"w@0": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    return {
        "valid": shard(VALID, DATA),
        "valid_empty_and_scalar": shard({"e@0": entry("F32", [0], 0, 0), "s@0": entry("I64", [], 0, 8)}, bytes(8)),
        "empty_file": b"",
        "shorter_than_length": b"\x10\x00\x00",
        "header_length_past_end": shard(VALID, DATA, length=4096),
        "header_length_huge": shard(VALID, DATA, length=2**63 + 5),
        "header_length_zero": shard(VALID, DATA, length=0),
        "header_not_json": shard(b"{not json at all", DATA),
        "header_array": shard([1, 2, 3], DATA),
        "header_string": shard("a string", DATA),
        "data_truncated": shard(VALID, DATA[:10]),
        "begin_after_end": with_entry("w@0", entry("F32", [4], 16, 0)),
        "negative_offsets": with_entry("w@0", entry("F32", [4], -16, 0)),
        "float_offsets": with_entry("w@0", entry("F32", [4], 0.5, 16.5)),
        "one_offset": with_entry("w@0", {"dtype": "F32", "shape": [4], "data_offsets": [16]}),
        "unknown_dtype": with_entry("w@0", entry("F8_E4M3", [4], 0, 16)),
        "dtype_number": with_entry("w@0", entry(32, [4], 0, 16)),
        "shape_size_mismatch": with_entry("w@0", entry("F32", [3], 0, 16)),
        "negative_shape": with_entry("w@0", entry("F32", [-4], 0, 16)),
        "shape_overflow": with_entry("w@0", entry("F32", [2**40, 2**40, 2**40], 0, 16)),
        "duplicate_names": shard(b'{"w@0":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},'
                                 b'"w@0":{"dtype":"F32","shape":[5],"data_offsets":[0,20]}}', DATA),
        "overlapping_tensors": with_entry("b@0", entry("BF16", [2], 12, 16)),
        "metadata_not_object": with_entry("__metadata__", ["format", "pt"]),
        "metadata_value_number": with_entry("__metadata__", {"format": 1}),
        "deep_nesting": shard(deep, DATA),
        "huge_numbers": shard(b'{"w@0":{"dtype":"F32","shape":[1e999],"data_offsets":[0,18446744073709551616]}}', DATA),
        "invalid_utf8_name": shard(b'{"w\xff\xfe@0":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', DATA),
        "missing_dtype": with_entry("w@0", {"shape": [4], "data_offsets": [0, 16]}),
        "entry_not_object": with_entry("w@0", "F32"),
        "nul_and_trailing_garbage": shard(json.dumps(VALID).encode() + b"\x00\x00garbage", DATA),
    }


def metadata(tensors=None, files=None, **top):
    """A valid metadata.json document (one file, one [4, 6] tensor in two flat pieces), with edits."""
    digest = hashlib.sha256(b"x").hexdigest()
    doc = {"format": "shardlab.checkpoint", "version": 1, "layout": "flat x2", "world_size": 2,
           "files": files if files is not None else {"shard-00000.safetensors": {"bytes": 200, "sha256": digest},
                                                     "shard-00001.safetensors": {"bytes": 200, "sha256": digest}},
           "tensors": tensors if tensors is not None else {"w": tensor()},
           "run_state": {"step": 10, "lr": 0.001, "data": {"epoch": 0, "position": 1234}}}
    doc.update(top)
    return doc


def piece(file=0, key="w@0", offsets=(0, 0), lengths=(4, 6), begin=0, end=12):
    return {"file": "shard-%05d.safetensors" % file, "key": key, "offsets": list(offsets),
            "lengths": list(lengths), "flat_begin": begin, "flat_end": end}


def tensor(pieces=None, shape=(4, 6), dtype="F32"):
    if pieces is None:
        pieces = [piece(0, "w@0", begin=0, end=12), piece(1, "w@0", begin=12, end=24)]
    return {"shape": list(shape), "dtype": dtype, "pieces": pieces}


def metadata_seeds():
    digest = hashlib.sha256(b"x").hexdigest()
    many = [piece(i % 2, "w@%d" % i, (0, 0), (4, 6), i, i + 1) for i in range(24)]
    text = lambda doc: json.dumps(doc, indent=1).encode()
    return {
        "valid": text(metadata()),
        "valid_boxes": text(metadata(tensors={"w": tensor([piece(0, "w@0", (0, 0), (2, 6), 0, 12),
                                                           piece(1, "w@0", (2, 0), (2, 6), 0, 12)])})),
        "valid_many_pieces": text(metadata(tensors={"w": tensor(many)})),
        "valid_scalar": text(metadata(tensors={"s": tensor([piece(0, "s@0", (), (), 0, 1)], shape=())})),
        "empty": b"",
        "truncated": text(metadata())[:150],
        "top_level_array": b"[1, 2, 3]",
        "top_level_string": b'"metadata"',
        "deep_nesting_70": text(metadata(run_state=json.loads("[" * 70 + "]" * 70))),
        "deep_nesting_5000": b'{"run_state": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        "missing_format": text({k: v for k, v in metadata().items() if k != "format"}),
        "newer_version": text(metadata(version=2)),
        "version_huge": text(metadata()).replace(b'"version": 1', b'"version": 1e999'),
        "world_size_negative": text(metadata(world_size=-3)),
        "files_not_object": text(metadata(files=["shard-00000.safetensors"])),
        "file_path_traversal": text(metadata(files={"../../etc/passwd": {"bytes": 1, "sha256": digest}})),
        "sha256_bad": text(metadata(files={"shard-00000.safetensors": {"bytes": 200, "sha256": "XYZ"},
                                           "shard-00001.safetensors": {"bytes": 200, "sha256": digest}})),
        "bytes_negative": text(metadata(files={"shard-00000.safetensors": {"bytes": -1, "sha256": digest},
                                               "shard-00001.safetensors": {"bytes": 200, "sha256": digest}})),
        "bytes_uint64_max": text(metadata(files={"shard-00000.safetensors": {"bytes": 2**64 - 1, "sha256": digest},
                                                 "shard-00001.safetensors": {"bytes": 200, "sha256": digest}})),
        "bytes_too_small": text(metadata(files={"shard-00000.safetensors": {"bytes": 8, "sha256": digest},
                                                "shard-00001.safetensors": {"bytes": 200, "sha256": digest}})),
        "tensors_not_object": text(metadata(tensors=[1])),
        "shape_string": text(metadata(tensors={"w": dict(tensor(), shape="4x6")})),
        "shape_negative": text(metadata(tensors={"w": tensor(shape=(-4, 6))})),
        "shape_overflow": text(metadata(tensors={"w": tensor(shape=(2**40, 2**40))})),
        "shape_too_many_dims": text(metadata(tensors={"w": tensor(shape=(1,) * 20)})),
        "dtype_unknown": text(metadata(tensors={"w": tensor(dtype="F8")})),
        "pieces_not_array": text(metadata(tensors={"w": dict(tensor(), pieces={"a": 1})})),
        "offset_negative": text(metadata(tensors={"w": tensor([piece(0, "w@0", (-1, 0), (4, 6), 0, 24)])})),
        "flat_range_outside": text(metadata(tensors={"w": tensor([piece(0, "w@0", (0, 0), (4, 6), 0, 25)])})),
        "lengths_out_of_bounds": text(metadata(tensors={"w": tensor([piece(0, "w@0", (2, 0), (4, 6), 0, 24)])})),
        "ndim_mismatch": text(metadata(tensors={"w": tensor([piece(0, "w@0", (0,), (24,), 0, 24)])})),
        "gap": text(metadata(tensors={"w": tensor([piece(0, "w@0", begin=0, end=11), piece(1, "w@0", begin=12, end=24)])})),
        "overlap": text(metadata(tensors={"w": tensor([piece(0, "w@0", begin=0, end=13), piece(1, "w@0", begin=12, end=24)])})),
        "unlisted_file": text(metadata(tensors={"w": tensor([piece(7, "w@0", begin=0, end=24)])})),
        "duplicate_key": text(metadata(tensors={"w": tensor([piece(0, "w@0", begin=0, end=12), piece(0, "w@0", begin=12, end=24)])})),
        "duplicate_tensor_names": text(metadata()).replace(b'"tensors": {', b'"tensors": {"w": 5, ', 1),
        "run_state_not_object": text(metadata(run_state=[1, 2])),
        "invalid_utf8": text(metadata()).replace(b'"flat x2"', b'"fl\xc3\x28t"'),
        "flat_end_huge": text(metadata(tensors={"w": tensor([piece(0, "w@0", begin=0, end=2**63 - 1)])})),
    }


def write(folder, seeds, suffix):
    path = os.path.join(ROOT, folder)
    os.makedirs(path, exist_ok=True)
    for old in os.listdir(path):
        os.remove(os.path.join(path, old))
    for i, (name, data) in enumerate(seeds.items()):
        with open(os.path.join(path, "%02d_%s%s" % (i, name, suffix)), "wb") as out:
            out.write(data)
    print("%s: %d seeds" % (path, len(seeds)))


if __name__ == "__main__":
    write("safetensors", safetensors_seeds(), ".bin")
    write("metadata", metadata_seeds(), ".json")
