//! Which constants `execute` still reads once the plan is built, and the
//! compact copy of them that lets ExecuTorch free the blob after `init`.
//!
//! A kernel that transforms its weights at init (the depthwise FFT's filter
//! spectra) never reads the originals again, so keeping the whole blob
//! would hold those weights twice. Like XNNPACK, which packs weights and
//! frees the processed buffer, the delegate then copies out only what
//! `execute` reads and tells backend.cpp to free the rest. When every
//! constant is still read (every other conv algorithm reads its weights in
//! place), they are used in place instead: a copy would only add an
//! init-time peak.

use crate::graph::Role;
use crate::memory::{AlignedBuf, ARENA_ALIGNMENT};
use crate::plan::{Location, Plan};

impl Plan {
    /// For each value, whether some step reads its data during `execute`
    /// (a weight an algorithm transformed at init is not read).
    fn read_at_execute(&self) -> Vec<bool> {
        let mut read = vec![false; self.values.len()];
        for step in &self.steps {
            for &v in &step.reads {
                read[v] = true;
            }
        }
        read
    }

    /// Whether some constant in the segment is no longer read.
    pub fn has_unread_constants(&self) -> bool {
        let read = self.read_at_execute();
        self.locations
            .iter()
            .enumerate()
            .any(|(v, l)| matches!(l, Location::Constant(_)) && !read[v])
    }

    /// Copies the constants `execute` reads out of `segment` (the constant
    /// segment the plan's [`Location::Constant`] offsets point into) into one
    /// aligned buffer, points their locations at it, and marks the others
    /// [`Location::Released`]. After this the plan needs nothing from the
    /// blob.
    pub fn retain_constants(&mut self, segment: &[u8]) -> AlignedBuf {
        let read = self.read_at_execute();
        let mut kept = Vec::new();
        let mut size = 0usize;
        for (v, location) in self.locations.iter_mut().enumerate() {
            if let (Location::Constant(from), Role::Constant { len, .. }) =
                (*location, &self.values[v].role)
            {
                if read[v] {
                    let to = size.next_multiple_of(ARENA_ALIGNMENT);
                    kept.push((from, to, *len));
                    *location = Location::Constant(to);
                    size = to + len;
                } else {
                    *location = Location::Released;
                }
            }
        }
        let mut buf = AlignedBuf::zeroed(size);
        let bytes = buf.as_mut_slice();
        for (from, to, len) in kept {
            bytes[to..to + len].copy_from_slice(&segment[from..from + len]);
        }
        buf
    }

    /// Drops the f32 copies of float16 constants that `execute` no longer
    /// reads (they were made for kernel preparation).
    pub fn drop_unread_converted(&mut self) {
        let read = self.read_at_execute();
        let mut converted = Vec::new();
        for (v, location) in self.locations.iter_mut().enumerate() {
            match *location {
                Location::Converted(from) if read[v] => {
                    let n = self.values[v].max_numel();
                    *location = Location::Converted(converted.len());
                    converted.extend_from_slice(&self.converted[from..from + n]);
                }
                Location::Converted(_) => *location = Location::Released,
                _ => {}
            }
        }
        self.converted = converted;
    }
}
