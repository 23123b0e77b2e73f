// The C++ half of the RustConv delegate: ExecuTorch's BackendInterface,
// implemented by forwarding to the Rust `Delegate` (delegate/src/ffi.rs).
// Everything here is a thin adapter; the logic lives in Rust.
#pragma once

#include <cstddef>
#include <cstdint>

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/event_tracer.h>
#include <executorch/runtime/core/span.h>

#include "rust/cxx.h"

namespace rustconv {
namespace ffi {

enum class DType : std::uint8_t;
enum class LogLevel : std::uint8_t;

// The delegate call's arguments (inputs then outputs) as Rust sees them:
// read-only shape/dtype queries, raw data pointers and output resizing.
class ExecuteArgs {
 public:
  explicit ExecuteArgs(executorch::runtime::Span<executorch::runtime::EValue*> args)
      : args_(args) {}

  std::size_t len() const { return args_.size(); }
  bool is_tensor(std::size_t i) const;
  DType dtype(std::size_t i) const;
  rust::Slice<const std::int32_t> sizes(std::size_t i) const;
  // True when the dim order is the default (contiguous, row-major) one.
  bool is_contiguous(std::size_t i) const;
  std::size_t nbytes(std::size_t i) const;
  std::uint8_t* data_ptr(std::size_t i) const;
  // Resizes output i (rank unchanged). False if ExecuTorch refuses, e.g. the
  // new size exceeds the memory planned for it.
  bool resize(std::size_t i, rust::Slice<const std::int32_t> sizes);

 private:
  executorch::runtime::Span<executorch::runtime::EValue*> args_;
};

// Where the Rust delegate reports each fused kernel's span after a call:
// the execution context's event tracer, or nothing (then Rust times nothing).
class KernelEventLog {
 public:
  explicit KernelEventLog(executorch::runtime::EventTracer* tracer)
      : tracer_(tracer) {}

  bool enabled() const { return tracer_ != nullptr; }
  // Logs one delegate event identified by its kernel index (the key of the
  // debug-handle map preprocess returned), with its metadata.
  void log_kernel(
      std::uint32_t kernel,
      std::uint64_t start,
      std::uint64_t end,
      rust::Slice<const std::uint8_t> metadata);

 private:
  executorch::runtime::EventTracer* tracer_;
};

// The runtime's clock, which the event tracer times everything else with.
std::uint64_t current_ticks();

// Writes one line to ExecuTorch's log (ET_LOG).
void log(LogLevel level, rust::Str message);

// Registers "RustConvBackend" with the ExecuTorch runtime; idempotent.
// Returns false if ExecuTorch refused the registration.
bool register_backend();

} // namespace ffi
} // namespace rustconv
