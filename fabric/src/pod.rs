//! Plain data that may be sent as bytes ([`Pod`]), and the min/max-with-location
//! pairs ([`Loc`]) reductions use.

/// Plain data that may be sent as bytes.
///
/// # Safety
/// Implementors must have no padding, no pointers and accept every bit pattern.
pub unsafe trait Pod: Copy + Send + Sync + 'static {}
macro_rules! pod {
    ($($t:ty),*) => { $(
        // SAFETY: a primitive number type: no padding, every bit pattern valid.
        unsafe impl Pod for $t {}
    )* };
}
pod!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, usize, isize, f32, f64);
// SAFETY: an array of Pod has no padding between elements and inherits their validity.
unsafe impl<T: Pod, const N: usize> Pod for [T; N] {}

/// A value with an index: the element of min/max-with-location reductions (MPI's
/// `MINLOC`/`MAXLOC` pair types, such as `MPI_DOUBLE_INT`). Plain data for the pairs
/// whose two fields have the same size (so no padding): `(f64|i64|u64, i64)` and
/// `(f32|i32|u32, i32)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Loc<V, I> {
    /// The value compared.
    pub value: V,
    /// Where it came from (a rank, an index); the smaller one wins ties.
    pub index: I,
}

macro_rules! loc_pod {
    ($(($v:ty, $i:ty)),*) => { $(
        const _: () = assert!(
            std::mem::size_of::<Loc<$v, $i>>()
                == std::mem::size_of::<$v>() + std::mem::size_of::<$i>()
        );
        // SAFETY: `repr(C)` with two fields of one size and alignment: no padding (the
        // size is asserted above), and both fields accept every bit pattern.
        unsafe impl Pod for Loc<$v, $i> {}
    )* };
}
loc_pod!(
    (f64, i64),
    (i64, i64),
    (u64, i64),
    (f32, i32),
    (i32, i32),
    (u32, i32)
);

pub(crate) fn bytes_of<T: Pod>(s: &[T]) -> (*const u8, usize) {
    (s.as_ptr().cast(), std::mem::size_of_val(s))
}

pub(crate) fn bytes_of_mut<T: Pod>(s: &mut [T]) -> (*mut u8, usize) {
    (s.as_mut_ptr().cast(), std::mem::size_of_val(s))
}
