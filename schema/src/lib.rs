//! Flatbuffer bindings for `schema/rustconv.fbs`.
//!
//! `generated/` is written by `scripts/gen_schema.sh` with the flatc that
//! ships in the pinned executorch wheel; never edit it by hand. The test
//! command runs `scripts/gen_schema.sh --check`, which fails when it is stale.

#[allow(
    clippy::all,
    clippy::pedantic,
    unused_imports,
    dead_code,
    non_camel_case_types,
    non_snake_case,
    unsafe_op_in_unsafe_fn,
    mismatched_lifetime_syntaxes
)]
#[rustfmt::skip]
mod generated {
    include!("generated/rustconv_generated.rs");
}

pub use generated::rustconv::fb::*;
