//! From the fused kernels the exporter recorded (`Node.kernel`) to what
//! each runs: which values are materialised, the statistics it gathers
//! first, the anchor's operands as stored values or prologue programs, the
//! epilogue, or the programs of a pass. The rules are schema/README.md's
//! "Fused kernels"; a grouping that breaks them is refused here, at init,
//! naming the kernel and the reason.
//!
//! A `Reduce` node needs all of its input before any element of its result
//! exists, so it cannot run inside the loops that read it: its result is
//! computed by the kernel's *statistics pass* (`rustconv_kernels::fused::reduce`),
//! into a stored value, before the kernel's main loop, whose programs then
//! load it (through the broadcasts the model applies). Reductions of one
//! input over the same dimensions (a LayerNorm's mean and variance) form one
//! [`Statistics`] group, gathered in one walk.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ops::Range;

use rustconv_kernels::fused::{CompiledProgram, Expr, Program, ReduceOp, StoreView};
use rustconv_kernels::MAX_RANK;

use crate::error::GraphError;
use crate::graph::{GraphDesc, NodeDesc, OpDesc, Operand, Role};
use crate::step::{AnchorOp, CopyStep, Epilogue, Fused, Operands, PassStep, Source, StepKind};

/// What a kernel computes before its main loop, into stored values its
/// programs then load.
#[derive(Debug)]
pub struct Statistics {
    /// Over the kernel's nodes (never its anchor), reading earlier
    /// statistics as stored.
    pub program: CompiledProgram,
    pub kind: StatisticsKind,
}

#[derive(Debug)]
pub enum StatisticsKind {
    /// Reductions of the program over the same dimensions, gathered in one
    /// walk.
    Reduce {
        /// The reduced dimensions of the program's root.
        dims: [bool; MAX_RANK],
        /// Each statistic and the value it is stored into (each op once).
        outputs: Vec<(ReduceOp, usize)>,
        /// The value the program computes (the `Reduce` nodes' input).
        input: usize,
    },
    /// An elementwise function of earlier statistics alone, of their shape
    /// (a LayerNorm's `rsqrt(var + eps)`), computed once per statistic
    /// rather than at every element that reads it through a broadcast.
    Derived {
        /// The value the program computes, stored.
        value: usize,
        /// Its op's name, for the plan.
        op: &'static str,
    },
}

impl Statistics {
    /// The values it stores.
    pub fn values(&self) -> Vec<usize> {
        match &self.kind {
            StatisticsKind::Reduce { outputs, .. } => outputs.iter().map(|&(_, v)| v).collect(),
            StatisticsKind::Derived { value, .. } => vec![*value],
        }
    }
}

/// One fused kernel, as recorded in the blob and checked.
#[derive(Debug)]
pub struct Kernel {
    /// The exporter's kernel index (the node's position when the blob has
    /// no grouping).
    pub index: u32,
    /// Positions of its nodes in `GraphDesc::nodes`.
    pub nodes: Range<usize>,
    /// The materialised values its main loop writes (an anchor kernel's
    /// result first); the statistics' values are in `statistics`.
    pub writes: Vec<usize>,
    /// Gathered before the main loop, in order (a group may read an
    /// earlier one's values).
    pub statistics: Vec<Statistics>,
    /// How it runs, from here to execution.
    pub body: Box<dyn StepKind>,
}

/// Splits the graph's nodes into kernels and builds each.
/// Returns the kernels and, per value, whether it is materialised.
pub fn build(graph: &GraphDesc) -> Result<(Vec<Kernel>, Vec<bool>), GraphError> {
    let ranges = kernel_ranges(&graph.nodes)?;
    let mut kernel_of_node = vec![0; graph.nodes.len()];
    for (k, r) in ranges.iter().enumerate() {
        kernel_of_node[r.clone()].fill(k);
    }
    let mut producer = vec![None; graph.values.len()];
    for (n, node) in graph.nodes.iter().enumerate() {
        producer[node.op.output()] = Some(n);
    }
    // Materialised: inputs, outputs, constants, and values read by a node
    // of another kernel than their producer's.
    let mut materialised: Vec<bool> = graph
        .values
        .iter()
        .map(|v| !matches!(v.role, Role::Intermediate))
        .collect();
    // A state's update is stored: it becomes the state after the call
    // (plan.rs: written into the state buffer's other half, or copied).
    for v in &graph.values {
        if let Role::State { update, .. } = v.role {
            materialised[update] = true;
        }
    }
    for (n, node) in graph.nodes.iter().enumerate() {
        for v in node.op.inputs() {
            if let Some(p) = producer[v] {
                if kernel_of_node[p] != kernel_of_node[n] {
                    materialised[v] = true;
                }
            }
        }
    }
    let ctx = Context {
        graph,
        producer: &producer,
        materialised: &materialised,
        statistics: RefCell::default(),
    };
    let kernels = ranges
        .into_iter()
        .map(|nodes| ctx.kernel(nodes))
        .collect::<Result<Vec<_>, _>>()?;
    // The statistics' values are stored by their kernel's statistics pass.
    for kernel in &kernels {
        for v in kernel.statistics.iter().flat_map(Statistics::values) {
            materialised[v] = true;
        }
    }
    Ok((kernels, materialised))
}

/// The node ranges of the kernels; each node alone when the blob records
/// no grouping.
fn kernel_ranges(nodes: &[NodeDesc]) -> Result<Vec<Range<usize>>, GraphError> {
    let bad = |reason: String| GraphError::BadIo {
        what: "fused kernels",
        reason,
    };
    if nodes.iter().all(|n| n.kernel.is_none()) {
        return Ok((0..nodes.len()).map(|n| n..n + 1).collect());
    }
    let mut ranges: Vec<Range<usize>> = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        let Some(k) = node.kernel else {
            return Err(bad(format!(
                "node {} ('{}') has no kernel index while others do",
                node.id, node.name
            )));
        };
        match ranges.len() as u32 {
            next if k == next => ranges.push(n..n + 1),
            next if k + 1 == next => ranges.last_mut().expect("k + 1 >= 1").end = n + 1,
            next => {
                return Err(bad(format!(
                    "node {} ('{}') is in kernel {k} but the kernels so far are 0..{next}: a \
                     kernel's nodes must be consecutive and kernels numbered in order",
                    node.id, node.name
                )))
            }
        }
    }
    Ok(ranges)
}

struct Context<'a> {
    graph: &'a GraphDesc,
    producer: &'a [Option<usize>],
    materialised: &'a [bool],
    /// The statistics of the kernel being built.
    statistics: RefCell<KernelStatistics>,
}

/// The statistics of the kernel being built: in order, the nodes already
/// among them, and which nodes derive from statistics alone.
#[derive(Default)]
struct KernelStatistics {
    list: Vec<Statistics>,
    known: HashSet<usize>,
    derivable: HashMap<usize, bool>,
}

impl Context<'_> {
    fn kernel(&self, nodes: Range<usize>) -> Result<Kernel, GraphError> {
        let graph = self.graph;
        let first = &graph.nodes[nodes.start];
        let index = first.kernel.unwrap_or(nodes.start as u32);
        let bad = |reason: String| GraphError::BadKernel {
            index,
            name: first.name.clone(),
            reason,
        };
        // A reduction's result is written by the statistics pass, whether
        // or not the blob materialises it; the main loop writes the rest.
        let writes: Vec<usize> = nodes
            .clone()
            .filter(|&n| !matches!(graph.nodes[n].op, OpDesc::Reduce { .. }))
            .map(|n| graph.nodes[n].op.output())
            .filter(|&v| self.materialised[v])
            .collect();
        let reduced_for_others = nodes.clone().any(|n| {
            matches!(graph.nodes[n].op, OpDesc::Reduce { .. })
                && self.materialised[graph.nodes[n].op.output()]
        });
        *self.statistics.borrow_mut() = Default::default();
        let anchors: Vec<(usize, &dyn AnchorOp)> = nodes
            .clone()
            .filter_map(|n| match &graph.nodes[n].op {
                OpDesc::Anchor(op) => Some((n, &**op)),
                _ => None,
            })
            .collect();
        // Materialised reductions are computed whether or not a program
        // reads them.
        for n in nodes.clone() {
            if let OpDesc::Reduce { output, .. } = graph.nodes[n].op {
                if self.materialised[output] {
                    self.statistic(&nodes, n).map_err(&bad)?;
                }
            }
        }
        let body = match anchors[..] {
            [] if nodes.len() == 1 => match graph.nodes[nodes.start].op {
                OpDesc::Regroup { input, output, .. } if writes == [output] => {
                    Box::new(CopyStep::new(input, output)) as Box<dyn StepKind>
                }
                _ => self
                    .pass(&nodes, &writes, reduced_for_others)
                    .map_err(&bad)?,
            },
            [] => self
                .pass(&nodes, &writes, reduced_for_others)
                .map_err(&bad)?,
            [(anchor, op)] => {
                let [result] = writes[..] else {
                    return Err(bad(format!(
                        "an anchor kernel stores one result, this one {} ({})",
                        writes.len(),
                        self.names(&writes)
                    )));
                };
                let node = &graph.nodes[anchor];
                let anchor_out = node.op.output();
                let epilogue = self.epilogue(&nodes, anchor_out, result).map_err(&bad)?;
                op.build_step(Fused {
                    id: node.id,
                    name: &node.name,
                    operands: &KernelOperands {
                        ctx: self,
                        nodes: &nodes,
                    },
                    epilogue,
                    result,
                })
                .map_err(&bad)?
            }
            _ => {
                return Err(bad(format!(
                    "holds {} convs or scans; a kernel holds one",
                    anchors.len()
                )))
            }
        };
        let statistics = self.statistics.take().list;
        Ok(Kernel {
            index,
            nodes,
            writes,
            statistics,
            body,
        })
    }

    /// The pass computing a kernel without an anchor: each of its `writes`
    /// by its program.
    fn pass(
        &self,
        nodes: &Range<usize>,
        writes: &[usize],
        reduced_for_others: bool,
    ) -> Result<Box<dyn StepKind>, String> {
        if writes.is_empty() && !reduced_for_others {
            return Err("computes nothing that is read".into());
        }
        let mut results = Vec::new();
        for &v in writes {
            results.push((v, self.program(nodes, None, v)?));
        }
        Ok(Box::new(PassStep::new(results)))
    }

    /// Registers `Reduce` node `n` with the kernel's statistics (once):
    /// into the group of its input and dimensions where that group does not
    /// compute its op yet, else as a new group after the ones its input
    /// program reads.
    fn statistic(&self, nodes: &Range<usize>, n: usize) -> Result<(), String> {
        let OpDesc::Reduce {
            op,
            input,
            output,
            dims,
        } = self.graph.nodes[n].op
        else {
            unreachable!("statistic of a Reduce node")
        };
        {
            let mut stats = self.statistics.borrow_mut();
            let KernelStatistics { list, known, .. } = &mut *stats;
            if known.contains(&n) {
                return Ok(());
            }
            let group = list.iter_mut().find_map(|s| match &mut s.kind {
                StatisticsKind::Reduce {
                    dims: d,
                    outputs,
                    input: i,
                } if *i == input && *d == dims && outputs.iter().all(|&(o, _)| o != op) => {
                    Some(outputs)
                }
                _ => None,
            });
            if let Some(outputs) = group {
                outputs.push((op, output));
                known.insert(n);
                return Ok(());
            }
        }
        // Registers the statistics the input reads first.
        let mut b = self.builder(nodes, None);
        b.reduction = Some(n);
        b.value(input)?;
        let mut stats = self.statistics.borrow_mut();
        stats.list.push(Statistics {
            program: b.program.compile(),
            kind: StatisticsKind::Reduce {
                dims,
                outputs: vec![(op, output)],
                input,
            },
        });
        stats.known.insert(n);
        Ok(())
    }

    /// Whether node `n` of the kernel computes an elementwise function of
    /// the kernel's reductions alone, at their shape (every tensor operand
    /// a reduction or such a node, of the output's dims), and is not stored
    /// for another reason: the statistics pass then computes it once.
    fn derivable(&self, nodes: &Range<usize>, n: usize) -> bool {
        if let Some(&d) = self.statistics.borrow().derivable.get(&n) {
            return d;
        }
        let graph = self.graph;
        let node = &graph.nodes[n];
        let out = node.op.output();
        let elementwise = matches!(
            node.op,
            OpDesc::Unary { .. }
                | OpDesc::Binary { .. }
                | OpDesc::Where { .. }
                | OpDesc::Clamp { .. }
        );
        let d = elementwise
            && !self.materialised[out]
            && node.op.inputs().into_iter().all(|v| {
                graph.values[v].dims == graph.values[out].dims
                    && self.producer[v].is_some_and(|p| {
                        nodes.contains(&p)
                            && (matches!(graph.nodes[p].op, OpDesc::Reduce { .. })
                                || self.derivable(nodes, p))
                    })
            });
        self.statistics.borrow_mut().derivable.insert(n, d);
        d
    }

    /// Registers node `n` (see [`Self::derivable`]) with the statistics,
    /// once, after those it reads.
    fn derive(&self, nodes: &Range<usize>, n: usize) -> Result<(), String> {
        if self.statistics.borrow().known.contains(&n) {
            return Ok(());
        }
        let mut b = self.builder(nodes, None);
        b.deriving = Some(n);
        let value = self.graph.nodes[n].op.output();
        b.value(value)?;
        let mut stats = self.statistics.borrow_mut();
        stats.list.push(Statistics {
            program: b.program.compile(),
            kind: StatisticsKind::Derived {
                value,
                op: self.graph.nodes[n].op.kind(),
            },
        });
        stats.known.insert(n);
        Ok(())
    }

    fn names(&self, values: &[usize]) -> String {
        let names: Vec<String> = values
            .iter()
            .map(|&v| format!("'{}'", self.graph.values[v].name))
            .collect();
        names.join(", ")
    }

    fn produced_in(&self, nodes: &Range<usize>, v: usize) -> bool {
        self.producer[v].is_some_and(|p| nodes.contains(&p))
    }

    /// An anchor operand: stored where materialised outside the kernel.
    fn source(&self, nodes: &Range<usize>, v: usize) -> Result<Source, String> {
        if self.materialised[v] && !self.produced_in(nodes, v) {
            Ok(Source::Stored(v))
        } else {
            self.program(nodes, None, v).map(Source::Computed)
        }
    }

    /// Two computed operands `a` and `u`: one program with both as roots
    /// where they share a computed subexpression, else one each.
    fn paired(&self, nodes: &Range<usize>, a: usize, u: usize) -> Result<(Source, Source), String> {
        let mut b = self.builder(nodes, None);
        let roots = vec![b.value(a)?, b.value(u)?];
        let mut program = b.program;
        program.set_roots(roots);
        if program.shared() == 0 {
            return Ok((
                Source::Computed(self.program(nodes, None, a)?),
                Source::Computed(self.program(nodes, None, u)?),
            ));
        }
        Ok((Source::Computed(program.compile()), Source::Paired))
    }

    /// The anchor's epilogue up to `result`, or None when the anchor's
    /// output is the result itself.
    fn epilogue(
        &self,
        nodes: &Range<usize>,
        anchor_out: usize,
        result: usize,
    ) -> Result<Option<Epilogue>, String> {
        if result == anchor_out {
            return Ok(None);
        }
        let graph = self.graph;
        let mut views = Vec::new();
        let mut e = result;
        while e != anchor_out {
            let Some(n) = self.producer[e].filter(|n| nodes.contains(n)) else {
                break;
            };
            let (input, map) = match graph.nodes[n].op {
                OpDesc::Permute {
                    input, ref perm, ..
                } => {
                    let mut map = [None; rustconv_kernels::MAX_RANK];
                    for (d, &p) in perm.iter().enumerate() {
                        map[d] = Some(p as u8);
                    }
                    (input, map)
                }
                OpDesc::Reshape { input, map, .. } => (input, map),
                _ => break,
            };
            views.push(StoreView {
                map,
                rank: graph.values[e].dims.len(),
            });
            e = input;
        }
        views.reverse();
        if graph.values[e].dims != graph.values[anchor_out].dims {
            return Err(format!(
                "the epilogue's elementwise result '{}' {:?} does not have the shape of the \
                 anchor's output '{}' {:?}",
                graph.values[e].name,
                graph.values[e].dims,
                graph.values[anchor_out].name,
                graph.values[anchor_out].dims
            ));
        }
        let program = self.program(nodes, Some(anchor_out), e)?;
        if !program.reads_anchor() {
            return Err(format!(
                "the result '{}' does not depend on the anchor",
                graph.values[result].name
            ));
        }
        Ok(Some(Epilogue { program, views }))
    }

    /// The program computing value `root` from the kernel's nodes, with
    /// `anchor_out` (in an epilogue) read as the anchor's chunk.
    fn program(
        &self,
        nodes: &Range<usize>,
        anchor_out: Option<usize>,
        root: usize,
    ) -> Result<CompiledProgram, String> {
        let mut b = self.builder(nodes, anchor_out);
        b.value(root)?;
        Ok(b.program.compile())
    }

    fn builder<'a>(
        &'a self,
        nodes: &'a Range<usize>,
        anchor_out: Option<usize>,
    ) -> ProgramBuilder<'a> {
        ProgramBuilder {
            ctx: self,
            nodes,
            anchor_out,
            program: Program::default(),
            memo: HashMap::new(),
            through_anchor: Vec::new(),
            reduction: None,
            deriving: None,
        }
    }
}

/// An anchor's operands as its kernel provides them.
struct KernelOperands<'a> {
    ctx: &'a Context<'a>,
    nodes: &'a Range<usize>,
}

impl Operands for KernelOperands<'_> {
    fn source(&self, v: usize) -> Result<Source, String> {
        self.ctx.source(self.nodes, v)
    }

    fn paired(&self, a: usize, b: usize) -> Result<(Source, Source), String> {
        self.ctx.paired(self.nodes, a, b)
    }

    fn stored_outside(&self, v: usize) -> bool {
        self.ctx.materialised[v] && !self.ctx.produced_in(self.nodes, v)
    }

    fn name(&self, v: usize) -> &str {
        &self.ctx.graph.values[v].name
    }
}

struct ProgramBuilder<'a> {
    ctx: &'a Context<'a>,
    nodes: &'a Range<usize>,
    anchor_out: Option<usize>,
    program: Program,
    memo: HashMap<usize, usize>,
    /// Per program node: whether it depends on the anchor's chunk.
    through_anchor: Vec<bool>,
    /// The `Reduce` node whose input this program computes, if it is one.
    reduction: Option<usize>,
    /// The derived statistic this program computes, if it is one.
    deriving: Option<usize>,
}

impl ProgramBuilder<'_> {
    fn push(&mut self, expr: Expr, value: usize) -> Result<usize, String> {
        let operands_read_anchor = match &expr {
            Expr::Load | Expr::Anchor | Expr::Const(_) => expr == Expr::Anchor,
            Expr::Unary { x, .. } | Expr::Clamp { x, .. } => self.through_anchor[*x],
            Expr::Binary { a, b, .. } => self.through_anchor[*a] || self.through_anchor[*b],
            Expr::Where { cond, a, b } => {
                self.through_anchor[*cond] || self.through_anchor[*a] || self.through_anchor[*b]
            }
            Expr::Broadcast { x } | Expr::View { x, .. } | Expr::Slice { x, .. } => {
                if self.through_anchor[*x] {
                    return Err(format!(
                        "the epilogue reads the anchor's output through a view or broadcast \
                         (at '{}'); it may only apply elementwise ops to it",
                        self.ctx.graph.values[value].name
                    ));
                }
                false
            }
            Expr::Cat { parts, .. } => {
                if parts.iter().any(|&p| self.through_anchor[p]) {
                    return Err("the epilogue concatenates the anchor's output".into());
                }
                false
            }
        };
        self.through_anchor.push(operands_read_anchor);
        Ok(self.program.push(expr, value))
    }

    /// Program node for value `v`.
    fn value(&mut self, v: usize) -> Result<usize, String> {
        if let Some(&i) = self.memo.get(&v) {
            return Ok(i);
        }
        let i = if Some(v) == self.anchor_out {
            self.push(Expr::Anchor, v)?
        } else {
            // A value of this kernel is computed, even where it is also
            // stored (a pass's earlier result): never read back while the
            // kernel writes it.
            match self.ctx.producer[v].filter(|p| self.nodes.contains(p)) {
                None => self.push(Expr::Load, v)?,
                Some(n) => self.node(n)?,
            }
        };
        self.memo.insert(v, i);
        Ok(i)
    }

    /// An elementwise operand, broadcast to `out` where the declared shapes
    /// differ.
    fn operand(&mut self, operand: Operand, out: usize) -> Result<usize, String> {
        match operand {
            Operand::Scalar(c) => self.push(Expr::Const(c), out),
            Operand::Value(v) => {
                let x = self.value(v)?;
                if crate::ops::declared_same_shape(&self.ctx.graph.values, v, out) {
                    Ok(x)
                } else {
                    self.push(Expr::Broadcast { x }, out)
                }
            }
        }
    }

    fn node(&mut self, n: usize) -> Result<usize, String> {
        let node = &self.ctx.graph.nodes[n];
        let out = node.op.output();
        if self.deriving != Some(n) && self.ctx.derivable(self.nodes, n) {
            // Computed by the statistics pass; read back as stored.
            self.ctx.derive(self.nodes, n)?;
            return self.push(Expr::Load, out);
        }
        let expr = match node.op {
            OpDesc::Anchor(_) => {
                if let Some(r) = self.reduction {
                    return Err(format!(
                        "the reduction '{}' reads the output of '{}' ({}), the kernel's own \
                         anchor: a kernel gathers its statistics before its anchor runs",
                        self.ctx.graph.nodes[r].name,
                        node.name,
                        node.op.kind()
                    ));
                }
                return Err(format!(
                    "'{}' ({}) is read inside its own kernel other than by its epilogue",
                    node.name,
                    node.op.kind()
                ));
            }
            OpDesc::Reduce { .. } => {
                // Computed by the statistics pass; read back as stored.
                self.ctx.statistic(self.nodes, n)?;
                Expr::Load
            }
            OpDesc::Regroup { .. } => {
                return Err(format!(
                    "'{}' reshapes by splitting or merging dimensions, which no view reads: \
                     it copies a stored value, alone in its kernel",
                    node.name
                ));
            }
            OpDesc::Unary { op, input, .. } => Expr::Unary {
                op,
                x: self.value(input)?,
            },
            OpDesc::Clamp {
                input, min, max, ..
            } => Expr::Clamp {
                x: self.value(input)?,
                min,
                max,
            },
            OpDesc::Binary { op, a, b, .. } => Expr::Binary {
                op,
                a: self.operand(a, out)?,
                b: self.operand(b, out)?,
            },
            OpDesc::Where { cond, a, b, .. } => Expr::Where {
                cond: self.operand(Operand::Value(cond), out)?,
                a: self.operand(a, out)?,
                b: self.operand(b, out)?,
            },
            OpDesc::Full { value, .. } => Expr::Const(value),
            OpDesc::Permute {
                input, ref perm, ..
            } => {
                let mut map = [None; rustconv_kernels::MAX_RANK];
                for (d, &p) in perm.iter().enumerate() {
                    map[d] = Some(p as u8);
                }
                Expr::View {
                    x: self.value(input)?,
                    map,
                }
            }
            OpDesc::Reshape { input, map, .. } => Expr::View {
                x: self.value(input)?,
                map,
            },
            OpDesc::Slice {
                input,
                dim,
                start,
                step,
                ..
            } => Expr::Slice {
                x: self.value(input)?,
                dim,
                start,
                step,
            },
            OpDesc::Cat {
                ref inputs, dim, ..
            } => {
                let parts = inputs
                    .iter()
                    .map(|&v| self.value(v))
                    .collect::<Result<Vec<_>, _>>()?;
                Expr::Cat { parts, dim }
            }
        };
        self.push(expr, out)
    }
}
