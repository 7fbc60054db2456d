//! Reduction operations ([`Op`]) and the element types they apply to ([`Element`]).

use std::fmt;
use std::sync::Arc;

use weft_fabric::sched::{cast_slice, cast_slice_mut};
use weft_fabric::{Loc, Pod};

/// A reduction operation over elements of type `T`.
///
/// The built-in operations are commutative and associative (floating-point sums up to
/// rounding: the order of a reduction is the algorithm's, the same on every member).
/// [`Op::user`] makes one of a closure; a non-commutative one is applied in rank order.
pub enum Op<T> {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Bitwise and (integers).
    BitAnd,
    /// Bitwise or (integers).
    BitOr,
    /// Bitwise xor (integers).
    BitXor,
    /// Logical and (integers: nonzero is true, the result is 0 or 1).
    LogicalAnd,
    /// Logical or (integers).
    LogicalOr,
    /// Minimum with location ([`Loc`] elements: the smaller value, and of equal values
    /// the smaller index).
    MinLoc,
    /// Maximum with location ([`Loc`] elements: the larger value, and of equal values
    /// the smaller index).
    MaxLoc,
    /// A user-defined operation (see [`Op::user`]).
    User(UserOp<T>),
}

impl<T> Op<T> {
    /// The same built-in operation over another element type (`None` for a user one).
    fn builtin_as<U>(&self) -> Option<Op<U>> {
        Some(match self {
            Op::Sum => Op::Sum,
            Op::Prod => Op::Prod,
            Op::Min => Op::Min,
            Op::Max => Op::Max,
            Op::BitAnd => Op::BitAnd,
            Op::BitOr => Op::BitOr,
            Op::BitXor => Op::BitXor,
            Op::LogicalAnd => Op::LogicalAnd,
            Op::LogicalOr => Op::LogicalOr,
            Op::MinLoc => Op::MinLoc,
            Op::MaxLoc => Op::MaxLoc,
            Op::User(_) => return None,
        })
    }
}

impl<T> Clone for Op<T> {
    fn clone(&self) -> Self {
        match self {
            Op::User(u) => Op::User(u.clone()),
            op => op.builtin_as().unwrap_or(Op::Sum),
        }
    }
}

impl<T> fmt::Debug for Op<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The closure of a user-defined reduction.
type UserFn<T> = Arc<dyn Fn(&[T], &mut [T]) + Send + Sync>;

/// A user-defined reduction: `f(input, inout)` sets `inout[i] = input[i] op inout[i]`
/// (MPI's convention: `input` holds the lower ranks' contribution when the operation is
/// not commutative).
pub struct UserOp<T> {
    f: UserFn<T>,
    commutative: bool,
}

impl<T> fmt::Debug for UserOp<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserOp")
            .field("commutative", &self.commutative)
            .finish_non_exhaustive()
    }
}

impl<T> Clone for UserOp<T> {
    fn clone(&self) -> Self {
        UserOp {
            f: self.f.clone(),
            commutative: self.commutative,
        }
    }
}

impl<T> Op<T> {
    /// A user-defined operation: `f(input, inout)` sets `inout[i] = input[i] op
    /// inout[i]`. It must be associative; `commutative: false` makes every collective
    /// apply it in rank order.
    pub fn user(f: impl Fn(&[T], &mut [T]) + Send + Sync + 'static, commutative: bool) -> Op<T> {
        Op::User(UserOp {
            f: Arc::new(f),
            commutative,
        })
    }

    /// Whether the operation is commutative (every built-in one is).
    pub fn commutative(&self) -> bool {
        match self {
            Op::User(u) => u.commutative,
            _ => true,
        }
    }

    /// The operation's name (as errors print it).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Sum => "Sum",
            Op::Prod => "Prod",
            Op::Min => "Min",
            Op::Max => "Max",
            Op::BitAnd => "BitAnd",
            Op::BitOr => "BitOr",
            Op::BitXor => "BitXor",
            Op::LogicalAnd => "LogicalAnd",
            Op::LogicalOr => "LogicalOr",
            Op::MinLoc => "MinLoc",
            Op::MaxLoc => "MaxLoc",
            Op::User(_) => "a user operation",
        }
    }
}

/// An element type of reductions: plain data with the built-in operations it supports.
pub trait Element: Pod {
    /// The type's name (as errors print it).
    const NAME: &'static str;
    /// Whether the built-in `op` is defined for this type (user operations always are).
    fn supports(op: &Op<Self>) -> bool;
    /// `inout[i] = input[i] op inout[i]` for a built-in `op` it supports.
    fn combine(op: &Op<Self>, input: &[Self], inout: &mut [Self]);
}

/// Applies `op` (built in or user) elementwise: `inout[i] = input[i] op inout[i]`.
pub(crate) fn apply<T: Element>(op: &Op<T>, input: &[T], inout: &mut [T]) {
    match op {
        Op::User(u) => (u.f)(input, inout),
        _ => T::combine(op, input, inout),
    }
}

/// A reduction over bytes, for schedules: `inout = input op inout`, both whole numbers
/// of aligned `T`s (schedules keep them so).
pub(crate) type ByteOp = Arc<dyn Fn(&[u8], &mut [u8]) + Send + Sync>;

/// `op` as a [`ByteOp`].
pub(crate) fn byte_op<T: Element>(op: &Op<T>) -> ByteOp {
    let op = op.clone();
    // Send + Sync: `Op` holds only `Arc<dyn Fn + Send + Sync>` and unit variants.
    let op = Arc::new(op);
    Arc::new(move |input: &[u8], inout: &mut [u8]| {
        let (Some(i), Some(o)) = (cast_slice::<T>(input), cast_slice_mut::<T>(inout)) else {
            // Offsets are multiples of the element size and buffers aligned: unreachable
            // unless a schedule is wrong, which the tests would show.
            panic!(
                "reduction over misaligned bytes ({} and {} bytes of {})",
                input.len(),
                inout.len(),
                T::NAME
            );
        };
        apply(&op, i, o)
    })
}

/// `inout[i] = f(input[i], inout[i])` in a loop the compiler can vectorize (one loop per
/// operation, no call per element).
macro_rules! zip_apply {
    ($input:expr, $inout:expr, |$a:ident, $b:ident| $e:expr) => {
        for (o, &$a) in $inout.iter_mut().zip($input) {
            let $b = *o;
            *o = $e;
        }
    };
}

macro_rules! int_element {
    ($($t:ty),*) => { $(
        impl Element for $t {
            const NAME: &'static str = stringify!($t);
            fn supports(op: &Op<Self>) -> bool {
                !matches!(op, Op::MinLoc | Op::MaxLoc)
            }
            fn combine(op: &Op<Self>, input: &[Self], inout: &mut [Self]) {
                match op {
                    Op::Sum => zip_apply!(input, inout, |a, b| a.wrapping_add(b)),
                    Op::Prod => zip_apply!(input, inout, |a, b| a.wrapping_mul(b)),
                    Op::Min => zip_apply!(input, inout, |a, b| a.min(b)),
                    Op::Max => zip_apply!(input, inout, |a, b| a.max(b)),
                    Op::BitAnd => zip_apply!(input, inout, |a, b| a & b),
                    Op::BitOr => zip_apply!(input, inout, |a, b| a | b),
                    Op::BitXor => zip_apply!(input, inout, |a, b| a ^ b),
                    Op::LogicalAnd => zip_apply!(input, inout, |a, b| <$t>::from(a != 0 && b != 0)),
                    Op::LogicalOr => zip_apply!(input, inout, |a, b| <$t>::from(a != 0 || b != 0)),
                    Op::MinLoc | Op::MaxLoc | Op::User(_) => {}
                }
            }
        }
    )* };
}
int_element!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, usize, isize);

macro_rules! float_element {
    ($($t:ty),*) => { $(
        impl Element for $t {
            const NAME: &'static str = stringify!($t);
            fn supports(op: &Op<Self>) -> bool {
                matches!(op, Op::Sum | Op::Prod | Op::Min | Op::Max | Op::User(_))
            }
            fn combine(op: &Op<Self>, input: &[Self], inout: &mut [Self]) {
                match op {
                    Op::Sum => zip_apply!(input, inout, |a, b| a + b),
                    Op::Prod => zip_apply!(input, inout, |a, b| a * b),
                    Op::Min => zip_apply!(input, inout, |a, b| a.min(b)),
                    Op::Max => zip_apply!(input, inout, |a, b| a.max(b)),
                    _ => {}
                }
            }
        }
    )* };
}
float_element!(f32, f64);

macro_rules! loc_element {
    ($(($v:ty, $i:ty)),*) => { $(
        impl Element for Loc<$v, $i> {
            const NAME: &'static str = concat!("Loc<", stringify!($v), ", ", stringify!($i), ">");
            fn supports(op: &Op<Self>) -> bool {
                matches!(op, Op::MinLoc | Op::MaxLoc | Op::User(_))
            }
            fn combine(op: &Op<Self>, input: &[Self], inout: &mut [Self]) {
                let min = matches!(op, Op::MinLoc);
                if !min && !matches!(op, Op::MaxLoc) {
                    return;
                }
                for (o, i) in inout.iter_mut().zip(input) {
                    let better = if min { i.value < o.value } else { i.value > o.value };
                    if better || (i.value == o.value && i.index < o.index) {
                        *o = *i;
                    }
                }
            }
        }
    )* };
}
loc_element!(
    (f64, i64),
    (i64, i64),
    (u64, i64),
    (f32, i32),
    (i32, i32),
    (u32, i32)
);

/// An array of elements is an element: a built-in operation applies to each component
/// (a `[u64; 2]` sums as two `u64`s, so `Op::Sum` over `[[u64; 2]]` is `Op::Sum` over the
/// flattened `[u64]`), and is defined where it is for the component type; a user
/// operation sees whole arrays, as always (e.g. an associative operation on pairs).
impl<T: Element, const N: usize> Element for [T; N] {
    const NAME: &'static str = "an array of elements";
    fn supports(op: &Op<Self>) -> bool {
        component_op(op).is_none_or(|o| T::supports(&o))
    }
    fn combine(op: &Op<Self>, input: &[Self], inout: &mut [Self]) {
        if let Some(o) = component_op(op) {
            T::combine(&o, input.as_flattened(), inout.as_flattened_mut());
        }
    }
}

/// The built-in `op` over arrays as the same operation over their components (`None`
/// for a user operation, which applies to whole arrays).
fn component_op<T, const N: usize>(op: &Op<[T; N]>) -> Option<Op<T>> {
    op.builtin_as()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_combine_elementwise() {
        let mut o = [5i32, -3, 0, 7];
        i32::combine(&Op::Sum, &[1, 2, 3, 4], &mut o);
        assert_eq!(o, [6, -1, 3, 11]);
        i32::combine(&Op::Min, &[0, 0, 0, 100], &mut o);
        assert_eq!(o, [0, -1, 0, 11]);
        let mut b = [0b1100u8, 1, 0];
        u8::combine(&Op::BitXor, &[0b1010, 1, 0], &mut b);
        assert_eq!(b, [0b0110, 0, 0]);
        u8::combine(&Op::LogicalOr, &[0, 1, 0], &mut b);
        assert_eq!(b, [1, 1, 0]);
        let mut f = [1.5f64, 2.0];
        f64::combine(&Op::Prod, &[2.0, 0.5], &mut f);
        assert_eq!(f, [3.0, 1.0]);
        assert!(!f64::supports(&Op::BitAnd));
        assert!(!i32::supports(&Op::MinLoc));
    }

    #[test]
    fn min_and_max_with_location_break_ties_by_the_smaller_index() {
        let l = |value, index| Loc { value, index };
        let mut o = [l(1.0f64, 5i64), l(2.0, 5), l(3.0, 1)];
        Loc::<f64, i64>::combine(&Op::MinLoc, &[l(1.0, 2), l(3.0, 0), l(3.0, 0)], &mut o);
        assert_eq!(o, [l(1.0, 2), l(2.0, 5), l(3.0, 0)]);
        Loc::<f64, i64>::combine(&Op::MaxLoc, &[l(0.5, 0), l(9.0, 9), l(3.0, 7)], &mut o);
        assert_eq!(o, [l(1.0, 2), l(9.0, 9), l(3.0, 0)]);
    }

    /// Decimal concatenation on (value, 10^digits) pairs: associative, not commutative
    /// (the README's scan example).
    fn concat() -> Op<[u64; 2]> {
        Op::user(
            |a: &[[u64; 2]], b: &mut [[u64; 2]]| {
                for (a, b) in a.iter().zip(b) {
                    *b = [a[0] * b[1] + b[0], a[1] * b[1]];
                }
            },
            false,
        )
    }

    #[test]
    fn user_operations_see_input_then_inout() {
        let op = concat();
        assert!(!op.commutative());
        let mut o = [[2u64, 10]];
        apply(&op, &[[1, 10]], &mut o);
        assert_eq!(o, [[12, 100]]);
        let bo = byte_op(&op);
        let a = [[3u64, 10], [56, 100]];
        let mut b = [[4u64, 10], [7, 10]];
        bo(
            weft_fabric::sched::as_bytes(&a),
            weft_fabric::sched::as_bytes_mut(&mut b),
        );
        assert_eq!(b, [[34, 100], [567, 1000]]);
    }

    #[test]
    fn the_concatenation_is_associative_so_any_grouping_of_a_scan_agrees() {
        let op = concat();
        let f = |a: [u64; 2], b: [u64; 2]| {
            let mut o = [b];
            apply(&op, &[a], &mut o);
            o[0]
        };
        let (x, y, z) = ([12, 100], [3, 10], [456, 1000]);
        assert_eq!(f(f(x, y), z), f(x, f(y, z)));
        assert_eq!(f(f(x, y), z), [123456, 1_000_000]);
        // Four ones scanned in any grouping: 1111.
        let one = [1, 10];
        assert_eq!(f(f(one, one), f(one, one)), f(one, f(one, f(one, one))));
        assert_eq!(f(f(one, one), f(one, one))[0], 1111);
    }

    #[test]
    fn arrays_combine_per_component_with_the_components_builtins() {
        let mut o = [[1u64, 2], [3, 4]];
        <[u64; 2]>::combine(&Op::Sum, &[[10, 20], [30, 40]], &mut o);
        assert_eq!(o, [[11, 22], [33, 44]]);
        <[u64; 2]>::combine(&Op::Max, &[[0, 100], [50, 0]], &mut o);
        assert_eq!(o, [[11, 100], [50, 44]]);
        let mut f = [[1.5f64, -1.0, 0.0]];
        <[f64; 3]>::combine(&Op::Min, &[[2.0, -2.0, 0.5]], &mut f);
        assert_eq!(f, [[1.5, -2.0, 0.0]]);
        assert!(<[u32; 4]>::supports(&Op::BitXor));
        assert!(!<[f64; 2]>::supports(&Op::BitAnd));
        assert!(!<[i32; 2]>::supports(&Op::MinLoc));
        assert!(<[f64; 2]>::supports(&Op::user(
            |_: &[[f64; 2]], _: &mut [[f64; 2]]| {},
            true
        )));
        // Nested arrays too; a user operation sees whole arrays.
        let mut n = [[[1u8, 2], [3, 4]]];
        <[[u8; 2]; 2]>::combine(&Op::BitOr, &[[[4, 4], [0, 8]]], &mut n);
        assert_eq!(n, [[[5, 6], [3, 12]]]);
        let swap = Op::user(
            |a: &[[u8; 2]], b: &mut [[u8; 2]]| b[0] = [a[0][1], a[0][0]],
            false,
        );
        let mut s = [[0u8, 0]];
        apply(&swap, &[[1, 2]], &mut s);
        assert_eq!(s, [[2, 1]]);
    }
}

/// Scratch bytes aligned for every element type: on the stack up to 64 bytes, else on
/// the heap.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    small: [u128; 4],
    large: Vec<u128>,
}

impl Scratch {
    /// `n` bytes of it, 16-byte aligned.
    pub(crate) fn bytes(&mut self, n: usize) -> &mut [u8] {
        let words = n.div_ceil(16);
        let w: &mut [u128] = if words <= self.small.len() {
            &mut self.small[..words]
        } else {
            self.large.resize(words, 0);
            &mut self.large
        };
        &mut weft_fabric::sched::as_bytes_mut(w)[..n]
    }
}

/// The error of a scratch buffer that does not hold whole aligned elements (a bug).
pub(crate) fn misaligned(op: &'static str) -> crate::CollError {
    crate::CollError::InvalidArgs {
        op,
        what: "misaligned scratch".into(),
    }
}
