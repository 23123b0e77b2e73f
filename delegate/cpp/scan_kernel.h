// The ExecuTorch operator kernel for `rustconv::linear_scan.out`: runs a
// linear scan that no delegate took (a program lowered without RustConv, an
// fp64 scan, a scan another partitioner left out). A plain scalar loop, the
// baseline; delegated scans run in the Rust kernels instead.
#pragma once

namespace rustconv {
namespace ffi {

// The name the kernel is registered under: the out variant that
// partitioner_py/rustconv/ops.py declares and to_executorch() emits.
inline constexpr const char* kLinearScanOutName = "rustconv::linear_scan.out";

// Registers the kernel with ExecuTorch's operator registry. Idempotent, and
// true (doing nothing) if some other copy of this code already registered a
// kernel under that name. False, with an ET_LOG line, if the registry refused.
bool register_linear_scan_kernel();

// Whether a kernel is registered under kLinearScanOutName, by this copy of the
// code or another.
bool linear_scan_kernel_registered();

} // namespace ffi
} // namespace rustconv
