//! The weights a conv is prepared with: constant or fed at run time (see
//! `prepared.rs`). Its own module because both the preparation and every
//! algorithm's `prepare` take it, and neither should import the other.

/// The weights a conv is prepared with.
#[derive(Clone, Copy, Debug)]
pub enum Weights<'a> {
    /// Known at prepare and the same at every call (a constant of the
    /// model): algorithms may derive data from them once.
    Constant(&'a [f32]),
    /// Fed at run time, possibly different at every call: every algorithm
    /// reads each call's weights, and nothing is derived from them ahead.
    Fed,
}

impl Weights<'_> {
    /// Whether these are [`Weights::Fed`].
    pub(crate) fn fed(&self) -> bool {
        matches!(self, Weights::Fed)
    }
}
