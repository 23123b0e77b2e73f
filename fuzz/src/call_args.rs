//! Delegate call arguments as a host passes them: sizes, dtype, layout, byte
//! count and address all chosen by the fuzz input, but honest about memory.
//! The host's side of `CallArgs`' contract is that `nbytes` bytes at `data`
//! are readable and writable for the call, so every tensor here owns (or
//! points into another argument's) storage of at least `nbytes` bytes;
//! everything else it says may be wrong, and the delegate must refuse that.

use rustconv_backend::executor::{ArgTensor, CallArgs};
use rustconv_backend::graph::{DType, GraphDesc, ValueDesc};

use crate::input::Input;

/// No tensor here holds more, so a huge declared shape costs nothing: a
/// tensor whose sizes need more gets no storage and says `nbytes` 0.
const MAX_BYTES: usize = 1 << 24;

pub struct HostTensor {
    /// None: a dtype the delegate never handles.
    dtype: Option<DType>,
    sizes: Vec<i32>,
    contiguous: bool,
    /// `tensor(i)` answers None: the argument is not a tensor.
    missing: bool,
    /// Its data points into the storage of the first input that holds its
    /// `nbytes` (an output overlapping an input), if one does.
    aliased: bool,
    nbytes: usize,
    /// Usable bytes from `data` on: `nbytes` never exceeds it.
    capacity: usize,
    /// `base + offset`: offset 1 misaligns it for every dtype.
    data: *mut u8,
    /// Owns the bytes `data` points into; never touched again after `new`
    /// took `data` from it, so writes through `data` alias nothing.
    _storage: Vec<u64>,
}

fn elem_size(dtype: Option<DType>) -> usize {
    dtype.map_or(4, DType::size)
}

/// Elements of `sizes`, negative sizes counted as 0; None past `MAX_BYTES`.
fn numel(sizes: &[i32]) -> Option<usize> {
    sizes.iter().try_fold(1usize, |n, &s| {
        n.checked_mul(usize::try_from(s).unwrap_or(0))
            .filter(|&n| n <= MAX_BYTES)
    })
}

impl HostTensor {
    /// A tensor told to be `sizes`; `fill` gives element `i`'s value.
    /// `short`: `nbytes` one element less than the sizes need (an input) or
    /// half the room they need (an output, which the delegate may resize).
    fn new(
        dtype: Option<DType>,
        sizes: Vec<i32>,
        misaligned: bool,
        short: bool,
        output: bool,
        fill: impl Fn(usize) -> f32,
    ) -> Self {
        let elem = elem_size(dtype);
        let (nbytes, capacity) = match numel(&sizes) {
            Some(n) if n * elem <= MAX_BYTES => {
                let want = n * elem;
                match (short, output) {
                    (false, _) => (want, want),
                    (true, false) => (want.saturating_sub(elem), want),
                    (true, true) => (want / 2, want / 2),
                }
            }
            _ => (0, 0),
        };
        let offset = usize::from(misaligned);
        let mut storage = vec![0u64; (capacity + offset).div_ceil(8)];
        // SAFETY: `offset` is 0 or 1 and the storage holds `capacity + offset`
        // bytes, so `data..data + capacity` lies inside it.
        let data = unsafe { storage.as_mut_ptr().cast::<u8>().add(offset) };
        let mut t = HostTensor {
            dtype,
            sizes,
            contiguous: true,
            missing: false,
            aliased: false,
            nbytes,
            capacity,
            data,
            _storage: storage,
        };
        t.fill(fill);
        t
    }

    fn fill(&mut self, value: impl Fn(usize) -> f32) {
        // SAFETY: `data` points at `capacity` bytes this tensor owns (`new`),
        // borrowed mutably through `self`.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.data, self.capacity) };
        match self.dtype {
            Some(DType::F16) => {
                for (i, e) in bytes.chunks_exact_mut(2).enumerate() {
                    e.copy_from_slice(&half::f16::from_f32(value(i)).to_le_bytes());
                }
            }
            _ => {
                for (i, e) in bytes.chunks_exact_mut(4).enumerate() {
                    e.copy_from_slice(&value(i).to_le_bytes());
                }
            }
        }
    }
}

/// Element values an input is filled with, chosen by one byte: 0 a ramp of
/// small values, then the values kernels must survive.
pub fn pattern(choice: u8) -> impl Fn(usize) -> f32 {
    move |i| {
        let ramp = ((i * 37 % 17) as f32 - 8.0) * 0.125;
        match choice {
            0 => ramp,
            1 => f32::NAN,
            2 => f32::INFINITY,
            3 => f32::NEG_INFINITY,
            4 => 3.0e38,
            5 => 1.0e-40,
            6 => 0.0,
            7 => -0.0,
            c => ramp * (f32::from(c) - 128.0),
        }
    }
}

pub struct HostArgs {
    tensors: Vec<HostTensor>,
    inputs: usize,
    refuse_resize: bool,
}

impl HostArgs {
    /// Every input of `graph` at its declared bounds, filled with the ramp,
    /// and every output at its bounds: a call any valid plan must run.
    pub fn at_bounds(graph: &GraphDesc) -> Self {
        let mut tensors = Vec::new();
        for (list, output) in [(&graph.inputs, false), (&graph.outputs, true)] {
            for &v in list {
                let value = &graph.values[v];
                let sizes = value.dims.iter().map(|d| clamp_i32(d.size)).collect();
                tensors.push(HostTensor::new(
                    Some(value.dtype),
                    sizes,
                    false,
                    false,
                    output,
                    pattern(0),
                ));
            }
        }
        HostArgs {
            tensors,
            inputs: graph.inputs.len(),
            refuse_resize: false,
        }
    }

    /// The arguments of a call of `graph` as `input` describes them (zeros:
    /// as declared, at the bounds).
    ///
    /// One flags byte: bit 0 drops the last argument, bit 1 adds one, bit 2
    /// points the first output into an input, bit 3 refuses every
    /// resize. Then per argument, inputs then outputs, see [`describe`].
    pub fn adversarial(graph: &GraphDesc, input: &mut Input) -> Self {
        let flags = input.byte();
        let mut tensors = Vec::new();
        for (list, output) in [(&graph.inputs, false), (&graph.outputs, true)] {
            for &v in list {
                tensors.push(describe(&graph.values[v], output, input));
            }
        }
        if flags & 1 != 0 {
            tensors.pop();
        }
        if flags & 2 != 0 {
            tensors.push(HostTensor::new(
                Some(DType::F32),
                vec![1, 4],
                false,
                false,
                false,
                pattern(0),
            ));
        }
        let inputs = graph.inputs.len();
        if let Some(first_output) = tensors.get_mut(inputs) {
            first_output.aliased = flags & 4 != 0;
        }
        HostArgs {
            tensors,
            inputs,
            refuse_resize: flags & 8 != 0,
        }
    }

    /// The bytes each output holds now (after a successful call: what the
    /// delegate wrote).
    pub fn outputs(&self) -> Vec<Vec<u8>> {
        (self.inputs..self.tensors.len())
            .filter_map(|i| self.tensor(i))
            // SAFETY: `tensor` gives `nbytes` readable bytes at `data`.
            .map(|t| unsafe { std::slice::from_raw_parts(t.data, t.nbytes) }.to_vec())
            .collect()
    }
}

/// One argument for `value`: a kind byte (bits 0-1: 0 the declared dtype,
/// 1 the other one, 2 an unsupported one, 3 not a tensor; bit 2 not
/// contiguous; bit 3 misaligned; bit 4 short of bytes; bit 5 another rank,
/// from the next byte), then a byte per dimension (see [`size`]), then for
/// an input the fill [`pattern`].
fn describe(value: &ValueDesc, output: bool, input: &mut Input) -> HostTensor {
    let kind = input.byte();
    let dtype = match kind & 3 {
        1 => Some(match value.dtype {
            DType::F32 => DType::F16,
            DType::F16 => DType::F32,
        }),
        2 => None,
        _ => Some(value.dtype),
    };
    let rank = if kind & 32 != 0 {
        usize::from(input.byte() % 6)
    } else {
        value.dims.len()
    };
    let sizes = (0..rank)
        .map(|d| {
            let bound = value.dims.get(d).map_or(1, |d| d.size);
            size(bound, input.byte())
        })
        .collect();
    let fill = if output {
        pattern(1)
    } else {
        pattern(input.byte())
    };
    let mut t = HostTensor::new(dtype, sizes, kind & 8 != 0, kind & 16 != 0, output, fill);
    t.contiguous = kind & 4 == 0;
    t.missing = kind & 3 == 3;
    t
}

/// A dimension's size from one byte: 0 the bound; below 0x80 a size from 0
/// to the bound (a static dimension's wrong sizes among them); from 0x80,
/// outside: just over the bound, negative, `i32::MAX` or `i32::MIN`.
fn size(bound: usize, choice: u8) -> i32 {
    let bound = clamp_i32(bound);
    let small = i32::from(choice >> 2 & 0x1f);
    match choice {
        0 => bound,
        1..0x80 => bound - (i32::from(choice) % (bound.saturating_add(1))),
        _ => match choice & 3 {
            0 => bound.saturating_add(1 + small),
            1 => -1 - small,
            2 => i32::MAX,
            _ => i32::MIN,
        },
    }
}

fn clamp_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

impl CallArgs for HostArgs {
    fn count(&self) -> usize {
        self.tensors.len()
    }

    fn tensor(&self, i: usize) -> Option<ArgTensor<'_>> {
        let t = self.tensors.get(i)?;
        if t.missing {
            return None;
        }
        let mut inputs = self.tensors.iter().take(self.inputs);
        let host = if t.aliased {
            inputs.find(|input| input.capacity >= t.nbytes)
        } else {
            None
        };
        let data = host.unwrap_or(t).data;
        Some(ArgTensor {
            dtype: t.dtype,
            sizes: &t.sizes,
            contiguous: t.contiguous,
            nbytes: t.nbytes,
            data,
        })
    }

    fn resize(&mut self, i: usize, sizes: &[i32]) -> bool {
        let Some(t) = self.tensors.get_mut(i) else {
            return false;
        };
        if self.refuse_resize || sizes.len() != t.sizes.len() {
            return false;
        }
        let elem = elem_size(t.dtype);
        match numel(sizes).and_then(|n| n.checked_mul(elem)) {
            Some(bytes) if bytes <= t.capacity => {
                t.sizes = sizes.to_vec();
                t.nbytes = bytes;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_from_a_byte() {
        assert_eq!(size(16, 0), 16);
        assert_eq!(size(16, 3), 13);
        assert_eq!(size(16, 17), 16);
        assert_eq!(size(0, 5), 0);
        assert_eq!(size(16, 0x80), 17);
        assert_eq!(size(16, 0x81), -1);
        assert_eq!(size(16, 0x82), i32::MAX);
        assert_eq!(size(16, 0x83), i32::MIN);
        assert_eq!(size(usize::MAX, 0), i32::MAX);
    }

    #[test]
    fn never_claims_more_bytes_than_it_holds() {
        let t = HostTensor::new(
            Some(DType::F32),
            vec![i32::MAX, 2],
            true,
            false,
            false,
            pattern(0),
        );
        assert_eq!((t.nbytes, t.capacity), (0, 0));
        let mut args = HostArgs {
            tensors: vec![HostTensor::new(
                Some(DType::F16),
                vec![2, 3],
                true,
                true,
                true,
                pattern(0),
            )],
            inputs: 0,
            refuse_resize: false,
        };
        assert_eq!(args.tensors[0].nbytes, 6);
        assert_eq!(args.tensors[0].data as usize % 2, 1);
        assert!(args.resize(0, &[1, 3]));
        assert!(!args.resize(0, &[2, 3]), "past the capacity");
        assert!(!args.resize(0, &[3]), "another rank");
        assert_eq!(args.outputs()[0].len(), 6);
    }
}
