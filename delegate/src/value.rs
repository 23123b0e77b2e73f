//! A graph's values: their dtype, dimensions and role (input, output,
//! constant, intermediate, state). Decoded by `graph`; read by the steps and
//! the op descriptions, which know nothing of the graph around them.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
        }
    }
}

/// One dimension: a fixed size, or a dynamic one with its upper bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DimSpec {
    pub size: usize,
    pub dynamic: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    Input(usize),
    Output(usize),
    /// Byte range within the constant segment.
    Constant {
        offset: usize,
        len: usize,
    },
    Intermediate,
    /// A mutable buffer the delegate owns across calls: its initial value is
    /// this byte range of the constant segment, and after every call it takes
    /// the contents of value `update`.
    State {
        offset: usize,
        len: usize,
        update: usize,
    },
}

#[derive(Clone, Debug)]
pub struct ValueDesc {
    pub name: String,
    pub dtype: DType,
    pub dims: Vec<DimSpec>,
    pub role: Role,
}

impl ValueDesc {
    /// Checks that the value has rank `want`; the error names it as `what`
    /// (a node's static checks word their reasons so).
    pub fn check_rank(&self, want: usize, what: &str) -> Result<(), String> {
        let got = self.dims.len();
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "{what} '{}' has rank {got}, expected {want}",
                self.name
            ))
        }
    }

    /// The shape at the upper bounds.
    pub fn bound_shape(&self) -> crate::shape::Shape {
        crate::shape::Shape::new(&self.dims.iter().map(|d| d.size).collect::<Vec<_>>())
    }

    /// Element count at the upper bounds.
    pub fn max_numel(&self) -> usize {
        self.dims.iter().map(|d| d.size).product()
    }
}
