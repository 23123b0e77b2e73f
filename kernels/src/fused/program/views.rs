//! The view algebra of a [`Program`]: lines mapped through views without
//! reading data (how a leaf reads the root's lines, the strides a line
//! reads).

use super::{resolve_start, Env, Expr, Line, Program};
use crate::fused::shape::MAX_RANK;

impl Program {
    /// The line a view node (broadcast, permute / squeeze, slice) reads of
    /// its operand when asked for `line`; any other node's `line` itself.
    pub(crate) fn view_line(&self, i: usize, env: &dyn Env, line: &Line) -> Line {
        self.view_map(i, env).apply(line)
    }

    /// How view node `i` maps its lines to its operand's, for `env`'s
    /// current shapes: asked of the env once, then applied to any number
    /// of lines (a leaf's base and one unit step per dimension).
    fn view_map(&self, i: usize, env: &dyn Env) -> ViewMap {
        let node = &self.nodes[i];
        match node.expr {
            Expr::Broadcast { x } => {
                let (to, from) = (env.shape(node.value), env.shape(self.nodes[x].value));
                let mut keep = [None; MAX_RANK];
                let lead = to.rank() - from.rank();
                for (d, k) in keep.iter_mut().enumerate().take(from.rank()) {
                    if from[d] != 1 {
                        *k = Some((d + lead) as u8);
                    }
                }
                ViewMap::Gather(keep)
            }
            Expr::Slice {
                x,
                dim,
                start,
                step,
            } => {
                let size = env.shape(self.nodes[x].value)[dim];
                ViewMap::Slice {
                    dim,
                    start: resolve_start(start, size),
                    step,
                }
            }
            Expr::View { map, .. } => {
                // Child dimension `m` is this node's `d` where `map[d] = m`.
                let mut keep = [None; MAX_RANK];
                for (d, m) in map.iter().enumerate().take(env.shape(node.value).rank()) {
                    if let Some(m) = *m {
                        keep[m as usize] = Some(d as u8);
                    }
                }
                ViewMap::Gather(keep)
            }
            _ => ViewMap::Same,
        }
    }

    /// [`Self::view_map`] for a way down into part `part` of a cat (a
    /// shift back by the parts before it along the cat's dimension, the
    /// part's own coordinates); any other node's view map.
    fn view_map_into(&self, i: usize, part: usize, env: &dyn Env) -> ViewMap {
        match self.nodes[i].expr {
            Expr::Cat { ref parts, dim } => ViewMap::Shift {
                dim,
                by: parts[..part]
                    .iter()
                    .map(|&p| env.shape(self.nodes[p].value)[dim])
                    .sum(),
            },
            _ => self.view_map(i, env),
        }
    }

    /// The origin of node `views[0]`'s coordinates and a unit step along
    /// each dimension, mapped down through `views` (outermost first; into
    /// part `parts[k]` of a cat `views[k]`): each view's shapes are asked
    /// once. Below a cat's shift the origin's coordinates wrap around
    /// (they are negative); every map is affine, so wrapping arithmetic
    /// gives the right element for every line that lies in the part.
    fn down_through(
        &self,
        views: &[usize],
        parts: &[u8],
        env: &dyn Env,
    ) -> (Line, [Line; MAX_RANK]) {
        let mut base = Line::default();
        let mut units = [Line::default(); MAX_RANK];
        for (d, u) in units.iter_mut().enumerate() {
            u.step[d] = 1;
        }
        for (k, &v) in views.iter().enumerate() {
            let part = parts.get(k).map_or(0, |&p| usize::from(p));
            let map = self.view_map_into(v, part, env);
            base = map.apply(&base);
            for u in &mut units {
                *u = map.apply(u);
            }
        }
        (base, units)
    }

    /// Where a cat `cat` below `views` (as for [`Self::down_through`]) is
    /// along its dimension at root coordinates `c`: `offset + sum(c[d] *
    /// coef[d])` (wrapping, as there), and where each of its parts starts
    /// along it, then its end (`bounds[k]..bounds[k + 1]` is part `k`);
    /// `None` for any other node, or more parts than `bounds` holds.
    pub(crate) fn cat_coordinate<const P: usize>(
        &self,
        views: &[usize],
        parts: &[u8],
        cat: usize,
        env: &dyn Env,
    ) -> Option<(usize, [usize; MAX_RANK], [usize; P])> {
        let Expr::Cat { parts: ref of, dim } = self.nodes[cat].expr else {
            return None;
        };
        let mut bounds = [0; P];
        for (k, &p) in of.iter().enumerate() {
            *bounds.get_mut(k + 1)? = bounds[k] + env.shape(self.nodes[p].value)[dim];
        }
        let (base, units) = self.down_through(views, parts, env);
        Some((base.base[dim], units.map(|u| u.step[dim]), bounds))
    }

    /// Whether node `i` is a *leaf*: a stored tensor or a constant, read
    /// through views only (what [`Self::leaf_map`] resolves).
    pub(crate) fn is_leaf(&self, mut i: usize) -> bool {
        loop {
            match self.nodes[i].expr {
                Expr::Load | Expr::Const(_) => return true,
                Expr::Broadcast { x } | Expr::View { x, .. } | Expr::Slice { x, .. } => i = x,
                _ => return false,
            }
        }
    }

    /// How leaf `i` (see [`Self::is_leaf`]) reads any line of the root,
    /// its geometry resolved for the env's current shapes and bound to the
    /// env's data ([`LeafGeometry::bind`]). `None` for other nodes.
    pub(crate) fn leaf_map<'e>(&self, i: usize, env: &'e dyn Env) -> Option<LeafMap<'e>> {
        Some(self.leaf_geometry(i, env)?.bind(env))
    }

    /// Where leaf `i` (see [`Self::is_leaf`]) reads any line of the root,
    /// from the env's current shapes alone: the views between a stored
    /// tensor and the root are affine maps of coordinates, so an element's
    /// offset is `offset + sum(coord[d] * coef[d])` over the root's
    /// dimensions. `None` for other nodes.
    pub(crate) fn leaf_geometry(&self, i: usize, env: &dyn Env) -> Option<LeafGeometry> {
        if let Some(c) = self.leaf_const(i) {
            return Some(LeafGeometry::Const(c));
        }
        // The origin and a unit step along each dimension, mapped down to
        // the load together: each view's shapes are asked once.
        let mut base = Line::default();
        let mut units = [Line::default(); MAX_RANK];
        for (d, u) in units.iter_mut().enumerate() {
            u.step[d] = 1;
        }
        let mut i = i;
        loop {
            let node = &self.nodes[i];
            match node.expr {
                Expr::Load => {
                    let shape = env.shape(node.value);
                    let strides = shape.strides();
                    let rank = shape.rank();
                    let at = |v: &[usize; MAX_RANK]| -> usize {
                        (0..rank).map(|d| v[d] * strides[d]).sum()
                    };
                    return Some(LeafGeometry::Stored {
                        value: node.value,
                        offset: at(&base.base),
                        coef: units.map(|u| at(&u.step)),
                    });
                }
                Expr::Broadcast { x } | Expr::View { x, .. } | Expr::Slice { x, .. } => {
                    let map = self.view_map(i, env);
                    base = map.apply(&base);
                    for u in &mut units {
                        *u = map.apply(u);
                    }
                    i = x;
                }
                _ => return None,
            }
        }
    }

    /// [`Self::leaf_geometry`] of leaf `i` for lines of another node's
    /// coordinates, `views` the view nodes between that node and `i`'s
    /// (outermost first): how `i` reads the lines of a node above views.
    pub(crate) fn leaf_geometry_through(
        &self,
        views: &[usize],
        i: usize,
        env: &dyn Env,
    ) -> Option<LeafGeometry> {
        self.leaf_geometry_into(views, &[], i, env)
    }

    /// [`Self::leaf_geometry_through`] where the way down goes into part
    /// `parts[k]` of a cat `views[k]` (see [`Self::down_through`]).
    pub(crate) fn leaf_geometry_into(
        &self,
        views: &[usize],
        parts: &[u8],
        i: usize,
        env: &dyn Env,
    ) -> Option<LeafGeometry> {
        let geometry = self.leaf_geometry(i, env)?;
        let LeafGeometry::Stored {
            value,
            offset,
            coef,
        } = geometry
        else {
            return Some(geometry);
        };
        let at = |at: &[usize; MAX_RANK]| -> usize {
            at.iter()
                .zip(&coef)
                .fold(0, |sum, (&c, &k)| sum.wrapping_add(c.wrapping_mul(k)))
        };
        let (base, units) = self.down_through(views, parts, env);
        Some(LeafGeometry::Stored {
            value,
            offset: offset.wrapping_add(at(&base.base)),
            coef: units.map(|u| at(&u.step)),
        })
    }

    /// Whether rows of `len` elements along dimension `along` of node `i`,
    /// consecutive along `across`, lie end to end
    /// ([`LeafMap::rows_end_to_end`]) in every leaf `i` reads through
    /// elementwise ops. False where `i` reads anything else (a cat, a view
    /// of a computed value, the anchor).
    pub(crate) fn rows_end_to_end(
        &self,
        i: usize,
        env: &dyn Env,
        across: usize,
        along: usize,
        len: usize,
    ) -> bool {
        if self.is_leaf(i) {
            return self
                .leaf_map(i, env)
                .is_some_and(|l| l.rows_end_to_end(across, along, len));
        }
        let ok = |x: usize| self.rows_end_to_end(x, env, across, along, len);
        match self.nodes[i].expr {
            Expr::Unary { x, .. } | Expr::Clamp { x, .. } => ok(x),
            Expr::Binary { a, b, .. } => ok(a) && ok(b),
            Expr::Where { cond, a, b } => ok(cond) && ok(a) && ok(b),
            _ => false,
        }
    }

    /// The constant leaf `i` is, if it is one (through views).
    fn leaf_const(&self, mut i: usize) -> Option<f32> {
        loop {
            match self.nodes[i].expr {
                Expr::Const(c) => return Some(c),
                Expr::Broadcast { x } | Expr::View { x, .. } | Expr::Slice { x, .. } => i = x,
                _ => return None,
            }
        }
    }
}

/// A view node's map of lines to its operand's, its shapes resolved
/// ([`Program::view_line`]).
#[derive(Clone, Copy, Debug)]
enum ViewMap {
    /// Child dimension `d` is this node's `keep[d]` (its base and step), or
    /// 0 where `None` (a broadcast dimension, a squeezed one).
    Gather([Option<u8>; MAX_RANK]),
    /// Along `dim`, from `start`, every `step`-th element.
    Slice {
        dim: usize,
        start: usize,
        step: usize,
    },
    /// Along `dim`, `by` fewer (into a cat's part: see
    /// [`Program::down_through`]).
    Shift { dim: usize, by: usize },
    /// Not a view.
    Same,
}

impl ViewMap {
    fn apply(&self, line: &Line) -> Line {
        match *self {
            ViewMap::Gather(keep) => {
                let mut child = Line::default();
                for (d, k) in keep.iter().enumerate() {
                    if let Some(k) = *k {
                        child.base[d] = line.base[k as usize];
                        child.step[d] = line.step[k as usize];
                    }
                }
                child
            }
            ViewMap::Slice { dim, start, step } => {
                let mut child = *line;
                // Wrapping: below a cat's shift (`Program::down_through`).
                child.base[dim] = start.wrapping_add(step.wrapping_mul(line.base[dim]));
                child.step[dim] = step * line.step[dim];
                child
            }
            ViewMap::Shift { dim, by } => {
                let mut child = *line;
                child.base[dim] = line.base[dim].wrapping_sub(by);
                child
            }
            ViewMap::Same => *line,
        }
    }
}

/// Where a leaf's elements lie for one set of shapes
/// ([`Program::leaf_geometry`]): a [`LeafMap`] before its data is read.
/// It depends on shapes alone, so a compiled program keeps its recipes'
/// geometries for the calls of one shape generation (`compiled.rs`) and
/// binds each call's data to them ([`Self::bind`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum LeafGeometry {
    /// A constant.
    Const(f32),
    /// Stored value `value`: the element at root coordinates `c` is its
    /// `offset + sum(c[d] * coef[d])`-th.
    Stored {
        value: usize,
        offset: usize,
        coef: [usize; MAX_RANK],
    },
}

impl LeafGeometry {
    /// The leaf read from `env`'s data: the one part of a [`LeafMap`] that
    /// changes between calls of the same shapes.
    pub(crate) fn bind<'e>(&self, env: &'e dyn Env) -> LeafMap<'e> {
        match *self {
            LeafGeometry::Const(c) => LeafMap::Const(c),
            LeafGeometry::Stored {
                value,
                offset,
                coef,
            } => LeafMap::Stored {
                data: env.data(value),
                offset,
                coef,
            },
        }
    }
}

/// How a leaf reads the root's lines ([`Program::leaf_map`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum LeafMap<'a> {
    /// A constant.
    Const(f32),
    /// A stored tensor: the element at root coordinates `c` is
    /// `data[offset + sum(c[d] * coef[d])]`.
    Stored {
        data: &'a [f32],
        offset: usize,
        coef: [usize; MAX_RANK],
    },
}

impl<'a> LeafMap<'a> {
    /// Whether rows of `len` elements along root dimension `along`,
    /// consecutive along `across`, lie end to end in this leaf (or are one
    /// value of it): then one line of several such rows, from the first
    /// one's start, reads those rows in order. The one test behind
    /// [`Program::rows_end_to_end`] and the flat form's
    /// `rows_are_one_line`.
    pub(crate) fn rows_end_to_end(&self, across: usize, along: usize, len: usize) -> bool {
        match *self {
            LeafMap::Const(_) => true,
            LeafMap::Stored { coef, .. } => {
                (coef[along], coef[across]) == (1, len) || (coef[along], coef[across]) == (0, 0)
            }
        }
    }

    /// The `len` elements along `line` when they need no copy: one value
    /// repeated (a constant, or a stored tensor read with stride 0, such
    /// as a per-channel parameter along time) or a contiguous run of a
    /// stored tensor. `None` for strided reads, which [`Program::eval`]
    /// gathers.
    ///
    /// # Panics
    /// If the line leaves its tensor (a bug of the caller's plan, as in
    /// [`Program::eval`]).
    #[inline]
    pub(crate) fn read(&self, line: &Line, len: usize) -> Option<Leaf<'a>> {
        match *self {
            LeafMap::Const(c) => Some(Leaf::Scalar(c)),
            LeafMap::Stored { data, offset, coef } => {
                let (start, stride) = start_and_stride(offset, &coef, line);
                match stride {
                    0 => Some(Leaf::Scalar(data[start])),
                    1 => {
                        let end = start + len;
                        let ahead = &data[end.min(data.len())..(end + len).min(data.len())];
                        Some(Leaf::Contiguous(&data[start..end], ahead))
                    }
                    _ => None,
                }
            }
        }
    }
}

impl<'a> LeafMap<'a> {
    /// The `len` elements along `line` of a leaf that [`Self::read`]
    /// declines (a stored tensor read with a stride of 2 or more: a
    /// transposed operand, a line across channels): the run from the first
    /// to the last, and the stride, for the caller to gather.
    ///
    /// # Panics
    /// If the line leaves its tensor, as [`Self::read`].
    #[inline]
    pub(crate) fn strided(&self, line: &Line, len: usize) -> Option<(&'a [f32], usize)> {
        match *self {
            LeafMap::Const(_) => None,
            LeafMap::Stored { data, offset, coef } => {
                let (start, stride) = start_and_stride(offset, &coef, line);
                let last = start + stride * len.checked_sub(1)?;
                (stride > 1).then(|| (&data[start..=last], stride))
            }
        }
    }
}

/// Where `line` starts in a stored leaf of `offset` and `coef`, and the
/// stride between its elements.
#[inline(always)]
fn start_and_stride(offset: usize, coef: &[usize; MAX_RANK], line: &Line) -> (usize, usize) {
    let mut start = offset;
    let mut stride = 0;
    for ((&b, &s), &c) in line.base.iter().zip(&line.step).zip(coef) {
        // Wrapping: a leaf inside a cat's part has an offset below 0
        // (`Program::down_through`); the sum is the element's index.
        start = start.wrapping_add(b * c);
        stride += s * c;
    }
    (start, stride)
}

/// A leaf's elements along a line, read in place ([`LeafMap::read`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Leaf<'a> {
    /// Every element is this value.
    Scalar(f32),
    /// The elements, in order, and as many after them as there are (the
    /// next line of a row walk, for the reader to prefetch while it
    /// computes this one: asked for all at once, at the line's start,
    /// the prefetches of three streams stalled on the memory system).
    Contiguous(&'a [f32], &'a [f32]),
}

impl Program {
    /// The largest element stride of the stored tensors the root's `line`
    /// reads (0 where it reads none): 1 is contiguous, larger means a
    /// strided gather. Walks the tree as [`Self::eval`] does, reading no
    /// data.
    pub fn max_load_stride(&self, env: &dyn Env, line: &Line) -> usize {
        self.stride_of(self.root(), env, line)
    }

    fn stride_of(&self, i: usize, env: &dyn Env, line: &Line) -> usize {
        let node = &self.nodes[i];
        let child_line = |x: usize| -> Line {
            let mut child = Line::default();
            match node.expr {
                Expr::Broadcast { .. } => {
                    let (to, from) = (env.shape(node.value), env.shape(self.nodes[x].value));
                    let lead = to.rank() - from.rank();
                    for d in 0..from.rank() {
                        if from[d] != 1 {
                            child.base[d] = line.base[d + lead];
                            child.step[d] = line.step[d + lead];
                        }
                    }
                }
                Expr::View { map, .. } => {
                    for (d, m) in map.iter().enumerate().take(env.shape(node.value).rank()) {
                        if let Some(m) = *m {
                            child.base[m as usize] = line.base[d];
                            child.step[m as usize] = line.step[d];
                        }
                    }
                }
                Expr::Slice { dim, step, .. } => {
                    child = *line;
                    child.base[dim] = 0;
                    child.step[dim] = step * line.step[dim];
                }
                _ => child = *line,
            }
            child
        };
        match node.expr {
            Expr::Load => {
                let strides = env.shape(node.value).strides();
                (0..env.shape(node.value).rank())
                    .map(|d| line.step[d] * strides[d])
                    .sum()
            }
            Expr::Anchor | Expr::Const(_) => 0,
            Expr::Unary { x, .. }
            | Expr::Clamp { x, .. }
            | Expr::Broadcast { x }
            | Expr::View { x, .. }
            | Expr::Slice { x, .. } => self.stride_of(x, env, &child_line(x)),
            Expr::Binary { a, b, .. } => self
                .stride_of(a, env, line)
                .max(self.stride_of(b, env, line)),
            Expr::Where { cond, a, b } => self
                .stride_of(cond, env, line)
                .max(self.stride_of(a, env, line))
                .max(self.stride_of(b, env, line)),
            Expr::Cat { ref parts, dim } => parts
                .iter()
                .map(|&p| {
                    let mut child = *line;
                    child.base[dim] = 0;
                    self.stride_of(p, env, &child)
                })
                .max()
                .unwrap_or(0),
        }
    }
}
