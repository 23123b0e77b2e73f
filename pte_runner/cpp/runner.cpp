#include "rustconv-pte-runner/cpp/runner.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <executorch/devtools/etdump/etdump_flatcc.h>
#include <executorch/extension/data_loader/file_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/backend/options.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/kernel/operator_registry.h>

#include "rustconv-pte-runner/src/ffi.rs.h"

// libexecutorch_threadpool.so exports the shared pool but the wheel ships no
// header for it; these declarations match its exported symbols
// (executorch/extension/threadpool/threadpool.h upstream).
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  bool _unsafe_reset_threadpool(std::uint32_t num_threads);
};
ThreadPool* get_threadpool();
} // namespace executorch::extension::threadpool

namespace rustconv {
namespace runner {

using executorch::aten::ScalarType;
using executorch::extension::FileDataLoader;
using executorch::extension::MallocMemoryAllocator;
using executorch::extension::TensorPtr;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::HierarchicalAllocator;
using executorch::runtime::MemoryManager;
using executorch::runtime::Method;
using executorch::runtime::MethodMeta;
using executorch::runtime::Program;
using executorch::runtime::Result;
using executorch::runtime::Span;

namespace {

[[noreturn]] void fail(const std::string& what, Error error) {
  throw std::runtime_error(
      what + " failed: " + executorch::runtime::to_string(error));
}

template <typename T>
T take(Result<T>&& result, const std::string& what) {
  if (!result.ok()) {
    fail(what, result.error());
  }
  return std::move(result.get());
}

TensorInfo info_of(const executorch::aten::Tensor& t) {
  TensorInfo info;
  info.dtype = static_cast<std::int8_t>(t.scalar_type());
  for (auto s : t.sizes()) {
    info.sizes.push_back(s);
  }
  return info;
}

constexpr std::size_t kSegmentAlignment = 64;

} // namespace

// The data loader and the program it reads: the program points into the
// loader, so both live here, behind LoadedProgram's pointer (never moved).
struct LoadedProgram::Impl {
  Impl(const std::string& path, bool minimal_verification)
      // Segments loaded 64-byte aligned, so delegates (ours, XNNPACK) can
      // read constants in place instead of copying them.
      : loader(take(
            FileDataLoader::from(path.c_str(), kSegmentAlignment),
            "opening " + path)),
        // InternalConsistency runs the flatbuffer verifier over the whole
        // program before anything reads it: with Minimal, a few changed bytes
        // crash the load inside ExecuTorch (parseTensor) instead of failing.
        // It costs time at load only, never per execute.
        program(take(
            Program::load(
                &loader,
                minimal_verification
                    ? Program::Verification::Minimal
                    : Program::Verification::InternalConsistency),
            "loading program " + path)) {}

  FileDataLoader loader;
  Program program;
};

LoadedProgram::LoadedProgram(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
LoadedProgram::~LoadedProgram() = default;
LoadedProgram::Impl& LoadedProgram::impl() const {
  return *impl_;
}

class SessionImpl {
 public:
  SessionImpl(
      std::shared_ptr<LoadedProgram> program,
      const std::string& method_name,
      bool trace)
      : program_(std::move(program)) {
    Program& program_ref = program_->impl().program;
    MethodMeta meta = take(
        program_ref.method_meta(method_name.c_str()),
        "reading method '" + method_name + "'");
    for (size_t i = 0; i < meta.num_memory_planned_buffers(); ++i) {
      const size_t size =
          take(meta.memory_planned_buffer_size(i), "planned buffer size");
      // Value-initialised, so zeroed: a mutable buffer (a model's state)
      // that ExecuTorch owns starts as the zeros it was registered with,
      // unless InitializedMutableBufferPass ran at export, in which case
      // load_method copies the exported values over these zeros. Left
      // uninitialised, such a state started as whatever the heap held.
      planned_buffers_.emplace_back(new std::uint8_t[size]());
      planned_spans_.emplace_back(planned_buffers_.back().get(), size);
    }
    planned_memory_ = std::make_unique<HierarchicalAllocator>(
        Span<Span<std::uint8_t>>(planned_spans_.data(), planned_spans_.size()));
    memory_manager_ = std::make_unique<MemoryManager>(
        &method_allocator_, planned_memory_.get(), &temp_allocator_);
    if (trace) {
      etdump_ = std::make_unique<executorch::etdump::ETDumpGen>();
    }
    method_ = std::make_unique<Method>(take(
        program_ref.load_method(
            method_name.c_str(), memory_manager_.get(), etdump_.get()),
        "loading method '" + method_name + "'"));
    // load_method leaves the plan's input and output value indices
    // unchecked, and Method's accessors of them abort (ET_CHECK) on one out
    // of range; MethodMeta's check it and return an error.
    const MethodMeta loaded = method_->method_meta();
    for (std::size_t i = 0; i < method_->inputs_size(); ++i) {
      take(loaded.input_tag(i), "reading input " + std::to_string(i));
    }
    for (std::size_t i = 0; i < method_->outputs_size(); ++i) {
      take(loaded.output_tag(i), "reading output " + std::to_string(i));
    }
    inputs_.resize(method_->inputs_size());
  }

  std::size_t num_inputs() const { return method_->inputs_size(); }

  TensorInfo input_info(std::size_t i) const {
    MethodMeta meta = method_->method_meta();
    auto tag = take(meta.input_tag(i), "input tag");
    if (tag != executorch::runtime::Tag::Tensor) {
      throw std::runtime_error(
          "input " + std::to_string(i) + " is not a tensor; not supported");
    }
    auto tensor_meta = take(meta.input_tensor_meta(i), "input meta");
    TensorInfo info;
    info.dtype = static_cast<std::int8_t>(tensor_meta.scalar_type());
    for (auto s : tensor_meta.sizes()) {
      info.sizes.push_back(s);
    }
    return info;
  }

  void set_input(
      std::size_t i,
      std::int8_t dtype,
      rust::Slice<const std::int32_t> sizes,
      rust::Slice<const std::uint8_t> data) {
    if (i >= inputs_.size()) {
      throw std::runtime_error("input index out of range");
    }
    // No copy: the caller keeps `data` alive and unchanged for the session's
    // life (see set_input in ffi.rs), and ExecuTorch only reads it.
    inputs_[i] = executorch::extension::make_tensor_ptr(
        std::vector<executorch::aten::SizesType>(sizes.begin(), sizes.end()),
        const_cast<std::uint8_t*>(data.data()),
        static_cast<ScalarType>(dtype),
        executorch::aten::Device(executorch::aten::DeviceType::CPU),
        executorch::aten::TensorShapeDynamism::DYNAMIC_BOUND,
        [](void*) {});
    const Error err = method_->set_input(EValue(*inputs_[i]), i);
    if (err != Error::Ok) {
      fail("setting input " + std::to_string(i), err);
    }
  }

  // Planned memory may reuse an input's buffer once the input is dead, so
  // every execute starts by copying the inputs in again.
  void reload_inputs() {
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      if (!inputs_[i]) {
        throw std::runtime_error("input " + std::to_string(i) + " was never set");
      }
      const Error err = method_->set_input(EValue(*inputs_[i]), i);
      if (err != Error::Ok) {
        fail("setting input " + std::to_string(i), err);
      }
    }
  }

  // A copy of planned memory as load_method left it: the zeros above, with
  // any InitializedMutableBufferPass values copied in. Restoring it puts the
  // state that ExecuTorch owns (mutable buffers) back at its start, as the
  // backend option reset_state does for RustConv's own.
  void keep_initial_memory() {
    initial_planned_.clear();
    for (const auto& span : planned_spans_) {
      initial_planned_.emplace_back(span.data(), span.data() + span.size());
    }
  }

  void restore_initial_memory() {
    if (initial_planned_.size() != planned_spans_.size()) {
      throw std::runtime_error("restore_initial_memory before keep_initial_memory");
    }
    for (std::size_t i = 0; i < planned_spans_.size(); ++i) {
      std::memcpy(
          planned_spans_[i].data(), initial_planned_[i].data(), planned_spans_[i].size());
    }
  }

  void execute() {
    const Error err = method_->execute();
    if (err != Error::Ok) {
      fail("execute", err);
    }
  }

  std::size_t num_outputs() const { return method_->outputs_size(); }

  TensorInfo output_info(std::size_t i) const {
    return info_of(output(i));
  }

  rust::Slice<const std::uint8_t> output_data(std::size_t i) const {
    const auto& t = output(i);
    return {static_cast<const std::uint8_t*>(t.const_data_ptr()), t.nbytes()};
  }

  void write_etdump(rust::Str path) {
    if (!etdump_) {
      throw std::runtime_error("the session was opened without tracing");
    }
    const executorch::etdump::ETDumpResult result =
        etdump_->get_etdump_data();
    if (result.buf == nullptr || result.size == 0) {
      throw std::runtime_error("ETDump is empty");
    }
    const std::string file(path);
    std::FILE* f = std::fopen(file.c_str(), "wb");
    const bool ok = f != nullptr &&
        std::fwrite(result.buf, 1, result.size, f) == result.size;
    if (f != nullptr) {
      std::fclose(f);
    }
    std::free(result.buf);
    if (!ok) {
      throw std::runtime_error("cannot write ETDump to " + file);
    }
  }

 private:
  const executorch::aten::Tensor& output(std::size_t i) const {
    if (i >= method_->outputs_size()) {
      throw std::runtime_error("output index out of range");
    }
    const EValue& value = method_->get_output(i);
    if (!value.isTensor()) {
      throw std::runtime_error(
          "output " + std::to_string(i) + " is not a tensor; not supported");
    }
    return value.toTensor();
  }

  // Declared first, so destroyed last: the method reads the program.
  std::shared_ptr<LoadedProgram> program_;
  MallocMemoryAllocator method_allocator_;
  MallocMemoryAllocator temp_allocator_;
  std::vector<std::unique_ptr<std::uint8_t[]>> planned_buffers_;
  std::vector<Span<std::uint8_t>> planned_spans_;
  std::vector<std::vector<std::uint8_t>> initial_planned_;
  std::unique_ptr<HierarchicalAllocator> planned_memory_;
  std::unique_ptr<MemoryManager> memory_manager_;
  std::unique_ptr<executorch::etdump::ETDumpGen> etdump_;
  std::unique_ptr<Method> method_;
  std::vector<TensorPtr> inputs_;
};

Session::Session(std::unique_ptr<SessionImpl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

std::size_t Session::num_inputs() const {
  return impl_->num_inputs();
}
TensorInfo Session::input_info(std::size_t i) const {
  return impl_->input_info(i);
}
void Session::set_input(
    std::size_t i,
    std::int8_t dtype,
    rust::Slice<const std::int32_t> sizes,
    rust::Slice<const std::uint8_t> data) {
  impl_->set_input(i, dtype, sizes, data);
}
void Session::reload_inputs() {
  impl_->reload_inputs();
}
void Session::keep_initial_memory() {
  impl_->keep_initial_memory();
}
void Session::restore_initial_memory() {
  impl_->restore_initial_memory();
}
void Session::execute() {
  impl_->execute();
}
std::size_t Session::num_outputs() const {
  return impl_->num_outputs();
}
TensorInfo Session::output_info(std::size_t i) const {
  return impl_->output_info(i);
}
rust::Slice<const std::uint8_t> Session::output_data(std::size_t i) const {
  return impl_->output_data(i);
}
void Session::write_etdump(rust::Str path) {
  impl_->write_etdump(path);
}

std::shared_ptr<LoadedProgram> open_program(
    rust::Str model_path,
    bool minimal_verification) {
  return std::make_shared<LoadedProgram>(std::make_unique<LoadedProgram::Impl>(
      std::string(model_path), minimal_verification));
}

std::unique_ptr<Session> load_method(
    const std::shared_ptr<LoadedProgram>& program,
    rust::Str method_name,
    bool trace) {
  if (!program) {
    throw std::runtime_error("no program");
  }
  return std::make_unique<Session>(
      std::make_unique<SessionImpl>(program, std::string(method_name), trace));
}

void set_num_threads(std::uint32_t num_threads) {
  auto* pool = executorch::extension::threadpool::get_threadpool();
  if (pool == nullptr || !pool->_unsafe_reset_threadpool(num_threads)) {
    throw std::runtime_error("cannot resize ExecuTorch's thread pool");
  }
  executorch::runtime::BackendOptions<1> options;
  options.set_option("num_threads", static_cast<int>(num_threads));
  const Error err =
      executorch::runtime::set_option("RustConvBackend", options.view());
  if (err != Error::Ok) {
    fail("set_option(RustConvBackend, num_threads)", err);
  }
}

void set_rustconv_threads(std::uint32_t num_threads) {
  executorch::runtime::BackendOptions<1> options;
  options.set_option("num_threads", static_cast<int>(num_threads));
  const Error err =
      executorch::runtime::set_option("RustConvBackend", options.view());
  if (err != Error::Ok) {
    fail("set_option(RustConvBackend, num_threads)", err);
  }
}

void reset_state() {
  executorch::runtime::BackendOptions<1> options;
  options.set_option("reset_state", true);
  const Error err =
      executorch::runtime::set_option("RustConvBackend", options.view());
  if (err != Error::Ok) {
    fail("set_option(RustConvBackend, reset_state)", err);
  }
}

void load_library(rust::Str path) {
  const std::string file(path);
  // RTLD_NOW: an unresolved symbol is an error here, not a crash at the
  // first call. RTLD_GLOBAL: a library loaded for the symbols of those loaded
  // after it (libpython, for the LLM custom ops' library) must export them.
  // Never closed: the kernels it registered point into it.
  if (dlopen(file.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error(
        "cannot load " + file + ": " + (why != nullptr ? why : "unknown error"));
  }
}

bool has_operator(rust::Str name) {
  // A walk over the registered kernels rather than registry_has_op_function,
  // which logs an error for every name it does not find.
  const std::string op(name);
  for (const auto& kernel : executorch::runtime::get_registered_kernels()) {
    if (kernel.name_ != nullptr && op == kernel.name_) {
      return true;
    }
  }
  return false;
}

rust::Vec<rust::String> registered_backends() {
  rust::Vec<rust::String> names;
  const size_t n = executorch::runtime::get_num_registered_backends();
  for (size_t i = 0; i < n; ++i) {
    auto name = executorch::runtime::get_backend_name(i);
    if (name.ok()) {
      names.push_back(rust::String(name.get()));
    }
  }
  return names;
}

} // namespace runner
} // namespace rustconv
