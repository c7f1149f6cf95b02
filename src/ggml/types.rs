//! ggml tensor types, as ggml's own ids. Tables (names, block sizes) come from ggml itself,
//! so every quant type ggml knows is supported without a copy of its tables here.

use std::ffi::CStr;
use std::fmt;

use super::sys;

/// A ggml element type (`enum ggml_type`), kept as the raw id.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(u32);

impl GgmlType {
    pub const F32: Self = Self(sys::GGML_TYPE_F32);
    pub const F16: Self = Self(sys::GGML_TYPE_F16);
    pub const BF16: Self = Self(sys::GGML_TYPE_BF16);
    pub const Q8_0: Self = Self(sys::GGML_TYPE_Q8_0);
    pub const I32: Self = Self(sys::GGML_TYPE_I32);

    /// The type with ggml id `id`, if ggml knows it (ids ggml retired have no traits).
    pub fn from_id(id: u32) -> Option<Self> {
        if id >= sys::GGML_TYPE_COUNT {
            return None;
        }
        let t = Self(id);
        // Removed types keep their slot but have a zero block size.
        (t.block_size() > 0 && t.type_size() > 0).then_some(t)
    }

    pub fn id(self) -> u32 {
        self.0
    }

    pub(crate) fn raw(self) -> sys::ggml_type {
        self.0 as sys::ggml_type
    }

    /// ggml's short name for the type ("f32", "q8_0", "q4_K", ...).
    pub fn name(self) -> String {
        // SAFETY: the id was range-checked; ggml returns a static NUL-terminated string.
        let p = unsafe { sys::ggml_type_name(self.raw()) };
        if p.is_null() {
            return format!("type#{}", self.0);
        }
        // SAFETY: non-null static C string from ggml's type table.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Elements per block (1 for plain float/int types).
    pub fn block_size(self) -> usize {
        // SAFETY: pure table lookup for an in-range id.
        unsafe { sys::ggml_blck_size(self.raw()) as usize }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        // SAFETY: pure table lookup for an in-range id.
        unsafe { sys::ggml_type_size(self.raw()) }
    }

    /// Bytes of one row of `ne0` elements, or None when `ne0` is not a whole number of blocks.
    pub fn row_bytes(self, ne0: usize) -> Option<usize> {
        let bs = self.block_size();
        (bs > 0 && ne0.is_multiple_of(bs)).then(|| ne0 / bs * self.type_size())
    }

    pub fn is_quantized(self) -> bool {
        // SAFETY: pure table lookup for an in-range id.
        unsafe { sys::ggml_is_quantized(self.raw()) }
    }

    /// Whether ggml can convert f32 rows into this type (quantize or plain cast).
    pub fn can_quantize_from_f32(self) -> bool {
        // SAFETY: pure table lookup for an in-range id.
        let traits = unsafe { sys::ggml_get_type_traits(self.raw()) };
        // SAFETY: ggml returns a pointer to a static table entry.
        !traits.is_null()
            && unsafe { (*traits).from_float_ref.is_some() }
            // SAFETY: pure table lookup for an in-range id.
            && !unsafe { sys::ggml_quantize_requires_imatrix(self.raw()) }
    }

    /// Looks a type up by ggml's name, case-insensitively ("Q8_0", "q4_k", "bf16").
    pub fn from_name(name: &str) -> Option<Self> {
        (0..sys::GGML_TYPE_COUNT)
            .filter_map(Self::from_id)
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Debug for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}
