#include "rustconv-backend/cpp/backend.h"
#include "rustconv-backend/cpp/scan_kernel.h"

#include <new>
#include <utility>

#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/event_tracer_hooks_delegate.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/log.h>

#include "rustconv-backend/src/ffi.rs.h"

// libexecutorch_threadpool.so exports the process's shared pool, the one
// XNNPACK and the optimized CPU kernels run on, but the wheel ships no header
// for it; this declaration matches its exported symbol
// (executorch/extension/threadpool/threadpool.h upstream).
struct pthreadpool;
namespace executorch::extension::threadpool {
pthreadpool* get_pthreadpool();
} // namespace executorch::extension::threadpool

// For delegate/src/threads.rs, which runs the kernels' loops on that pool
// through pthreadpool's C API. Null when there is none (or while a
// NoThreadPoolGuard is active on this thread).
extern "C" pthreadpool* rustconv_executorch_pthreadpool() {
  return executorch::extension::threadpool::get_pthreadpool();
}

namespace rustconv {
namespace ffi {

using executorch::runtime::ArrayRef;
using executorch::runtime::BackendExecutionContext;
using executorch::runtime::BackendInitContext;
using executorch::runtime::BackendInterface;
using executorch::runtime::BackendOption;
using executorch::runtime::BackendOptionContext;
using executorch::runtime::CompileSpec;
using executorch::runtime::DelegateHandle;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::FreeableBuffer;
using executorch::runtime::Result;
using executorch::runtime::Span;
using executorch::aten::ScalarType;
using executorch::aten::Tensor;

bool ExecuteArgs::is_tensor(std::size_t i) const {
  return args_[i] != nullptr && args_[i]->isTensor();
}

DType ExecuteArgs::dtype(std::size_t i) const {
  switch (args_[i]->toTensor().scalar_type()) {
    case ScalarType::Float:
      return DType::Float32;
    case ScalarType::Half:
      return DType::Float16;
    default:
      return DType::Unsupported;
  }
}

rust::Slice<const std::int32_t> ExecuteArgs::sizes(std::size_t i) const {
  const auto sizes = args_[i]->toTensor().sizes();
  return {sizes.data(), sizes.size()};
}

bool ExecuteArgs::is_contiguous(std::size_t i) const {
  const auto order = args_[i]->toTensor().dim_order();
  for (std::size_t d = 0; d < order.size(); ++d) {
    if (order[d] != d) {
      return false;
    }
  }
  return true;
}

std::size_t ExecuteArgs::nbytes(std::size_t i) const {
  return args_[i]->toTensor().nbytes();
}

std::uint8_t* ExecuteArgs::data_ptr(std::size_t i) const {
  return static_cast<std::uint8_t*>(
      args_[i]->toTensor().mutable_data_ptr());
}

bool ExecuteArgs::resize(
    std::size_t i,
    rust::Slice<const std::int32_t> sizes) {
  const Error err = executorch::runtime::resize_tensor(
      args_[i]->toTensor(),
      ArrayRef<executorch::aten::SizesType>(sizes.data(), sizes.size()));
  return err == Error::Ok;
}

void KernelEventLog::log_kernel(
    std::uint32_t kernel,
    std::uint64_t start,
    std::uint64_t end,
    rust::Slice<const std::uint8_t> metadata) {
  // Identified by index, not name: exactly one of the two is set.
  executorch::runtime::event_tracer_log_profiling_delegate(
      tracer_,
      /*name=*/nullptr,
      static_cast<executorch::runtime::DelegateDebugIntId>(kernel),
      static_cast<et_timestamp_t>(start),
      static_cast<et_timestamp_t>(end),
      metadata.data(),
      metadata.size());
}

std::uint64_t current_ticks() {
  return static_cast<std::uint64_t>(executorch::runtime::pal_current_ticks());
}

void log(LogLevel level, rust::Str message) {
  const int len = static_cast<int>(message.size());
  switch (level) {
    case LogLevel::Debug:
      ET_LOG(Debug, "RustConvBackend: %.*s", len, message.data());
      break;
    case LogLevel::Info:
      ET_LOG(Info, "RustConvBackend: %.*s", len, message.data());
      break;
    default:
      ET_LOG(Error, "RustConvBackend: %.*s", len, message.data());
      break;
  }
}

namespace {

Error to_error(Status status) {
  switch (status) {
    case Status::Ok:
      return Error::Ok;
    case Status::InvalidArgument:
      return Error::InvalidArgument;
    case Status::InvalidProgram:
      return Error::InvalidProgram;
    case Status::InvalidState:
      return Error::InvalidState;
    case Status::NotSupported:
      return Error::NotSupported;
    case Status::DelegateInvalidCompatibility:
      return Error::DelegateInvalidCompatibility;
    case Status::MemoryAllocationFailed:
      return Error::DelegateMemoryAllocationFailed;
    default:
      return Error::Internal;
  }
}

// What init() hands ExecuTorch. The Rust delegate may read constants in place
// from `processed` (unless it released it), so the buffer is declared first:
// members are destroyed in reverse order, the delegate before the bytes it
// points into.
struct Handle {
  FreeableBuffer processed;
  rust::Box<Delegate> delegate;
};

class RustConvBackend final : public BackendInterface {
 public:
  bool is_available() const override { return true; }

  Result<DelegateHandle*> init(
      BackendInitContext& context,
      FreeableBuffer* processed,
      ArrayRef<CompileSpec> compile_specs) const override {
    rust::Box<Delegate> delegate = delegate_new();
    for (const CompileSpec& spec : compile_specs) {
      delegate->add_compile_spec(
          rust::Str(spec.key),
          rust::Slice<const std::uint8_t>(
              static_cast<const std::uint8_t*>(spec.value.buffer),
              spec.value.nbytes));
    }
    const Status status = delegate->init(rust::Slice<const std::uint8_t>(
        static_cast<const std::uint8_t*>(processed->data()),
        processed->size()));
    if (status != Status::Ok) {
      return to_error(status);
    }
    // Constants the kernels transformed at init (FFT spectra, packed
    // panels) are not read again: the delegate kept a copy of the rest.
    if (!delegate->keeps_blob()) {
      processed->Free();
    }
    Handle* handle =
        context.get_runtime_allocator()->allocateInstance<Handle>();
    if (handle == nullptr) {
      return Error::MemoryAllocationFailed;
    }
    new (handle) Handle{std::move(*processed), std::move(delegate)};
    return handle;
  }

  Error execute(
      BackendExecutionContext& context,
      DelegateHandle* raw_handle,
      Span<EValue*> args) const override {
    if (raw_handle == nullptr) {
      return Error::DelegateInvalidHandle;
    }
    auto* handle = static_cast<Handle*>(raw_handle);
    ExecuteArgs execute_args(args);
    KernelEventLog events(context.event_tracer());
    return to_error(handle->delegate->execute(execute_args, events));
  }

  Error set_option(
      BackendOptionContext& /*context*/,
      const Span<BackendOption>& options) override {
    for (const BackendOption& option : options) {
      if (std::strcmp(option.key, "num_threads") == 0) {
        const int* value = std::get_if<int>(&option.value);
        if (value == nullptr) {
          ET_LOG(Error, "RustConvBackend: option num_threads must be an int");
          return Error::InvalidArgument;
        }
        const Status status = set_num_threads(*value);
        if (status != Status::Ok) {
          return to_error(status);
        }
      } else if (std::strcmp(option.key, "reset_state") == 0) {
        // Delegate-owned conv and scan states go back to their exported
        // values before each delegate's next call (delegate/src/state.rs).
        const bool* value = std::get_if<bool>(&option.value);
        if (value == nullptr) {
          ET_LOG(Error, "RustConvBackend: option reset_state must be a bool");
          return Error::InvalidArgument;
        }
        if (*value) {
          reset_state();
        }
      } else {
        ET_LOG(Error, "RustConvBackend: unknown option '%s'", option.key);
        return Error::InvalidArgument;
      }
    }
    return Error::Ok;
  }

  void destroy(DelegateHandle* raw_handle) const override {
    if (raw_handle != nullptr) {
      // The runtime allocator owns the memory; only run the destructor.
      static_cast<Handle*>(raw_handle)->~Handle();
    }
  }
};

} // namespace

bool register_backend() {
  static RustConvBackend backend;
  static const Error status = executorch::runtime::register_backend(
      executorch::runtime::Backend{"RustConvBackend", &backend});
  // With it, the operator kernel for scans left outside any delegate
  // (scan_kernel.cpp): this is the one entry point both the shared library's
  // load-time constructor and pte_runner call.
  const bool kernel_registered = register_linear_scan_kernel();
  return status == Error::Ok && kernel_registered;
}

} // namespace ffi
} // namespace rustconv
