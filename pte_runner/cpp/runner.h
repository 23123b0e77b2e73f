// pte_runner's C++ side: loads a .pte with ExecuTorch's Program/Method API,
// feeds inputs, runs, reads outputs and writes the ETDump. Errors are thrown
// as std::runtime_error, which cxx turns into Rust `Err`s.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "rust/cxx.h"

namespace rustconv {
namespace runner {

struct TensorInfo;
class SessionImpl;

// A program file loaded and verified once; any number of methods (the same
// one several times included) are loaded from it, each a Session that keeps
// it alive. Only read once loaded, so sessions on different threads share it.
class LoadedProgram {
 public:
  struct Impl;
  explicit LoadedProgram(std::unique_ptr<Impl> impl);
  ~LoadedProgram();
  Impl& impl() const;

 private:
  std::unique_ptr<Impl> impl_;
};

// One loaded method of one program, with its inputs and memory.
class Session {
 public:
  explicit Session(std::unique_ptr<SessionImpl> impl);
  ~Session();

  std::size_t num_inputs() const;
  TensorInfo input_info(std::size_t i) const;
  void set_input(
      std::size_t i,
      std::int8_t dtype,
      rust::Slice<const std::int32_t> sizes,
      rust::Slice<const std::uint8_t> data);
  void reload_inputs();
  // Copies planned memory as loaded, for restore_initial_memory: what
  // -reset_state puts back so ExecuTorch-owned state restarts too.
  void keep_initial_memory();
  void restore_initial_memory();
  void execute();
  std::size_t num_outputs() const;
  TensorInfo output_info(std::size_t i) const;
  rust::Slice<const std::uint8_t> output_data(std::size_t i) const;
  void write_etdump(rust::Str path);

 private:
  std::unique_ptr<SessionImpl> impl_;
};

// Verifies the program with ExecuTorch's InternalConsistency unless
// minimal_verification (for timing runs of trusted programs).
std::shared_ptr<LoadedProgram> open_program(
    rust::Str model_path,
    bool minimal_verification);

// A new load of one method: its own planned memory, inputs and delegate
// instances (so its own delegate-owned state).
std::unique_ptr<Session> load_method(
    const std::shared_ptr<LoadedProgram>& program,
    rust::Str method_name,
    bool trace);

// Thread count for ExecuTorch's shared thread pool (XNNPACK and the
// optimized CPU kernels) and, through set_option, for RustConvBackend.
void set_num_threads(std::uint32_t num_threads);

// RustConvBackend's threads alone (its num_threads backend option), after
// set_num_threads: to compare its pool's size with XNNPACK's held fixed.
void set_rustconv_threads(std::uint32_t num_threads);

// The backend option reset_state: RustConv delegates restart from their
// initial state at their next call.
void reset_state();

rust::Vec<rust::String> registered_backends();

// dlopen(path, RTLD_NOW | RTLD_GLOBAL), for libraries whose static
// initialisers register ExecuTorch kernels; throws with dlerror()'s reason.
void load_library(rust::Str path);

// Whether ExecuTorch's kernel registry has an operator of this name
// ("llama::custom_sdpa.out"), for any dtype.
bool has_operator(rust::Str name);

} // namespace runner
} // namespace rustconv
