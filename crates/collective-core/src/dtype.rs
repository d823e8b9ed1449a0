//! Element types: every plain type may be gathered; f32, f16 and bf16 may be reduced.
use half::{bf16, f16};

/// The runtime element type of a view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    F32 = 0,
    F16 = 1,
    BF16 = 2,
    F64 = 3,
    U8 = 4,
    I8 = 5,
    U16 = 6,
    I16 = 7,
    U32 = 8,
    I32 = 9,
    U64 = 10,
    I64 = 11,
}

impl DType {
    /// Every dtype, in code order.
    pub const ALL: [DType; 12] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::U32,
        DType::I32,
        DType::U64,
        DType::I64,
    ];
    /// The dtypes a reduction accepts.
    pub const REDUCIBLE: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 => 1,
            DType::F16 | DType::BF16 | DType::U16 | DType::I16 => 2,
            DType::F32 | DType::U32 | DType::I32 => 4,
            DType::F64 | DType::U64 | DType::I64 => 8,
        }
    }

    /// Whether the fixed tree is defined for this dtype.
    pub const fn is_reducible(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// Lower-case name as used on command lines and in bench output.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::U16 => "u16",
            DType::I16 => "i16",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::U64 => "u64",
            DType::I64 => "i64",
        }
    }

    /// Parses a name as printed by [`DType::name`] (also `fp32`, `fp16`, `float32`, ...).
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" | "float" => DType::F32,
            "f16" | "fp16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "f64" | "fp64" | "float64" => DType::F64,
            other => return DType::ALL.into_iter().find(|d| d.name() == other),
        })
    }

    /// The dtype with this code, as stored in a [`crate::Signature`].
    pub const fn from_code(code: u8) -> Option<DType> {
        if (code as usize) < DType::ALL.len() { Some(DType::ALL[code as usize]) } else { None }
    }
}

impl core::fmt::Display for DType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A plain element type: any bit pattern is a value, no padding, no drop glue.
///
/// # Safety
/// Implementors must be `Copy`, have no padding and no invalid bit patterns, and `DTYPE.size()`
/// must equal `size_of::<Self>()`.
pub unsafe trait Plain: Copy + Send + Sync + 'static {
    /// The runtime dtype of this type.
    const DTYPE: DType;
}

macro_rules! plain {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        // SAFETY: primitive numeric types have no padding and no invalid bit patterns.
        unsafe impl Plain for $t { const DTYPE: DType = DType::$d; }
        const _: () = assert!(core::mem::size_of::<$t>() == DType::$d.size());
    )*};
}
plain!(f32 => F32, f16 => F16, bf16 => BF16, f64 => F64, u8 => U8, i8 => I8, u16 => U16,
       i16 => I16, u32 => U32, i32 => I32, u64 => U64, i64 => I64);

/// A type the fixed tree reduces: `f32`, `half::f16`, `half::bf16`.
pub trait Reducible: Plain + fixed_tree::Element {}
impl Reducible for f32 {}
impl Reducible for f16 {}
impl Reducible for bf16 {}
