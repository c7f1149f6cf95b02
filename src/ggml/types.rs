//! What ggml itself says about the tensor types of [`DType`] (the crate's one type table):
//! the raw id for ggml calls and whether ggml can quantize into a type. The tests check the
//! table in `crate::dtype` against ggml's own traits.

use super::sys;
use crate::dtype::DType;

impl DType {
    /// The ggml id as ggml's C enum (whose integer type differs between platforms).
    #[allow(clippy::unnecessary_cast)]
    pub(super) fn raw(self) -> sys::ggml_type {
        self.id() as sys::ggml_type
    }

    /// The type with ggml's raw id `raw` (`None` for ids ggml retired or does not know).
    #[allow(clippy::unnecessary_cast)]
    pub(super) fn from_raw(raw: sys::ggml_type) -> Option<DType> {
        DType::from_id(raw as u32)
    }

    /// Whether ggml can convert f32 rows into this type (quantize or plain cast) without an
    /// importance matrix.
    pub fn can_quantize_from_f32(self) -> bool {
        // SAFETY: pure table lookup for a type ggml knows (every DType id is in range).
        let traits = unsafe { sys::ggml_get_type_traits(self.raw()) };
        // SAFETY: ggml returns a pointer to a static table entry.
        !traits.is_null()
            && unsafe { (*traits).from_float_ref.is_some() }
            // SAFETY: pure table lookup for an in-range id.
            && !unsafe { sys::ggml_quantize_requires_imatrix(self.raw()) }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;

    /// Every type ggml has traits for is in the table, with ggml's block size, block bytes,
    /// quantized flag and name.
    #[test]
    fn table_matches_ggml() {
        let mut seen = 0;
        for id in 0..sys::GGML_TYPE_COUNT {
            let raw = id as sys::ggml_type;
            // SAFETY: pure table lookups for an in-range id.
            let (block, size) = unsafe { (sys::ggml_blck_size(raw), sys::ggml_type_size(raw)) };
            if block <= 0 || size == 0 {
                assert!(DType::from_id(id).is_none(), "id {id} was retired by ggml");
                continue;
            }
            let t = DType::from_id(id).unwrap_or_else(|| panic!("ggml type {id} missing"));
            seen += 1;
            // SAFETY: static NUL-terminated name from ggml's table.
            let name = unsafe { CStr::from_ptr(sys::ggml_type_name(raw)) };
            assert_eq!(t.name(), name.to_str().unwrap(), "name of {id}");
            assert_eq!(t.block_size(), block as usize, "{t} block size");
            assert_eq!(t.type_size(), size, "{t} block bytes");
            // SAFETY: pure table lookup.
            assert_eq!(
                t.is_quantized(),
                unsafe { sys::ggml_is_quantized(raw) },
                "{t}"
            );
        }
        assert_eq!(seen, DType::ALL.len());
        assert!(DType::Q8_0.can_quantize_from_f32());
        assert!(!DType::IQ2_XXS.can_quantize_from_f32());
    }
}
