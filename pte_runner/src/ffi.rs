//! cxx bridge to cpp/runner.cpp, the part of pte_runner that drives
//! ExecuTorch's C++ Program/Method API.

#[cxx::bridge(namespace = "rustconv::runner")]
pub mod bridge {
    /// A tensor's ExecuTorch ScalarType code and sizes.
    struct TensorInfo {
        dtype: i8,
        sizes: Vec<i32>,
    }

    unsafe extern "C++" {
        include!("rustconv-pte-runner/cpp/runner.h");

        type LoadedProgram;
        type Session;
        fn open_program(
            model_path: &str,
            minimal_verification: bool,
        ) -> Result<SharedPtr<LoadedProgram>>;
        fn load_method(
            program: &SharedPtr<LoadedProgram>,
            method_name: &str,
            trace: bool,
        ) -> Result<UniquePtr<Session>>;
        fn num_inputs(self: &Session) -> usize;
        fn input_info(self: &Session, i: usize) -> Result<TensorInfo>;
        /// # Safety
        /// The session reads `data` in place at every later `reload_inputs`
        /// and `execute`: it must stay alive and unchanged until the session
        /// is dropped.
        unsafe fn set_input(
            self: Pin<&mut Session>,
            i: usize,
            dtype: i8,
            sizes: &[i32],
            data: &[u8],
        ) -> Result<()>;
        fn reload_inputs(self: Pin<&mut Session>) -> Result<()>;
        fn keep_initial_memory(self: Pin<&mut Session>);
        fn restore_initial_memory(self: Pin<&mut Session>) -> Result<()>;
        fn execute(self: Pin<&mut Session>) -> Result<()>;
        fn num_outputs(self: &Session) -> usize;
        fn output_info(self: &Session, i: usize) -> Result<TensorInfo>;
        fn output_data(self: &Session, i: usize) -> Result<&[u8]>;
        fn write_etdump(self: Pin<&mut Session>, path: &str) -> Result<()>;

        fn set_num_threads(num_threads: u32) -> Result<()>;
        fn set_rustconv_threads(num_threads: u32) -> Result<()>;
        fn reset_state() -> Result<()>;
        fn registered_backends() -> Vec<String>;
        /// dlopen with RTLD_NOW | RTLD_GLOBAL; the library is never closed.
        ///
        /// # Safety
        /// Loading runs the library's static initialisers in this process:
        /// it must be a library meant to be loaded into an ExecuTorch
        /// program runner (an operator library built against this runtime,
        /// as the user's `-kernel_lib` and the executorch wheel's own LLM
        /// custom ops are), or one such a library needs (libpython).
        unsafe fn load_library(path: &str) -> Result<()>;
        fn has_operator(name: &str) -> bool;
    }
}

// SAFETY: a Session is one load of one method (cpp/runner.cpp's
// SessionImpl): its Method, planned memory, inputs and delegate instances
// belong to it alone. What it shares with other sessions is only read once
// they are loaded (the LoadedProgram, held through a std::shared_ptr whose
// count is atomic, so the last session dropped frees it on any thread;
// ExecuTorch's operator and backend registries) or locks itself
// (ExecuTorch's pthreadpool, our kernels' pools, the delegate's state
// mutex). So a session may move to another thread and sessions may run on
// different threads at once; `execute` takes it by `Pin<&mut>`, so one
// session never runs on two threads at once. concurrent.rs does exactly
// this; tests/test_concurrency.py and its ThreadSanitizer run
// (scripts/sanitize.sh --thread) exercise it.
unsafe impl Send for bridge::Session {}
