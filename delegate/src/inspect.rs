//! The plan as data, for `python -m rustconv.inspect`: per delegate call,
//! the fused kernels in order, the model's ops each absorbed, the algorithm,
//! and where every stored value lives in the arena and for how long.
//!
//! It is built by the same code `init` runs ([`Plan::build`]), so what it
//! shows is what the runtime will do with the blob on this machine.

use serde::Serialize;

use crate::blob::BlobLayout;
use crate::error::DelegateError;
use crate::graph::{GraphDesc, Role};
use crate::options::CompileOptions;
use crate::plan::{Location, Plan};
use crate::threads;

#[derive(Serialize)]
pub struct PlanDoc {
    /// Bytes of the arena holding every stored intermediate.
    pub arena_bytes: usize,
    /// Bytes of kernel scratch per thread.
    pub scratch_bytes_per_thread: usize,
    /// Bytes of kernel scratch shared by a call's threads (`fft_gemm`'s
    /// weights, packed per call).
    pub shared_scratch_bytes: usize,
    /// Bytes of delegate-owned state kept across calls (conv and scan
    /// states), plus as much again for their initial values (a reset).
    pub state_bytes: usize,
    pub threads: usize,
    pub kernels: Vec<KernelDoc>,
    pub values: Vec<ValueDoc>,
    /// The lines `init` logs.
    pub log: Vec<String>,
}

#[derive(Serialize)]
pub struct KernelDoc {
    /// The fused kernel's index, as recorded at export.
    pub kernel: u32,
    pub algorithm: &'static str,
    /// What runs in the kernel's loops and what goes through memory.
    pub fusion: String,
    pub absorbed: Vec<OpDoc>,
    pub reads: Vec<String>,
    pub writes: Vec<String>,
}

#[derive(Serialize)]
pub struct OpDoc {
    pub id: u32,
    pub name: String,
    pub op: &'static str,
    pub debug_handles: Vec<u32>,
}

#[derive(Serialize)]
pub struct ValueDoc {
    pub name: String,
    pub dtype: &'static str,
    /// Sizes at their upper bounds; dynamic ones are marked.
    pub dims: Vec<String>,
    pub role: &'static str,
    /// `arena`, `argument`, `constant`, `virtual` (computed where read,
    /// never stored), `released` (a weight transformed at init) or `state`
    /// (delegate-owned, kept across calls).
    pub location: &'static str,
    pub arena_offset: Option<usize>,
    /// Bytes stored as f32 at the upper bounds (0 for virtual values).
    pub bytes: usize,
    /// First and last kernel (positions in `kernels`) of an arena value.
    pub lifetime: Option<(usize, usize)>,
}

/// Plans `blob` with `specs` (compile-spec keys and values) as `init`
/// would, and describes the plan.
pub fn describe(blob: &[u8], specs: &[(String, Vec<u8>)]) -> Result<PlanDoc, DelegateError> {
    let mut options = CompileOptions::default();
    for (key, value) in specs {
        options.apply(key, value)?;
    }
    let layout = BlobLayout::parse(blob)?;
    let graph = GraphDesc::decode(blob, &layout)?;
    // Kernels read constants as f32: copy the segment to aligned memory.
    let segment = crate::memory::AlignedBuf::from_bytes(&blob[layout.constants.clone()]);
    // SAFETY: `from_bytes` filled the buffer's `len()` bytes.
    let segment = unsafe { std::slice::from_raw_parts(segment.as_ptr(), segment.len()) };
    let workers = threads::Workers::choose(options.num_threads)?;
    let plan = workers.run(|| Plan::build(graph, segment, &options))??;
    Ok(document(&plan, workers.threads()))
}

fn document(plan: &Plan, threads: usize) -> PlanDoc {
    let name = |v: usize| plan.values[v].name.clone();
    let kernels = plan
        .steps
        .iter()
        .map(|s| KernelDoc {
            kernel: s.kernel,
            algorithm: s.algorithm(),
            fusion: s.fusion_summary().trim_start_matches(", ").to_owned(),
            absorbed: s
                .absorbed
                .iter()
                .map(|a| OpDoc {
                    id: a.id,
                    name: a.name.clone(),
                    op: a.op,
                    debug_handles: a.debug_handles.clone(),
                })
                .collect(),
            reads: s.reads.iter().map(|&v| name(v)).collect(),
            writes: s.writes.iter().map(|&v| name(v)).collect(),
        })
        .collect();
    let values = plan
        .values
        .iter()
        .enumerate()
        .map(|(v, value)| {
            let location = plan.locations[v];
            ValueDoc {
                name: value.name.clone(),
                dtype: value.dtype.name(),
                dims: value
                    .dims
                    .iter()
                    .map(|d| {
                        if d.dynamic {
                            format!("<={}", d.size)
                        } else {
                            d.size.to_string()
                        }
                    })
                    .collect(),
                role: match value.role {
                    Role::Input(_) => "input",
                    Role::Output(_) => "output",
                    Role::Constant { .. } => "constant",
                    Role::Intermediate => "intermediate",
                    Role::State { .. } => "state",
                },
                location: match location {
                    Location::Arg(_) => "argument",
                    Location::Constant(_) | Location::Converted(_) => "constant",
                    Location::Arena(_) => "arena",
                    Location::Released => "released",
                    Location::Virtual => "virtual",
                    Location::State(_) => "state",
                    Location::NextState(_) => "next state",
                },
                arena_offset: match location {
                    Location::Arena(offset) => Some(offset),
                    _ => None,
                },
                bytes: match location {
                    Location::Virtual | Location::Released => 0,
                    _ => value.max_numel() * 4,
                },
                lifetime: plan.lifetimes[v],
            }
        })
        .collect();
    PlanDoc {
        arena_bytes: plan.arena_bytes,
        scratch_bytes_per_thread: plan.scratch_per_thread * 4,
        shared_scratch_bytes: plan.shared_scratch * 4,
        state_bytes: plan.state_bytes(),
        threads,
        kernels,
        values,
        log: plan.report.clone(),
    }
}

/// Compile specs as `python -m rustconv.inspect` sends them: a JSON list of
/// `[key, hex value]` pairs.
pub fn parse_specs(json: &[u8]) -> Result<Vec<(String, Vec<u8>)>, String> {
    let pairs: Vec<(String, String)> =
        serde_json::from_slice(json).map_err(|e| format!("compile specs: {e}"))?;
    pairs
        .into_iter()
        .map(|(key, hex)| {
            if hex.len() % 2 != 0 {
                return Err(format!("compile spec '{key}': odd-length hex"));
            }
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
                .collect::<Result<Vec<u8>, _>>()
                .map_err(|e| format!("compile spec '{key}': {e}"))?;
            Ok((key, bytes))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_from_hex_and_bad_ones_are_refused() {
        let specs = parse_specs(br#"[["num_threads", "02000000"]]"#).unwrap();
        assert_eq!(specs, vec![("num_threads".to_owned(), vec![2, 0, 0, 0])]);
        assert!(parse_specs(b"[[\"k\", \"0\"]]").is_err());
        assert!(parse_specs(b"not json").is_err());
    }
}
