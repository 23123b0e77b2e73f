// rustconv::linear_scan.out(Tensor x0, Tensor a, Tensor u, *, Tensor(a!) out)
//     -> Tensor(a!)
//
// For x0 [B, C] and a, u, out [B, C, N], all contiguous and of one dtype:
//
//     out[..., 0] = a[..., 0] * x0 + u[..., 0]
//     out[..., t] = a[..., t] * out[..., t - 1] + u[..., t]
//
// float32 and float64 compute in their own type; float16 and bfloat16 carry
// the state in float32 and round each output once, as the delegate does.
// Every malformed call fails the kernel context with InvalidArgument after
// one ET_LOG line; nothing aborts.
#include "rustconv-backend/cpp/scan_kernel.h"

#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/core/span.h>
#include <executorch/runtime/kernel/kernel_runtime_context.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/log.h>

namespace rustconv {
namespace ffi {
namespace {

using executorch::aten::BFloat16;
using executorch::aten::Half;
using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::Kernel;
using executorch::runtime::KernelRuntimeContext;
using executorch::runtime::Span;

#define SCAN_CHECK(cond, message, ...)                          \
  ET_KERNEL_CHECK_MSG(                                          \
      context,                                                  \
      cond,                                                     \
      InvalidArgument,                                          \
      /* void */,                                               \
      "rustconv::linear_scan.out: " message,                    \
      ##__VA_ARGS__)

// Compute type: float32 for the 16-bit formats.
template <typename T>
struct Acc {
  using type = T;
};
template <>
struct Acc<Half> {
  using type = float;
};
template <>
struct Acc<BFloat16> {
  using type = float;
};

template <typename T>
void scan(const Tensor& x0, const Tensor& a, const Tensor& u, Tensor& out) {
  using A = typename Acc<T>::type;
  const std::size_t rows =
      static_cast<std::size_t>(a.size(0)) * static_cast<std::size_t>(a.size(1));
  const std::size_t n = static_cast<std::size_t>(a.size(2));
  const T* x0_data = x0.const_data_ptr<T>();
  const T* a_data = a.const_data_ptr<T>();
  const T* u_data = u.const_data_ptr<T>();
  T* out_data = out.mutable_data_ptr<T>();
  for (std::size_t row = 0; row < rows; ++row) {
    const std::size_t base = row * n;
    A state = static_cast<A>(x0_data[row]);
    for (std::size_t t = 0; t < n; ++t) {
      state = static_cast<A>(a_data[base + t]) * state +
          static_cast<A>(u_data[base + t]);
      out_data[base + t] = static_cast<T>(state);
    }
  }
}

const char* dtype_name(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::Float:
      return "float32";
    case ScalarType::Half:
      return "float16";
    case ScalarType::BFloat16:
      return "bfloat16";
    case ScalarType::Double:
      return "float64";
    default:
      return "an unsupported dtype";
  }
}

// Default dim order and the matching (contiguous) strides. Strides of size-1
// dimensions do not matter, nor any of an empty tensor's.
bool is_contiguous(const Tensor& t) {
  const auto order = t.dim_order();
  for (std::size_t d = 0; d < order.size(); ++d) {
    if (order[d] != d) {
      return false;
    }
  }
  if (t.numel() == 0) {
    return true;
  }
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  long long expected = 1;
  for (std::size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] != 1 && strides[d] != expected) {
      return false;
    }
    expected *= sizes[d];
  }
  return true;
}

// Whether a kernel is registered under `name`, without the error line that
// registry_has_op_function logs when there is none.
bool is_registered(const char* name) {
  for (const Kernel& kernel : executorch::runtime::get_registered_kernels()) {
    if (kernel.name_ != nullptr && std::strcmp(kernel.name_, name) == 0) {
      return true;
    }
  }
  return false;
}

void linear_scan_out(KernelRuntimeContext& context, Span<EValue*> stack) {
  // x0, a, u, out, then the return value (out again).
  SCAN_CHECK(
      stack.size() == 4 || stack.size() == 5,
      "expected 4 arguments and 1 return value, got %zu values",
      stack.size());
  static const char* const kNames[] = {"x0", "a", "u", "out"};
  for (std::size_t i = 0; i < 4; ++i) {
    SCAN_CHECK(
        stack[i] != nullptr && stack[i]->isTensor(),
        "argument %s is not a tensor",
        kNames[i]);
  }
  const Tensor& x0 = stack[0]->toTensor();
  const Tensor& a = stack[1]->toTensor();
  const Tensor& u = stack[2]->toTensor();
  Tensor& out = stack[3]->toTensor();

  SCAN_CHECK(
      x0.dim() == 2, "x0 must be 2-D [B, C], got %lld-D", (long long)x0.dim());
  SCAN_CHECK(
      a.dim() == 3, "a must be 3-D [B, C, N], got %lld-D", (long long)a.dim());
  SCAN_CHECK(
      u.dim() == 3, "u must be 3-D [B, C, N], got %lld-D", (long long)u.dim());
  for (int d = 0; d < 3; ++d) {
    SCAN_CHECK(
        a.size(d) == u.size(d),
        "a and u must have the same shape, got [%lld, %lld, %lld] and "
        "[%lld, %lld, %lld]",
        (long long)a.size(0),
        (long long)a.size(1),
        (long long)a.size(2),
        (long long)u.size(0),
        (long long)u.size(1),
        (long long)u.size(2));
  }
  for (int d = 0; d < 2; ++d) {
    SCAN_CHECK(
        x0.size(d) == a.size(d),
        "x0 must be [B, C] matching a [B, C, N], got [%lld, %lld] and "
        "[%lld, %lld, %lld]",
        (long long)x0.size(0),
        (long long)x0.size(1),
        (long long)a.size(0),
        (long long)a.size(1),
        (long long)a.size(2));
  }
  const ScalarType dtype = a.scalar_type();
  SCAN_CHECK(
      dtype == ScalarType::Float || dtype == ScalarType::Double ||
          dtype == ScalarType::Half || dtype == ScalarType::BFloat16,
      "unsupported dtype %s (ScalarType %d); expected float32, float16, "
      "bfloat16 or float64",
      dtype_name(dtype),
      static_cast<int>(dtype));
  SCAN_CHECK(
      x0.scalar_type() == dtype && u.scalar_type() == dtype &&
          out.scalar_type() == dtype,
      "x0, a, u and out must have the same dtype, got %s, %s, %s and %s",
      dtype_name(x0.scalar_type()),
      dtype_name(dtype),
      dtype_name(u.scalar_type()),
      dtype_name(out.scalar_type()));
  SCAN_CHECK(
      is_contiguous(x0) && is_contiguous(a) && is_contiguous(u),
      "x0, a and u must be contiguous with the default dim order");
  SCAN_CHECK(
      out.dim() == 3, "out must be 3-D [B, C, N], got %lld-D", (long long)out.dim());
  const Error resized = executorch::runtime::resize_tensor(out, a.sizes());
  SCAN_CHECK(
      resized == Error::Ok,
      "cannot resize out to [%lld, %lld, %lld] (error 0x%" PRIx32
      "): larger than the memory planned for it?",
      (long long)a.size(0),
      (long long)a.size(1),
      (long long)a.size(2),
      static_cast<std::uint32_t>(resized));
  SCAN_CHECK(
      is_contiguous(out),
      "out must be contiguous with the default dim order");
  if (a.numel() == 0) {
    return;
  }
  SCAN_CHECK(
      x0.const_data_ptr() != nullptr && a.const_data_ptr() != nullptr &&
          u.const_data_ptr() != nullptr && out.mutable_data_ptr() != nullptr,
      "a tensor has no data");

  switch (dtype) {
    case ScalarType::Float:
      scan<float>(x0, a, u, out);
      break;
    case ScalarType::Double:
      scan<double>(x0, a, u, out);
      break;
    case ScalarType::Half:
      scan<Half>(x0, a, u, out);
      break;
    case ScalarType::BFloat16:
      scan<BFloat16>(x0, a, u, out);
      break;
    default:
      break; // refused above
  }
}

#undef SCAN_CHECK

} // namespace

bool register_linear_scan_kernel() {
  // Once per copy of this code. The registry aborts the process on a
  // duplicate name, and a process may hold two copies (pte_runner's, linked
  // from the rlib, and librustconv_backend.so's, if something loads it too),
  // so a name already present counts as success.
  static const bool registered = [] {
    if (is_registered(kLinearScanOutName)) {
      ET_LOG(
          Info,
          "RustConvBackend: %s is already registered; keeping that kernel",
          kLinearScanOutName);
      return true;
    }
    const Error err = executorch::runtime::register_kernel(
        Kernel(kLinearScanOutName, &linear_scan_out));
    if (err != Error::Ok) {
      ET_LOG(
          Error,
          "RustConvBackend: registering the %s kernel failed (error 0x%" PRIx32
          ")",
          kLinearScanOutName,
          static_cast<std::uint32_t>(err));
      return false;
    }
    return true;
  }();
  return registered;
}

bool linear_scan_kernel_registered() {
  return is_registered(kLinearScanOutName);
}

} // namespace ffi
} // namespace rustconv
