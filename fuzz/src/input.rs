//! A fuzz input read front to back as the choices a target makes.

/// Past the end every byte reads as 0, and 0 always means "as declared", so
/// a short input (a seed of one or two bytes) is a well-formed call.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// What is left, taken whole.
    pub fn rest(self) -> &'a [u8] {
        self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_in_order_then_zeros() {
        let mut input = Input::new(&[7, 9, 11]);
        assert_eq!(input.byte(), 7);
        assert_eq!(input.rest(), &[9, 11]);
        let mut empty = Input::new(&[]);
        assert_eq!((empty.byte(), empty.byte()), (0, 0));
    }
}
