//! Fragmentation of free GPU capacity, after Weng et al., "Beware of Fragmentation"
//! (USENIX ATC '23), and the request mix it is measured against.
//!
//! A node's *fragmentation* under a mix of task shapes is the expected amount of its
//! free GPU capacity (in vcuda-core, 100 = one GPU) that a task drawn from the mix
//! could not use:
//! - a share task (`core`, `memory` on one GPU) cannot use a GPU whose free cores or
//!   free memory are below its demand, so those GPUs' free cores are fragments; on a
//!   GPU where `n` such tasks fit, the cores left after `n` of them are fragments too
//!   (30-core tasks strand 10 cores of an idle GPU). The paper counts only the first
//!   case; the leftover is our addition (docs/simulate.md measures it);
//! - a task of `k` whole GPUs cannot use partly used GPUs; if fewer than `k` GPUs are
//!   wholly free it cannot use the node at all, and every free core is a fragment;
//! - a task whose CPU or memory the node cannot host now, or that can never run on
//!   the node (another GPU model, more GPUs than the node has, more memory than one
//!   of its GPUs), cannot use any of its GPUs: every free core is a fragment.
//!
//! Counting the never-runnable shapes, as the paper does, is deliberate: it makes
//! a pod prefer capacity that fewer shapes can use, keeping the versatile capacity
//! for the shapes that need it (measured: +0.14 points on the default trace against
//! leaving them out, docs/simulate.md).
//!
//! Each shape weighs its frequency among the tasks (the paper's popularity) divided by
//! the square root of its size in GPUs, every shape seen is kept (up to
//! [`MAX_GPU_SHAPES`] GPU shapes), and shapes carry GPU, CPU and models but not memory.
//! Each of these was measured against its alternatives (plain frequency, weights by GPU
//! demand, the paper's 95% cut, memory in the shape) on the openb traces;
//! docs/simulate.md has the screen.
//!
//! FGD places a pod where the fragmentation grows least (see `policy.rs`).
//!
//! The module is cut by concept: `shape` (what a task asks for), `mix` (fixed and
//! learnt request mixes), `measure` (fragmentation and its growth) and `fit`
//! (fragment-aware fitting).

mod fit;
mod measure;
mod mix;
mod shape;

#[cfg(test)]
mod tests;

pub(super) use fit::least_fragmenting_fit;
pub(crate) use mix::RequestMix;
pub use mix::TaskMix;
#[cfg(test)]
use mix::{MAX_GPU_SHAPES, MAX_SHAPES};
pub use shape::{GpuShape, HostRoom, TaskShape};
