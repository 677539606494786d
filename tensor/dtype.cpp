#include "tensor/dtype.h"

#include "tensor/error.h"

namespace sl {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
  }
  SL_ASSERT(false);
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
  }
  SL_ASSERT(false);
}

bool is_floating(DType dtype) { return !is_integer(dtype); }
bool is_integer(DType dtype) { return dtype == DType::i32 || dtype == DType::i64; }

}  // namespace sl
